// The dataloader actor in local and cluster mode: batches of encoded
// prompts with their solutions, the state after delivered batches only,
// exact resume, slicing for dp ranks, and clear errors.
#include "actors/dataloader.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/synthetic.hpp"
#include "support/cluster.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace glint::actors {
namespace {

using placement::DeviceGroup;

// A dataset of 40 arithmetic rows and a tokenizer trained on it.
struct Files {
  std::string data, tokenizer;
};
const Files& files() {
  static const Files f = [] {
    auto dir = glint::testing::fresh_dir("loader");
    auto rows = components::arithmetic_rows(40, {.seed = 4});
    components::Dataset ds = components::Dataset::from_rows(rows);
    EXPECT_TRUE(components::save_jsonl(rows, dir + "/arith.jsonl"));
    auto json = components::train_bpe(components::texts_of(ds), {.vocab_size = 300});
    EXPECT_TRUE(components::save_chatml_tokenizer(dir, *json));
    return Files{dir + "/arith.jsonl", dir};
  }();
  return f;
}

DataLoaderSpec spec() {
  return {.dataset = files().data, .preprocess = "gsm8k", .tokenizer = files().tokenizer,
          .add_generation_prompt = true, .batch_size = 6, .seed = 2, .epochs = 2, .prefetch = 3};
}

class DataloaderTest : public glint::testing::ModeJobTest {
protected:
  Group<dataloader_actor> spawn(DataLoaderSpec s) {
    auto g = spawn_dataloader(*job_.rt, DeviceGroup::of("data" + std::to_string(groups_++), 1), std::move(s));
    EXPECT_TRUE(g) << describe(g.error());
    return std::move(*g);
  }
  int groups_ = 0;
  DataBatch next(Group<dataloader_actor>& g) {
    auto b = g.call<Collect::first>(Dispatch::first, next_batch_atom_v).get();
    EXPECT_TRUE(b) << describe(b.error());
    return b ? *b : DataBatch{};
  }
};

TEST_P(DataloaderTest, BatchesArePromptsWithSolutionsAndEndAfterTheEpochs) {
  auto g = spawn(spec());
  auto info = g.call<Collect::first>(Dispatch::first, loader_info_atom_v).get();
  ASSERT_TRUE(info) << describe(info.error());
  EXPECT_EQ(info->rows, 40);
  EXPECT_EQ(info->batches_per_epoch, 6);
  EXPECT_EQ(info->skipped, "no rows skipped");
  int batches = 0;
  for (;;) {
    auto b = next(g);
    if (b.end) break;
    ASSERT_EQ(b.rows.size(), 6u);
    for (const auto& r : b.rows) {
      EXPECT_FALSE(r.fields.at("solution").empty());
      EXPECT_FALSE(r.input_ids.empty());
      EXPECT_EQ(r.loss_mask.size(), r.input_ids.size());
    }
    ++batches;
    ASSERT_LT(batches, 100);
  }
  EXPECT_EQ(batches, 12);
  EXPECT_TRUE(next(g).end) << "stays at the end";
}

TEST_P(DataloaderTest, StateCountsDeliveredBatchesAndResumesExactly) {
  auto g = spawn(spec());
  std::vector<DataBatch> seen;
  for (int i = 0; i < 8; ++i) seen.push_back(next(g));  // crosses into epoch 1
  // Prefetching made batches ahead; the state is after the 8th delivered one.
  auto st = g.call<Collect::first>(Dispatch::first, loader_state_atom_v).get();
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, seen.back().state);
  EXPECT_EQ(st->epoch, 1);
  EXPECT_EQ(st->position, 12);
  std::vector<DataBatch> rest;
  for (auto b = next(g); !b.end; b = next(g)) rest.push_back(b);
  // A fresh loader restored to the 4th batch's state replays batches 5..12.
  auto h = spawn(spec());
  auto ok = h.call<Collect::first>(Dispatch::first, set_loader_state_atom_v, seen[3].state).get();
  ASSERT_TRUE(ok) << describe(ok.error());
  for (size_t i = 4; i < 8; ++i) EXPECT_EQ(next(h), seen[i]) << i;
  for (const auto& b : rest) EXPECT_EQ(next(h), b);
  EXPECT_TRUE(next(h).end);
  auto foreign = h.call<Collect::first>(Dispatch::first, set_loader_state_atom_v, LoaderState{.seed = 99}).get();
  ASSERT_FALSE(foreign);
  EXPECT_NE(describe(foreign.error()).find("seed 99"), std::string::npos);
}

