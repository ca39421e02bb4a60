// The checkpoint engine in local and cluster mode: full weights in several
// buckets make a sampler generate as one loaded with the model's weights;
// a LoRA adapter synced as adapter equals the same adapter merged and
// synced as base weights; refusals change nothing.
#include "actors/checkpoint_engine.hpp"
#include "actors/model_group.hpp"
#include "actors/sampler_group.hpp"
#include "components/model/config.hpp"
#include "support/cluster.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace glint::actors {
namespace {

using placement::DeviceGroup;
using placement::DeviceMesh;

components::ModelConfig tiny(int64_t hidden = 32) {
  auto c = components::ModelConfig::make(components::Architecture::qwen3, 64, hidden, 48, 2, 4, 2);
  c.max_position_embeddings = 256;
  return c;
}

const SamplingParams greedy{.max_tokens = 8, .temperature = 0, .ignore_eos = true, .logprobs = 1};
const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3, 4}, {9, 8, 7}, {5, 50, 60, 10, 11}};

class CheckpointEngineTest : public glint::testing::ModeJobTest {
protected:
  int groups_ = 0;
  ModelGroup model(uint64_t seed) {
    auto g = open_model_group(*job_.rt, DeviceGroup::of("model" + std::to_string(groups_++), 1),
                               *DeviceMesh::from_sizes({.dp = 1}), {.config_json = tiny().to_json(), .seed = seed});
    EXPECT_TRUE(g) << describe(g.error());
    return std::move(*g);
  }
  SamplerGroup sampler(uint64_t seed, int ranks = 2, int64_t hidden = 32) {
    auto g = open_sampler_group(*job_.rt, DeviceGroup::of("sampler" + std::to_string(groups_++), ranks),
                                 *DeviceMesh::from_sizes({.dp = ranks}),
                                 {.config_json = tiny(hidden).to_json(), .seed = seed, .cache_bytes = 1 << 20});
    EXPECT_TRUE(g) << describe(g.error());
    return std::move(*g);
  }
  static std::vector<SampledSequence> sample(const SamplerGroup& g, const std::string& adapter = "") {
    auto s = g.with_adapter(adapter).sample(prompts, greedy).take();
    EXPECT_TRUE(s) << describe(s.error());
    return s ? *s : std::vector<SampledSequence>{};
  }
  static void expect_same(const std::vector<SampledSequence>& a, const std::vector<SampledSequence>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].tokens, b[i].tokens) << "sequence " << i;
      ASSERT_EQ(a[i].logprobs.chosen.size(), b[i].logprobs.chosen.size());
      for (size_t k = 0; k < a[i].logprobs.chosen.size(); ++k)
        EXPECT_NEAR(a[i].logprobs.chosen[k], b[i].logprobs.chosen[k], 1e-4);
    }
  }
};

TEST_P(CheckpointEngineTest, FullWeightsInBucketsMakeTheSamplerGenerateAsTheModel) {
  auto m = model(3);
  auto s = sampler(9);
  auto reference = sample(sampler(3, 1));  // loaded with the model's own weights
  auto before = sample(s);
  CheckpointEngine ckpt{m, s};
  auto r = ckpt.sync_weights({.bucket_bytes = 16 << 10, .transport = SyncTransport::messages});
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(r->version, 1);
  EXPECT_GT(r->buckets, 3) << "16 KiB buckets split the weights";
  EXPECT_EQ(r->bytes, tiny().num_parameters() * 4);
  auto after = sample(s);
  expect_same(after, reference);
  for (const auto& q : after) EXPECT_EQ(q.weight_version, 1);
  bool changed = false;
  for (size_t i = 0; i < after.size(); ++i) changed |= after[i].tokens != before[i].tokens;
  EXPECT_TRUE(changed) << "the sampler's own random weights generate something else";
  auto again = ckpt.sync_weights({.transport = SyncTransport::messages});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->version, 2);
  EXPECT_EQ(again->buckets, 1);
  // automatic: the live weights within a process, the stream across processes (on CPU).
  auto chosen = ckpt.sync_weights();
  ASSERT_TRUE(chosen) << describe(chosen.error());
  EXPECT_EQ(chosen->transport, GetParam() == Mode::local ? SyncTransport::messages : SyncTransport::stream);
  expect_same(sample(s), reference);
  // The c10d broadcast (Gloo) moves the same weights, in buckets, twice over one group.
  auto fresh = sampler(9);
  CheckpointEngine c10d{m, fresh};
  for (int64_t version = 1; version <= 2; ++version) {
    auto c = c10d.sync_weights({.bucket_bytes = 16 << 10, .transport = SyncTransport::collective});
    ASSERT_TRUE(c) << describe(c.error());
    EXPECT_EQ(c->transport, SyncTransport::collective);
    EXPECT_GT(c->buckets, 3);
    EXPECT_EQ(c->bytes, r->bytes);
    auto out = sample(fresh);
    expect_same(out, reference);
    for (const auto& q : out) EXPECT_EQ(q.weight_version, version);
  }
  // The stream transport: raw bytes from model rank 0 down a socket to each
  // of the two sampler ranks (in cluster mode, on another node).
  auto streamed = sampler(9);
  CheckpointEngine stream{m, streamed};
  for (int64_t version = 1; version <= 2; ++version) {
    auto c = stream.sync_weights({.transport = SyncTransport::stream});
    ASSERT_TRUE(c) << describe(c.error());
    EXPECT_EQ(c->transport, SyncTransport::stream);
    EXPECT_EQ(c->bytes, r->bytes);
    auto out = sample(streamed);
    expect_same(out, reference);
    for (const auto& q : out) EXPECT_EQ(q.weight_version, version);
  }
  EXPECT_EQ(*parse_sync_transport("stream"), SyncTransport::stream);
  EXPECT_FALSE(parse_sync_transport("pigeon"));
}

