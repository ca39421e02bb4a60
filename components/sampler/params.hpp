#pragma once
/// What a sampling request asks for and what it gets back; the engine's
/// configuration. Plain values without LibTorch, so that actors and drivers
/// use them directly (the sampler actor sends them as they are).

#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace glint::components {

/// The sampling parameters users know from vLLM's SamplingParams.
struct SamplingParams {
  int64_t num_samples = 1;  ///< completions per prompt (vLLM's n); they share the prompt's cache blocks
  int64_t max_tokens = 16;  ///< new tokens at most; 0 scores the prompt only (see prompt_logprobs)
  double temperature = 1.0;  ///< 0: greedy
  int64_t top_k = 0;         ///< keep the k likeliest tokens; 0 or -1: all
  double top_p = 1.0;        ///< keep the smallest set of tokens whose probability reaches p; in (0, 1]
  double min_p = 0.0;        ///< drop tokens less likely than min_p x the likeliest; in [0, 1]
  double repetition_penalty = 1.0;  ///< > 1 discourages tokens already in prompt or output (CTRL's rule)
  /// Seeds this request's random draws: the same seed gives the same
  /// completions whatever else is in the batch. -1: from the engine's seed.
  int64_t seed = -1;
  std::vector<int64_t> stop_token_ids{};  ///< stop after any of these (kept in tokens)
  std::vector<std::string> stop{};        ///< stop strings: the text is cut before the first match
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;  ///< do not stop at the model's eos_token_id
  /// Log-probabilities of the sampled tokens (>= 0) plus, for k > 0, the k
  /// likeliest tokens at each step. -1: none. Values are under the model's
  /// distribution (before temperature, penalties and filters): what a
  /// trainer computes for the same tokens.
  int64_t logprobs = -1;
  /// The same for each prompt token given the ones before it (the first
  /// has none). Such requests do not read the prefix cache: cached tokens
  /// are not recomputed, so they would have no log-probabilities.
  int64_t prompt_logprobs = -1;
  /// Routing replay (a model with experts only): each completion token's
  /// experts, SequenceOutput::routes, for a trainer to replay them.
  bool return_routes = false;

  /// The first problem with these values, naming the field and the range.
  Result<void> validate() const;
  friend bool operator==(const SamplingParams&, const SamplingParams&) = default;
};

enum class StopReason : uint8_t {
  none,    ///< still generating
  length,  ///< max_tokens or the model's maximum length
  stop,    ///< eos, a stop token or a stop string
  abort,   ///< aborted, or dropped by a weight update with the abort policy
};
std::string_view to_string(StopReason r);

/// Log-probabilities at a run of positions: for each, the chosen token's,
/// and when asked, the k likeliest tokens (flattened, k per position).
struct TokenLogprobs {
  std::vector<float> chosen;        ///< [positions]
  int64_t k = 0;                    ///< top entries per position
  std::vector<int64_t> top_ids;     ///< [positions * k], likeliest first
  std::vector<float> top_logprobs;  ///< [positions * k]
  friend bool operator==(const TokenLogprobs&, const TokenLogprobs&) = default;
};

/// The experts a model with experts chose for a run of tokens: for token t,
/// sparse layer s (the model's sparse layers in order) and slot j,
/// experts[(t * layers + s) * k + j], in the router's order (likeliest
/// first). Token t's are the routes at the position whose logits drew it
/// (the prompt's last position for the first token): what the trainer
/// computes at the position that predicts it.
struct ExpertRoutes {
  int64_t layers = 0;  ///< sparse layers
  int64_t k = 0;       ///< experts per token (num_experts_per_tok)
  std::vector<int32_t> experts;
  int64_t tokens() const { return layers * k > 0 ? static_cast<int64_t>(experts.size()) / (layers * k) : 0; }
  friend bool operator==(const ExpertRoutes&, const ExpertRoutes&) = default;
};

/// One completion of a request.
struct SequenceOutput {
  std::vector<int64_t> tokens;  ///< the completion's tokens
  TokenLogprobs logprobs;       ///< per completion token, when asked
  std::string text;             ///< the decoded completion (empty without a tokenizer)
  StopReason stop_reason = StopReason::none;
  /// What stopped it: the stop token, or -1; the stop string, or empty.
  int64_t stop_token = -1;
  std::string stop_string;
  /// The weight version of its last token: of the last update that changed
  /// its weights (its adapter's or the base's, whichever applied later; 0
  /// for none). Every token has it, except
  /// after an update with UpdatePolicy::continue_new landed while the
  /// sequence ran: its tokens then span [first_weight_version, weight_version].
  int64_t weight_version = 0;
  int64_t first_weight_version = 0;  ///< of its first token's weights
  ExpertRoutes routes;  ///< per completion token, with SamplingParams::return_routes
  friend bool operator==(const SequenceOutput&, const SequenceOutput&) = default;
};

/// What a request has produced so far (or in the end).
struct RequestOutput {
  uint64_t id = 0;
  std::vector<int64_t> prompt;
  TokenLogprobs prompt_logprobs;  ///< for prompt tokens 1..n-1, when asked
  std::vector<SequenceOutput> sequences;
  std::string adapter;
  bool finished = false;
  int64_t cached_tokens = 0;  ///< prompt tokens served by the prefix cache
  friend bool operator==(const RequestOutput&, const RequestOutput&) = default;
};

/// How an engine lays out its cache and batches its steps.
struct EngineConfig {
  int64_t block_size = 16;            ///< tokens per KV-cache block
  int64_t cache_bytes = 256ll << 20;  ///< the KV cache's memory budget
  int64_t max_num_seqs = 256;         ///< sequences running at once
  int64_t max_num_batched_tokens = 2048;  ///< tokens per engine step (prefill chunks + decodes)
  int64_t max_model_len = 0;          ///< prompt + completion; 0: the model's max_position_embeddings
  bool enable_prefix_caching = true;
  uint64_t seed = 0;                  ///< draws of requests without a seed

  Result<void> validate() const;
  friend bool operator==(const EngineConfig&, const EngineConfig&) = default;
};

/// What to do with requests in flight when new weights arrive.
enum class UpdatePolicy : uint8_t {
  finish_old,  ///< running requests finish on the old weights; new ones wait, then use the new
  abort,       ///< running requests stop now with stop_reason abort; the update applies at once
  /// The update applies before the next engine step; running requests go
  /// on with the new weights (their cached keys and values stay), and each
  /// records the versions its tokens span (SequenceOutput::first_weight_version).
  continue_new,
};
/// "finish_old", "abort" or "continue_new".
std::string_view to_string(UpdatePolicy p);
Result<UpdatePolicy> parse_update_policy(std::string_view name);

}  // namespace glint::components
