#include "actors/rollout.hpp"

#include <algorithm>

namespace glint::actors {

namespace {
using clock = std::chrono::steady_clock;
double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }
}  // namespace

RolloutPipeline::RolloutPipeline(CheckpointEngine& engine, SamplerGroup sampler, Source source, RolloutOptions options)
    : engine_(engine), sampler_(std::move(sampler)), source_(std::move(source)), options_(std::move(options)) {}

RolloutPipeline::~RolloutPipeline() { close(); }

Result<void> RolloutPipeline::check() const {
  const auto& o = options_;
  if (o.max_staleness < 0 || o.max_staleness > 8)
    return make_error(errc::invalid_argument,
                      "max_staleness must be 0 to 8, not " + std::to_string(o.max_staleness) +
                          ": each weight update that waits for samples in flight holds a copy of the weights on every "
                          "sampler rank");
  if (o.max_running < 0)
    return make_error(errc::invalid_argument, "max_running must be >= 0 (0: no limit), not " +
                                                  std::to_string(o.max_running));
  if (o.first_batch < 1) return make_error(errc::invalid_argument, "first_batch counts from 1");
  if (o.last_batch != 0 && o.last_batch < o.first_batch)
    return make_error(errc::invalid_argument, "last_batch " + std::to_string(o.last_batch) + " is before first_batch " +
                                                  std::to_string(o.first_batch));
  if (!source_) return make_error(errc::invalid_argument, "the rollout pipeline needs a source of batches");
  if (o.sync.policy == components::UpdatePolicy::abort)
    return make_error(errc::invalid_argument,
                      "the rollout pipeline syncs with finish_old or continue_new: abort would cut the batches in flight "
                      "short, and a group is trained only when whole");
  return {};
}

bool RolloutPipeline::wait_for_one() {
  for (auto& p : pending_)
    for (auto& c : p.chunks)
      if (!c.answer.ready()) {
        c.answer.wait();
        return true;
      }
  return false;
}

size_t RolloutPipeline::running() const {
  size_t n = 0;
  for (const auto& p : pending_)
    for (const auto& c : p.chunks)
      if (!c.answer.ready()) n += c.end - c.begin;
  return n;
}

Result<void> RolloutPipeline::admit() {
  const int64_t allowed = options_.first_batch + options_.max_staleness + stats_.updates;  // the last batch admissible
  for (;;) {
    Pending* p = nullptr;
    for (auto& q : pending_)
      if (q.admitted < q.batch.prompts.size()) {
        p = &q;
        break;
      }
    if (!p) {
      const int64_t k = options_.first_batch + fetched_;
      if (source_done_ || (options_.last_batch != 0 && k > options_.last_batch) || k > allowed) return {};
      auto b = source_(k);
      if (!b) return with_context(b.error(), "the rollout source, batch " + std::to_string(k));
      if (!*b) {
        source_done_ = true;
        return {};
      }
      if ((*b)->prompts.empty())
        return make_error(errc::invalid_argument, "the rollout source gave batch " + std::to_string(k) +
                                                      " without prompts");
      if ((*b)->params.num_samples < 1)
        return make_error(errc::invalid_argument, "batch " + std::to_string(k) + " asks for num_samples " +
                                                      std::to_string((*b)->params.num_samples) + "; at least 1");
      ++fetched_;
      pending_.push_back(
          {.step = k, .batch = std::move(**b), .version = engine_.version(), .start = clock::now(), .chunks = {}});
      p = &pending_.back();
    }
    if (p->step > allowed) return {};
    const size_t size = p->batch.prompts.size();
    size_t n = size - p->admitted;
    if (options_.max_running > 0) {
      const auto busy = running();
      const auto cap = static_cast<size_t>(options_.max_running);
      if (busy >= cap) return {};
      n = std::min(n, cap - busy);
    }
    std::vector<SampleRequest> requests;
    requests.reserve(n);
    for (size_t i = p->admitted; i < p->admitted + n; ++i)
      requests.push_back({.index = static_cast<int64_t>(i), .prompt = p->batch.prompts[i]});
    // The time the answer came, written (on a transport thread) before the
    // chunk's future is ready, read after.
    auto arrived = std::make_shared<clock::time_point>();
    Chunk c{.begin = p->admitted,
            .end = p->admitted + n,
            .answer = (options_.sample ? options_.sample(p->step, p->batch, requests)
                                       : sampler_.sample(requests, p->batch.params))
                          .then([arrived](const Result<std::vector<SampledSequence>>& r) {
                            *arrived = clock::now();
                            return r;
                          }),
            .arrived = arrived};
    if (p->admitted == 0) {
      p->version = engine_.version();
      p->start = clock::now();
    }
    p->admitted += n;
    stats_.admitted += static_cast<int64_t>(n);
    p->chunks.push_back(std::move(c));
  }
}

