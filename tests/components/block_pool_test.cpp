#include "components/sampler/block_pool.hpp"
#include "components/sampler/scheduler.hpp"

#include <gtest/gtest.h>

#include <numeric>

namespace glint::components {
namespace {

std::vector<int64_t> toks(int64_t from, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(BlockPool, AllocatesUntilEmptyAndRecyclesInFreeOrder) {
  BlockPool pool{3};
  auto a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  ASSERT_TRUE(a && b && c);
  EXPECT_FALSE(pool.allocate());
  EXPECT_EQ(pool.num_free(), 0);
  pool.release(*b);
  pool.release(*a);
  EXPECT_EQ(pool.allocate(), b);  // least recently freed first
  EXPECT_EQ(pool.allocate(), a);
}

TEST(BlockPool, SharedBlocksFreeWithTheirLastHolder) {
  BlockPool pool{2};
  auto a = *pool.allocate();
  pool.retain(a);
  EXPECT_EQ(pool.refcount(a), 2);
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockPool, CachedBlocksSurviveFreeingUntilReallocated) {
  BlockPool pool{2};
  auto t = toks(0, 4);
  auto key = chain_hash(hash_seed("a"), t);
  auto a = *pool.allocate();
  pool.register_cached(a, key, hash_seed("a"), t);
  pool.release(a);
  auto again = pool.acquire_cached(key, hash_seed("a"), t);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, a);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(a);
  // Two allocations reach the cached block (freed last) and evict it.
  (void)pool.allocate();
  (void)pool.allocate();
  EXPECT_FALSE(pool.acquire_cached(key, hash_seed("a"), t));
}

TEST(BlockPool, LookupChecksTokensAndParentNotJustTheKey) {
  BlockPool pool{1};
  auto t = toks(0, 4);
  auto a = *pool.allocate();
  pool.register_cached(a, 42, 7, t);
  EXPECT_FALSE(pool.acquire_cached(42, 8, t));            // another parent
  EXPECT_FALSE(pool.acquire_cached(42, 7, toks(1, 4)));   // other tokens under a colliding key
  EXPECT_TRUE(pool.acquire_cached(42, 7, t));
  pool.reset_cache();
  EXPECT_FALSE(pool.acquire_cached(42, 7, t));
}

TEST(BlockPool, ChainHashDependsOnEveryTokenAndTheParent) {
  auto t = toks(0, 16);
  auto base = chain_hash(1, t);
  EXPECT_NE(base, chain_hash(2, t));
  for (size_t i = 0; i < t.size(); ++i) {
    auto u = t;
    ++u[i];
    EXPECT_NE(base, chain_hash(1, u)) << i;
  }
}

// -- Scheduler ------------------------------------------------------------------

SchedulerConfig small(int32_t blocks, int64_t seqs = 8, int64_t tokens = 64) {
  return {.block_size = 4, .num_blocks = blocks, .max_num_seqs = seqs, .max_num_batched_tokens = tokens,
          .enable_prefix_caching = true};
}

TEST(Scheduler, ChunksLongPromptsUnderTheTokenBudget) {
  Scheduler s{small(16, 8, 6)};
  auto& a = s.add(1, toks(0, 10), 0, true, 0);
  auto st = s.schedule();
  ASSERT_EQ(st.chunks.size(), 1u);
  EXPECT_EQ(st.chunks[0].count, 6);
  s.commit(st);
  st = s.schedule();
  ASSERT_EQ(st.chunks.size(), 1u);
  EXPECT_EQ(st.chunks[0].begin, 6);
  EXPECT_EQ(st.chunks[0].count, 4);
  EXPECT_TRUE(st.chunks[0].completes());
  s.commit(st);
  EXPECT_EQ(a.num_computed, 10);
  EXPECT_EQ(a.blocks.size(), 3u);
}

TEST(Scheduler, AdmitsInOrderWithinMaxNumSeqs) {
  Scheduler s{small(16, 2)};
  s.add(1, toks(0, 3), 0, true, 0);
  s.add(2, toks(0, 3), 0, true, 0);
  s.add(3, toks(0, 3), 0, true, 0);
  auto st = s.schedule();
  EXPECT_EQ(st.chunks.size(), 2u);
  EXPECT_EQ(s.num_waiting(), 1u);
}

TEST(Scheduler, ReservesSlotsForSamplesNotForkedYet) {
  Scheduler s{small(16, 4)};
  s.add(1, toks(0, 3), 0, true, 3);  // 4 samples
  s.add(2, toks(0, 3), 0, true, 0);
  auto st = s.schedule();
  EXPECT_EQ(st.chunks.size(), 1u);
  EXPECT_EQ(s.num_waiting(), 1u);
}

TEST(Scheduler, PreemptsTheLatestArrivalWhenBlocksRunOut) {
  Scheduler s{small(4)};
  auto& a = s.add(1, toks(0, 4), 0, false, 0);
  auto& b = s.add(2, toks(10, 4), 0, false, 0);
  auto st = s.schedule();  // two prompts of one block each
  s.commit(st);
  EXPECT_EQ(s.pool().num_free(), 2);
  // Each grows by five tokens: a needs two more blocks, then b one.
  for (int i = 0; i < 5; ++i) {
    a.tokens.push_back(1);
    b.tokens.push_back(1);
  }
  st = s.schedule();
  ASSERT_EQ(st.preempted.size(), 1u);
  EXPECT_EQ(st.preempted[0], &b);
  ASSERT_EQ(st.chunks.size(), 1u);
  EXPECT_EQ(st.chunks[0].seq, &a);
  EXPECT_EQ(b.num_computed, 0);
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(s.num_waiting(), 1u);
  s.commit(st);
  s.finish(a);
  st = s.schedule();  // b comes back and recomputes prompt and output
  ASSERT_EQ(st.chunks.size(), 1u);
  EXPECT_EQ(st.chunks[0].seq, &b);
  EXPECT_EQ(st.chunks[0].count, 9);
  EXPECT_EQ(s.stats().preemptions, 1);
}

TEST(Scheduler, ForkSharesBlocksAndCopiesOnWrite) {
  Scheduler s{small(8)};
  auto& a = s.add(1, toks(0, 6), 0, false, 2);
  auto st = s.schedule();
  s.commit(st);
  auto kids = s.fork(a, 3);
  ASSERT_EQ(kids.size(), 2u);
  EXPECT_EQ(s.pool().refcount(a.blocks[0]), 3);
  EXPECT_EQ(s.pool().refcount(a.blocks[1]), 3);
  a.tokens.push_back(1);
  for (auto* k : kids) k->tokens.push_back(2);
  st = s.schedule();
  // The full first block stays shared; the half-full second one is copied
  // for the first two writers, and the last writer keeps it.
  EXPECT_EQ(st.copies.size(), 2u);
  EXPECT_EQ(a.blocks[0], kids[0]->blocks[0]);
  EXPECT_NE(a.blocks[1], kids[0]->blocks[1]);
  EXPECT_NE(kids[0]->blocks[1], kids[1]->blocks[1]);
  for (auto* q : {&a, kids[0], kids[1]}) EXPECT_EQ(s.pool().refcount(q->blocks[1]), 1);
}

TEST(Scheduler, PrefixCacheServesFullBlocksOfALaterPrompt) {
  Scheduler s{small(16)};
  auto& a = s.add(1, toks(0, 11), 0, true, 0);
  s.commit(s.schedule());
  s.finish(a);
  auto& b = s.add(2, toks(0, 9), 0, true, 0);  // shares two full blocks
  auto st = s.schedule();
  ASSERT_EQ(st.chunks.size(), 1u);
  EXPECT_EQ(st.chunks[0].begin, 8);
  EXPECT_EQ(b.num_computed, 8);
  EXPECT_EQ(s.stats().cached_tokens, 8);
  // Prompts admitted in one step share what the first one computes in it.
  auto& c = s.add(4, toks(100, 9), 5, true, 0);
  auto& d = s.add(5, toks(100, 10), 5, true, 0);
  st = s.schedule();
  EXPECT_EQ(c.num_computed, 0);
  EXPECT_EQ(d.num_computed, 8);
  EXPECT_EQ(d.blocks[0], c.blocks[0]);
  // Another salt (adapter) shares nothing.
  s.add(3, toks(0, 9), 99, true, 0);
  st = s.schedule();
  EXPECT_EQ(st.chunks.back().begin, 0);
}

}  // namespace
}  // namespace glint::components
