// The OpenAI-compatible door's bodies (rpc/tinker/openai.hpp): the first
// byte picks chat or text completions and streamed or not, the rest is the
// JSON body. A body is refused with an error or parsed into a prompt and
// sampling parameters that validate; an answer made from it is valid JSON,
// or a stream of events that ends with [DONE].
#include "common.hpp"

#include "components/data/bpe_trainer.hpp"
#include "components/data/template.hpp"
#include "rpc/tinker/openai.hpp"

using namespace glint;
using namespace glint::components;

namespace {

const Template& chat() {
  static const Template t = [] {
    TokenizerConfig config;
    config.chat_template = kChatmlToolsTemplate;
    config.chat_template_origin = "kChatmlToolsTemplate";
    return *Template::make(fuzz::chat_tokenizer(std::move(config)), {.name = "jinja"});
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > fuzz::kMaxInputBytes) return 0;
  const bool is_chat = (data[0] & 1) != 0;
  const auto text = fuzz::text_of(data + 1, size - 1);
  auto body = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (body.is_discarded()) return 0;
  const auto& t = chat();
  auto r = rpc::openai::parse_request(body, is_chat, &t, t.tokenizer(), {.max_context = 512});
  if (!r) return 0;
  GLINT_FUZZ_CHECK(static_cast<bool>(r->params.validate()), "a parsed request's sampling parameters do not validate");
  GLINT_FUZZ_CHECK(!r->prompt.empty() && static_cast<int64_t>(r->prompt.size()) + r->params.max_tokens <= 512,
                   "a parsed request passes the context");
  // An answer of the prompt's first tokens, as if sampled.
  rpc::openai::Choice c;
  c.tokens.assign(r->prompt.begin(), r->prompt.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(8, r->prompt.size())));
  c.tokens.push_back(t.end_of_turn_id());
  c.logprobs.chosen.assign(c.tokens.size(), -1.f);
  c.logprobs.k = r->top_logprobs;
  for (auto id : c.tokens)
    for (int64_t k = 0; k < r->top_logprobs; ++k) {
      c.logprobs.top_ids.push_back(id);
      c.logprobs.top_logprobs.push_back(-1.f);
    }
  c.stop_reason = StopReason::stop;
  c.stop_token = t.end_of_turn_id();
  std::vector<rpc::openai::Choice> choices(static_cast<size_t>(r->params.num_samples), c);
  auto a = rpc::openai::answer(*r, choices, t.tokenizer(), ToolCallFormat::hermes, "id", 0);
  if (r->stream) {
    GLINT_FUZZ_CHECK(a.body.size() >= 14 && a.body.compare(a.body.size() - 14, 14, "data: [DONE]\n\n") == 0,
                     "a stream does not end with [DONE]");
  } else {
    GLINT_FUZZ_CHECK(!nlohmann::json::parse(a.body, nullptr, false).is_discarded(), "an answer is not JSON");
  }
  return 0;
}
