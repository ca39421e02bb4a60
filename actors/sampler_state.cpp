#include "actors/sampler_state.hpp"

#include "actors/detail/message_size.hpp"
#include "actors/weight_sync/collective.hpp"
#include "actors/weight_sync/stream.hpp"
#include "runtime/log.hpp"
#include "runtime/stop.hpp"

#include <algorithm>
#include <cstdio>

namespace glint::actors {

namespace {

/// The seed of request `index` of a call seeded with `seed`: request 0
/// keeps it (a one-prompt call samples as the engine does), request i > 0
/// draws from (seed, i), so the prompts of one call do not share their
/// random numbers, whatever rank serves them.
int64_t request_seed(int64_t seed, int64_t index) {
  if (seed < 0 || index == 0) return seed;
  uint64_t z = static_cast<uint64_t>(seed) + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<int64_t>((z ^ (z >> 31)) & 0x7fffffffffffffffull);
}

}  // namespace

using namespace glint::components;

struct SamplerState::Sync {
  weight_sync::SyncGroup group;
};

SamplerState::SamplerState(RankContext ctx, SamplerSpec spec, std::function<void(uint64_t)> schedule_step)
    : ctx_(std::move(ctx)), spec_(std::move(spec)), schedule_step_(std::move(schedule_step)),
      sync_(std::make_shared<Sync>()) {
  try {
    EngineConfig cfg{.block_size = spec_.block_size,
                     .cache_bytes = spec_.cache_bytes,
                     .max_num_seqs = spec_.max_num_seqs,
                     .max_num_batched_tokens = spec_.max_num_batched_tokens,
                     .max_model_len = spec_.max_model_len,
                     .enable_prefix_caching = spec_.enable_prefix_caching,
                     .seed = spec_.sampling_seed + static_cast<uint64_t>(ctx_.rank)};
    auto engine = [&]() -> Result<Engine> {
      if (!spec_.model_dir.empty()) return Engine::load(spec_.model_dir, cfg);
      auto mc = ModelConfig::parse(spec_.config_json, "SamplerSpec::config_json");
      if (!mc) return mc.error();
      auto lm = CausalLM::init_random(*mc, spec_.seed);
      if (!lm) return lm.error();
      return Engine::create(std::move(*lm), cfg);
    }();
    if (engine) engine_.emplace(std::move(*engine));
    else load_error_ = engine.error();
  } catch (const std::exception& e) {
    load_error_ = error_of_exception(e, "loading the sampler");
  }
}

std::string SamplerState::where() const {
  return "rank " + std::to_string(ctx_.rank) + " of sampler group '" + ctx_.group + "'";
}

Result<Engine*> SamplerState::engine() {
  if (!engine_) return load_error_;
  return &*engine_;
}

void SamplerState::sample(const std::vector<SampleRequest>& requests, const SamplingParams& params,
                          const std::string& adapter, OnChunk on_chunk, Answer answer) {
  auto e = engine();
  if (!e) return answer(fail(e.error()));
  if ((*e)->sleeping())
    return answer(fail(make_error(errc::failed_precondition, "the sampler is asleep: call wake before sampling")));
  if (auto ok = params.validate(); !ok) return answer(fail(ok.error()));
  const auto n = static_cast<size_t>(params.num_samples);
  if (requests.size() > max_sequences_per_call / n)
    return answer(fail(make_error(errc::resource_exhausted,
                                  std::to_string(requests.size()) + " requests x " + std::to_string(n) +
                                      " samples exceed the limit of " + std::to_string(max_sequences_per_call) +
                                      " sequences per call; split the call")));
  // Chosen log-probabilities are always recorded: they are the old_logps.
  auto engine_params = params;
  engine_params.logprobs = std::max<int64_t>(params.logprobs, 0);
  const auto id = next_call_++;
  auto& call = calls_[id];
  call.answer = std::move(answer);
  call.on_chunk = std::move(on_chunk);
  call.n = n;
  call.out.resize(requests.size() * n);
  call.streamed.assign(call.out.size(), 0);
  call.closed.assign(call.out.size(), 0);
  try {
    for (size_t r = 0; r < requests.size(); ++r) {
      for (size_t k = 0; k < n; ++k) {
        auto& s = call.out[r * n + k];
        s.index = requests[r].index;
        s.sample = static_cast<int64_t>(k);
      }
      auto request_params = engine_params;
      request_params.seed = request_seed(params.seed, requests[r].index);
      auto rid = (*e)->add_request(requests[r].prompt, request_params, adapter);
      if (!rid) {
        refuse(call, r, describe(rid.error()));
        continue;
      }
      owner_[*rid] = {id, r};
      ++call.remaining;
    }
  } catch (const std::exception& ex) {
    drop(id, error_of_exception(ex, "adding the requests"));
    return;
  }
  if (call.remaining == 0) finish(id);
  else kick();
}

void SamplerState::step(uint64_t loop) {
  if (loop != loop_ || !stepping_ || !engine_) return;
  auto& e = *engine_;
  // The driver has returned: nothing waits for these calls.
  if (auto ok = check_stop("sampling"); !ok) fail_all(ok.error());
  try {
    const auto steps_before = e.stats().steps;
    auto touched = e.step();
    // A failed step aborts its requests without naming them.
    if (touched) collect(*touched);
    else collect_all();
    if (e.has_unfinished() && !e.sleeping() && e.stats().steps == steps_before)
      fail_all(make_error(errc::internal, "the engine scheduled nothing while requests wait (a glint bug); "
                                          "their calls are failed"));
  } catch (const std::exception& ex) {
    fail_all(error_of_exception(ex, "the engine step"));
  }
  if (has_work()) {
    tell_progress();
    schedule_step_(loop_);
  } else {
    stepping_ = false;
    busy_since_.reset();
  }
}

void SamplerState::report_progress(std::chrono::milliseconds every, std::function<void(const std::string&)> say) {
  progress_every_ = every;
  say_ = std::move(say);
}

void SamplerState::tell_progress() {
  const auto now = std::chrono::steady_clock::now();
  // The engine's counters only when a line starts or is said, not every step.
  auto generated = [&] { return engine_ ? engine_->stats().generated_tokens : 0; };
  if (!busy_since_) {
    busy_since_ = said_at_ = now;
    tokens_at_start_ = generated();
    return;
  }
  if (now - *said_at_ < progress_every_) return;
  said_at_ = now;
  size_t total = 0, left = 0;
  for (const auto& [_, c] : calls_) {
    total += c.out.size();
    left += c.remaining * c.n;
  }
  if (total == 0) return;  // only a weight update waits
  const double secs = std::chrono::duration<double>(now - *busy_since_).count();
  char line[256];
  std::snprintf(line, sizeof line, "%s: sampling: %zu of %zu sequences finished after %.0f s (%lld tokens generated)",
                where().c_str(), total - left, total, secs, static_cast<long long>(generated() - tokens_at_start_));
  if (say_) say_(line);
  else log::info(line);
}

Result<void> SamplerState::update_weights(NamedTensors weights, const WeightUpdate& u) {
  auto e = engine();
  if (!e) return e.error();
  // Staged buckets and this last one apply together, as one version.
  NamedTensors named;
  if (staged_version_ == u.version) named = std::move(staged_);
  staged_.clear();
  staged_version_ = -1;
  named.reserve(named.size() + weights.size());
  for (auto& w : weights) named.push_back(std::move(w));
  if (auto ok = (*e)->update_weights(named, u.adapter, u.version, u.policy); !ok) return ok.error();
  collect_all();  // with the abort policy, requests in flight have finished
  kick();         // a deferred update applies in a step
  return {};
}

Result<void> SamplerState::stage_weights(NamedTensors weights, int64_t version) {
  auto e = engine();
  if (!e) return e.error();
  if (version != staged_version_) {
    staged_.clear();
    staged_version_ = version;
  }
  for (auto& w : weights) staged_.push_back(std::move(w));
  return {};
}

Result<std::vector<Tensor>> SamplerState::allocate(const SyncManifest& m) {
  std::vector<Tensor> tensors;
  tensors.reserve(m.tensors.size());
  for (const auto& spec : m.tensors) {
    if (static_cast<size_t>(spec.dtype) >= dtype_count)
      return make_error(errc::invalid_argument, "the sync manifest's " + spec.name + " has unknown dtype code " +
                                                    std::to_string(static_cast<int>(spec.dtype)));
    auto t = Tensor::zeros(spec.dtype, spec.shape);
    if (!t) return with_context(t.error(), "the sync manifest's " + spec.name);
    tensors.push_back(std::move(*t));
  }
  return tensors;
}

Result<void> SamplerState::apply(const SyncManifest& m, std::vector<Tensor> tensors, const WeightUpdate& u) {
  NamedTensors w;
  w.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) w.emplace_back(m.tensors[i].name, std::move(tensors[i]));
  return update_weights(std::move(w), u);
}

