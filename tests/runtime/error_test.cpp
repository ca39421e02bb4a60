#include "runtime/error.hpp"
#include "runtime/memory.hpp"

#include <caf/exit_reason.hpp>
#include <caf/sec.hpp>

#include <gtest/gtest.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdlib>
#include <new>
#include <stdexcept>

namespace glint {
namespace {

TEST(Error, CarriesCodeAndContext) {
  auto e = make_error(errc::invalid_argument, "token id 70000 is outside the vocabulary of 32000");
  EXPECT_EQ(code_of(e), errc::invalid_argument);
  EXPECT_EQ(context_of(e), "token id 70000 is outside the vocabulary of 32000");
  EXPECT_EQ(describe(e), "invalid_argument: token id 70000 is outside the vocabulary of 32000");
}

TEST(Error, WithContextPrefixesAndKeepsTheCode) {
  auto e = with_context(make_error(errc::not_found, "no adapter 'a'"), "rank 1 of group 'model'");
  EXPECT_EQ(code_of(e), errc::not_found);
  EXPECT_EQ(context_of(e), "rank 1 of group 'model': no adapter 'a'");
}

TEST(Error, MapsCafErrorsToTheCodeThatSaysWhatToDo) {
  EXPECT_EQ(code_of(caf::make_error(caf::sec::request_timeout)), errc::deadline_exceeded);
  EXPECT_EQ(code_of(caf::make_error(caf::sec::request_receiver_down)), errc::unavailable);
  EXPECT_EQ(code_of(caf::make_error(caf::exit_reason::remote_link_unreachable)), errc::unavailable);
  auto e = with_context(caf::make_error(caf::sec::request_timeout), "rank 0");
  EXPECT_EQ(code_of(e), errc::deadline_exceeded);
  EXPECT_NE(describe(e).find("rank 0"), std::string::npos);
}

TEST(Error, EveryCodeHasAName) {
  for (int c = 0; c <= static_cast<int>(errc::internal); ++c)
    EXPECT_NE(to_string(static_cast<errc>(c)), "unknown");
}

// Library exceptions by kind: out of memory says shed load; anything else
// got past our input checks and is ours.
TEST(Error, LibraryExceptionsAreTranslatedByKind) {
  auto oom = error_of_exception(std::bad_alloc{}, "forward_backward");
  EXPECT_EQ(code_of(oom), errc::resource_exhausted);
  EXPECT_NE(describe(oom).find("forward_backward ran out of memory"), std::string::npos) << describe(oom);
  // LibTorch's CPU allocator, with the backtrace it appends.
  std::runtime_error torch_oom{"[enforce fail at alloc_cpu.cpp:75] DefaultCPUAllocator: can't allocate memory: you "
                               "tried to allocate 1099511627776 bytes.\nException raised from alloc_cpu at ..."};
  auto t = error_of_exception(torch_oom, "the engine step");
  EXPECT_EQ(code_of(t), errc::resource_exhausted);
  EXPECT_EQ(describe(t).find("Exception raised from"), std::string::npos) << "no backtrace: " << describe(t);
  auto bug = error_of_exception(std::runtime_error{"shape '[2, 3]' is invalid for input of size 5"}, "the forward pass");
  EXPECT_EQ(code_of(bug), errc::internal);
  EXPECT_NE(describe(bug).find("the forward pass failed: shape"), std::string::npos) << describe(bug);
}

}  // namespace

TEST(Memory, CheckMemoryRefusesWhatTheMachineCannotHoldAndSaysHowMuch) {
  EXPECT_GT(memory_limit_bytes(), uint64_t{1} << 20);
  EXPECT_TRUE(check_memory(1024, "a kilobyte"));
  auto big = check_memory(1e20, "a hundred exabytes");
  ASSERT_FALSE(big);
  EXPECT_EQ(code_of(big.error()), errc::resource_exhausted);
  EXPECT_NE(describe(big.error()).find("a hundred exabytes needs 86.7 EiB, more than this machine's"), std::string::npos)
      << describe(big.error());
  EXPECT_EQ(format_bytes(512), "512 bytes");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024), "1.5 MiB");
  EXPECT_EQ(format_bytes(24.0 * (uint64_t{1} << 30)), "24.0 GiB");
}

#if defined(__GLIBC__)
// After keep_freed_memory, a 16 MiB block comes from the heap (glibc's
// default threshold, 128 KiB at first, would map it): freed, it stays for
// the next step instead of being faulted in again.
TEST(Memory, KeepFreedMemoryServesStepSizedBlocksFromTheHeap) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's allocator stands in for glibc's, whose thresholds this checks";
#endif
  keep_freed_memory();
  keep_freed_memory();  // once per process; a second call changes nothing
  const auto mapped = mallinfo2().hblks;
  void* block = std::malloc(16 << 20);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(mallinfo2().hblks, mapped) << "the block was mapped on its own";
  std::free(block);
  void* huge = std::malloc(64 << 20);  // over 32 MiB: still mapped
  ASSERT_NE(huge, nullptr);
  EXPECT_EQ(mallinfo2().hblks, mapped + 1);
  std::free(huge);
}
#endif

}  // namespace glint
