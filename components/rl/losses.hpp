#pragma once
/// The training losses of glint (SFT cross-entropy, GRPO, DR-GRPO, GSPO, CISPO, DPO, and the
/// token-level losses as Tinker defines them: importance sampling, PPO, CISPO, DRO) as plain
/// functions on at::Tensor. Formulas, shapes and an example: docs/losses.md.
///
/// Each function is pure: it reads its inputs, builds a scalar `loss` that keeps the autograd graph
/// to `logps` (and `entropies`), and never modifies an input. Old, reference and advantage tensors are
/// detached inside: no gradient reaches them. Computation runs in f64 when `logps` is f64, else in
/// f32 (bf16/f16 inputs are upcast). Tokens where `mask` is 0 may hold any value, NaN and inf
/// included: they are replaced by 0 before any arithmetic, so they reach neither loss nor gradient.
///
/// Bad input (shapes, non-finite advantages, an empty mask, unknown option values, a KL or entropy
/// coefficient without its tensor) is `invalid_argument` with the tensor and the shapes named; a
/// LibTorch exception is `internal`. Nothing throws. Thread-safe as LibTorch ops are.

#include "runtime/error.hpp"

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>

namespace glint::components::rl {

/// Per-token inputs of the SFT and policy losses; B sequences of T tokens.
struct LossInputs {
  at::Tensor logps;       ///< [B, T] floating: log-probs of the taken tokens under the current policy
  at::Tensor mask;        ///< [B, T] bool, integer or floating, values 0/1: the tokens that count
  at::Tensor old_logps;   ///< [B, T] behaviour-policy log-probs; undefined: logps.detach() (ratio 1)
  at::Tensor ref_logps;   ///< [B, T] reference-policy log-probs; needed when beta > 0
  at::Tensor advantages;  ///< [B] per sequence (broadcast over T) or [B, T] per token
  at::Tensor entropies;   ///< [B, T] per-token entropies; needed when entropy_coef != 0
  at::Tensor weights;     ///< [B, T] floating per-token weights (token_loss cross_entropy only; any sign)
  /// [B, T] the behaviour policy's log-probs (the sampler's), for
  /// decoupled_ppo, whose old_logps are the proximal policy's.
  at::Tensor behavior_logps;
  /// [B, T] integer, optional: the sequence each token belongs to within
  /// its row, for rows that pack several sequences end to end (a packed
  /// batch's segment_ids). Per-sequence reductions (seq_mean_token_mean,
  /// GSPO's ratio, token_sum_norm's count, not its T) then work per (row, id) instead
  /// of per row, so a packed batch gives its padded batch's loss; the
  /// advantages must then be per token. A sequence without a counted token
  /// is not told apart from padding and does not count. Undefined: each row
  /// is one sequence.
  at::Tensor sequences;
};

/// The sequences of rows that pack several (LossInputs::sequences).
struct Sequences {
  at::Tensor index;     ///< i64 [B * T]: each token's sequence, numbered by row, then id
  int64_t count = 0;    ///< sequences, padding's included
  int64_t counted = 0;  ///< sequences with a token in the mask
  at::Tensor counted_ids;  ///< i64 [counted]: those sequences' numbers, in order
};
/// `ids` [B, T] (non-negative integers) read per row; `mask` [B, T] bool
/// the counted tokens. A sequence without a counted token is not told
/// apart from padding: it is not counted.
Sequences sequences_of(const at::Tensor& mask, const at::Tensor& ids);
/// Per sequence of `s`, the sum of x [B, T] over its tokens: [s.count].
at::Tensor sum_per_sequence(const at::Tensor& x, const Sequences& s);

/// A scalar loss (0-dim, with its autograd graph) and detached metrics.
struct LossOutput {
  at::Tensor loss;
  /// Policy losses: clip_fraction, ratio_mean; kl when ref_logps is given; entropy when entropies
  /// are. Cross-entropy: tokens. DPO: reward_chosen, reward_rejected, reward_margin, reward_accuracy.
  std::map<std::string, double> metrics;
  /// What each metric is a mean over (its count of tokens, sequences or
  /// pairs), so that the metrics of slices of a batch combine into the
  /// whole batch's (combine_metrics); a metric without a weight is a sum.
  std::map<std::string, double> weights;
};

/// The metrics of a batch from those of its slices: weighted means for the
/// metrics with a weight, sums for the others.
std::map<std::string, double> combine_metrics(const std::vector<LossOutput>& parts);

/// SFT: -sum(mask * logps) / sum(mask), the mean negative log-likelihood per counted token.
/// Reads logps and mask only.
Result<LossOutput> cross_entropy(const LossInputs& in);

/// Options of the policy-gradient losses. Each function says which it reads.
struct PolicyOptions {
  double epsilon = 0.2;          ///< lower clip: ratio >= 1 - epsilon
  double epsilon_high = 0.2;     ///< upper clip: ratio <= 1 + epsilon_high
  double beta = 0.0;             ///< coefficient of the k3 KL estimate to ref_logps
  double entropy_coef = 0.0;     ///< entropy bonus: entropy_coef * entropy is subtracted per token
  double log_ratio_clamp = 20.0; ///< |logp - old_logp| is clamped to this before exp (overflow guard)
  /// How grpo reduces per-token losses: "seq_mean_token_mean" (mean per sequence, then over
  /// sequences with a counted token), "token_mean" (over all counted tokens, as DAPO), or
  /// "token_sum_norm" (sum / (B * max_tokens), as DR-GRPO).
  std::string aggregation = "seq_mean_token_mean";
  int64_t max_tokens = 0;        ///< DR-GRPO's constant normaliser; 0 means T
};

/// GRPO / PPO-clip per token, reduced by options.aggregation. Reads every option.
Result<LossOutput> grpo(const LossInputs& in, const PolicyOptions& options);

/// DR-GRPO: grpo's per-token loss, summed over counted tokens and divided by B * max_tokens.
/// options.aggregation is not read.
Result<LossOutput> dr_grpo(const LossInputs& in, const PolicyOptions& options);

/// GSPO: one ratio per sequence, exp(mean over counted tokens of logp - old_logp), clipped with
/// epsilon / epsilon_high (the paper uses ~3e-4 / 4e-4), in GSPO-token form so that per-token
/// advantages also work; per-sequence mean, then mean over sequences. options.aggregation is not read.
Result<LossOutput> gspo(const LossInputs& in, const PolicyOptions& options);

/// CISPO: -sg(min(ratio, 1 + epsilon_high)) * A * logp per token, mean over all counted tokens.
/// epsilon and options.aggregation are not read.
Result<LossOutput> cispo(const LossInputs& in, const PolicyOptions& options);

/// The token-level losses as Tinker defines them. Per counted token, with r = exp(logp - q) (q:
/// old_logps, the sampler's log-probs), A the advantages and w the weights:
///   cross_entropy        -w * logp                (w: weights, default 1; reads no q, A)
///   importance_sampling  -r * A
///   ppo                  -min(r * A, clip(r, clip_low, clip_high) * A)
///   cispo                -sg(clip(r, clip_low, clip_high)) * logp * A   (sg: no gradient)
///   dro                  -(logp * A - beta / 2 * (logp - q)^2)
/// The loss is their sum over every counted token of every row (`sum`, Tinker's reduction: no
/// normalisation, so a batch split in parts gives the same total), or their mean per counted token.
/// No ratio guard: a non-finite ratio makes the loss non-finite, which the trainer refuses.
/// Metrics: tokens; ratio_mean for the ratio losses; clip_fraction (ppo, cispo: the share of
/// counted tokens whose ratio is outside [clip_low, clip_high]).
enum class TokenLoss { cross_entropy, importance_sampling, ppo, cispo, dro };
struct TokenLossOptions {
  double clip_low = 0.8;   ///< ppo, cispo: ratio bounds (>= 0, clip_low <= clip_high)
  double clip_high = 1.2;
  double beta = 0.0;       ///< dro: the quadratic penalty's coefficient (>= 0)
  bool sum = true;         ///< false: the mean per counted token
};
Result<LossOutput> token_loss(TokenLoss kind, const LossInputs& in, const TokenLossOptions& options);

/// Options of decoupled_ppo.
struct DecoupledOptions {
  double epsilon = 0.2;        ///< lower clip of the ratio to the proximal policy
  double epsilon_high = 0.2;   ///< upper clip
  /// Cap of the behaviour importance weight pi_prox / pi_behav (> 1):
  /// AReaL's default is 5, veRL's truncated importance sampling uses 2.
  double weight_cap = 5.0;
  /// "mask": a token whose weight is above the cap counts nothing (AReaL);
  /// "clamp": its weight is the cap (veRL's truncated IS).
  std::string cap_mode = "mask";
  double log_ratio_clamp = 20.0;  ///< |log ratio| bound before exp (overflow guard), as grpo
};

/// The decoupled PPO objective (AReaL, for samples from older weights): with
/// the behaviour policy (`behavior_logps`, the sampler's), the proximal
/// policy (`old_logps`, the trainer's before this update) and the current
/// one (`logps`), per counted token
///   r_t = exp(logp_t - prox_t)                     (clipped as PPO's)
///   w_t = sg(exp(prox_t - behav_t)), capped         (the off-policy correction)
///   l_t = -w_t * min(r_t * A_t, clip(r_t, 1 - epsilon, 1 + epsilon_high) * A_t)
///   loss = sum_t m_t * l_t / N
/// with N the counted tokens before the cap drops any (the original count).
/// With behav = prox it is PPO-clip's token_mean exactly. Metrics:
/// clip_fraction, ratio_mean, behavior_weight_mean (before the cap),
/// capped_fraction (tokens above the cap). ref_logps, entropies and weights
/// are refused.
Result<LossOutput> decoupled_ppo(const LossInputs& in, const DecoupledOptions& options);

/// Sequence log-probs (summed over the completion) of preference pairs.
struct DpoInputs {
  at::Tensor chosen_logps;        ///< [B], the policy; keeps its graph
  at::Tensor rejected_logps;      ///< [B], the policy; keeps its graph
  at::Tensor ref_chosen_logps;    ///< [B], the reference; detached inside
  at::Tensor ref_rejected_logps;  ///< [B], the reference; detached inside
};

struct DpoOptions {
  double beta = 0.1;             ///< > 0
  std::string kind = "sigmoid";  ///< "sigmoid" (DPO) or "ipo"
  double label_smoothing = 0.0;  ///< in [0, 0.5], sigmoid only (conservative DPO)
};

/// DPO or IPO, mean over the B pairs.
Result<LossOutput> dpo(const DpoInputs& in, const DpoOptions& options);

}  // namespace glint::components::rl
