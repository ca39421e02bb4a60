// safetensors files: the 8-byte header length, the JSON header, and every
// tensor it describes read back; a file that parses is written again with
// write_safetensors and must read back the same.
#include "common.hpp"

#include "components/checkpoint/safetensors.hpp"

#include <unistd.h>

#include <cstring>
#include <vector>

using namespace glint;
using namespace glint::components;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  // The parsed file owns its bytes: tensors view them and may write them.
  auto buf = std::make_shared<std::vector<std::byte>>(size);
  if (size > 0) std::memcpy(buf->data(), data, size);
  auto f = SafetensorsFile::parse(std::span<std::byte>{buf->data(), buf->size()}, buf, "fuzz.safetensors");
  if (!f) {
    (void)describe(f.error());
    return 0;
  }
  NamedTensors all;
  for (const auto& name : f->names()) {
    GLINT_FUZZ_CHECK(f->contains(name), name);
    auto t = f->get(name);
    GLINT_FUZZ_CHECK(t, name + ": " + (t ? "" : describe(t.error())));
    uint8_t sum = 0;
    const auto* p = reinterpret_cast<const uint8_t*>(t->data());
    for (size_t i = 0; i < t->nbytes(); ++i) sum = static_cast<uint8_t>(sum + p[i]);
    (void)sum;
    (void)t->describe();
    all.emplace_back(name, std::move(*t));
  }
  // Written again, the tensors read back equal (metadata too).
  static const std::string path = "/tmp/glint-fuzz-safetensors-" + std::to_string(::getpid()) + ".safetensors";
  auto written = write_safetensors(path, all, f->metadata());
  GLINT_FUZZ_CHECK(written, written ? "" : describe(written.error()));
  auto back = SafetensorsFile::open(path);
  GLINT_FUZZ_CHECK(back, back ? "" : describe(back.error()));
  GLINT_FUZZ_CHECK(back->names() == f->names(), "names differ after a write");
  GLINT_FUZZ_CHECK(back->metadata() == f->metadata(), "metadata differs after a write");
  for (const auto& [name, t] : all) {
    auto b = back->get(name);
    GLINT_FUZZ_CHECK(b && b->dtype() == t.dtype() && b->shape() == t.shape() && b->nbytes() == t.nbytes() &&
                         (t.nbytes() == 0 || std::memcmp(b->data(), t.data(), t.nbytes()) == 0),
                     name + " differs after a write");
  }
  ::unlink(path.c_str());
  return 0;
}
