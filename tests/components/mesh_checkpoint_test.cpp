// A model trained or held on one mesh (FSDP, tensor or pipeline parallel)
// saved by Trainer::save_model, gathered piece by piece, as one Hugging Face
// directory that loads into any other mesh: the same weights bitwise, the
// same log-probabilities (bitwise where the same ops run, within 1e-5 in
// f32 where tensor parallelism sums in another order).
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"
#include "components/tensor/torch_bridge.hpp"

#include "support/temp_dir.hpp"
#include "support/tensors.hpp"
#include "support/near.hpp"
#include "support/thread_ranks.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace glint::components {
namespace {

using glint::testing::borrowed;
using glint::testing::fresh_dir;
using glint::testing::ids_of;
using glint::testing::near;
using glint::testing::on_ranks;

// Divides by 2 every way tensor parallelism splits it (heads, kv heads,
// MLP, vocabulary); three layers, so that pipeline stages are uneven.
ModelConfig mesh_config(bool tied) {
  auto c = ModelConfig::make(Architecture::qwen3, 32, 16, 24, 3, 4, 2);
  c.tie_word_embeddings = tied;
  return c;
}

const Tensor kIds = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}, {31, 30, 4, 4, 2, 1}, {5, 5, 6, 7, 8, 9}});

// Trained with FSDP over 2 ranks, saved in shards of at most 4 KB (so that
// the streamed writer fills several), then loaded by one process (DP 1:
// the same log-probs bitwise as the FSDP model's own gathered forward) and
// by a tensor-parallel pair (TP 2: within 1e-5 relative).
TEST(MeshCheckpoint, SavedWithFsdpLoadsWithOneRankAndWithTensorParallel) {
  const auto dir = fresh_dir("mesh-fsdp");
  at::Tensor expected;
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto lm = CausalLM::init_random(mesh_config(false), 4);
    ASSERT_TRUE(lm);
    auto tr = Trainer::create(std::move(*lm), {.optimizer = {.lr = 1e-2}, .fsdp_group = borrowed(pg)});
    ASSERT_TRUE(tr) << describe(tr.error());
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(tr->forward_backward({.tokens = {.input_ids = *kIds.slice(2 * r, 2 * r + 2)}}, {}));
      ASSERT_TRUE(tr->clip_grad_and_step());
    }
    auto saved = tr->save_model(dir, 4096);
    ASSERT_TRUE(saved) << describe(saved.error());
    ASSERT_TRUE(tr->gather_parameters());
    auto f = tr->model().forward({.input_ids = kIds});
    ASSERT_TRUE(f) << describe(f.error());
    if (r == 0) expected = to_torch(f->logprobs).clone();
  });
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path{dir} / "model.safetensors.index.json")) << "in shards";
  auto one = CausalLM::load(dir);
  ASSERT_TRUE(one) << describe(one.error());
  auto got = one->forward({.input_ids = kIds});
  ASSERT_TRUE(got);
  EXPECT_TRUE(at::equal(to_torch(got->logprobs), expected)) << "DP 1";
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto lm = CausalLM::load(dir);
    ASSERT_TRUE(lm);
    auto tr = Trainer::create(std::move(*lm), {.tp_group = borrowed(pg)});
    ASSERT_TRUE(tr) << describe(tr.error());
    auto f = tr->model().forward({.input_ids = kIds});
    ASSERT_TRUE(f) << describe(f.error());
    EXPECT_TRUE(near(to_torch(f->logprobs), expected, 1e-5)) << "TP 2, rank " << r;
  });
}

// A model held tensor-parallel, and one cut into pipeline stages (tied
// embeddings and not), saved and loaded by one process: every weight as it
// was before the cut, bitwise.
TEST(MeshCheckpoint, SavedFromTensorAndPipelineParallelIsTheWholeModel) {
  for (int kind = 0; kind < 3; ++kind) {
    const bool tp = kind == 0, tied = kind == 2;
    SCOPED_TRACE(tp ? "tp 2" : tied ? "pp 2, tied embeddings" : "pp 2");
    const auto dir = fresh_dir("mesh-save");
    auto whole = CausalLM::init_random(mesh_config(tied), 6);
    ASSERT_TRUE(whole);
    on_ranks(2, [&](int, ProcessGroup& pg) {
      auto lm = CausalLM::init_random(mesh_config(tied), 6);
      ASSERT_TRUE(lm);
      TrainConfig tc;
      (tp ? tc.tp_group : tc.pp_group) = borrowed(pg);
      auto tr = Trainer::create(std::move(*lm), tc);
      ASSERT_TRUE(tr) << describe(tr.error());
      auto saved = tr->save_model(dir, 4096);
      ASSERT_TRUE(saved) << describe(saved.error());
    });
    auto back = CausalLM::load(dir);
    ASSERT_TRUE(back) << describe(back.error());
    for (const auto& [n, p] : whole->impl().params) EXPECT_TRUE(at::equal(back->impl().params.at(n), p)) << n;
  }
}