TEST_P(DataloaderTest, SlicesForDpRanksPartitionTheBatch) {
  auto g = spawn(spec());
  auto b = next(g);
  std::vector<DataRow> joined;
  for (int r = 0; r < 4; ++r) {
    auto part = slice_for_rank(b, r, 4);
    ASSERT_TRUE(part);
    EXPECT_EQ(part->rows.size(), r < 2 ? 2u : 1u);
    joined.insert(joined.end(), part->rows.begin(), part->rows.end());
  }
  EXPECT_EQ(joined, b.rows);
  EXPECT_FALSE(slice_for_rank(b, 0, 7)) << "6 rows cannot feed 7 ranks";
  auto batch = train_batch_of(b.rows, 0);
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->tensors.at("input_ids").shape()[0], 6);
}

TEST(PackedBatch, RowsArePackedWholeIntoRowsToldApartBySegmentIds) {
  std::vector<DataRow> rows;
  for (int64_t n : {5, 3, 4, 2, 6}) {
    DataRow r;
    for (int64_t i = 0; i < n; ++i) r.input_ids.push_back(10 * n + i);
    r.loss_mask.assign(static_cast<size_t>(n), 1.f);
    r.loss_mask.front() = 0.f;
    rows.push_back(r);
  }
  auto b = packed_batch_of(rows, 0, 10, 1);
  ASSERT_TRUE(b);
  const auto& ids = b->tensors.at("input_ids");
  const auto R = static_cast<size_t>(ids.shape()[0]), T = static_cast<size_t>(ids.shape()[1]);
  EXPECT_LE(T, 10u) << "rows of at most 10 tokens";
  EXPECT_LT(R, rows.size()) << "some rows share a row";
  auto id = *ids.values<int64_t>();
  auto seg = *b->tensors.at("segment_ids").values<int64_t>();
  auto mask = *b->tensors.at("loss_mask").values<float>();
  auto attn = *b->tensors.at("attention_mask").values<int64_t>();
  // Every row appears once, whole and in order, its tokens sharing one segment id.
  std::map<int64_t, std::vector<int64_t>> found;  // first id -> the ids of its segment
  float kept = 0;
  for (size_t r = 0; r < R; ++r)
    for (size_t t = 0; t < T; ++t) {
      const size_t i = r * T + t;
      if (!attn[i]) continue;
      kept += mask[i];
      auto& run = found[static_cast<int64_t>(r) * 100 + seg[i]];
      run.push_back(id[i]);
    }
  ASSERT_EQ(found.size(), rows.size());
  std::set<std::vector<int64_t>> want, got;
  for (const auto& r : rows) want.insert(r.input_ids);
  for (const auto& [_, v] : found) got.insert(v);
  EXPECT_EQ(got, want);
  EXPECT_EQ(kept, 20.f - 5.f) << "the loss mask travels with its tokens";
  auto spread = packed_batch_of(rows, 0, 100, 3);
  ASSERT_TRUE(spread);
  EXPECT_EQ(spread->tensors.at("input_ids").shape()[0], 3) << "at least min_rows rows, for data-parallel ranks";
  EXPECT_FALSE(packed_batch_of({}, 0, 10));
}

TEST_P(DataloaderTest, BadSpecsFailEveryCallWithTheReason) {
  auto s = spec();
  s.dataset = "/nonexistent/data.jsonl";
  auto g = spawn(s);
  auto b = g.call<Collect::first>(Dispatch::first, next_batch_atom_v).get();
  ASSERT_FALSE(b);
  EXPECT_NE(describe(b.error()).find("cannot read dataset /nonexistent/data.jsonl"), std::string::npos) << describe(b.error());
  auto s2 = spec();
  s2.preprocess = "squad";
  auto h = spawn(s2);
  auto info = h.call<Collect::first>(Dispatch::first, loader_info_atom_v).get();
  ASSERT_FALSE(info);
  EXPECT_NE(describe(info.error()).find("unknown preprocessor 'squad'"), std::string::npos);
  auto s3 = spec();
  s3.batch_size = 100;
  auto k = spawn(s3);
  auto none = k.call<Collect::first>(Dispatch::first, next_batch_atom_v).get();
  ASSERT_FALSE(none);
  EXPECT_NE(describe(none.error()).find("make no batch"), std::string::npos) << describe(none.error());
  EXPECT_FALSE(spawn_dataloader(*job_.rt, DeviceGroup::of("pair", 2), spec()));
}

INSTANTIATE_TEST_SUITE_P(Modes, DataloaderTest, ::testing::Values(Mode::local, Mode::cluster),
                         [](const auto& info) { return info.param == Mode::local ? "local" : "cluster"; });

}  // namespace
}  // namespace glint::actors
