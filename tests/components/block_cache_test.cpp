// The block cache in front of LibTorch's CPU allocator: large blocks come
// back for requests of about their size, small ones never enter it, it keeps
// at most kKeptBlocksMaxBytes, and GLINT_MALLOC_TUNING=0 leaves it out.
#include "components/tensor/block_cache.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>
#include <vector>

namespace glint::components {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// An f32 tensor of `mib` MiB, its pages never touched (LibTorch does not
// fill what it allocates).
at::Tensor block(int64_t mib) { return at::empty({mib * kMiB / 4}); }

class BlockCache : public ::testing::Test {
protected:
  void SetUp() override {
    keep_freed_tensor_blocks();
    if (!tensor_block_cache_installed()) GTEST_SKIP() << "the block cache is off here (GLINT_MALLOC_TUNING=0?)";
    release_kept_tensor_blocks();
  }
  void TearDown() override { release_kept_tensor_blocks(); }
};

TEST_F(BlockCache, AFreedLargeBlockServesTheNextRequestOfAboutItsSize) {
  const void* p = nullptr;
  {
    auto t = block(40);
    p = t.data_ptr();
  }
  EXPECT_EQ(kept_tensor_block_bytes(), size_t{40} << 20);
  {
    auto same = block(40);
    EXPECT_EQ(same.data_ptr(), p) << "a request of the block's size gets it back";
    EXPECT_EQ(kept_tensor_block_bytes(), 0u);
  }
  {
    auto smaller = block(32);  // a fifth less: the 40 MiB block serves it
    EXPECT_EQ(smaller.data_ptr(), p);
    smaller.fill_(1.5);
    EXPECT_EQ(smaller.sum().item<double>(), 1.5 * static_cast<double>(smaller.numel()));
  }
  EXPECT_EQ(kept_tensor_block_bytes(), size_t{40} << 20) << "the block keeps its own size";
  {
    auto much_larger = block(60);  // more than the block holds
    EXPECT_NE(much_larger.data_ptr(), p);
  }
  EXPECT_EQ(kept_tensor_block_bytes(), size_t{100} << 20);
  release_kept_tensor_blocks();
  EXPECT_EQ(kept_tensor_block_bytes(), 0u);
}

TEST_F(BlockCache, ARequestFarSmallerThanAKeptBlockGetsItsOwn) {
  {
    auto big = block(100);
  }
  auto small = block(40);  // the 100 MiB block would waste 60
  EXPECT_EQ(kept_tensor_block_bytes(), size_t{100} << 20);
}

TEST_F(BlockCache, SmallBlocksNeverEnterIt) {
  {
    auto t = at::empty({static_cast<int64_t>(kKeptBlockMinBytes / 4) - 1});
  }
  EXPECT_EQ(kept_tensor_block_bytes(), 0u);
}

TEST_F(BlockCache, ItKeepsAtMostItsCeilingAndFreesTheRest) {
  const int64_t each = static_cast<int64_t>(kKeptBlocksMaxBytes / 3) / kMiB + 1;  // three pass the ceiling
  {
    std::vector<at::Tensor> ts;
    for (int i = 0; i < 4; ++i) ts.push_back(block(each));
  }
  EXPECT_LE(kept_tensor_block_bytes(), kKeptBlocksMaxBytes);
  EXPECT_EQ(kept_tensor_block_bytes(), 2 * static_cast<size_t>(each * kMiB));
  {
    auto huge = block(static_cast<int64_t>(kKeptBlocksMaxBytes) / kMiB + 1);  // alone past the ceiling
  }
  EXPECT_EQ(kept_tensor_block_bytes(), 2 * static_cast<size_t>(each * kMiB)) << "a block past the ceiling is freed";
}

TEST_F(BlockCache, ThreadsTakeAndGiveBackBlocksConcurrently) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 25; ++i) {
        auto x = block(33 + (t + i) % 3);
        x.view(-1)[0] = static_cast<float>(i);
        ASSERT_EQ(x.view(-1)[0].item<float>(), static_cast<float>(i));
      }
    });
  for (auto& th : threads) th.join();
  // A request takes a kept block at least its size: a 35 MiB request after
  // 33 and 34 MiB blocks were kept makes its own, so more than 4 may exist.
  EXPECT_GT(kept_tensor_block_bytes(), 0u);
  EXPECT_LE(kept_tensor_block_bytes(), kKeptBlocksMaxBytes);
  release_kept_tensor_blocks();
  EXPECT_EQ(kept_tensor_block_bytes(), 0u);
}

TEST(BlockCacheOptOut, MallocTuningZeroLeavesLibTorchsAllocatorAlone) {
  // A fresh process: the cache is installed once per process.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::setenv("GLINT_MALLOC_TUNING", "0", 1);
        keep_freed_tensor_blocks();
        { auto t = block(40); }
        std::_Exit(!tensor_block_cache_installed() && kept_tensor_block_bytes() == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace glint::components
