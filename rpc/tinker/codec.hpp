#pragma once
/// The Tinker API's bodies, in both of the SDK's wire formats (JSON, SDK 0.24
/// and older; protobuf, rpc/tinker/tinker_public.proto, 0.19 and newer),
/// read into and written from one set of plain structs, so that the gateway
/// (rpc/tinker/gateway.cpp) never sees a format. Every field is checked as
/// it is read: a wrong type, shape or size is an error naming the field
/// (the gateway answers it as HTTP 400).
///
///   auto req = tinker::parse_forward_backward_proto(body);   // or _json
///   ... run it ...
///   auto out = tinker::render_forward_backward_proto(result); // or _json

#include "components/sampler/params.hpp"
#include "runtime/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace glint::rpc::tinker {

/// A dense tensor of a Datum's loss_fn_inputs (sparse CSR is made dense as
/// it is read). `values` holds every element in row-major order; for int64
/// tensors they are exact (checked to be integers).
struct TensorData {
  enum class Dtype { f32, i64 } dtype = Dtype::f32;
  std::vector<int64_t> shape;
  std::vector<double> values;
};

struct Datum {
  std::vector<int64_t> tokens;  ///< the model input: every text chunk's tokens, in order
  std::map<std::string, TensorData> inputs;
};

struct ForwardBackwardRequest {
  std::string model_id;
  int64_t seq_id = 0;
  std::vector<Datum> data;
  std::string loss_fn;
  std::map<std::string, double> loss_fn_config;
  bool forward_only = false;
};

/// One datum's outputs: its target log-probs, shaped as its target_tokens.
struct DatumOutput {
  std::vector<float> logprobs;
  std::vector<int64_t> shape;
};

struct ForwardBackwardResult {
  std::vector<DatumOutput> outputs;
  /// "name:reduction" keys (the SDK combines chunks' metrics by the part
  /// after the colon).
  std::map<std::string, double> metrics;
};

struct SampledSequence {
  bool length = false;  ///< stopped at max_tokens (else at a stop token or string)
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
};

struct SampleResult {
  std::vector<SampledSequence> sequences;
  /// One per prompt token; NaN where there is none (the first).
  std::optional<std::vector<float>> prompt_logprobs;
  /// The top k (id, logprob) per prompt token, row-major [prompt, k]; rows
  /// with fewer than k hold (0, -99999), the SDK's empty cell.
  struct Topk {
    uint32_t k = 0;
    std::vector<int32_t> ids;
    std::vector<float> logprobs;
  };
  std::optional<Topk> topk_prompt_logprobs;
  int64_t prompt_cache_hit_tokens = 0;
};

/// The deepest JSON a request may nest. The SDK's deepest body (a datum's
/// loss_fn_inputs tensors) nests 6 levels.
inline constexpr size_t kMaxJsonDepth = 64;

/// The elements (tokens, tensor entries, JSON values) one request may make
/// on a server of `tokens_per_call`: 16 per token, and 65,536 more.
inline size_t request_element_budget(int64_t tokens_per_call) {
  return static_cast<size_t>(tokens_per_call < (int64_t{1} << 22) ? tokens_per_call : int64_t{1} << 22) * 16 + 65536;
}

/// forward_backward (and forward) bodies. JSON: SDK 0.16's form (no type
/// fields, nulls) and 0.18's (every default, type fields) alike; `forward`
/// reads "forward_input" instead of "forward_backward_input".
/// `max_elements` bounds what the request makes (its tokens and every
/// tensor's entries, sparse ones as made dense), checked before each is
/// made: over it, resource_exhausted.
Result<ForwardBackwardRequest> parse_forward_backward_json(const nlohmann::json& body, bool forward,
                                                           size_t max_elements = size_t{1} << 26);
/// The model_id and seq_id of a protobuf forward_backward body whose
/// content parse_forward_backward_proto refused (a call refused for its
/// content still takes its seq_id's turn); an error if the message itself
/// does not parse.
Result<std::pair<std::string, int64_t>> forward_backward_ids_proto(std::string_view body);

/// `canonical`: when not null, set to the message serialized
/// deterministically (maps in key order): two encodings of one request give
/// the same bytes, so a retry is recognised whatever order its maps came in.
Result<ForwardBackwardRequest> parse_forward_backward_proto(std::string_view body, std::string* canonical = nullptr,
                                                            size_t max_elements = size_t{1} << 26);

std::string render_forward_backward_json(const ForwardBackwardResult& r);
std::string render_forward_backward_proto(const ForwardBackwardResult& r);
std::string render_sample_json(const SampleResult& r);
std::string render_sample_proto(const SampleResult& r);

/// A model input's tokens from {"chunks": [{"tokens": [...], "type": "encoded_text"}, ...]}
/// (type may be absent, as SDK 0.16 sends it); other chunk kinds are refused.
Result<std::vector<int64_t>> parse_model_input_json(const nlohmann::json& input, const std::string& field,
                                                    size_t max_elements = size_t{1} << 26);
/// What an asample body asks, beside its sampling_session_id and seq_id
/// (which the gateway reads first, to find the session and a retry).
struct SampleBody {
  std::vector<int64_t> prompt;
  components::SamplingParams params;
  bool prompt_logprobs = false;      ///< the answer carries each prompt token's log-prob
  int64_t topk_prompt_logprobs = 0;  ///< and the k likeliest at each prompt token
};
/// The server's bounds an asample body is read within.
struct SampleBounds {
  int64_t max_context = 0;      ///< the base model's context: prompt plus new tokens
  int64_t tokens_per_call = 0;  ///< prompt plus every sample's new tokens, when max_tokens is not given
};
/// An asample body's prompt, sampling_params (max_tokens, seed, stop,
/// temperature, top_k, top_p; any other key is refused), num_samples,
/// prompt_logprobs and topk_prompt_logprobs, each checked for its type and
/// the whole by SamplingParams::validate. max_tokens not given: as many as
/// the context leaves, within tokens_per_call for the call's samples.
Result<SampleBody> parse_sample_json(const nlohmann::json& body, const SampleBounds& bounds,
                                     size_t max_elements = size_t{1} << 26);

/// The JSON object of a POST body (decompressed), as the gateway reads every
/// body that is not protobuf: bounded by check_json_bounds(max_depth,
/// max_values), then parsed; an empty body is {}. An error when it is not
/// a JSON object.
Result<nlohmann::json> decode_json_body(std::string_view body, size_t max_depth, size_t max_values);

/// Whether a JSON text may be parsed: nested at most `max_depth` deep (a
/// deeper document would overflow the stack of nlohmann's recursive dump
/// and destructor) and holding at most about `max_values` values (counted
/// by commas, outside strings). One pass over the bytes, before any value
/// is made; invalid_argument (depth) or resource_exhausted (values).
Result<void> check_json_bounds(std::string_view text, size_t max_depth, size_t max_values);

/// A zstd frame's content (Content-Encoding: zstd), at most `max_bytes`.
Result<std::string> zstd_decompress(std::string_view frame, size_t max_bytes);

}  // namespace glint::rpc::tinker
