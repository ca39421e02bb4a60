#pragma once
/// The optimizer over LibTorch parameters (components/ and tests only).

#include "components/checkpoint/safetensors.hpp"
#include "components/model/optim.hpp"

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {

using ParamList = std::vector<std::pair<std::string, at::Tensor>>;

class Optimizer {
public:
  explicit Optimizer(OptimizerConfig cfg) : cfg_(cfg) {}

  /// One update of every parameter that has a gradient, at rate `lr`.
  /// Weight decay goes by name (decays()), or for a parameter that
  /// `decay_masks` has, by element (flat shards mixing a layer's weights
  /// and norms: true where it decays).
  void step(const ParamList& params, double lr, const std::map<std::string, at::Tensor>* decay_masks = nullptr);
  int64_t steps() const { return steps_; }
  /// The bytes of the moments held.
  int64_t state_bytes() const;
  const OptimizerConfig& config() const { return cfg_; }
  /// New hyperparameters of the same kind; the moments and the step count
  /// stay (as changing a PyTorch param_group's lr does).
  void reconfigure(const OptimizerConfig& cfg) { cfg_ = cfg; }

  /// The state as named tensors ("exp_avg.NAME", "exp_avg_sq.NAME",
  /// "momentum.NAME", "step"), and back. Loading checks names and shapes
  /// against `params`.
  NamedTensors state() const;
  Result<void> load_state(const std::map<std::string, Tensor>& state, const ParamList& params);

private:
  struct Slot {
    at::Tensor exp_avg, exp_avg_sq, momentum;
  };
  OptimizerConfig cfg_;
  int64_t steps_ = 0;
  std::map<std::string, Slot> slots_;
};

/// Scales the gradients so that their global L2 norm is at most `max_norm`
/// (no-op when max_norm <= 0 or the norm is not finite). Returns the norm
/// before clipping.
double clip_grad_norm(const ParamList& params, double max_norm);

/// The sum of a gradient's squares in float64 (kernels::sum_of_squares, or
/// LibTorch's composition where the fused kernels are off): what gradient
/// norms add up, locally or before a sum over ranks.
double grad_squares(const at::Tensor& g);

/// The clipping of clip_grad_norm for callers that compute the global norm
/// themselves (sharded parameters, whose squares sum over ranks): scales
/// `grads` (undefined ones skipped) by max_norm / (norm + 1e-6) when `norm`
/// is finite and passes max_norm (> 0).
void clip_to_norm(const std::vector<at::Tensor>& grads, double norm, double max_norm);

}  // namespace glint::components
