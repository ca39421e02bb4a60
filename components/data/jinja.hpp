#pragma once
/// `JinjaTemplate`: a Jinja2 template, such as a model's chat_template
/// (tokenizer_config.json or chat_template.jinja), parsed once and rendered
/// as transformers' apply_chat_template renders it with Jinja2, without
/// Python:
///
///   auto t = JinjaTemplate::parse(config.chat_template.value(), "models/qwen/chat_template.jinja");
///   nlohmann::ordered_json vars = {{"messages", messages}, {"add_generation_prompt", true},
///                                  {"bos_token", ""}, {"eos_token", "<|im_end|>"}};
///   auto text = t->render(vars);          // Result<JinjaTemplate::Rendered>
///
/// The environment is transformers': trim_blocks and lstrip_blocks on, the
/// trailing newline dropped, loop controls ({% break %}, {% continue %}),
/// {% generation %} blocks (their byte ranges in `Rendered::generation`),
/// its tojson (ensure_ascii off, no HTML escaping), raise_exception and
/// strftime_now (which reads SOURCE_DATE_EPOCH when it is set, so renders
/// can be reproduced; else the local time), in Jinja2's immutable sandbox
/// (a list or dict method that would change it fails). Values behave as
/// Python's do (docs/templates.md lists what is covered).
///
/// parse refuses, naming the line: a syntax error, an unknown filter or
/// test, and what glint's Jinja does not run ({% include %}, {% extends %},
/// {% call %}, {% do %}, recursive loops, *args in calls, `%` formatting of
/// strings is refused when rendered). render fails with invalid_argument,
/// naming the template and line, where Jinja2 would raise: an undefined
/// value used as more than text, a type error, raise_exception (its message,
/// as `raised`). Immutable after parse: render is safe from many threads.

#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {

class JinjaTemplate {
public:
  struct Rendered {
    std::string text;
    /// [begin, end) byte ranges that {% generation %} blocks wrote.
    std::vector<std::pair<size_t, size_t>> generation;
  };

  /// `name` says where the source came from, in errors.
  static Result<JinjaTemplate> parse(const std::string& source, std::string name);

  /// Renders with `variables` (a JSON object: messages, tools,
  /// add_generation_prompt, ...), in its key order.
  Result<Rendered> render(const nlohmann::ordered_json& variables) const;

  const std::string& name() const;

private:
  struct Program;
  std::shared_ptr<const Program> program_;
};

}  // namespace glint::components