TEST_P(CheckpointEngineTest, AnAdapterSyncedEqualsTheSameAdapterMergedIntoTheBase) {
  auto m = model(3);
  ASSERT_TRUE(m.add_adapter("a", {.r = 4}, /*seed=*/1).get());
  auto a = m.with_adapter("a");
  ASSERT_TRUE(a.set_optimizer({.lr = 0.05}).get());
  Batch b;
  b.tensors["input_ids"] = *Tensor::from_values(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  for (int step = 0; step < 3; ++step) {  // B moves off zero
    ASSERT_TRUE(a.forward_backward(b).get());
    ASSERT_TRUE(a.clip_grad_and_step().get());
  }
  auto with_lora = sampler(3);
  ASSERT_TRUE(with_lora.add_adapter("a", {.r = 4}).get());
  auto base_before = sample(with_lora);
  auto untrained = sample(with_lora, "a");
  expect_same(untrained, base_before);  // B zero: the base's output
  CheckpointEngine lora_sync{a, with_lora};
  auto r = lora_sync.sync_weights();
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(r->tensors, 2 * 4 * 2) << "A and B of q, k, v, o in 2 layers";
  auto plain = sampler(3);
  CheckpointEngine merged_sync{a, plain};
  auto merged = merged_sync.sync_weights({.merge_and_sync = true, .bucket_bytes = 8 << 10});
  ASSERT_TRUE(merged) << describe(merged.error());
  auto tuned = sample(with_lora, "a");
  expect_same(sample(plain), tuned);
  bool changed = false;
  for (size_t i = 0; i < tuned.size(); ++i) changed |= tuned[i].tokens != base_before[i].tokens;
  EXPECT_TRUE(changed) << "training moved the adapter";
  expect_same(sample(with_lora), base_before);  // the sampler's base is untouched by an adapter sync
}

// A model cut over its ranks (FSDP, TP, PP on two ranks, on two nodes in
// cluster mode; TP replicated over dp on four) syncs its whole weights: every rank takes part in the
// gathering, a piece at a time, and rank 0 sends the buckets as they fill.
// The sampler then generates as one loaded with the model's weights. The
// transports that send from rank 0 alone refuse, naming the one that works.
TEST_P(CheckpointEngineTest, AModelCutOverItsRanksSyncsItsWholeWeightsBucketByBucket) {
  auto reference = sample(sampler(3, 1));
  const std::pair<const char*, placement::MeshSizes> meshes[] = {
      {"fsdp", {.fsdp = 2}}, {"tp", {.tp = 2}}, {"pp", {.pp = 2}}, {"dp-tp", {.dp = 2, .tp = 2}}};
  for (const auto& [name, sizes] : meshes) {
    SCOPED_TRACE(name);
    auto mesh = DeviceMesh::from_sizes(sizes);
    ASSERT_TRUE(mesh);
    auto g = open_model_group(*job_.rt, DeviceGroup::of(name, mesh->world_size()), *mesh,
                              {.config_json = tiny().to_json(), .seed = 3});
    ASSERT_TRUE(g) << describe(g.error());
    auto m = *g;
    // A step at learning rate 0 cuts the model and leaves its weights.
    ASSERT_TRUE(m.set_optimizer({.kind = OptimizerConfig::Kind::sgd, .lr = 0}).take());
    Batch b;
    b.tensors["input_ids"] = *Tensor::from_values(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
    ASSERT_TRUE(m.forward_backward(b).take());
    ASSERT_TRUE(m.clip_grad_and_step().take());
    auto s = sampler(9);
    CheckpointEngine ckpt{m, s};
    auto refused = ckpt.sync_weights({.transport = SyncTransport::stream});
    ASSERT_FALSE(refused);
    EXPECT_NE(describe(refused.error()).find("use the messages transport"), std::string::npos)
        << describe(refused.error());
    auto r = ckpt.sync_weights({.bucket_bytes = 16 << 10});
    ASSERT_TRUE(r) << describe(r.error());
    EXPECT_EQ(r->transport, SyncTransport::messages);
    EXPECT_GT(r->buckets, 3) << "16 KiB buckets split the weights";
    EXPECT_EQ(r->bytes, tiny().num_parameters() * 4);
    auto out = sample(s);
    expect_same(out, reference);
    for (const auto& q : out) EXPECT_EQ(q.weight_version, r->version);
  }
}

// An MoE model with its experts split over ep = 2 ranks syncs every expert
// (each sent to rank 0 by its owner as the buckets fill): the sampler, a
// whole replica on each of its ranks, then generates as one loaded with the
// model's weights.
TEST_P(CheckpointEngineTest, AnExpertParallelModelSyncsEveryExpertToTheSampler) {
  auto moe = tiny();
  moe.architecture = components::Architecture::qwen3_moe;
  moe.moe = {.num_experts = 4, .num_experts_per_tok = 2, .moe_intermediate_size = 16, .norm_topk_prob = true};
  auto sampler_of = [&](const std::string& name, int ranks, uint64_t seed) {
    auto g = open_sampler_group(*job_.rt, DeviceGroup::of(name, ranks), *DeviceMesh::from_sizes({.dp = ranks}),
                                {.config_json = moe.to_json(), .seed = seed, .cache_bytes = 1 << 20});
    EXPECT_TRUE(g) << describe(g.error());
    return std::move(*g);
  };
  auto reference = sample(sampler_of("moe-reference", 1, 3));
  auto mesh = DeviceMesh::from_sizes({.ep = 2});
  auto g = open_model_group(*job_.rt, DeviceGroup::of("moe-ep", 2), *mesh, {.config_json = moe.to_json(), .seed = 3});
  ASSERT_TRUE(g) << describe(g.error());
  auto m = *g;
  ASSERT_TRUE(m.set_optimizer({.kind = OptimizerConfig::Kind::sgd, .lr = 0}).take());
  Batch b;
  b.tensors["input_ids"] = *Tensor::from_values(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  ASSERT_TRUE(m.forward_backward(b).take());  // cuts the model: each rank keeps 2 experts
  ASSERT_TRUE(m.clip_grad_and_step().take());
  auto s = sampler_of("moe-sampler", 2, 9);
  ASSERT_NE(sample(s)[0].tokens, reference[0].tokens) << "the sampler starts from other weights";
  CheckpointEngine ckpt{m, s};
  auto r = ckpt.sync_weights({.bucket_bytes = 16 << 10});
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(r->bytes, moe.num_parameters() * 4);
  expect_same(sample(s), reference);
}

TEST_P(CheckpointEngineTest, RefusalsChangeNothing) {
  auto m = model(3);
  auto s = sampler(9);
  auto before = sample(s);
  CheckpointEngine ckpt{m, s};
  EXPECT_FALSE(ckpt.sync_weights({.bucket_bytes = 0}));
  // A bucket is one message: larger than the message limit is refused up front.
  auto huge = ckpt.sync_weights({.bucket_bytes = int64_t{8} << 30, .transport = SyncTransport::messages});
  ASSERT_FALSE(huge);
  EXPECT_NE(describe(huge.error()).find("max_message_bytes"), std::string::npos) << describe(huge.error());
  EXPECT_NE(describe(ckpt.sync_weights({.merge_and_sync = true}).error()).find("needs the adapter"), std::string::npos);
  CheckpointEngine nobody{m.with_adapter("nobody"), s};
  auto unknown = nobody.sync_weights();
  ASSERT_FALSE(unknown);
  EXPECT_NE(describe(unknown.error()).find("no adapter 'nobody'"), std::string::npos) << describe(unknown.error());
  // A sampler of another shape refuses, naming a tensor; in buckets, nothing of it applies.
  auto other = sampler(9, 1, 16);
  auto other_before = sample(other);
  CheckpointEngine mismatch{m, other};
  auto bad_stream = mismatch.sync_weights({.transport = SyncTransport::stream});
  ASSERT_FALSE(bad_stream) << "a sampler of another shape refuses the streamed weights";
  auto bad = mismatch.sync_weights({.bucket_bytes = 8 << 10});
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("embed_tokens"), std::string::npos) << describe(bad.error());
  EXPECT_EQ(mismatch.version(), 0);
  expect_same(sample(other), other_before);
  for (const auto& q : sample(other)) EXPECT_EQ(q.weight_version, 0);
  // The failed version is skipped; the next good sync to `s` works.
  expect_same(sample(s), before);
  ASSERT_TRUE(ckpt.sync_weights());
}

INSTANTIATE_TEST_SUITE_P(Modes, CheckpointEngineTest, ::testing::Values(Mode::local, Mode::cluster),
                         [](const auto& info) { return info.param == Mode::local ? "local" : "cluster"; });

}  // namespace
}  // namespace glint::actors
