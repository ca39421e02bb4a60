// Trains a small random Qwen3-shaped model with a data-parallel model group
// of two ranks: each rank gets half of every batch, gradients are averaged
// over Gloo, and the loss falls. Runs in one process (local mode) or as
//   glint run --nproc 2 -- build/examples/train_model
// where rank 1 lives in the second process. Pass a Hugging Face directory
// (e.g. one written by `glint init-model`) to train that model instead.
#include "actors/model_group.hpp"
#include "components/model/config.hpp"
#include "placement/service.hpp"

#include <cstdio>

int main(int argc, char** argv) {
  std::string model_dir = argc > 1 ? argv[1] : "";
  return glint::run_main([&](glint::Runtime& rt) {
    using namespace glint;
    actors::ModelSpec spec;
    if (model_dir.empty()) {
      auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 64, 64, 128, 2, 4, 2);
      spec.config_json = cfg.to_json();
      spec.seed = 1;
    } else {
      spec.model_dir = model_dir;
    }
    auto mesh = placement::DeviceMesh::from_sizes({.dp = 2});
    if (!mesh) return 1;
    auto model = actors::open_model_group(rt, placement::DeviceGroup::of("model", 2), *mesh, spec);
    if (!model) {
      std::fprintf(stderr, "%s\n", describe(model.error()).c_str());
      return 1;
    }
    auto set = model->set_optimizer({.lr = 3e-3}).get();
    if (!set) {
      std::fprintf(stderr, "%s\n", describe(set.error()).c_str());
      return 1;
    }
    // A fixed batch of 8 counting sequences (token ids kept inside a small vocabulary).
    std::vector<int64_t> ids;
    for (int64_t row = 0; row < 8; ++row)
      for (int64_t t = 0; t < 16; ++t) ids.push_back((row * 3 + t) % 50 + 1);
    Batch batch;
    auto input_ids = Tensor::from_values(ids, {8, 16});
    if (!input_ids) {
      std::fprintf(stderr, "%s\n", describe(input_ids.error()).c_str());
      return 1;
    }
    batch.tensors["input_ids"] = std::move(*input_ids);
    double first = 0, last = 0;
    for (int step = 1; step <= 30; ++step) {
      // Each rank gets its half of the rows; the answer is the whole batch's loss.
      auto loss = model->forward_backward(batch).take();
      if (!loss) {
        std::fprintf(stderr, "%s\n", describe(loss.error()).c_str());
        return 1;
      }
      auto st = model->clip_grad_and_step().take();  // every rank steps, after averaging gradients
      if (!st) {
        std::fprintf(stderr, "%s\n", describe(st.error()).c_str());
        return 1;
      }
      (step == 1 ? first : last) = loss->at("loss");
      if (step % 5 == 0 || step == 1)
        std::printf("step %2d  loss %.4f  grad_norm %.3f\n", step, loss->at("loss"), st->at("grad_norm"));
    }
    if (last > first / 3) {
      std::fprintf(stderr, "the loss fell only from %.4f to %.4f\n", first, last);
      return 1;
    }
    return 0;
  });
}
