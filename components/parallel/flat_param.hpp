#pragma once
/// `FlatParam`: the unit of fully sharded data parallelism (FSDP, ZeRO-3).
/// A list of parameters (one decoder layer's) lives as one flat buffer,
/// padded to a multiple of the shard count; each rank of the fsdp group
/// keeps one contiguous shard of it, and the optimizer steps that shard.
///
///   auto f = FlatParam::shard(layer_params, pg.size(), pg.rank());
///   f->gather(pg);        // before the layer's forward (and its backward)
///   ... forward / backward ...
///   f->free_full();       // after use: only the shard stays
///   f->reduce_grads(pg);  // the shard's gradient: the mean over ranks
///
/// Each parameter is a view of the flat buffer (no copy per parameter), so
/// the module and autograd see the parameters they always had; free_full
/// releases the buffer's bytes but keeps its storage, which the next gather
/// fills again (as PyTorch's FSDP frees and refills storage): what autograd
/// saved of a parameter in the forward reads the gathered values in the
/// backward, so a hook on a layer's output gradient that gathers again is
/// all the backward needs. Gloo has no reduce-scatter and no AVG: reduce_grads
/// sums (ProcessGroup::reduce_scatter_sum), then divides by the group's
/// size, as data parallelism's all-reduce does.

#include "components/comm/process_group.hpp"

#include <ATen/ATen.h>

#include <vector>

namespace glint::components {

class FlatParam {
public:
  /// `params` (one dtype, on one device) flattened in order, padded, and cut
  /// into `shards`; this rank keeps shard `rank`, a copy of its values. The
  /// parameters become views of the flat buffer, full until free_full().
  static Result<FlatParam> shard(std::vector<at::Tensor> params, int shards, int rank);

  int64_t numel() const { return numel_; }                   ///< the parameters' elements
  int64_t padded_numel() const { return shard_numel_ * shards_; }
  int64_t shard_numel() const { return shard_numel_; }
  /// This rank's shard: a 1-d leaf that requires grad, for the optimizer.
  at::Tensor& local() { return local_; }
  const at::Tensor& local() const { return local_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  /// Whether the parameters hold their full values now.
  bool gathered() const { return gathered_; }

  /// Every rank's shard gathered (ProcessGroup::all_gather, each rank
  /// calling it) into the flat buffer the parameters view.
  Result<void> gather(ProcessGroup& pg);
  /// The flat buffer's bytes released: the parameters keep their shapes but
  /// must not be read until the next gather.
  void free_full();
  /// The parameters' gradients (a missing one counts as zeros) flattened,
  /// summed over the group and, with `average`, divided by its size: this
  /// shard's part of the result is added to local().grad() (set when it has
  /// none), as autograd accumulates. The parameters' own gradients are
  /// dropped. average = false: for a caller that divides by a count of its
  /// own (the trainer divides by the tokens of every rank).
  Result<void> reduce_grads(ProcessGroup& pg, bool average = true);

private:
  Result<void> check_group(const ProcessGroup& pg, const char* what) const;
  void point_params();

  std::vector<at::Tensor> params_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> offsets_;  // of each parameter in the flat buffer
  int64_t numel_ = 0, shard_numel_ = 0;
  int shards_ = 1, rank_ = 0;
  at::Tensor local_;
  at::Tensor full_;  // the flat buffer the parameters view; no bytes while freed
  bool gathered_ = true;
};

/// Gradient clipping over sharded parameters: the global norm of the
/// gradients of `params` (their local() shards summed over the group, so
/// every rank gets the same norm, the one of the whole model), and, when it
/// passes `max_norm` (> 0), every shard's gradient scaled by max_norm / norm.
/// Answers the norm before clipping.
Result<double> clip_grad_norm(const std::vector<FlatParam*>& params, ProcessGroup& pg, double max_norm);

}  // namespace glint::components