Result<void> SamplerState::sync_recv(const SyncManifest& m, const WeightUpdate& u, const SyncGroupAddress& at) {
  auto e = engine();
  if (!e) return e.error();
  auto tensors = allocate(m);
  if (!tensors) return tensors.error();
  auto pg = sync_->group.join(at.host, at.port, at.rank, at.world);
  if (!pg) return pg.error();
  if (auto got = (*pg)->broadcast_buckets(*tensors, 0, at.bucket_bytes); !got) return got.error();
  return apply(m, std::move(*tensors), u);
}

Result<void> SamplerState::stream_recv(const SyncManifest& m, const WeightUpdate& u, const StreamAddress& at) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(at.timeout_ms, 1));
  auto e = engine();
  auto tensors = e ? allocate(m) : Result<std::vector<Tensor>>{e.error()};
  if (!tensors) {
    (void)weight_sync::decline(at.host, at.port, at.receiver, deadline);
    return tensors.error();
  }
  if (auto ok = weight_sync::recv_weights(at.host, at.port, at.receiver, *tensors, deadline); !ok) return ok;
  return apply(m, std::move(*tensors), u);
}

Result<int64_t> SamplerState::abort_all() {
  auto e = engine();
  if (!e) return e.error();
  const auto n = static_cast<int64_t>(owner_.size());
  for (const auto& [rid, where] : owner_) (*e)->abort(rid);
  collect_all();
  return n;
}