// The parameters streamed for weight sync from each mesh (FSDP 2, TP 2,
// PP 2 with tied embeddings): on rank 0 only, every parameter once, whole,
// in Hugging Face's order, bitwise the model's, in buckets of at most 2 KB
// (a bigger parameter alone). A sink that fails on rank 0 fails the call on
// both ranks, and the group is still in step afterwards.
TEST(MeshCheckpoint, StreamedParametersAreTheWholeModelInBuckets) {
  constexpr int64_t kBucket = 2048;
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind == 0 ? "fsdp 2" : kind == 1 ? "tp 2" : "pp 2");
    const bool tied = kind == 2;
    auto whole = CausalLM::init_random(mesh_config(tied), 8);
    ASSERT_TRUE(whole);
    const auto shapes = model_detail::parameter_shapes(whole->config());
    on_ranks(2, [&](int r, ProcessGroup& pg) {
      auto lm = CausalLM::init_random(mesh_config(tied), 8);
      ASSERT_TRUE(lm);
      TrainConfig tc;
      (kind == 0 ? tc.fsdp_group : kind == 1 ? tc.tp_group : tc.pp_group) = borrowed(pg);
      auto tr = Trainer::create(std::move(*lm), tc);
      ASSERT_TRUE(tr) << describe(tr.error());
      std::vector<std::string> names;
      std::vector<NamedTensors> kept;
      auto ok = tr->stream_parameters(kBucket, [&](NamedTensors bucket) -> Result<void> {
        int64_t bytes = 0;
        for (auto& [n, t] : bucket) {
          names.push_back(n);
          bytes += t.nbytes();
        }
        EXPECT_TRUE(bytes <= kBucket || bucket.size() == 1) << bytes << " bytes in " << bucket.size() << " tensors";
        kept.push_back(std::move(bucket));
        return {};
      });
      ASSERT_TRUE(ok) << describe(ok.error());
      if (r == 0) {
        ASSERT_EQ(names.size(), shapes.size());
        for (size_t i = 0; i < shapes.size(); ++i) EXPECT_EQ(names[i], shapes[i].first);
        EXPECT_GT(kept.size(), 3u);
        // Full buckets: each was sent only when the next tensor would not fit.
        for (size_t b = 0; b + 1 < kept.size(); ++b) {
          int64_t bytes = 0;
          for (auto& [n, t] : kept[b]) bytes += t.nbytes();
          EXPECT_GT(bytes + kept[b + 1].front().second.nbytes(), kBucket) << "bucket " << b << " sent early";
        }
      } else {
        EXPECT_TRUE(kept.empty()) << "only rank 0 receives";
      }
      // The buckets kept are the weights at the call, not views of the live
      // ones: a training step after it leaves them as they were.
      ASSERT_TRUE(tr->forward_backward({.tokens = {.input_ids = kIds}}, {}));
      ASSERT_TRUE(tr->clip_grad_and_step());
      for (auto& bucket : kept)
        for (auto& [n, t] : bucket) EXPECT_TRUE(at::equal(to_torch(t), whole->impl().params.at(n))) << n;
      int calls = 0;
      auto refused = tr->stream_parameters(kBucket, [&](NamedTensors) -> Result<void> {
        if (++calls == 2) return make_error(errc::unavailable, "the sampler went away (a test's)");
        return {};
      });
      ASSERT_FALSE(refused);
      EXPECT_NE(describe(refused.error()).find(r == 0 ? "the sampler went away" : "failed on another rank"),
                std::string::npos)
          << describe(refused.error());
      EXPECT_TRUE(tr->forward_backward({.tokens = {.input_ids = kIds}}, {})) << "still in step";
    });
  }
}

// Without a group: every parameter, copies (a step after the call leaves
// the buckets as they were).
TEST(MeshCheckpoint, StreamedParametersOfOneRankAreCopies) {
  auto whole = CausalLM::init_random(mesh_config(true), 8);
  ASSERT_TRUE(whole);
  auto lm = CausalLM::init_random(mesh_config(true), 8);
  ASSERT_TRUE(lm);
  auto tr = Trainer::create(std::move(*lm), {.optimizer = {.lr = 1e-2}});
  ASSERT_TRUE(tr);
  NamedTensors all;
  ASSERT_TRUE(tr->stream_parameters(1 << 20, [&](NamedTensors bucket) -> Result<void> {
    for (auto& nt : bucket) all.push_back(std::move(nt));
    return {};
  }));
  ASSERT_EQ(all.size(), whole->impl().params.size());
  ASSERT_TRUE(tr->forward_backward({.tokens = {.input_ids = kIds}}, {}));
  ASSERT_TRUE(tr->clip_grad_and_step());
  for (auto& [n, t] : all) EXPECT_TRUE(at::equal(to_torch(t), whole->impl().params.at(n))) << n;
}

// A writer that cannot write (its directory is a file): every rank of the
// group answers an error, none waits for a collective the writer skipped.
TEST(MeshCheckpoint, AFailedWriteFailsEveryRank) {
  const auto dir = fresh_dir("mesh-fail");
  const auto blocked = dir + "/file";
  { std::ofstream{blocked} << "not a directory"; }
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto lm = CausalLM::init_random(mesh_config(false), 4);
    ASSERT_TRUE(lm);
    auto tr = Trainer::create(std::move(*lm), {.fsdp_group = borrowed(pg)});
    ASSERT_TRUE(tr);
    auto saved = tr->save_model(blocked + "/model");
    ASSERT_FALSE(saved);
    if (r == 1) EXPECT_NE(describe(saved.error()).find("failed on another rank"), std::string::npos) << describe(saved.error());
    // The group is still in step: a training call works on both.
    EXPECT_TRUE(tr->forward_backward({.tokens = {.input_ids = *kIds.slice(r, r + 1)}}, {}));
  });
}

}  // namespace
}  // namespace glint::components
