#pragma once
// A 2-process cluster job on this machine for benchmarks: this process is
// the driver, a child running this same binary serves as node 1.

#include "runtime/options.hpp"
#include "runtime/process.hpp"
#include "runtime/runtime.hpp"

#include <chrono>
#include <memory>

namespace glint::bench {

struct TwoProcessJob {
  ChildProcess node;
  std::unique_ptr<Runtime> rt;

  static Result<TwoProcessJob> start() {
    auto port = pick_free_port();
    if (!port) return port.error();
    Options opts;
    opts.mode = Mode::cluster;
    opts.cluster.world_size = 2;
    opts.cluster.local_world_size = 2;
    opts.cluster.master_port = *port;
    auto node_env = opts.cluster;
    node_env.rank = node_env.local_rank = 1;
    TwoProcessJob job;
    auto child = ChildProcess::start({self_executable()}, node_env.to_environment());
    if (!child) return child.error();
    job.node = std::move(*child);
    auto rt = initialize(opts);
    if (!rt) return rt.error();
    job.rt = std::move(*rt);
    return job;
  }

  void stop() {
    if (rt) rt->shutdown();
    node.wait_for(std::chrono::seconds(10));
  }
};

}  // namespace glint::bench
