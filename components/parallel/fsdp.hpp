#pragma once
/// `Fsdp`: a CausalLM's base parameters fully sharded over a process group
/// (FSDP, ZeRO-3): one FlatParam per decoder layer and one for the rest
/// (the embeddings, the final norm and an untied LM head), and on an
/// expert-parallel model one more per sparse layer for the experts this ep
/// rank holds (sharded over the ranks holding the same experts), each rank
/// holding one shard of each, its gradient and (in the trainer) its
/// optimizer state.
///
/// A training pass, on every rank of the group at once:
///
///   fsdp->begin_pass(lora);               // gathers the rest (kept for the pass)
///   pass.layer_hooks = fsdp->hooks();     // layer l: gathered on entry, freed on exit
///   ... forward, loss, backward ...       // gathered again as the backward reaches it
///   fsdp->end_pass();                     // reduce-scatters the rest, frees everything
///
/// In the backward, when autograd reaches layer l's output, layer l + 1's
/// backward is done: its gradients are reduce-scattered (summed; the
/// trainer divides by the step's count) into its shard's gradient and its
/// buffer freed, then layer l is gathered. So the collectives of a pass come
/// in one order on every rank: the rest, layers 0..L-1 forward; layer L-1
/// gathered, then for each lower layer the reduce of the one above and its
/// own gather; the reduce of layer 0 and of the rest. A pass that failed
/// part of the way (its loss not finite, an exception) is finished by
/// end_pass with zero gradients, so the other ranks are never left waiting
/// in a collective this rank skipped.
///
/// With a frozen base (LoRA) the layers are gathered for the forward and
/// again for the backward (the input gradients need the weights), from the
/// top down to the lowest layer an adapter reaches, and nothing is reduced.
///
/// The base parameters are the model's own tensors, views of the flat
/// buffers: between passes their bytes are freed, and the model refuses to
/// be read (CausalLM::Impl::sharded_by) until gather_all().

#include "components/comm/process_group.hpp"
#include "components/model/optim_impl.hpp"
#include "components/model/transformer.hpp"
#include "components/parallel/flat_param.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace glint::components {

class Fsdp {
public:
  /// Shards `model`'s base parameters over `pg` (this rank keeps shard
  /// pg.rank()). train: the base is trained (its gradients flow and are
  /// reduce-scattered); false: frozen (an adapter trains). The model must
  /// outlive this, and stays sharded after it (refusing reads).
  static Result<std::unique_ptr<Fsdp>> shard(CausalLM::Impl& model, std::shared_ptr<ProcessGroup> pg, bool train);
  ~Fsdp();
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  ProcessGroup& group() { return *pg_; }
  bool trains_base() const { return train_; }

  /// Starts a pass: gathers the rest. `lora`: the adapter the pass applies
  /// (with a frozen base, which layers the backward reaches).
  Result<void> begin_pass(const LoraAdapter* lora);
  const PassOptions::LayerHooks* hooks() const { return &hooks_; }
  /// Ends a pass, whether its backward ran or not: the collectives it did
  /// not reach (with zero gradients), the rest's reduce, every buffer freed.
  Result<void> end_pass();

  /// Whether any rank of the group has another pass to run (`mine`: this
  /// rank has), and whether any rank's pass failed (`failed`: this one's
  /// did): one small all-reduce, the agreement that keeps ranks in step
  /// when their batches need different numbers of passes.
  struct Vote {
    bool any_pass = false;
    bool any_failed = false;
  };
  Result<Vote> vote(bool mine, bool failed);

  /// Every layer's full parameters (collective), for reading the model
  /// (forward, save, weight sync); release_all() frees them again.
  Result<void> gather_all();
  void release_all();
  /// One unit's full parameters (collective), for reading them one piece at
  /// a time (a streamed save): the unit of `name` (its decoder layer, or
  /// the rest), gathered until release_unit.
  size_t unit_of(const std::string& name) const;
  Result<void> gather_unit_to_read(size_t unit);
  void release_unit(size_t unit);

  /// The shards, for the optimizer: ("fsdpRofN.layers.L", "fsdpRofN.rest"
  /// or, on an expert-parallel model, "fsdpRofN.epEofP.layers.L.experts";
  /// the shard), each a 1-d leaf that requires grad when the base trains.
  ParamList shards() const;
  /// Whether the shard named `shard` (shards()) holds this expert-parallel
  /// rank's own experts (its gradient is whole after the fsdp reduce),
  /// rather than parameters every ep rank holds.
  bool holds_experts(const std::string& shard) const;
  /// Per shard, which elements weight decay applies to (decays() of the
  /// parameter each element belongs to; the padding does not decay).
  const std::map<std::string, at::Tensor>& decay_masks() const { return decay_; }
  std::vector<FlatParam*> units();
  /// The bytes this rank holds for the base: its shards and their gradients.
  int64_t shard_bytes() const;

private:
  Fsdp() = default;
  void gather_unit(size_t u);  // throw: they run inside the forward and the backward
  void free_unit(size_t u);
  // Layer (or the rest) u's units in units_: its own, and its experts' (ep).
  std::vector<size_t> unit_parts(size_t u) const;
  void reduce_unit(size_t u, bool check);
  void backward_reached(int64_t layer, bool check);
  void finish_pending(bool check);
  Result<void> usable() const;

  CausalLM::Impl* model_ = nullptr;
  std::shared_ptr<ProcessGroup> pg_;
  bool train_ = false;
  int64_t layers_ = 0;
  std::vector<FlatParam> units_;     // layers 0..L-1, the rest, then the experts of sparse layers (ep)
  std::vector<size_t> expert_unit_;  // per layer: its experts' unit, or 0 (none)
  std::vector<std::vector<bool>> routed_;  // per unit, per parameter: a routed expert's
  std::vector<std::string> unit_names_;
  std::map<std::string, at::Tensor> decay_;
  PassOptions::LayerHooks hooks_;
  // The pass in progress.
  bool in_pass_ = false;
  std::vector<bool> backward_needed_;  // per layer: its output requires grad
  int64_t forward_done_ = 0;           // layers whose forward gathered
  int64_t next_backward_ = -1;         // the next layer the backward gathers
  int64_t pending_ = -1;               // gathered for the backward, not yet reduced (-1: none)
  bool gathered_all_ = false;
  // The collective that failed, whose rank is now out of step with the
  // others; every later call is refused with it.
  std::optional<caf::error> broken_;
  // Marks the group broken by `e` (the first failure stays) and gives it back.
  const caf::error& broken_by(const caf::error& e);
};

}  // namespace glint::components
