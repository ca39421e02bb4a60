// `glint init-model`: writes a Hugging Face model directory with random
// weights, so tests, examples and benchmarks need no download.
#include "components/model/model.hpp"
#include "launcher/commands.hpp"

#include <cstdio>

namespace glint::launcher {

int init_model(const InitModelArgs& a) {
  auto arch = components::parse_architecture(a.arch);
  if (!arch) {
    std::fprintf(stderr, "glint init-model: %s\n", describe(arch.error()).c_str());
    return 2;
  }
  auto cfg = components::ModelConfig::make(*arch, a.vocab, a.hidden, a.intermediate, a.layers, a.heads,
                                           a.kv_heads > 0 ? a.kv_heads : a.heads, a.head_dim);
  cfg.tie_word_embeddings = a.tie;
  cfg.max_position_embeddings = a.max_positions;
  auto dtype = parse_dtype(a.dtype);
  if (!dtype || (*dtype != Dtype::f32 && *dtype != Dtype::bf16 && *dtype != Dtype::f16)) {
    std::fprintf(stderr, "glint init-model: --dtype must be f32, bf16 or f16, not '%s'\n", a.dtype.c_str());
    return 2;
  }
  cfg.dtype = *dtype;
  if (auto ok = cfg.validate(); !ok) {
    std::fprintf(stderr, "glint init-model: %s\n", describe(ok.error()).c_str());
    return 2;
  }
  auto lm = components::CausalLM::init_random(cfg, a.seed);
  if (!lm) {
    std::fprintf(stderr, "glint init-model: %s\n", describe(lm.error()).c_str());
    return 1;
  }
  if (auto ok = lm->save(a.out); !ok) {
    std::fprintf(stderr, "glint init-model: %s\n", describe(ok.error()).c_str());
    return 1;
  }
  std::printf("wrote %s: %s, %.2fM parameters (%s), seed %llu\n", a.out.c_str(),
              std::string{components::hf_class_name(cfg.architecture)}.c_str(),
              static_cast<double>(cfg.num_parameters()) / 1e6, a.dtype.c_str(),
              static_cast<unsigned long long>(a.seed));
  return 0;
}

}  // namespace glint::launcher
