#include "actors/sampler.hpp"

#include "actors/detail/answer.hpp"
#include "actors/detail/chunk_stream.hpp"
#include "actors/detail/pad.hpp"
#include "actors/sampler_state.hpp"
#include "placement/service.hpp"

#include <caf/send.hpp>
#include <caf/typed_response_promise.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>

namespace glint::actors {

using components::Engine;


std::vector<SampleRequest> requests_of(const std::vector<std::vector<int64_t>>& prompts) {
  std::vector<SampleRequest> out;
  out.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) out.push_back({static_cast<int64_t>(i), prompts[i]});
  return out;
}

namespace {

// Every sequence has routes, one per completion token, of one shape.
Result<void> check_routes(const std::vector<SampledSequence>& seqs) {
  const auto& first = seqs.front().routes;
  for (const auto& s : seqs) {
    const auto what = "sequence " + std::to_string(s.sample) + " of request " + std::to_string(s.index);
    const auto& r = s.routes;
    if (r.layers <= 0 || r.k <= 0)
      return make_error(errc::invalid_argument,
                        "routing replay: " + what + " has no routes; sample with return_routes (a model with experts)");
    if (r.layers != first.layers || r.k != first.k)
      return make_error(errc::invalid_argument, "routing replay: " + what + " has routes of " +
                                                    std::to_string(r.layers) + " layers x " + std::to_string(r.k) +
                                                    " experts, the first sequence " + std::to_string(first.layers) +
                                                    " x " + std::to_string(first.k) + ": sampled by different models");
    if (static_cast<int64_t>(r.experts.size()) != static_cast<int64_t>(s.tokens.size()) * r.layers * r.k)
      return make_error(errc::invalid_argument, "routing replay: " + what + " has " + std::to_string(r.tokens()) +
                                                    " tokens' routes for " + std::to_string(s.tokens.size()) +
                                                    " tokens");
  }
  return {};
}

// Where a sequence's first token lies in the batch.
struct Placed {
  int64_t row = 0, offset = 0;
};

// `routes` [B, T, S, k] i32: each completion token's routes at the
// position that predicts it (prompt length - 1 + j), -1 elsewhere.
Result<void> put_routes(Batch& batch, const std::vector<std::vector<int64_t>>& prompts,
                        const std::vector<SampledSequence>& seqs, const std::vector<Placed>& at) {
  const auto& ids = batch.tensors.at("input_ids");
  const int64_t B = ids.size(0), T = ids.size(1), S = seqs.front().routes.layers, k = seqs.front().routes.k;
  std::vector<int32_t> v(static_cast<size_t>(B * T * S * k), -1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& r = seqs[i].routes;
    const auto p = static_cast<int64_t>(prompts[static_cast<size_t>(seqs[i].index)].size());
    const int64_t first = (at[i].row * T + at[i].offset + p - 1) * S * k;
    std::copy(r.experts.begin(), r.experts.end(), v.begin() + first);
  }
  auto t = Tensor::from_values(v, {B, T, S, k});
  if (!t) return with_context(t.error(), "the batch's routes");
  batch.tensors["routes"] = std::move(*t);
  return {};
}

}  // namespace

