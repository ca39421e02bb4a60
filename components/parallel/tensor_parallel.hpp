#pragma once
/// Tensor parallelism's pieces (Megatron-LM's layout), each an autograd
/// function over a process group of tp ranks that hold the same input:
///
///   auto h = tp::column_linear(x, w_gate_shard, {}, pg);     // [.., out / p]: this rank's features
///   auto y = tp::row_linear(h, w_down_shard, {}, pg);        // [.., out]: summed over ranks
///   auto lp = tp::vocab_logprob(hidden, head_shard, v0, V, targets, pg);  // [N], no [N, V] anywhere
///
/// A column-parallel linear holds rows [r n/p, (r+1) n/p) of its weight
/// (its output features; q/k/v/gate/up, whose heads or features split
/// cleanly); a row-parallel one holds the same columns (its input features;
/// o/down): its partial products are summed over the group. The input of a
/// column-parallel linear is replicated, so its gradient is summed over the
/// group in the backward (copy_to); a row-parallel output is summed in the
/// forward (reduce_from). The vocabulary splits the same way: each rank
/// holds a run of the embedding's and the LM head's rows, and the log-
/// probability of a target is computed from each rank's local logits and
/// two small collectives (every rank's max and sum of exponentials, and the
/// target's logit from the rank that holds it), never the full logits.
///
/// A collective that fails inside the forward or the backward throws
/// CarriedError (components/comm/process_group_impl.hpp).

#include "components/comm/process_group.hpp"
#include "components/model/transformer.hpp"

#include <ATen/ATen.h>

namespace glint::components::tp {

/// This rank's run [begin, begin + size) of `n` rows split over the group;
/// an error naming `what` when n does not divide by the group's size.
struct Range {
  int64_t begin = 0, size = 0;
};
Result<Range> shard_range(int64_t n, const ProcessGroup& pg, const std::string& what);
/// This rank's rows of a vocabulary of V split over the group as evenly as
/// it goes (the first V % p ranks one row more): trained tokenizers' sizes
/// rarely divide. An error when there are fewer rows than ranks.
Result<Range> vocab_range(int64_t V, const ProcessGroup& pg);

/// Identity forward; the gradient summed over the group (the replicated
/// input of column-parallel work).
at::Tensor copy_to(const at::Tensor& x, ProcessGroup& pg);
/// Summed over the group forward; identity backward (the partial outputs of
/// row-parallel work).
at::Tensor reduce_from(const at::Tensor& x, ProcessGroup& pg);

/// x [.., in] (replicated) @ w_shard^T [out/p, in] (+ b_shard [out/p]).
at::Tensor column_linear(const at::Tensor& x, const at::Tensor& w_shard, const at::Tensor& b_shard, ProcessGroup& pg);
/// x_shard [.., in/p] @ w_shard^T [out, in/p], summed over the group (+ b
/// [out], replicated, added once).
at::Tensor row_linear(const at::Tensor& x_shard, const at::Tensor& w_shard, const at::Tensor& b, ProcessGroup& pg);

/// Rows of the embedding: ids [..] (any in [0, V)) to [.., hidden], this
/// rank's rows [vocab_begin, vocab_begin + w_shard.size(0)) looked up, the
/// others' added in by the group.
at::Tensor vocab_embedding(const at::Tensor& ids, const at::Tensor& w_shard, int64_t vocab_begin, ProcessGroup& pg);

/// log p(targets) [N] under logits hidden [N, H] @ W^T of the whole head W,
/// from this rank's rows w_shard (vocab_begin on): gradients to hidden
/// (summed over the group) and to w_shard. Targets outside [0, V) are an
/// error (V: the whole vocabulary, which vocab_range splits).
at::Tensor vocab_logprob(const at::Tensor& hidden, const at::Tensor& w_shard, int64_t vocab_begin, int64_t V,
                         const at::Tensor& targets, ProcessGroup& pg);

/// Cuts `model`'s parameters into this rank's tensor-parallel shards, in
/// place: attention heads (q, k, v rows; o columns) and MLP features (gate
/// and up rows, down columns) split evenly, the vocabulary's rows of the
/// embeddings and the LM head too; norms stay whole. Refused, naming the
/// reason, where a count does not divide by the group's size (GQA's key/
/// value heads included), where an output projection has a bias (it would
/// be added on every rank), or where the model has adapters. From then on
/// every pass is collective and the model cannot be saved or read whole.
Result<void> shard_model(CausalLM::Impl& model, std::shared_ptr<ProcessGroup> pg);

/// Whether parameter `name` of a tensor-parallel model is a shard (false:
/// whole on every rank), and, for whole ones, whether each rank's gradient
/// is only its heads' part (q_norm and k_norm, applied to this rank's heads)
/// and must be summed over the group.
bool is_shard(const std::string& name);
bool gradient_is_partial(const std::string& name);
/// The whole parameter `name` from every rank's `shard` of it (shard_model's
/// split; a collective: every rank of `pg` calls it for the same name).
/// A parameter that is not split is answered as it is, without a collective.
Result<at::Tensor> gather_whole(const std::string& name, const at::Tensor& shard, ProcessGroup& pg);

}  // namespace glint::components::tp
