// Tensor parallelism's pieces on 2 ranks against the same computation
// unsharded, forward and gradients, in f64 with logits scaled up so that an
// error would show (each test says its bound).
#include "components/comm/process_group_impl.hpp"
#include "components/tensor/torch_bridge.hpp"
#include "components/model/trainer.hpp"
#include "components/parallel/tensor_parallel.hpp"
#include "runtime/stop.hpp"

#include "support/tensors.hpp"
#include "support/near.hpp"
#include "support/thread_ranks.hpp"

#include <gtest/gtest.h>

#include <array>

namespace glint::components {
namespace {

using glint::testing::borrowed;
using glint::testing::ids_of;
using glint::testing::near;
using glint::testing::on_ranks;

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
  for (const int64_t V : {10, 11}) {  // 11: the rows split 6 and 5
  SCOPED_TRACE(V);
  const int64_t H = 4, N = 7;
  const auto h0 = at::randn({N, H}, at::kDouble) * 30, w0 = at::randn({V, H}, at::kDouble),
             dy = at::randn({N}, at::kDouble);
  const auto targets = at::tensor({0, 4, 5, 9, 2, 7, 5}, at::kLong);
  auto h = leaf(h0), w = leaf(w0);
  auto lp = at::log_softmax(at::matmul(h, w.t()), 1).gather(1, targets.unsqueeze(1)).squeeze(1);
  lp.backward(dy);
  ASSERT_LT(lp.min().item<double>(), -50) << "some targets deep in the tail";
  const auto emb = at::embedding(w0, targets);
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto range = tp::vocab_range(V, pg);
    ASSERT_TRUE(range);
    EXPECT_EQ(range->size, V == 10 ? 5 : (r == 0 ? 6 : 5));
    // The whole table back from the shards (as a save gathers it).
    auto whole = tp::gather_whole("model.embed_tokens.weight", w0.narrow(0, range->begin, range->size), pg);
    ASSERT_TRUE(whole);
    EXPECT_TRUE(near(*whole, w0, 0));
    auto hs = leaf(h0), ws = leaf(w0.narrow(0, range->begin, range->size));
    auto lps = tp::vocab_logprob(hs, ws, range->begin, V, targets, pg);
    EXPECT_TRUE(near(lps, lp.detach(), 1e-12)) << lps << "\nagainst\n" << lp;
    lps.backward(dy);
    EXPECT_TRUE(near(hs.grad(), h.grad(), 1e-12));
    EXPECT_TRUE(near(ws.grad(), w.grad().narrow(0, range->begin, range->size), 1e-12)) << "rank " << r;
    EXPECT_TRUE(near(tp::vocab_embedding(targets, ws.detach(), range->begin, pg), emb, 0));
    EXPECT_THROW(tp::vocab_logprob(hs, ws, range->begin, V, at::tensor({V}, at::kLong), pg), CarriedError);
    EXPECT_FALSE(tp::shard_range(7, pg, "the number of kv heads"));
  });
  }
}

// Qwen3 (q/k norms, GQA 4 heads over 2 key/value heads), in f64.
Result<CausalLM> tp_model() {
  auto lm = CausalLM::init_random(ModelConfig::make(Architecture::qwen3, 32, 16, 24, 2, 4, 2), 9);
  if (lm)
    for (auto& [n, t] : lm->impl().params) t = (n.find("norm") == std::string::npos ? t * 8.0 : t).to(at::kDouble);
  return lm;
}