Result<Rollout> RolloutPipeline::next() {
  if (broken_) return *broken_;
  if (closed_) return make_error(errc::failed_precondition, "the rollout pipeline is closed");
  auto fail = [&](caf::error e) -> caf::error {
    broken_ = e;
    return e;
  };
  if (auto ok = check(); !ok) return fail(ok.error());
  if (!synced_) {
    const auto start = clock::now();
    auto s = engine_.sync_weights(options_.sync);
    stats_.sync_seconds += seconds_since(start);
    if (!s) return fail(with_context(s.error(), "the rollout pipeline's first weight sync"));
    synced_ = true;
  }
  if (auto ok = admit(); !ok) return fail(ok.error());
  if (pending_.empty()) {
    if (source_done_ || (options_.last_batch != 0 && options_.first_batch + fetched_ > options_.last_batch))
      return make_error(errc::not_found, "no batch after " + std::to_string(options_.first_batch + fetched_ - 1) +
                                             ": the rollout source has ended");
    return make_error(errc::failed_precondition,
                      "batch " + std::to_string(options_.first_batch + fetched_) + " may start only after " +
                          std::to_string(fetched_ - options_.max_staleness) + " weight updates (max_staleness " +
                          std::to_string(options_.max_staleness) + "), and " + std::to_string(stats_.updates) +
                          " came: call weights_updated() after each optimizer step");
  }
  const auto waiting = clock::now();
  // The oldest batch, whole: with max_running its later prompts are
  // admitted as earlier ones finish.
  auto& p = pending_.front();
  std::vector<std::vector<SampledSequence>> parts;
  for (size_t taken = 0; taken < p.chunks.size() || p.admitted < p.batch.prompts.size();) {
    if (taken == p.chunks.size()) {
      // Nothing left to wait for, yet prompts wait for room: the room is
      // taken by later batches' chunks (max_running), which finish first.
      const bool waited = wait_for_one();
      if (auto ok = admit(); !ok) return fail(ok.error());
      if (!waited && taken == p.chunks.size())
        return fail(make_error(errc::internal, "the rollout pipeline cannot admit batch " + std::to_string(p.step)));
      continue;
    }
    auto seqs = p.chunks[taken].answer.take();
    if (!seqs) return fail(with_context(seqs.error(), "sampling batch " + std::to_string(p.step)));
    ++taken;
    parts.push_back(std::move(*seqs));
    if (auto ok = admit(); !ok) return fail(ok.error());
  }
  const double waited = seconds_since(waiting);
  stats_.wait_seconds += waited;
  Rollout r;
  r.step = p.step;
  r.admitted_version = p.version;
  r.trained_version = engine_.version();
  r.wait_seconds = waited;
  clock::time_point last = p.start;
  for (const auto& c : p.chunks) last = std::max(last, *c.arrived);
  r.sample_seconds = std::chrono::duration<double>(last - p.start).count();
  const auto n = static_cast<size_t>(p.batch.params.num_samples);
  r.sequences.reserve(p.batch.prompts.size() * n);
  for (auto& part : parts)
    for (auto& s : part) r.sequences.push_back(std::move(s));
  if (r.sequences.size() != p.batch.prompts.size() * n)
    return fail(make_error(errc::internal, "batch " + std::to_string(p.step) + " came back with " +
                                               std::to_string(r.sequences.size()) + " sequences, not " +
                                               std::to_string(p.batch.prompts.size() * n)));
  double sum = 0;
  for (const auto& s : r.sequences) {
    if (!s.error.empty())
      return fail(make_error(errc::invalid_argument, "batch " + std::to_string(p.step) + ": prompt " +
                                                         std::to_string(s.index) + " was refused: " + s.error));
    if (s.stop_reason == StopReason::abort)
      return fail(make_error(errc::aborted, "batch " + std::to_string(p.step) + ": a sample of prompt " +
                                                std::to_string(s.index) +
                                                " was aborted (the sampler was told to abort, or a step failed)"));
    const int64_t lag = r.trained_version - s.first_weight_version;
    r.staleness_max = std::max(r.staleness_max, lag);
    sum += static_cast<double>(lag);
  }
  r.staleness_mean = sum / static_cast<double>(r.sequences.size());
  stats_.finished += static_cast<int64_t>(p.batch.prompts.size());
  r.batch = std::move(p.batch);
  pending_.pop_front();
  return r;
}

Result<SyncReport> RolloutPipeline::weights_updated() {
  if (broken_) return *broken_;
  if (closed_) return make_error(errc::failed_precondition, "the rollout pipeline is closed");
  if (auto ok = check(); !ok) return ok.error();
  const auto start = clock::now();
  auto s = engine_.sync_weights(options_.sync);
  stats_.sync_seconds += seconds_since(start);
  if (!s) {
    broken_ = with_context(s.error(), "the rollout pipeline's weight sync");
    return *broken_;
  }
  synced_ = true;
  ++stats_.updates;
  if (auto ok = admit(); !ok) {
    broken_ = ok.error();
    return *broken_;
  }
  return s;
}

void RolloutPipeline::close() {
  if (closed_) return;
  closed_ = true;
  bool busy = false;
  for (const auto& p : pending_)
    for (const auto& c : p.chunks) busy |= !c.answer.ready();
  if (busy) (void)sampler_.abort().get();
  for (auto& p : pending_)
    for (auto& c : p.chunks) c.answer.wait();
  pending_.clear();
}

}  // namespace glint::actors
