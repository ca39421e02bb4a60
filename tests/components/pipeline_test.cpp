// The pipeline executor on 2 and 3 stages (threads, Gloo over loopback)
// against gradient accumulation on one process: the same gradients, bitwise
// (each micro-batch's ops and the accumulation run in the same order), for
// 1, p - 1, p and 2p + 1 micro-batches of uneven sizes.
#include "components/parallel/pipeline.hpp"

#include "support/thread_ranks.hpp"

#include <gtest/gtest.h>

namespace glint::components {
namespace {

using glint::testing::on_ranks;

struct Toy {
  std::vector<at::Tensor> w;  // three layers: [8, 6], [8, 8], [3, 8]
  at::Tensor x, y;            // [9, 6], [9, 3]
  static Toy make() {
    at::manual_seed(11);
    Toy t;
    for (auto shape : {std::vector<int64_t>{8, 6}, {8, 8}, {3, 8}}) t.w.push_back(at::randn(shape, at::kDouble));
    t.x = at::randn({9, 6}, at::kDouble);
    t.y = at::randn({9, 3}, at::kDouble);
    return t;
  }
  std::vector<at::Tensor> params() const {
    std::vector<at::Tensor> out;
    for (const auto& p : w) out.push_back(p.clone().set_requires_grad(true));
    return out;
  }
  static at::Tensor layer(size_t l, const std::vector<at::Tensor>& p, const at::Tensor& h) {
    auto z = at::matmul(h, p[l].t());
    return l < 2 ? at::tanh(z) : z;
  }
};

// Micro-batch m's rows [begin, begin + n) of 9 split into `m` uneven runs.
std::pair<int64_t, int64_t> rows(int m, int count) {
  const int64_t begin = 9 * m / count, end = 9 * (m + 1) / count;
  return {begin, end - begin};
}

TEST(Pipeline, StagesTrainAsGradientAccumulationOnOneProcess) {
  const auto toy = Toy::make();
  for (int stages : {2, 3})
    for (int micro : {1, stages - 1, stages, 2 * stages + 1}) {
      auto whole = toy.params();
      for (int m = 0; m < micro; ++m) {
        auto [b, n] = rows(m, micro);
        auto h = toy.x.narrow(0, b, n);
        for (size_t l = 0; l < 3; ++l) h = Toy::layer(l, whole, h);
        ((h - toy.y.narrow(0, b, n)).pow(2).sum() / 9).backward();
      }
      // Stage s runs layers first[s] .. first[s + 1) - 1.
      const std::vector<size_t> first = stages == 2 ? std::vector<size_t>{0, 2, 3} : std::vector<size_t>{0, 1, 2, 3};
      on_ranks(stages, [&](int s, ProcessGroup& pp) {
        auto mine = toy.params();
        PipelineStage st;
        st.dtype = at::kDouble;
        st.activation_shape = [&](int m) { return std::vector<int64_t>{rows(m, micro).second, 8}; };
        st.forward = [&](int m, const at::Tensor& in) {
          auto [b, n] = rows(m, micro);
          auto h = s == 0 ? toy.x.narrow(0, b, n) : in;
          for (size_t l = first[static_cast<size_t>(s)]; l < first[static_cast<size_t>(s) + 1]; ++l)
            h = Toy::layer(l, mine, h);
          return s == stages - 1 ? (h - toy.y.narrow(0, b, n)).pow(2).sum() / 9 : h;
        };
        auto ok = run_pipeline(pp, micro, st);
        ASSERT_TRUE(ok) << describe(ok.error());
        for (size_t l = first[static_cast<size_t>(s)]; l < first[static_cast<size_t>(s) + 1]; ++l)
          EXPECT_TRUE(at::equal(mine[l].grad(), whole[l].grad()))
              << stages << " stages, " << micro << " micro-batches, layer " << l << " on stage " << s;
      });
    }
}

TEST(Pipeline, NoMicroBatchesIsRefused) {
  on_ranks(2, [&](int, ProcessGroup& pp) {
    auto r = run_pipeline(pp, 0, {});
    ASSERT_FALSE(r);
  });
}

}  // namespace
}  // namespace glint::components