// Three AdamW steps with clipping of a tensor-parallel model on 2 ranks
// (both take the whole batch) against one process: the same losses and
// global gradient norms, and afterwards the same log-probabilities (every
// weight takes part) and norm weights (q_norm and k_norm, whose gradients
// are summed over the ranks' heads). Within 1e-12 relative in f64 (weights
// scaled up so that the attention is sharp).
TEST(TensorParallel, ATensorParallelModelTrainsAsOneProcess) {
  const auto ids = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 0, 0}, {31, 30, 4, 4, 2, 1}});
  const auto mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});
  const TrainBatch batch{.tokens = {.input_ids = ids, .attention_mask = mask}};
  const TrainConfig tc{.optimizer = {.lr = 2e-2, .weight_decay = 0.1, .max_grad_norm = 0.5}};
  auto single = Trainer::create(*tp_model(), tc);
  ASSERT_TRUE(single);
  std::vector<double> losses, norms;
  for (int s = 0; s < 3; ++s) {
    auto m = single->forward_backward(batch, {});
    ASSERT_TRUE(m);
    auto st = single->clip_grad_and_step();
    ASSERT_TRUE(st);
    losses.push_back(m->at("loss"));
    norms.push_back(st->at("grad_norm"));
    EXPECT_GT(norms.back(), 0.5);
  }
  auto expected = single->model().forward(batch.tokens);
  ASSERT_TRUE(expected);
  std::array<NamedTensors, 2> states;
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto mine = tc;
    mine.tp_group = borrowed(pg);
    auto tr = Trainer::create(*tp_model(), mine);
    ASSERT_TRUE(tr) << describe(tr.error());
    EXPECT_EQ(tr->model().impl().params.at("model.layers.0.self_attn.k_proj.weight").size(0), 4) << "one kv head each";
    for (int s = 0; s < 3; ++s) {
      auto m = tr->forward_backward(batch, {});
      ASSERT_TRUE(m) << describe(m.error());
      auto st = tr->clip_grad_and_step();
      ASSERT_TRUE(st) << describe(st.error());
      EXPECT_NEAR(m->at("loss"), losses[s], 1e-12 * losses[s]) << "step " << s;
      EXPECT_NEAR(st->at("grad_norm"), norms[s], 1e-12 * norms[s]) << "step " << s;
    }
    auto got = tr->model().forward(batch.tokens);
    ASSERT_TRUE(got) << describe(got.error());
    EXPECT_TRUE(near(to_torch(got->logprobs), to_torch(expected->logprobs), 1e-12)) << "rank " << r;
    for (auto* n : {"model.layers.1.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
                    "model.layers.1.input_layernorm.weight", "model.norm.weight"})
      EXPECT_TRUE(near(tr->model().impl().params.at(n), single->model().impl().params.at(n), 1e-12)) << n;
    auto saved = tr->model().save("/nonexistent");
    ASSERT_FALSE(saved);
    EXPECT_NE(describe(saved.error()).find("tensor-parallel shards"), std::string::npos) << describe(saved.error());
    EXPECT_FALSE(tr->model().forward(batch.tokens, {.entropies = true})) << "not built: refused, not wrong";
    // A rank given other targets for the same ids (each rank's target logit
    // would count): both refuse the call, naming it.
    auto other = batch;
    if (r == 1) other.tokens.target_ids = ids_of({{2, 3, 4, 5, 6, 0}, {8, 9, 10, 0, 0, 0}, {30, 4, 4, 2, 1, 0}});
    auto m = tr->forward_backward(other, {});
    ASSERT_FALSE(m);
    EXPECT_NE(describe(m.error()).find("different batches"), std::string::npos) << describe(m.error());
    // One rank's optimizer state (same shapes) is refused by the other.
    states[static_cast<size_t>(r)] = tr->optimizer_state();
    ASSERT_TRUE(pg.barrier());
    const auto& theirs = states[static_cast<size_t>(1 - r)];
    EXPECT_FALSE(tr->load_optimizer_state(std::map<std::string, Tensor>(theirs.begin(), theirs.end())));
    EXPECT_TRUE(tr->load_optimizer_state(
        std::map<std::string, Tensor>(states[static_cast<size_t>(r)].begin(), states[static_cast<size_t>(r)].end())));
  });
}

// A stop request under tensor parallelism stops the call on every rank
// before any slice (the ranks agree on it with the rows per pass), never
// between slices, where a rank that stopped would leave the other waiting.
// The ranks are threads, so both see the flag; the call fails on both,
// aborted, with nothing accumulated, and the next call runs.
TEST(TensorParallel, AStopRequestStopsTheCallOnEveryRankBeforeAnySlice) {
  const auto ids = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 0, 0}, {31, 30, 4, 4, 2, 1}});
  struct Withdraw {
    ~Withdraw() { request_stop(false); }
  } withdraw;
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto tr = Trainer::create(*tp_model(), {.tp_group = borrowed(pg), .micro_batch_rows = 1});
    ASSERT_TRUE(tr) << describe(tr.error());
    ASSERT_TRUE(pg.barrier());
    if (r == 0) request_stop(true);
    ASSERT_TRUE(pg.barrier());
    auto m = tr->forward_backward({.tokens = {.input_ids = ids}}, {});
    ASSERT_FALSE(m);
    EXPECT_EQ(code_of(m.error()), errc::aborted) << describe(m.error());
    for (const auto& [n, p] : tr->model().impl().params) EXPECT_FALSE(p.grad().defined()) << n;
    ASSERT_TRUE(pg.barrier());
    if (r == 0) request_stop(false);
    ASSERT_TRUE(pg.barrier());
    EXPECT_TRUE(tr->forward_backward({.tokens = {.input_ids = ids}}, {}));
  });
}

TEST(TensorParallel, AModelThatDoesNotSplitIsRefused) {
  on_ranks(2, [&](int, ProcessGroup& pg) {
    // One key/value head cannot go to two ranks (GQA).
    auto lm = CausalLM::init_random(ModelConfig::make(Architecture::qwen3, 32, 16, 24, 1, 4, 1), 1);
    ASSERT_TRUE(lm);
    auto tr = Trainer::create(std::move(*lm), {.tp_group = borrowed(pg)});
    ASSERT_FALSE(tr);
    EXPECT_NE(describe(tr.error()).find("the number of key/value heads (GQA) (1) does not divide by the "
                                        "tensor-parallel size 2"),
              std::string::npos)
        << describe(tr.error());
    // A vocabulary splits unevenly (31 rows: 16 and 15), but not below a row a rank.
    auto odd = CausalLM::init_random(ModelConfig::make(Architecture::qwen3, 31, 16, 24, 1, 4, 2), 1);
    auto split = Trainer::create(std::move(*odd), {.tp_group = borrowed(pg)});
    ASSERT_TRUE(split) << describe(split.error());
    EXPECT_EQ(split->model().impl().params.at("model.embed_tokens.weight").size(0), pg.rank() == 0 ? 16 : 15);
    auto one = CausalLM::init_random(ModelConfig::make(Architecture::qwen3, 1, 16, 24, 1, 4, 2), 1);
    ASSERT_TRUE(one);
    auto refused = Trainer::create(std::move(*one), {.tp_group = borrowed(pg)});
    ASSERT_FALSE(refused);
    EXPECT_NE(describe(refused.error()).find("vocab_size (1) is smaller"), std::string::npos) << describe(refused.error());
  });
}

}  // namespace
}  // namespace glint::components
