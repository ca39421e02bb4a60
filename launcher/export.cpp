// `glint export gguf`: a model directory (and its tokenizer) as one GGUF
// file for llama.cpp.
#include "components/model/gguf_export.hpp"
#include "launcher/commands.hpp"
#include "runtime/memory.hpp"
#include "runtime/progress.hpp"

#include <cstdio>
#include <filesystem>
#include <optional>

namespace glint::launcher {

int export_gguf(const ExportGgufArgs& a) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(a.out, ec) && !a.force) {
    std::fprintf(stderr, "glint export gguf: %s exists; pass --force to replace it\n", a.out.c_str());
    return 2;
  }
  components::GgufExportOptions opts{.adapter = a.adapter, .tokenizer = a.tokenizer, .name = a.name};
  if (!a.dtype.empty()) {
    auto d = parse_dtype(a.dtype);
    if (!d) {
      std::fprintf(stderr, "glint export gguf: %s\n", describe(d.error()).c_str());
      return 2;
    }
    opts.dtype = *d;
  }
  std::optional<Progress> bar;
  size_t shown = 0;  // in twentieths: a log gets 20 lines, not one per tensor
  opts.progress = [&](size_t done, size_t total) {
    if (!bar) bar.emplace("gguf", static_cast<int>(total));
    if (done * 20 / total == shown && done != total) return;
    shown = done * 20 / total;
    bar->update(static_cast<int>(done), "tensors");
  };
  auto done = components::export_gguf(a.model, a.out, opts);
  if (!done) {
    std::fprintf(stderr, "glint export gguf: %s\n", describe(done.error()).c_str());
    return code_of(done.error()) == errc::unimplemented ? 2 : 1;
  }
  if (bar) bar->finish();
  std::printf("wrote %s: %s, %zu tensors (%s), %s; %lld tokens (tokenizer.ggml.pre %s%s)%s\n", a.out.c_str(),
              done->architecture.c_str(), done->tensors, std::string{to_string(done->dtype)}.c_str(),
              format_bytes(static_cast<double>(done->bytes)).c_str(), static_cast<long long>(done->vocab),
              done->pre_tokenizer.c_str(),
              done->padded_tokens ? (", " + std::to_string(done->padded_tokens) + " [PAD] tokens to fill the model's "
                                                                                   "vocabulary").c_str()
                                  : "",
              a.adapter.empty() ? "" : (", adapter " + a.adapter + " merged").c_str());
  return 0;
}

}  // namespace glint::launcher
