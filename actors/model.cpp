#include "actors/model.hpp"

#include "actors/detail/answer.hpp"
#include "actors/model_state.hpp"
#include "actors/sampler.hpp"
#include "placement/service.hpp"
#include "runtime/dispatch.hpp"
#include "runtime/process.hpp"

#include <caf/scoped_actor.hpp>

#include <chrono>
#include <memory>

namespace glint::actors {

namespace {

// Sends `buckets` to every sampler of `push`: bucket k to all of them, then,
// once all answered, bucket k + 1 (the last as update_weights). It blocks
// this rank's own thread (model ranks are detached), so the rank serves
// nothing else meanwhile and the live weights that local-mode buckets share
// cannot change under them. The requests go from a scoped actor: an awaited
// request's timeout would hold the rank itself in CAF's clock until it fired,
// and its thread could not end at shutdown.
Result<void> push_buckets(caf::actor_system& sys, const WeightPush& push, const std::vector<NamedTensors>& buckets) {
  caf::scoped_actor me{sys};
  const auto timeout = std::chrono::milliseconds{push.timeout_ms};
  for (size_t k = 0; k < buckets.size(); ++k) {
    const bool last = k + 1 == buckets.size();
    caf::error failed;
    size_t failed_at = 0;
    // Fan out to every sampler first, then collect: the samplers stage in parallel.
    auto fan_out = [&](auto send) {
      using Handle = decltype(send(std::declval<const sampler_actor&>()));
      std::vector<Handle> handles;
      for (const auto& a : push.samplers) handles.push_back(send(caf::actor_cast<sampler_actor>(a)));
      for (size_t s = 0; s < handles.size(); ++s)
        handles[s].receive([](bool) {},
                           [&](caf::error& e) {
                             if (!failed) failed = std::move(e), failed_at = s;
                           });
    };
    if (last)
      fan_out([&](const sampler_actor& to) {
        return me->request(to, timeout, update_weights_atom::value, buckets[k], push.update);
      });
    else
      fan_out([&](const sampler_actor& to) {
        return me->request(to, timeout, stage_weights_atom::value, buckets[k], push.update.version);
      });
    if (failed)
      return with_context(failed, "push_weights: sampler " + std::to_string(failed_at) + " of " +
                                      std::to_string(push.samplers.size()) + ", bucket " + std::to_string(k + 1) +
                                      " of " + std::to_string(buckets.size()));
  }
  return {};
}

}  // namespace

model_actor::behavior_type model_shard(model_actor::pointer self, RankContext ctx, ModelSpec spec) {
  auto st = std::make_shared<ModelState>(std::move(ctx), std::move(spec));
  // Every handler answers through `answer`: a result, or the error with the
  // rank named; an exception becomes an error too, so the rank and its
  // training state survive it.
  auto answer = [st](auto&& run) { return detail::answer(*st, run); };
  // The same for a method that answers nothing but success.
  auto done = [answer](auto&& run) {
    return answer([&]() -> Result<bool> {
      if (auto ok = run(); !ok) return ok.error();
      return true;
    });
  };
  return {
      [st, answer](forward_backward_atom, const Batch& b, const std::string& adapter) -> caf::result<Metrics> {
        return answer([&] { return st->forward_backward(b, adapter); });
      },
      [st, answer](forward_only_atom, const Batch& b, const std::string& adapter) -> caf::result<Tensor> {
        return answer([&] { return st->forward_only(b, adapter); });
      },
      [st, answer](clip_grad_and_step_atom, const std::string& adapter) -> caf::result<Metrics> {
        return answer([&] { return st->clip_grad_and_step(adapter); });
      },
      [st, done](set_loss_atom, const std::string& adapter, const LossSpec& s) -> caf::result<bool> {
        return done([&] { return st->set_loss(adapter, s); });
      },
      [st, done](set_optimizer_atom, const std::string& adapter, const OptimizerConfig& s) -> caf::result<bool> {
        return done([&] { return st->set_optimizer(adapter, s); });
      },
      [st, done](set_lr_scheduler_atom, const std::string& adapter, const SchedulerConfig& s) -> caf::result<bool> {
        return done([&] { return st->set_lr_scheduler(adapter, s); });
      },
      [st, done](add_adapter_atom, const std::string& name, const LoraConfig& c, uint64_t seed) -> caf::result<bool> {
        return done([&] { return st->add_adapter(name, c, seed); });
      },
      [st, done](remove_adapter_atom, const std::string& name) -> caf::result<bool> {
        return done([&] { return st->remove_adapter(name); });
      },
      [st, answer](calculate_metric_atom, const std::string& adapter) -> caf::result<Metrics> {
        return answer([&] { return st->calculate_metric(adapter); });
      },
      [st, answer](get_train_configs_atom, const std::string& adapter) -> caf::result<std::string> {
        return answer([&] { return st->train_configs(adapter); });
      },
      [st, answer](save_atom, const std::string& adapter, const std::string& dir,
                   bool with_optimizer) -> caf::result<std::string> {
        return answer([&] { return st->save(adapter, dir, with_optimizer); });
      },
      [st, done](load_atom, const std::string& adapter, const std::string& dir, bool with_optimizer) -> caf::result<bool> {
        return done([&] { return st->load(adapter, dir, with_optimizer); });
      },
      [st, answer](export_weights_atom, const std::string& adapter) -> caf::result<NamedTensors> {
        return answer([&] { return st->export_weights(adapter, false, /*snapshot=*/true); });
      },
      [st, answer](sync_manifest_atom, const std::string& adapter, bool merged) -> caf::result<SyncManifest> {
        return answer([&] { return st->sync_manifest(adapter, merged); });
      },
      [st, self, answer](push_weights_atom, const WeightPush& push) -> caf::result<Metrics> {
        return answer([&]() -> Result<Metrics> {
          if (push.samplers.empty() || push.bucket_bytes < 1 || push.timeout_ms < 1)
            return make_error(errc::invalid_argument,
                              "push_weights needs samplers, bucket_bytes >= 1 and a timeout >= 1 ms");
          // A bucket is one message: it must fit what the samplers' processes accept.
          const auto limit = max_tensor_bytes();
          if (static_cast<uint64_t>(push.bucket_bytes) > limit)
            return make_error(errc::invalid_argument, "bucket_bytes " + std::to_string(push.bucket_bytes) +
                                                          " exceeds the message limit of " + std::to_string(limit) +
                                                          " bytes (Options::max_message_bytes); lower it");
          auto w = st->export_weights(push.adapter, push.merged, /*snapshot=*/false);
          if (!w) return w.error();
          for (const auto& [name, t] : *w)
            if (t.nbytes() > limit)
              return make_error(errc::resource_exhausted,
                                "weight " + name + " (" + std::to_string(t.nbytes()) + " bytes) exceeds the message limit of " +
                                    std::to_string(limit) + " bytes (Options::max_message_bytes); raise it, or sync "
                                    "with the collective transport");
          const auto tensors = w->size();
          const auto bytes = glint::detail::payload_bytes(*w);
          auto buckets = buckets_of(std::move(*w), push.bucket_bytes);
          if (!buckets) return buckets.error();
          if (auto ok = push_buckets(self->system(), push, *buckets); !ok) return ok.error();
          return Metrics{{"tensors", static_cast<double>(tensors)},
                         {"buckets", static_cast<double>(buckets->size())},
                         {"bytes", static_cast<double>(bytes)}};
        });
      },
      [st, answer](stream_listen_atom, int32_t receivers, const std::string& host) -> caf::result<int32_t> {
        return answer([&] { return st->stream_listen(receivers, host); });
      },
      [st, answer](stream_send_atom, const std::string& adapter, bool merged, int64_t timeout_ms) -> caf::result<int64_t> {
        return answer([&] { return st->stream_send(adapter, merged, timeout_ms); });
      },
      [st, answer](sync_send_atom, const std::string& adapter, bool merged,
                   const SyncGroupAddress& at) -> caf::result<int64_t> {
        return answer([&] { return st->sync_send(adapter, merged, at); });
      },
  };
}

std::string address_of_node(Runtime& rt, int node) {
  if (rt.mode() == Mode::local) return "127.0.0.1";
  // Node 0 is this process: the address the node processes reach it by.
  return node == 0 ? rt.options().cluster.master_addr : rt.node(node).hello.host;
}

Result<Group<model_actor>> spawn_model_group(Runtime& rt, const placement::DeviceGroup& group,
                                             const placement::DeviceMesh& mesh, ModelSpec spec) {
  auto slots = placement::place(rt, group, mesh);
  if (!slots) return slots.error();
  if (spec.store_port == 0) {
    int host_node = 0;
    for (const auto& s : *slots)
      if (s.dp_rank == 0) {
        host_node = s.node;
        break;
      }
    spec.store_host = address_of_node(rt, host_node);
    auto port = pick_free_port();
    if (!port) return with_context(port.error(), "choosing a port for the process group of '" + group.name + "'");
    spec.store_port = *port;
  }
  return Group<model_actor>::spawn(rt, group.name, model_type, std::move(*slots), spec);
}

}  // namespace glint::actors
