// Tool calls in model output (parse_tool_calls): the first byte picks the
// format, the rest is what the model wrote. Nothing crashes; every call
// read has a name and object arguments, and what cannot be read is an error.
#include "common.hpp"

#include "components/data/tool_calls.hpp"

using namespace glint;
using namespace glint::components;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > fuzz::kMaxInputBytes) return 0;
  const auto format = static_cast<ToolCallFormat>(data[0] % 5);
  const std::string text{fuzz::text_of(data + 1, size - 1)};
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}}])");
  auto reply = parse_tool_calls(text, format, tools);
  for (const auto& c : reply.calls) {
    GLINT_FUZZ_CHECK(!c.name.empty(), "a tool call without a name was read");
    GLINT_FUZZ_CHECK(c.arguments.is_object(), "a tool call's arguments are not an object");
  }
  GLINT_FUZZ_CHECK(to_openai(reply.calls).size() == reply.calls.size(), "to_openai lost a call");
  return 0;
}
