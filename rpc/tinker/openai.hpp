#pragma once
/// The OpenAI-compatible door of `glint serve` (docs/remote.md, "OpenAI-
/// compatible endpoint"): /v1/chat/completions, /v1/completions and
/// /v1/models on the Tinker HTTP port, for the clients and tools that speak
/// OpenAI's protocol. This file turns their JSON into glint's sampling
/// (a prompt, SamplingParams) and sampled sequences back into their JSON;
/// the gateway (gateway.cpp) authenticates, picks the weights `model` names
/// and samples through the tenant's session, as the Tinker door does.
///
/// Every field of the two requests either changes what is sampled as
/// OpenAI defines it or is refused with a 400 naming it: model, messages
/// (with tools, tool calls, tool results, the model's own chat template),
/// prompt, n, max_tokens / max_completion_tokens, temperature, top_p,
/// seed, stop, logprobs / top_logprobs, tools, tool_choice ("auto" or
/// "none"), stream and stream_options.include_usage; user and metadata
/// are kept nowhere (they change nothing). Refused: frequency and presence
/// penalties other than 0, logit_bias, response_format other than text,
/// tool_choice "required" or a named function, parallel_tool_calls false,
/// echo, suffix, best_of other than n, and anything unknown.

#include "components/data/template.hpp"
#include "components/data/tool_calls.hpp"
#include "components/sampler/params.hpp"
#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace glint::rpc::openai {

/// What a request asks for, in glint's terms.
struct Request {
  bool chat = true;
  std::string model;
  std::vector<int64_t> prompt;  ///< the rendered and encoded conversation, or the completion's prompt
  components::SamplingParams params;
  bool logprobs = false;
  int64_t top_logprobs = 0;
  bool stream = false;
  bool include_usage = false;
  bool parse_tools = false;  ///< tools offered and tool_choice not "none"
  nlohmann::ordered_json tools;  ///< null: none
};

struct Limits {
  int64_t max_context = 0;   ///< the served model's positions
  int64_t max_n = 16;
  int64_t max_stop = 4;      ///< OpenAI's bound on stop strings
};

/// Parses a /v1/chat/completions (`chat`) or /v1/completions body.
/// `chat_template` renders messages (null: the model has none, and chat is
/// refused). Errors are invalid_argument naming the field.
Result<Request> parse_request(const nlohmann::json& body, bool chat, const components::Template* chat_template,
                              const components::Tokenizer& tokenizer, const Limits& limits);

/// One sampled sequence, as the gateway read it.
struct Choice {
  std::vector<int64_t> tokens;
  components::TokenLogprobs logprobs;
  components::StopReason stop_reason = components::StopReason::none;
  int64_t stop_token = -1;
  std::string text;  ///< the sampler's text (stop strings cut), "" to decode here
};

/// The answer of a request sampled as `choices`: the completion object, or
/// (stream) the text/event-stream body of its chunks and [DONE]. `id`
/// and `created` as OpenAI's.
struct Answer {
  std::string content_type;
  std::string body;
};
Answer answer(const Request& request, const std::vector<Choice>& choices, const components::Tokenizer& tokenizer,
              components::ToolCallFormat format, const std::string& id, int64_t created);

/// GET /v1/models: the base and the tenant's sampler checkpoints (tinker:// paths).
nlohmann::json models(const std::string& base, const std::vector<std::string>& paths, int64_t created);

/// OpenAI's error object for `e`, and the HTTP status.
nlohmann::json error_json(const caf::error& e);

}  // namespace glint::rpc::openai
