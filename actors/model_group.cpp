#include "actors/model_group.hpp"

#include "actors/detail/clients.hpp"
#include "actors/remote.hpp"

#include <mutex>
#include <set>

namespace glint::actors {

namespace {

using detail::done_of;

// The model group over CAF (local and cluster mode): each method is the one
// place its dispatch and collect modes are chosen.
class ActorModelBackend final : public ModelBackend {
public:
  explicit ActorModelBackend(Group<model_actor> g) : g_(std::move(g)), info_(g_.info()) {}

  const GroupInfo& info() const override { return info_; }
  const Group<model_actor>* actor_group() const override { return &g_; }

  Future<Metrics> forward_backward(const Batch& batch, const std::string& adapter) override {
    const auto ranks = static_cast<double>(info_.dp_size());
    const auto& g = group_for(batch, adapter);
    return g.call<Collect::mean>(Dispatch::slice_dp, forward_backward_atom_v, batch, adapter)
        .then([ranks](const Result<Metrics>& r) -> Result<Metrics> {
          if (!r) return r.error();
          return detail::whole_batch_metrics(*r, ranks);
        });
  }
  Future<TrainOutput> forward_backward_with_logps(const Batch& batch, const std::string& adapter) override {
    const auto ranks = static_cast<double>(info_.dp_size());
    const auto& g = group_for(batch, adapter);
    return g.call<Collect::flatten>(Dispatch::slice_dp, forward_backward_logps_atom_v, batch, adapter)
        .then([ranks](const Result<std::vector<TrainOutput>>& r) -> Result<TrainOutput> {
          if (!r) return r.error();
          // As forward_backward's Collect::mean, then the whole batch's.
          std::vector<Metrics> metrics;
          std::vector<Tensor> logps;
          for (const auto& part : *r) {
            metrics.push_back(part.metrics);
            logps.push_back(part.logps);
          }
          auto mean = ::glint::detail::collect<Collect::mean>(std::move(metrics));
          if (!mean) return mean.error();
          auto rows = Tensor::concat(logps);
          if (!rows) return rows.error();
          return TrainOutput{detail::whole_batch_metrics(std::move(*mean), ranks), std::move(*rows)};
        });
  }
  Future<Tensor> forward_only(const Batch& batch, const std::string& adapter) override {
    return g_.call<Collect::flatten>(Dispatch::slice_dp, forward_only_atom_v, batch, adapter);
  }
  Future<Metrics> clip_grad_and_step(const std::string& adapter) override {
    return g_.call<Collect::first>(Dispatch::all, clip_grad_and_step_atom_v, adapter);
  }
  Future<void> set_loss(const std::string& adapter, const LossSpec& loss) override {
    auto done = done_of(g_.call<Collect::first>(Dispatch::all, set_loss_atom::value, adapter, loss));
    // Recorded once the ranks took it (a refused loss leaves the old one).
    return done.then([p = pairwise_, adapter, pairs = components::is_pairwise(loss.kind)](const Result<void>& r) -> Result<void> {
      if (r) {
        std::lock_guard lock{p->mu};
        if (pairs) p->adapters.insert(adapter);
        else p->adapters.erase(adapter);
      }
      return r;
    });
  }
  Future<void> set_optimizer(const std::string& adapter, const OptimizerConfig& optimizer) override {
    return done_of(g_.call<Collect::first>(Dispatch::all, set_optimizer_atom::value, adapter, optimizer));
  }
  Future<void> set_lr_scheduler(const std::string& adapter, const SchedulerConfig& scheduler) override {
    return done_of(g_.call<Collect::first>(Dispatch::all, set_lr_scheduler_atom::value, adapter, scheduler));
  }
  Future<void> add_adapter(const std::string& adapter, const LoraConfig& lora, uint64_t seed) override {
    if (adapter.empty())
      return detail::failed<void>(make_error(errc::invalid_argument, "add_adapter needs a name for the adapter"));
    return done_of(g_.call<Collect::first>(Dispatch::all, add_adapter_atom::value, adapter, lora, seed));
  }
  Future<void> load_adapter(const std::string& adapter, const std::string& dir) override {
    if (adapter.empty())
      return detail::failed<void>(make_error(errc::invalid_argument, "load_adapter needs a name for the adapter"));
    return done_of(g_.call<Collect::first>(Dispatch::all, load_adapter_atom::value, adapter, dir));
  }
  Future<void> remove_adapter(const std::string& adapter) override {
    {
      std::lock_guard lock{pairwise_->mu};
      pairwise_->adapters.erase(adapter);
    }
    return done_of(g_.call<Collect::first>(Dispatch::all, remove_adapter_atom::value, adapter));
  }
  Future<Metrics> calculate_metric(const std::string& adapter) override {
    // Every rank keeps its own running metrics: clear them all, report rank 0's.
    return g_.call<Collect::first>(Dispatch::all, calculate_metric_atom::value, adapter);
  }
  Future<std::string> train_configs(const std::string& adapter) override {
    return g_.call<Collect::first>(Dispatch::first, get_train_configs_atom::value, adapter);
  }
  Future<std::string> save(const std::string& adapter, const SaveRequest& r) override {
    return g_.call<Collect::first>(collective(), save_atom::value, adapter, r.dir, r.with_optimizer,
                                   r.max_shard_bytes);
  }
  Future<void> load(const std::string& adapter, const LoadRequest& r) override {
    return done_of(g_.call<Collect::first>(Dispatch::all, load_atom::value, adapter, r.dir, r.with_optimizer));
  }
  Future<NamedTensors> export_weights(const std::string& adapter) override {
    return g_.call<Collect::first>(collective(), export_weights_atom::value, adapter);
  }

private:
  // A model cut over the ranks gathers its whole weights in a collective of
  // them all (rank 0 answers); else rank 0 holds them.
  Dispatch collective() const { return g_.size() > 0 && model_parallel(g_.rank(0).ctx) ? Dispatch::all : Dispatch::first; }

