#pragma once
/// Expert parallelism: a mixture-of-experts model's experts split over the
/// ranks of a group, each rank holding num_experts / p of every sparse
/// layer's experts and a whole copy of everything else. The ranks are
/// data-parallel (each has its own batch): every rank routes its own tokens,
/// sends each (token, slot) to the rank holding its expert and gets the
/// expert's output back, by two all-to-alls per sparse layer forward and
/// two backward (DeepSpeed-MoE's and Megatron's layout):
///
///   ep::shard_model(model, pg);                    // keeps this rank's experts
///   auto got = ep::exchange(rows, send_rows, recv_rows, pg);  // autograd: the reverse exchange backward
///
/// Each expert's gradient gathers the contributions of every rank's tokens
/// through the exchange, so only the replicated parameters' gradients are
/// summed over the group (as data parallelism sums them); the experts'
/// are summed only over replicas of the same experts (dp). A collective
/// that fails inside the forward or the backward throws CarriedError
/// (components/comm/process_group_impl.hpp).

#include "components/comm/process_group.hpp"
#include "components/model/transformer.hpp"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace glint::components::ep {

/// This rank's experts [first, first + count) of `experts` split over the
/// group; an error naming num_experts and the size when they do not divide.
struct Range {
  int64_t first = 0, count = 0;
};
Result<Range> expert_range(int64_t experts, const ProcessGroup& pg);

/// Rows of `x` (dim 0) to the group's ranks: the first send_rows[0] to rank
/// 0, the next send_rows[1] to rank 1, ...; answers recv_rows[r] rows from
/// each rank r, in rank order (what each sent this rank). Its gradient is
/// the reverse exchange. Each rank's counts must be the others' mirror
/// (send_rows[r] here is recv_rows[this rank] on r): exchange_counts gives them.
at::Tensor exchange(const at::Tensor& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                    ProcessGroup& pg);
/// What each rank sends this one, from what this one sends each rank:
/// counts [p * n] (n per destination, in rank order) to the counts [p * n]
/// received (n from each source). Throws CarriedError when it fails.
at::Tensor exchange_counts(const at::Tensor& counts, ProcessGroup& pg);

/// Which routed expert parameter `name` (model.layers.L.mlp.experts.N.*,
/// after any prefix, such as an optimizer's) belongs to; -1: none.
int64_t expert_of(const std::string& name);
/// The rank of a group of `size` that holds parameter `name` of a model
/// with config `c` (-1: every rank holds it).
int owner_of(const ModelConfig& c, int size, const std::string& name);

/// Keeps this rank's experts of every sparse layer and drops the others, in
/// place; from then on every pass is collective over `pg` (each rank its
/// own batch). Refused, naming the reason, for a model without experts,
/// when num_experts does not divide by the group's size, and for a model
/// already cut another way (tensor-parallel shards, a pipeline stage) or
/// with adapters.
Result<void> shard_model(CausalLM::Impl& model, std::shared_ptr<ProcessGroup> pg);

}  // namespace glint::components::ep
