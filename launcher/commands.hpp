#pragma once
/// The subcommands of the `glint` binary, each returning an exit code.

#include <string>

namespace glint::launcher {

struct InfoArgs {
  std::string config;  ///< a job TOML to plan (empty: none)
  int nproc = 1;       ///< plan as if this many processes shared the machine
  bool probe = false;  ///< also spawn a probe per node and show where it runs
};
int info(const InfoArgs& args);

struct DemoArgs {
  int steps = 20;
  int ranks = 2;
};
/// The local-mode (or, under `glint run`, cluster-mode) demo of the runtime.
int demo(const DemoArgs& args);

}  // namespace glint::launcher
