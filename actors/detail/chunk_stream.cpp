#include "actors/detail/chunk_stream.hpp"

#include <caf/send.hpp>

#include <algorithm>

namespace glint::actors::detail {

ChunkStream::ChunkStream(Runtime& rt, std::function<void(const SampleChunk&)> on_chunk, size_t expected) : rt_(rt) {
  st_->on_chunk = std::move(on_chunk);
  st_->expected = expected;
  if (expected == 0) st_->all_seen.state()->set(true);
}

ChunkStream::~ChunkStream() { stop(); }

Result<std::shared_ptr<ChunkStream>> ChunkStream::open(Runtime& rt, const std::vector<SampleRequest>& requests,
                                                       const SamplingParams& params,
                                                       std::function<void(const SampleChunk&)> on_chunk) {
  std::set<int64_t> seen;
  for (const auto& r : requests)
    if (!seen.insert(r.index).second)
      return make_error(errc::invalid_argument, "request index " + std::to_string(r.index) +
                                                    " appears twice in a streamed sample call: chunks name their "
                                                    "request by index, so give each request its own");
  return std::make_shared<ChunkStream>(rt, std::move(on_chunk),
                                       requests.size() * static_cast<size_t>(std::max<int64_t>(params.num_samples, 0)));
}

void ChunkStream::State::take(const SampleChunk& c, size_t at) {
  if (closed) return;
  const Key k{c.index, c.sample};
  if (finished.count(k)) return;  // heard in full from another attempt
  auto& have = delivered[k];
  const size_t end = at + c.tokens.size();
  SampleChunk out = c;
  if (have.size() > at) {  // tokens handed on already, from an attempt that died
    const size_t skip = std::min(have.size() - at, c.tokens.size());
    for (size_t j = 0; j < skip; ++j)
      if (c.tokens[j] != have[at + j]) {
        failure = "request " + std::to_string(c.index) + " sample " + std::to_string(c.sample) +
                  ": the rank that took it over from a lost one drew token " + std::to_string(c.tokens[j]) +
                  " at position " + std::to_string(at + j) + " where the lost rank had streamed " +
                  std::to_string(have[at + j]) + "; the stream cannot go on without splicing two sequences";
        closed = true;
        all_seen.state()->set(true);
        return;
      }
    const auto cut = static_cast<std::ptrdiff_t>(skip);
    out.tokens.erase(out.tokens.begin(), out.tokens.begin() + cut);
    out.logprobs.erase(out.logprobs.begin(),
                       out.logprobs.begin() + std::min<std::ptrdiff_t>(cut, static_cast<std::ptrdiff_t>(out.logprobs.size())));
  }
  if (end > have.size()) have.insert(have.end(), out.tokens.end() - static_cast<std::ptrdiff_t>(end - have.size()), out.tokens.end());
  if (out.tokens.empty() && !out.finished) return;
  try {
    on_chunk(out);
  } catch (const std::exception& e) {
    failure = std::string{"its chunk callback threw: "} + e.what();
    closed = true;
    all_seen.state()->set(true);
    return;
  }
  if (c.finished) {
    finished.insert(k);
    if (finished.size() == expected) all_seen.state()->set(true);
  }
}

sample_listener ChunkStream::listener() {
  {
    std::lock_guard<std::mutex> guard{lmx_};
    if (stopped_) return {};  // the call is over: no listener (a rank refuses a call without one)
  }
  // Where this attempt's chunks are in each sequence (the listener's own).
  auto at = std::make_shared<std::map<Key, size_t>>();
  // Detached: the callback is user code, and must not hold up CAF's workers.
  glint::detail::CallerThreadScope on_caller;
  // Its state comes as spawn arguments, not captures: CAF 0.17 dereferences
  // a null argument tuple for an actor spawned without any (UBSan's
  // "reference binding to null pointer", init_fun_factory.hpp).
  using Positions = std::map<Key, size_t>;
  auto l = rt_.system().spawn<caf::detached>(
      [](sample_listener::pointer, std::shared_ptr<State> st,
         std::shared_ptr<Positions> at) -> sample_listener::behavior_type {
        return {[st, at](const SampleChunk& c) {
          std::lock_guard<std::mutex> guard{st->mx};
          auto& from = (*at)[{c.index, c.sample}];
          const size_t start = from;
          from += c.tokens.size();
          st->take(c, start);
        }};
      },
      st_, at);
  std::lock_guard<std::mutex> guard{lmx_};
  if (stopped_) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
  else listeners_.push_back(caf::actor_cast<caf::actor>(l));
  return l;
}

void ChunkStream::stop() {
  std::lock_guard<std::mutex> lguard{lmx_};
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> guard{st_->mx};
    st_->closed = true;
  }
  for (auto& l : listeners_) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
}

Result<std::vector<SampledSequence>> ChunkStream::finish(Result<std::vector<SampledSequence>> answer,
                                                         std::chrono::milliseconds wait) {
  const bool all_seen = !answer || st_->all_seen.wait_for(wait);
  stop();
  if (!answer) return answer.error();
  if (!st_->failure.empty())
    return make_error(errc::aborted, "a streamed sample call stopped: " + st_->failure);
  if (!all_seen) {
    size_t finished = 0;
    {
      std::lock_guard<std::mutex> guard{st_->mx};
      finished = st_->finished.size();
    }
    return make_error(errc::deadline_exceeded, "a streamed sample call was answered but " +
                                                   std::to_string(st_->expected - finished) + " of its " +
                                                   std::to_string(st_->expected) +
                                                   " sequences sent no last chunk within " +
                                                   std::to_string(wait.count()) + " ms");
  }
  return answer;
}

}  // namespace glint::actors::detail