Result<Batch> training_batch(const std::vector<std::vector<int64_t>>& prompts, const std::vector<SampledSequence>& seqs,
                             const TrainingBatchOptions& o) {
  if (seqs.empty()) return make_error(errc::invalid_argument, "no sequences to make a training batch of");
  if (!o.advantages.empty() && o.advantages.size() != seqs.size())
    return make_error(errc::invalid_argument, std::to_string(o.advantages.size()) + " advantages for " +
                                                  std::to_string(seqs.size()) + " sequences; give one per sequence");
  for (size_t i = 0; i < o.advantages.size(); ++i)
    if (!std::isfinite(o.advantages[i]))
      return make_error(errc::invalid_argument, "advantage " + std::to_string(i) + " is not finite");
  if (!o.learned.empty() && o.learned.size() != seqs.size())
    return make_error(errc::invalid_argument, std::to_string(o.learned.size()) + " learned masks for " +
                                                  std::to_string(seqs.size()) + " sequences; give one per sequence");
  // Position t predicts token t + 1 (TrainBatch's convention): the
  // completion's tokens are the targets of positions P-1 .. L-2.
  std::vector<components::EncodedRow> rows(seqs.size());
  std::vector<std::vector<float>> old_logps(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    const auto what = "sequence " + std::to_string(s.sample) + " of request " + std::to_string(s.index);
    if (!s.error.empty()) return make_error(errc::invalid_argument, what + " was not sampled: " + s.error);
    if (s.index < 0 || static_cast<size_t>(s.index) >= prompts.size())
      return make_error(errc::invalid_argument, what + " has no prompt: the index is outside the " +
                                                    std::to_string(prompts.size()) + " prompts given");
    const auto& prompt = prompts[static_cast<size_t>(s.index)];
    if (prompt.empty()) return make_error(errc::invalid_argument, what + " has an empty prompt");
    if (s.logprobs.chosen.size() != s.tokens.size())
      return make_error(errc::invalid_argument, what + " has " + std::to_string(s.logprobs.chosen.size()) +
                                                    " log-probabilities for " + std::to_string(s.tokens.size()) +
                                                    " tokens");
    if (!o.learned.empty() && o.learned[i].size() != s.tokens.size())
      return make_error(errc::invalid_argument, what + " has a learned mask of " + std::to_string(o.learned[i].size()) +
                                                    " for " + std::to_string(s.tokens.size()) + " tokens");
    const size_t p = prompt.size(), c = s.tokens.size(), len = p + c;
    auto& row = rows[i];
    row.input_ids.reserve(len);
    row.input_ids = prompt;
    row.input_ids.insert(row.input_ids.end(), s.tokens.begin(), s.tokens.end());
    row.loss_mask.assign(len, 0.f);
    old_logps[i].assign(len, 0.f);
    for (size_t j = 0; j < c; ++j) {
      row.loss_mask[p - 1 + j] = o.learned.empty() ? 1.f : o.learned[i][j];
      old_logps[i][p - 1 + j] = s.logprobs.chosen[j];
    }
  }
  if (o.routing_replay)
    if (auto ok = check_routes(seqs); !ok) return ok.error();
  if (o.pack) {
    size_t longest = 1;
    for (const auto& r : rows) longest = std::max(longest, r.input_ids.size());
    const auto row_tokens = static_cast<int64_t>(longest);
    const auto min_rows = std::max<int64_t>(o.min_rows, 1);
    // Per token: a packed row holds several sequences' advantages.
    std::vector<std::vector<float>> adv(rows.size());
    if (!o.advantages.empty())
      for (size_t i = 0; i < rows.size(); ++i)
        adv[i].assign(rows[i].input_ids.size(), static_cast<float>(o.advantages[i]));
    std::vector<std::vector<size_t>> bins;
    auto batch = o.advantages.empty()
                     ? detail::pack_rows(rows, o.pad_id, row_tokens, min_rows, {{"old_logps", &old_logps}}, &bins)
                     : detail::pack_rows(rows, o.pad_id, row_tokens, min_rows,
                                         {{"old_logps", &old_logps}, {"advantages", &adv}}, &bins);
    if (!batch || !o.routing_replay) return batch;
    // Where pack_rows put each sequence.
    std::vector<Placed> at(rows.size());
    int64_t b = 0;
    for (const auto& bin : bins) {
      int64_t offset = 0;
      for (size_t i : bin) {
        at[i] = {b, offset};
        offset += static_cast<int64_t>(rows[i].input_ids.size());
      }
      ++b;
    }
    if (auto ok = put_routes(*batch, prompts, seqs, at); !ok) return ok.error();
    return batch;
  }
  auto batch = detail::pad_rows(rows, o.pad_id, {{"old_logps", &old_logps}});
  if (!batch) return batch;
  if (o.routing_replay) {
    std::vector<Placed> at(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) at[i] = {static_cast<int64_t>(i), 0};
    if (auto ok = put_routes(*batch, prompts, seqs, at); !ok) return ok.error();
  }
  if (o.advantages.empty()) return batch;
  std::vector<float> adv(o.advantages.begin(), o.advantages.end());
  auto t = Tensor::from_values(adv, {static_cast<int64_t>(adv.size())});
  if (!t) return t.error();
  batch->tensors["advantages"] = std::move(*t);
  return batch;
}

