#include "support/cluster.hpp"

namespace glint::testing {

Result<TestJob> TestJob::start(Mode mode, int world, Options opts) {
  TestJob job;
  opts.mode = mode;
  if (mode == Mode::cluster) {
    auto port = pick_free_port();
    if (!port) return port.error();
    opts.cluster.world_size = world;
    opts.cluster.local_world_size = world;
    opts.cluster.master_port = *port;
    opts.cluster.source = "test";
    opts.connect_timeout = std::chrono::seconds(30);
    for (int r = 1; r < world; ++r) {
      auto c = opts.cluster;
      c.rank = r;
      c.local_rank = r;
      auto env = c.to_environment();
      env["GLINT_MAX_MESSAGE_BYTES"] = std::to_string(opts.max_message_bytes);
      auto child = ChildProcess::start({self_executable()}, env);
      if (!child) return child.error();
      job.nodes.push_back(std::move(*child));
    }
  }
  auto rt = initialize(opts);
  if (!rt) return rt.error();
  job.rt = std::move(*rt);
  return job;
}

}  // namespace glint::testing