Result<void> SamplerState::wake() {
  auto e = engine();
  if (!e) return e.error();
  if (auto ok = (*e)->wake(); !ok) return ok.error();
  kick();
  return {};
}

Result<Metrics> SamplerState::stats() {
  if (!engine_) return load_error_;
  Metrics m;
  const auto s = engine_->stats();
  auto put = [&](const char* k, auto v) { m[k] = static_cast<double>(v); };
  put("num_blocks", s.num_blocks);
  put("free_blocks", s.free_blocks);
  put("block_size", s.block_size);
  put("steps", s.steps);
  put("prompt_tokens", s.prompt_tokens);
  put("cached_tokens", s.cached_tokens);
  put("prefix_cache_hit_rate", s.prefix_cache_hit_rate());
  put("generated_tokens", s.generated_tokens);
  put("preemptions", s.preemptions);
  put("recomputed_tokens", s.recomputed_tokens);
  put("running", s.running);
  put("waiting", s.waiting);
  put("weight_version", engine_->weight_version());
  put("update_pending", engine_->update_pending());
  put("sleeping", engine_->sleeping());
  put("calls", calls_.size());
  return m;
}

bool SamplerState::has_work() const {
  return engine_ && !engine_->sleeping() && (engine_->has_unfinished() || engine_->update_pending());
}

void SamplerState::kick() {
  if (stepping_ || !has_work()) return;
  stepping_ = true;
  ++loop_;
  schedule_step_(loop_);
}

void SamplerState::collect_all() {
  std::vector<uint64_t> ids;
  ids.reserve(owner_.size());
  for (const auto& [rid, where] : owner_) ids.push_back(rid);
  collect(ids);
}

