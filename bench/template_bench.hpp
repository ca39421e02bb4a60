#pragma once
/// `glint bench template`: how fast chat templates render.
///
/// - jinja_render_us, jinja2_render_us: microseconds per conversation to
///   render each model's chat template of tests/data/chat_templates over
///   the conversations of tests/data/chat/conversations.json, with glint's
///   interpreter and with Python's Jinja2 in transformers' environment
///   (bench/python/template_baseline.py), the template parsed once, the
///   median over templates; jinja_vs_jinja2: Jinja2's time over glint's
///   (goal > 1), the median of the per-template ratios, and
///   jinja_vs_jinja2_min, the slowest template's.
/// - chat_cpp_vs_jinja_encode: a training row's encode (render, loss mask,
///   token ids) by the C++ format over the same row through the
///   interpreter, for the templates a C++ format renders (ChatML, Qwen2,
///   Qwen2.5, Qwen3, Llama 3): why those formats stay.

namespace glint::bench {

struct TemplateBenchArgs {
  int repeats = 5;  ///< timed rounds; medians are printed
};

int templates(const TemplateBenchArgs& args);

}  // namespace glint::bench
