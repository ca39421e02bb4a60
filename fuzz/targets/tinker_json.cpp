// The Tinker API's JSON bodies as the gateway reads them (rpc/tinker/codec.hpp):
// the first byte picks the endpoint (forward_backward, forward, asample) and
// whether the rest is a zstd frame (Content-Encoding: zstd); the body is then
// decompressed within the server's bound, bounded and parsed
// (decode_json_body) and read by the endpoint's parser, with the budget a
// server of 4,096 tokens per call gives. What a successful read holds must
// fit that budget and be consistent: every tensor as many values as its
// shape, every sampling parameter valid, the prompt within the context.
#include "tinker_checks.hpp"

#include <nlohmann/json.hpp>

using namespace glint;
using namespace glint::rpc::tinker;

namespace {
constexpr int64_t kTokensPerCall = 4096;
constexpr size_t kMaxBodyBytes = size_t{1} << 20;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > fuzz::kMaxInputBytes) return 0;
  const uint8_t how = data[0];
  std::string body{reinterpret_cast<const char*>(data + 1), size - 1};
  if (how & 0x80) {
    auto plain = zstd_decompress(body, kMaxBodyBytes);
    if (!plain) {
      (void)describe(plain.error());
      return 0;
    }
    GLINT_FUZZ_CHECK(plain->size() <= kMaxBodyBytes, "a frame decompressed past its bound");
    body = std::move(*plain);
  }
  const size_t budget = request_element_budget(kTokensPerCall);
  auto j = decode_json_body(body, kMaxJsonDepth, budget);
  if (!j) {
    (void)describe(j.error());
    return 0;
  }
  GLINT_FUZZ_CHECK(j->is_object(), "decode_json_body gave a non-object");
  (void)j->dump();  // what the gateway digests a request by
  switch (how & 0x03) {
    case 0:
    case 1: {
      auto r = parse_forward_backward_json(*j, (how & 0x03) == 1, budget);
      if (!r) {
        (void)describe(r.error());
        return 0;
      }
      fuzz::check_forward_backward(*r, budget);
      break;
    }
    default: {
      const SampleBounds bounds{.max_context = 2048, .tokens_per_call = kTokensPerCall};
      auto r = parse_sample_json(*j, bounds, budget);
      if (!r) {
        (void)describe(r.error());
        return 0;
      }
      GLINT_FUZZ_CHECK(!r->prompt.empty(), "an empty prompt was read");
      GLINT_FUZZ_CHECK(static_cast<int64_t>(r->prompt.size()) < bounds.max_context, "a prompt past the context");
      GLINT_FUZZ_CHECK(static_cast<bool>(r->params.validate()), "invalid sampling params were read");
      GLINT_FUZZ_CHECK(r->topk_prompt_logprobs >= 0, "a negative top-k");
      break;
    }
  }
  return 0;
}
