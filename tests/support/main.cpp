// The main of every glint test binary. A test that starts a cluster runs this
// same binary as its node processes; they are told so by the GLINT_*
// variables and serve the driver instead of running tests. A test may also
// run it as a job's driver (GLINT_TEST_ROLE=driver), where the binary
// provides one (support/roles.hpp).
#include "support/roles.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace glint::testing {
int (*driver_role)(const Options&) = nullptr;
std::map<std::string, int (*)()>& roles() {
  static std::map<std::string, int (*)()> r;
  return r;
}
}

int main(int argc, char** argv) {
  auto opts = glint::Options::from_environment();
  if (!opts) {
    std::fprintf(stderr, "%s\n", glint::describe(opts.error()).c_str());
    return 2;
  }
  if (opts->mode == glint::Mode::cluster && opts->cluster.rank != 0) return glint::serve_node(*opts);
  if (const char* role = std::getenv("GLINT_TEST_ROLE"); role && glint::testing::roles().count(role))
    return glint::testing::roles().at(role)();
  if (const char* role = std::getenv("GLINT_TEST_ROLE"); role && std::string{role} == "driver") {
    if (!glint::testing::driver_role) {
      std::fprintf(stderr, "this test binary has no driver role\n");
      return 2;
    }
    return glint::testing::driver_role(*opts);
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
