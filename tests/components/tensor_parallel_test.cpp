// Tensor parallelism's pieces on 2 ranks against the same computation
// unsharded, forward and gradients, in f64 with logits scaled up so that an
// error would show (each test says its bound).
#include "components/comm/process_group_impl.hpp"
#include "components/parallel/tensor_parallel.hpp"

#include "support/thread_ranks.hpp"

#include <gtest/gtest.h>

namespace glint::components {
namespace {

using glint::testing::on_ranks;

::testing::AssertionResult near(const at::Tensor& a, const at::Tensor& b, double rel) {
  if (a.sizes() != b.sizes()) return ::testing::AssertionFailure() << "shape " << a.sizes() << " vs " << b.sizes();
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  const double diff = (a - b).abs().max().item<double>();
  if (diff <= rel * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "differs by " << diff << " (" << diff / scale << " of its largest value)";
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

// A SwiGLU MLP with gate and up column-parallel and down row-parallel (the
// layout of a decoder layer's MLP): its output, the input's gradient and
// each rank's weight gradients equal the unsharded ones' slices. Within
// 1e-12 relative (the row-parallel sum adds two partial products).
TEST(TensorParallel, ColumnThenRowParallelLinearsEqualTheWholeLayer) {
  at::manual_seed(3);
  const int64_t H = 6, I = 8, N = 5;
  const auto x0 = at::randn({N, H}, at::kDouble) * 4, gate0 = at::randn({I, H}, at::kDouble),
             up0 = at::randn({I, H}, at::kDouble), down0 = at::randn({H, I}, at::kDouble),
             bias0 = at::randn({H}, at::kDouble), dy = at::randn({N, H}, at::kDouble);
  auto x = leaf(x0), gate = leaf(gate0), up = leaf(up0), down = leaf(down0), bias = leaf(bias0);
  auto y = at::linear(at::silu(at::linear(x, gate)) * at::linear(x, up), down, bias);
  y.backward(dy);
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto range = tp::shard_range(I, pg, "the intermediate size");
    ASSERT_TRUE(range);
    auto cols = [&](const at::Tensor& w) { return leaf(w.narrow(0, range->begin, range->size)); };
    auto xs = leaf(x0), g = cols(gate0), u = cols(up0), d = leaf(down0.narrow(1, range->begin, range->size)),
         b = leaf(bias0);
    auto h = at::silu(tp::column_linear(xs, g, {}, pg)) * tp::column_linear(xs, u, {}, pg);
    auto ys = tp::row_linear(h, d, b, pg);
    EXPECT_TRUE(near(ys, y.detach(), 1e-12));
    ys.backward(dy);
    EXPECT_TRUE(near(xs.grad(), x.grad(), 1e-12)) << "the input's gradient is summed over the ranks";
    EXPECT_TRUE(near(g.grad(), gate.grad().narrow(0, range->begin, range->size), 1e-12));
    EXPECT_TRUE(near(u.grad(), up.grad().narrow(0, range->begin, range->size), 1e-12));
    EXPECT_TRUE(near(d.grad(), down.grad().narrow(1, range->begin, range->size), 1e-12));
    EXPECT_TRUE(near(b.grad(), bias.grad(), 1e-12));
  });
}

// The log-probability of each target over a vocabulary split in two, its
// logits scaled up (some targets far in the tail, some in each half), never
// forming the [N, V] logits: equal to log_softmax's within 1e-12 relative,
// and so are the gradients of the hidden states and of each rank's rows.
// The embedding split the same way equals the whole table's lookup.
TEST(TensorParallel, TheVocabularySplitsForTheLogProbAndTheEmbedding) {
  at::manual_seed(5);
  const int64_t V = 10, H = 4, N = 7;
  const auto h0 = at::randn({N, H}, at::kDouble) * 30, w0 = at::randn({V, H}, at::kDouble),
             dy = at::randn({N}, at::kDouble);
  const auto targets = at::tensor({0, 4, 5, 9, 2, 7, 5}, at::kLong);
  auto h = leaf(h0), w = leaf(w0);
  auto lp = at::log_softmax(at::matmul(h, w.t()), 1).gather(1, targets.unsqueeze(1)).squeeze(1);
  lp.backward(dy);
  ASSERT_LT(lp.min().item<double>(), -50) << "some targets deep in the tail";
  const auto emb = at::embedding(w0, targets);
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto range = tp::shard_range(V, pg, "the vocabulary");
    ASSERT_TRUE(range);
    auto hs = leaf(h0), ws = leaf(w0.narrow(0, range->begin, range->size));
    auto lps = tp::vocab_logprob(hs, ws, range->begin, targets, pg);
    EXPECT_TRUE(near(lps, lp.detach(), 1e-12)) << lps << "\nagainst\n" << lp;
    lps.backward(dy);
    EXPECT_TRUE(near(hs.grad(), h.grad(), 1e-12));
    EXPECT_TRUE(near(ws.grad(), w.grad().narrow(0, range->begin, range->size), 1e-12)) << "rank " << r;
    EXPECT_TRUE(near(tp::vocab_embedding(targets, ws.detach(), range->begin, pg), emb, 0));
    EXPECT_THROW(tp::vocab_logprob(hs, ws, range->begin, at::tensor({10}, at::kLong), pg), CarriedError);
    EXPECT_FALSE(tp::shard_range(7, pg, "the number of kv heads"));
  });
}

}  // namespace
}  // namespace glint::components
