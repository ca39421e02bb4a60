#pragma once
// The chunks of one streamed sample call, handed to the caller's callback
// (actors' own). A call may hear a sequence from more than one rank: a
// rank that dies mid-call has its requests sampled again by another, from
// their first token, and the same tokens come out (a sequence's draws are
// keyed by seed, request and sample, not by rank). Each attempt streams to
// a listener of its own, which knows how far into each sequence its chunks
// are; the stream hands on only tokens not handed on before, so the
// callback sees each sequence once, in order, whichever ranks served it.
// Should a retry draw other tokens than were handed on (a rank on other
// hardware rounding differently), the call fails rather than splice two
// sequences into one.

#include "actors/sampler.hpp"
#include "runtime/future.hpp"
#include "runtime/runtime.hpp"

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace glint::actors::detail {

class ChunkStream {
public:
  /// The stream of a call of `requests`: it expects requests x num_samples
  /// sequences; an error if two requests share an index (chunks name their
  /// request by it).
  static Result<std::shared_ptr<ChunkStream>> open(Runtime& rt, const std::vector<SampleRequest>& requests,
                                                   const SamplingParams& params,
                                                   std::function<void(const SampleChunk&)> on_chunk);
  /// `expected`: the sequences the call asks for.
  ChunkStream(Runtime& rt, std::function<void(const SampleChunk&)> on_chunk, size_t expected);
  ~ChunkStream();
  ChunkStream(const ChunkStream&) = delete;
  ChunkStream& operator=(const ChunkStream&) = delete;

  /// A new listener, for one attempt of (a part of) the call. Thread-safe.
  sample_listener listener();
  /// The call's result, once it is answered: waits up to `wait` for the
  /// last chunks (the answer and the chunks travel on different paths),
  /// then stops the listeners; an error if the callback threw or chunks
  /// are missing.
  Result<std::vector<SampledSequence>> finish(Result<std::vector<SampledSequence>> answer,
                                              std::chrono::milliseconds wait);

private:
  using Key = std::pair<int64_t, int64_t>;  // (request index, sample)
  struct State {
    std::mutex mx;  // the callback runs under it: once `closed` is set, none runs
    std::function<void(const SampleChunk&)> on_chunk;
    bool closed = false;
    std::string failure;  // what the callback threw
    size_t expected = 0;
    std::map<Key, std::vector<int64_t>> delivered;  // tokens handed on, per sequence
    std::set<Key> finished;
    Future<bool> all_seen;
    // A chunk an attempt's listener heard, whose tokens start `at` tokens
    // into its sequence.
    void take(const SampleChunk& c, size_t at);
  };
  Runtime& rt_;
  std::shared_ptr<State> st_ = std::make_shared<State>();
  std::mutex lmx_;  // listener() may run on several threads (failovers of parts)
  std::vector<caf::actor> listeners_;
  bool stopped_ = false;
  void stop();
};

}  // namespace glint::actors::detail