sampler_actor::behavior_type sampler_rank(sampler_actor::pointer self, RankContext ctx, SamplerSpec spec) {
  auto st = std::make_shared<SamplerState>(std::move(ctx), std::move(spec), [self](uint64_t loop) {
    self->send(caf::actor_cast<sampler_actor>(self), engine_step_atom::value, loop);
  });
  auto answer = [st](auto&& run) { return detail::answer(*st, run); };
  // The same for a method that answers nothing but success.
  auto done = [answer](auto&& run) {
    return answer([&]() -> Result<bool> {
      if (auto ok = run(); !ok) return ok.error();
      return true;
    });
  };
  // Runs `act` on the engine and answers true.
  auto on_engine = [st, done](auto&& act) {
    return done([&]() -> Result<void> {
      auto e = st->engine();
      if (!e) return e.error();
      return act(**e);
    });
  };
  // A sample call answered through a promise, when its last request finishes.
  auto sample = [self, st](const std::vector<SampleRequest>& requests, const SamplingParams& params,
                           const std::string& adapter, SamplerState::OnChunk on_chunk) {
    auto rp = self->make_response_promise<std::vector<SampledSequence>>();
    st->sample(requests, params, adapter, std::move(on_chunk), [rp](Result<std::vector<SampledSequence>> r) mutable {
      if (r) rp.deliver(std::move(*r));
      else rp.deliver(r.error());
    });
    return rp;
  };
  return {
      [sample](sample_atom, const std::vector<SampleRequest>& requests, const SamplingParams& params,
               const std::string& adapter) -> caf::result<std::vector<SampledSequence>> {
        return sample(requests, params, adapter, nullptr);
      },
      [self, st, sample](sample_stream_atom, const std::vector<SampleRequest>& requests, const SamplingParams& params,
                         const std::string& adapter,
                         const sample_listener& listener) -> caf::result<std::vector<SampledSequence>> {
        if (!listener)
          return st->fail(make_error(errc::invalid_argument, "sample_stream needs a listener actor for its chunks"));
        return sample(requests, params, adapter, [self, listener](SampleChunk c) { self->send(listener, std::move(c)); });
      },
      [st, done](update_weights_atom, NamedTensors& w, const WeightUpdate& u) -> caf::result<bool> {
        return done([&] { return st->update_weights(std::move(w), u); });
      },
      [st, done](sync_recv_atom, const SyncManifest& m, const WeightUpdate& u,
                 const SyncGroupAddress& at) -> caf::result<bool> {
        return done([&] { return st->sync_recv(m, u, at); });
      },
      [st, done](stream_recv_atom, const SyncManifest& m, const WeightUpdate& u,
                 const StreamAddress& at) -> caf::result<bool> {
        return done([&] { return st->stream_recv(m, u, at); });
      },
      [st, done](stage_weights_atom, NamedTensors& w, int64_t version) -> caf::result<bool> {
        return done([&] { return st->stage_weights(std::move(w), version); });
      },
      [on_engine](add_adapter_atom, const std::string& name, const LoraConfig& c) -> caf::result<bool> {
        return on_engine([&](Engine& e) { return e.add_adapter(name, c); });
      },
      [on_engine](load_adapter_atom, const std::string& name, const std::string& dir) -> caf::result<bool> {
        return on_engine([&](Engine& e) { return e.load_adapter(name, dir); });
      },
      [on_engine](remove_adapter_atom, const std::string& name) -> caf::result<bool> {
        return on_engine([&](Engine& e) -> Result<void> {
          if (name.empty()) return make_error(errc::invalid_argument, "the base model is not an adapter to remove");
          return e.remove_adapter(name);
        });
      },
      [on_engine](reset_prefix_cache_atom) -> caf::result<bool> {
        return on_engine([](Engine& e) -> Result<void> {
          e.reset_prefix_cache();
          return {};
        });
      },
      [on_engine](sleep_atom) -> caf::result<bool> { return on_engine([](Engine& e) { return e.sleep(); }); },
      [st, done](wake_atom) -> caf::result<bool> { return done([&] { return st->wake(); }); },
      [st, answer](abort_atom) -> caf::result<int64_t> { return answer([&] { return st->abort_all(); }); },
      [st, answer](stats_atom) -> caf::result<Metrics> { return answer([&] { return st->stats(); }); },
      [st](engine_step_atom, uint64_t loop) { st->step(loop); },
  };
}

Result<Group<sampler_actor>> spawn_sampler_group(Runtime& rt, const placement::DeviceGroup& group,
                                                 const placement::DeviceMesh& mesh, SamplerSpec spec) {
  // Each rank serves whole sequences with the whole model: data parallelism.
  if (auto ok = mesh.require_only({placement::Dim::dp}, "sampler group '" + group.name + "'"); !ok) return ok.error();
  return placement::spawn_group<sampler_actor>(rt, group, mesh, sampler_type, spec);
}

Result<std::vector<SampledSequence>> sample_streaming(Runtime& rt, const Group<sampler_actor>& sampler,
                                                      const std::vector<SampleRequest>& requests,
                                                      const SamplingParams& params, const std::string& adapter,
                                                      std::function<void(const SampleChunk&)> on_chunk) {
  auto stream = detail::ChunkStream::open(rt, requests, params, std::move(on_chunk));
  if (!stream) return stream.error();
  auto result = sampler.call<Collect::flatten>(Dispatch::slice_dp, sample_stream_atom_v, requests, params, adapter,
                                               (*stream)->listener())
                    .get();
  return (*stream)->finish(std::move(result), sampler.timeout());
}

GLINT_DEFINE_REGISTRATIONS(sampler, types) {
  types.add_message_type<SamplerSpec>("glint.sampler_spec");
  types.add_message_type<SamplingParams>("glint.sampling_params");
  types.add_message_type<std::vector<SampleRequest>>("glint.sample_requests");
  types.add_message_type<std::vector<SampledSequence>>("glint.sampled_sequences");
  types.add_message_type<SampleChunk>("glint.sample_chunk");
  types.add_message_type<sample_listener>("glint.sample_listener");
  types.add(sampler_type, sampler_rank);
}

}  // namespace glint::actors
