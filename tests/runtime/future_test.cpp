// Future: take moves the result out without a copy and only once; then
// maps a result (or passes its error) whether it completes before or after.
#include "runtime/future.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace glint {
namespace {

TEST(Future, TakeMovesTheResultOutWithoutACopy) {
  Future<std::vector<int>> f;
  std::vector<int> big(1000, 7);
  const int* data = big.data();
  f.state()->set(std::move(big));
  auto got = f.take();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->data(), data) << "the buffer moved, not copied";
  auto again = f.take();
  ASSERT_FALSE(again);
  EXPECT_EQ(code_of(again.error()), errc::failed_precondition);
}

TEST(Future, TakeWaitsForAResultSetOnAnotherThread) {
  Future<int> f;
  std::thread t([s = f.state()] { s->set(5); });
  EXPECT_EQ(*f.take(), 5);
  t.join();
}

TEST(Future, ThenMapsResultsBeforeAndAfterTheyComeAndPassesErrors) {
  auto twice = [](const Result<int>& r) -> Result<int> {
    if (!r) return r.error();
    return *r * 2;
  };
  EXPECT_EQ(*Future<int>::ready_with(4).then(twice).get(), 8) << "already complete";
  Future<int> pending;
  auto mapped = pending.then(twice);
  EXPECT_FALSE(mapped.ready());
  std::thread t([s = pending.state()] { s->set(21); });
  EXPECT_EQ(*mapped.get(), 42);
  t.join();
  auto failed = Future<int>::ready_with(make_error(errc::aborted, "no")).then(twice).get();
  ASSERT_FALSE(failed);
  EXPECT_EQ(code_of(failed.error()), errc::aborted);
  auto done = Future<bool>::ready_with(true).then([](const Result<bool>& r) -> Result<void> {
    if (!r) return r.error();
    return {};
  });
  EXPECT_TRUE(done.get());
}

}  // namespace
}  // namespace glint