void SamplerState::collect(const std::vector<uint64_t>& ids) {
  auto& e = *engine_;
  for (auto rid : ids) {
    auto it = owner_.find(rid);
    if (it == owner_.end()) continue;
    const auto [cid, r] = it->second;
    auto& call = calls_.at(cid);
    const auto* o = e.output(rid);
    if (!o) continue;
    if (call.on_chunk) stream(call, r, *o);
    if (!o->finished) continue;
    auto done = e.take(rid);
    owner_.erase(it);
    for (size_t k = 0; k < call.n; ++k) {
      auto& s = call.out[r * call.n + k];
      auto& seq = done->sequences[k];
      s.tokens = std::move(seq.tokens);
      s.logprobs = std::move(seq.logprobs);
      s.stop_reason = seq.stop_reason;
      s.stop_token = seq.stop_token;
      s.stop_string = std::move(seq.stop_string);
      s.text = std::move(seq.text);
      s.weight_version = seq.weight_version;
      s.first_weight_version = seq.first_weight_version;
      s.routes = std::move(seq.routes);
      s.prompt_logprobs = done->prompt_logprobs;
      s.cached_tokens = done->cached_tokens;
    }
    if (--call.remaining == 0) finish(cid);
  }
}

void SamplerState::stream(Call& call, size_t r, const RequestOutput& o) {
  for (size_t k = 0; k < call.n; ++k) {
    const auto i = r * call.n + k;
    const auto& seq = o.sequences[k];
    const bool finished = seq.stop_reason != StopReason::none;
    if (call.closed[i] || (seq.tokens.size() == call.streamed[i] && !finished)) continue;
    SampleChunk c;
    c.index = call.out[i].index;
    c.sample = static_cast<int64_t>(k);
    const auto from = call.streamed[i];
    c.tokens.assign(seq.tokens.begin() + static_cast<std::ptrdiff_t>(from), seq.tokens.end());
    if (seq.logprobs.chosen.size() >= seq.tokens.size())
      c.logprobs.assign(seq.logprobs.chosen.begin() + static_cast<std::ptrdiff_t>(from),
                        seq.logprobs.chosen.begin() + static_cast<std::ptrdiff_t>(seq.tokens.size()));
    c.finished = finished;
    c.stop_reason = seq.stop_reason;
    call.streamed[i] = seq.tokens.size();
    call.closed[i] = finished;
    call.on_chunk(std::move(c));
  }
}

void SamplerState::refuse(Call& call, size_t r, const std::string& why) {
  for (size_t k = 0; k < call.n; ++k) {
    const auto i = r * call.n + k;
    call.out[i].error = why;
    if (!call.on_chunk) continue;
    SampleChunk c;
    c.index = call.out[i].index;
    c.sample = static_cast<int64_t>(k);
    c.finished = true;
    c.error = why;
    call.closed[i] = 1;
    call.on_chunk(std::move(c));
  }
}

void SamplerState::finish(uint64_t cid) {
  auto it = calls_.find(cid);
  auto call = std::move(it->second);
  calls_.erase(it);
  // The answer is one message: it must fit what the caller's process accepts.
  uint64_t bytes = 0;
  auto logprob_bytes = [](const TokenLogprobs& l) {
    return l.chosen.size() * sizeof(float) + l.top_ids.size() * sizeof(int64_t) + l.top_logprobs.size() * sizeof(float);
  };
  for (const auto& s : call.out)
    bytes += 64 + s.tokens.size() * sizeof(int64_t) + logprob_bytes(s.logprobs) + logprob_bytes(s.prompt_logprobs) +
             s.text.size() + s.stop_string.size() + s.error.size();
  if (auto ok = detail::fits_in_a_message(bytes, "the answer of " + std::to_string(call.out.size()) + " sequences",
                                          "sample fewer prompts or samples per call, or fewer logprobs");
      !ok)
    return call.answer(fail(ok.error()));
  call.answer(std::move(call.out));
}

void SamplerState::drop(uint64_t cid, const caf::error& err) {
  for (auto it = owner_.begin(); it != owner_.end();) {
    if (it->second.first != cid) {
      ++it;
      continue;
    }
    engine_->abort(it->first);
    (void)engine_->take(it->first);
    it = owner_.erase(it);
  }
  auto c = calls_.find(cid);
  auto call = std::move(c->second);
  calls_.erase(c);
  call.answer(fail(err));
}

void SamplerState::fail_all(const caf::error& err) {
  std::vector<uint64_t> ids;
  for (const auto& [cid, call] : calls_) ids.push_back(cid);
  for (auto cid : ids) drop(cid, err);
}

}  // namespace glint::actors