  // A pairwise loss's padded batch is sliced in whole pairs of rows (chosen,
  // rejected); a packed one holds whole pairs in each row.
  const Group<model_actor>& group_for(const Batch& batch, const std::string& adapter) const {
    return pairwise(adapter) && !batch.tensors.count("segment_ids") ? paired_ : g_;
  }
  bool pairwise(const std::string& adapter) const {
    std::lock_guard lock{pairwise_->mu};
    return pairwise_->adapters.count(adapter) > 0;
  }

  Group<model_actor> g_;
  Group<model_actor> paired_ = g_.with_row_unit(2);
  GroupInfo info_;
  /// The adapters ("" the full model) set to a pairwise loss (shared with
  /// set_loss's continuation, which may outlive the backend).
  struct Pairwise {
    std::mutex mu;
    std::set<std::string> adapters;
  };
  std::shared_ptr<Pairwise> pairwise_ = std::make_shared<Pairwise>();
};

}  // namespace

ModelGroup model_group_of(Group<model_actor> group) {
  return ModelGroup{std::make_shared<ActorModelBackend>(std::move(group))};
}

Result<ModelGroup> open_model_group(Runtime& rt, const placement::DeviceGroup& group,
                                    const placement::DeviceMesh& mesh, ModelSpec spec) {
  if (rt.mode() == Mode::remote) {
    // The server's model group is the server's: a mesh that cuts the model
    // is not the client's to choose, and is not dropped silently.
    using placement::Dim;
    if (mesh.size(Dim::fsdp) > 1 || mesh.size(Dim::tp) > 1 || mesh.size(Dim::pp) > 1)
      return make_error(errc::invalid_argument, "open_model_group: in remote mode the server's model group serves "
                                                "every client; a mesh of " + mesh.describe() +
                                                " is not the client's to set (leave out --mesh)");
    auto remote = remote_groups(rt, "open_model_group");
    if (!remote) return remote.error();
    return (*remote)->open_model(spec);
  }
  auto g = spawn_model_group(rt, group, mesh, std::move(spec));
  if (!g) return g.error();
  return model_group_of(std::move(*g));
}

}  // namespace glint::actors
