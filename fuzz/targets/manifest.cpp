// A committed checkpoint directory's manifest.json (parse_manifest): every
// path it gives stays below the directory.
#include "common.hpp"

#include "components/checkpoint/atomic_dir.hpp"

#include <filesystem>

using namespace glint;
using namespace glint::components;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  auto files = parse_manifest(fuzz::text_of(data, size), "fuzz/manifest.json");
  if (!files) {
    (void)describe(files.error());
    return 0;
  }
  for (const auto& f : *files) {
    const std::filesystem::path p{f.path};
    GLINT_FUZZ_CHECK(!f.path.empty() && p.is_relative(), f.path);
    auto under = (std::filesystem::path{"/ckpt/step-1"} / p).lexically_normal().string();
    GLINT_FUZZ_CHECK(under.rfind("/ckpt/step-1/", 0) == 0, f.path + " leaves the directory: " + under);
  }
  return 0;
}
