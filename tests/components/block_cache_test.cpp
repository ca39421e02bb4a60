// The block cache in front of LibTorch's CPU allocator: large blocks come
// back for requests of about their size, small ones never enter it, its
// bookkeeping keeps at most its ceiling, and GLINT_MALLOC_TUNING=0 leaves it
// out.
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

// The bookkeeping alone, with a ceiling of 100 "bytes" (the sizes are
// claimed; the blocks are one-byte allocations).
std::vector<void*> released;
void record_release(void* p) {
  released.push_back(p);
  std::free(p);
}

TEST(BlockKeeper, KeepsAtMostItsCeilingLettingLargerBlocksGoForSmallerOnes) {
  released.clear();
  detail::BlockKeeper k{100, &record_release};
  auto block_of = [&](size_t n) {
    void* p = std::malloc(1);
    k.track(p, n);
    return p;
  };
  void *a = block_of(40), *b = block_of(40), *c = block_of(40);
  EXPECT_TRUE(k.give_back(a));
  EXPECT_TRUE(k.give_back(b));
  EXPECT_TRUE(k.give_back(c));  // 120 > 100: c is released
  EXPECT_EQ(k.kept_bytes(), 80u);
  ASSERT_EQ(released, std::vector<void*>{c});
  // A 30-byte block evicts a 40-byte one to fit (the larger go first).
  void* d = block_of(30);
  EXPECT_TRUE(k.give_back(d));
  EXPECT_EQ(k.kept_bytes(), 70u);
  EXPECT_EQ(k.blocks_kept(), 2u);
  // Requests: 40 takes the kept 40; 31 finds nothing as large (the 30 is
  // too small); 25 takes the 30 (at most a third larger than it).
  void* g = k.take(40);
  EXPECT_NE(g, nullptr);
  EXPECT_EQ(k.take(31), nullptr);
  void* e = k.take(25);
  EXPECT_EQ(e, d);
  EXPECT_EQ(k.kept_bytes(), 0u);
  // A block past the ceiling alone is released, not kept.
  void* f = block_of(101);
  EXPECT_TRUE(k.give_back(f));
  EXPECT_EQ(released.back(), f);
  EXPECT_FALSE(k.give_back(&released)) << "not a block of this keeper";
  EXPECT_TRUE(k.give_back(e));
  EXPECT_TRUE(k.give_back(g));
  EXPECT_EQ(k.kept_bytes(), 70u);
  k.release_all();
  EXPECT_EQ(k.kept_bytes(), 0u);
  EXPECT_EQ(released.size(), 5u);  // c, one 40 evicted, f, then e and g
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
  // (gtest puts its flags back after each test.)
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
