#include "runtime/error.hpp"

#include <caf/exit_reason.hpp>
#include <caf/sec.hpp>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace glint
