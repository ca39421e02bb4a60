#include "actors/model.hpp"

#include "actors/detail/answer.hpp"
#include "actors/model_state.hpp"
#include "actors/weight_sync/buckets.hpp"
#include "actors/sampler.hpp"
#include "placement/service.hpp"
#include "runtime/process.hpp"

#include <chrono>
#include <memory>

namespace glint::actors {


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
      [st, answer](forward_backward_logps_atom, const Batch& b, const std::string& adapter) -> caf::result<TrainOutput> {
        return answer([&]() -> Result<TrainOutput> {
          TrainOutput out;
          auto m = st->forward_backward(b, adapter, &out.logps);
          if (!m) return m.error();
          out.metrics = std::move(*m);
          return out;
        });
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
      [st, answer](save_atom, const std::string& adapter, const std::string& dir, bool with_optimizer,
                   int64_t max_shard_bytes) -> caf::result<std::string> {
        return answer([&] { return st->save(adapter, dir, with_optimizer, max_shard_bytes); });
      },
      [st, done](load_atom, const std::string& adapter, const std::string& dir, bool with_optimizer) -> caf::result<bool> {
        return done([&] { return st->load(adapter, dir, with_optimizer); });
      },
      [st, done](load_adapter_atom, const std::string& name, const std::string& dir) -> caf::result<bool> {
        return done([&] { return st->load_adapter(name, dir); });
      },
      [st, answer](export_weights_atom, const std::string& adapter) -> caf::result<NamedTensors> {
        return answer([&] { return st->export_weights(adapter, false, /*snapshot=*/true); });
      },
      [st, answer](sync_manifest_atom, const std::string& adapter, bool merged) -> caf::result<SyncManifest> {
        return answer([&] { return st->sync_manifest(adapter, merged); });
      },
      [st, self, answer](push_weights_atom, const WeightPush& push) -> caf::result<Metrics> {
        return answer([&] { return st->push_weights(self->system(), push); });
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

Result<void> check_model_mesh(const placement::DeviceMesh& mesh, const std::string& who) {
  using placement::Dim;
  if (auto ok = mesh.require_only({Dim::dp, Dim::fsdp, Dim::ep, Dim::tp, Dim::pp}, who); !ok) return ok.error();
  // The trainer runs one way of cutting the model at a time (with dp), or
  // fsdp with ep.
  const bool fsdp = mesh.size(Dim::fsdp) > 1, ep = mesh.size(Dim::ep) > 1;
  if ((fsdp || ep) + (mesh.size(Dim::tp) > 1) + (mesh.size(Dim::pp) > 1) > 1)
    return make_error(errc::unimplemented, who + ": mesh " + mesh.describe() +
                                               " combines tp or pp with another cut, which the trainer does not yet; "
                                               "use one of fsdp (with ep), tp and pp, with dp");
  return {};
}

bool model_parallel(const RankContext& ctx) {
  if (ctx.mesh.empty()) return false;
  auto m = placement::DeviceMesh::from_dims(ctx.mesh);
  using placement::Dim;
  return m && (m->size(Dim::fsdp) > 1 || m->size(Dim::ep) > 1 || m->size(Dim::tp) > 1 || m->size(Dim::pp) > 1);
}

std::string address_of_node(Runtime& rt, int node) {
  if (rt.mode() == Mode::local) return "127.0.0.1";
  // Node 0 is this process: the address the node processes reach it by.
  // Another node: the address of its route to this one (its host name may
  // resolve to a loopback address there), else its host name.
  if (node == 0) return rt.options().cluster.master_addr;
  const auto n = rt.node(node);
  return n.hello.address.empty() ? n.hello.host : n.hello.address;
}

Result<Group<model_actor>> spawn_model_group(Runtime& rt, const placement::DeviceGroup& group,
                                             const placement::DeviceMesh& mesh, ModelSpec spec) {
  if (auto ok = check_model_mesh(mesh, "model group '" + group.name + "'"); !ok) return ok.error();
  auto slots = placement::place(rt, group, mesh);
  if (!slots) return slots.error();
  if (spec.store_port == 0) {
    // Rank 0 hosts the store (it is dp rank 0 as well).
    spec.store_host = address_of_node(rt, slots->front().node);
    auto port = pick_free_port();
    if (!port) return with_context(port.error(), "choosing a port for the process group of '" + group.name + "'");
    spec.store_port = *port;
  }
  return Group<model_actor>::spawn(rt, group.name, model_type, std::move(*slots), spec);
}

GLINT_DEFINE_REGISTRATIONS(model, types) {
  types.add_message_type<ModelSpec>("glint.model_spec");
  types.add_message_type<LossSpec>("glint.loss_spec");
  types.add_message_type<TrainOutput>("glint.train_output");
  types.add_message_type<OptimizerConfig>("glint.optimizer_config");
  types.add_message_type<SchedulerConfig>("glint.scheduler_config");
  types.add_message_type<LoraConfig>("glint.lora_config");
  types.add_message_type<NamedTensors>("glint.named_tensors");
  types.add_message_type<SyncManifest>("glint.sync_manifest");
  types.add_message_type<SyncGroupAddress>("glint.sync_group_address");
  types.add_message_type<StreamAddress>("glint.stream_address");
  types.add_message_type<WeightUpdate>("glint.weight_update");
  types.add_message_type<WeightPush>("glint.weight_push");
  types.add(model_type, model_shard);
}

}  // namespace glint::actors
