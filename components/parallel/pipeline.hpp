#pragma once
/// The pipeline-parallel executor: one stage's forwards and backwards over
/// a batch's micro-batches in 1F1B order (pipeline_schedule.hpp), the
/// activations sent on to the next stage and their gradients back, over a
/// process group whose rank is the stage.
///
///   PipelineStage st{.forward = [&](int m, const at::Tensor& in) { return my_layers(m, in); },
///                    .activation_shape = [&](int m) { return std::vector<int64_t>{rows(m), T, H}; }};
///   run_pipeline(pp, micro_batches, st);   // every stage at once; gradients accumulate in its parameters
///
/// Sends are posted and waited for at the end (ProcessGroup::send_async),
/// receives block: the 1F1B order then never waits in a cycle (its
/// simulator test checks every stage count), where blocking sends would
/// deadlock two neighbours that both send first.

#include "components/comm/process_group.hpp"
#include "components/model/model.hpp"

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace glint::components {

struct PipelineStage {
  /// Micro-batch m's forward on this stage. `input`: the previous stage's
  /// activations, a leaf that requires grad (undefined on the first stage).
  /// Answers the activations for the next stage, or on the last stage the
  /// loss to backward (a scalar: the micro-batch's share of the batch's).
  std::function<at::Tensor(int m, const at::Tensor& input)> forward;
  /// The shape of micro-batch m's activations between stages.
  std::function<std::vector<int64_t>(int m)> activation_shape;
  at::ScalarType dtype = at::kFloat;
};

/// Runs this stage's part (stage pp.rank() of pp.size()) of the forward and
/// backward of `micro_batches` micro-batches; the parameters' gradients
/// accumulate over them, as gradient accumulation does on one process.
/// A forward or backward that throws on this stage does not stop the
/// schedule (its neighbours would wait for messages that never come): the
/// rest runs with zeros sent in its place, and the error is answered at the
/// end, on this stage only; the caller agrees with the other stages on
/// whether any failed (its gradients then are not to be used).
Result<void> run_pipeline(ProcessGroup& pp, int micro_batches, const PipelineStage& stage);

namespace pp {

/// The decoder layers [first, end) of stage `stage` of `stages`: an even
/// split, the earlier stages taking one more where it does not divide.
std::pair<int64_t, int64_t> stage_layers(int64_t layers, int stages, int stage);

/// Cuts the model to pipeline stage pg->rank() of pg->size() in place
/// (CausalLM::Impl::pp): it keeps that stage's layers, the embeddings on
/// the first stage, the final norm and the LM head on the last (tied
/// embeddings on both: their gradients are summed between the two). Refuses
/// fewer layers than stages, LoRA adapters, and a model sharded already.
Result<void> shard_model(CausalLM::Impl& m, std::shared_ptr<ProcessGroup> pg);

/// The stage of `stages` that holds parameter `name` of a model of config
/// `c` (the first one for tied embeddings, which the last holds too: their
/// gradients are summed between the two, Trainer::clip_grad_and_step).
int stage_of(const ModelConfig& c, int stages, const std::string& name);

}  // namespace pp

}  // namespace glint::components
