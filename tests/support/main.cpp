// The main of every glint test binary. A test that starts a cluster runs this
// same binary as its node processes; they are told so by the GLINT_*
// variables and serve the driver instead of running tests.
#include "runtime/options.hpp"
#include "runtime/runtime.hpp"

#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  auto opts = glint::Options::from_environment();
  if (!opts) {
    std::fprintf(stderr, "%s\n", glint::describe(opts.error()).c_str());
    return 2;
  }
  if (opts->mode == glint::Mode::cluster && opts->cluster.rank != 0) return glint::serve_node(*opts);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
