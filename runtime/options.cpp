#include "runtime/options.hpp"

#include <charconv>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace glint {

std::string_view to_string(Mode m) {
  switch (m) {
    case Mode::local: return "local";
    case Mode::cluster: return "cluster";
    case Mode::remote: return "remote";
  }
  return "?";
}

Result<Mode> parse_mode(std::string_view name) {
  if (name == "local") return Mode::local;
  if (name == "cluster") return Mode::cluster;
  if (name == "remote") return Mode::remote;
  return make_error(errc::invalid_argument, "unknown mode '" + std::string{name} + "'; expected local, cluster or remote");
}

namespace {

using Env = std::map<std::string, std::string>;

Result<int> read_int(const Env& env, const std::string& key, int fallback, int min = 0) {
  auto i = env.find(key);
  if (i == env.end() || i->second.empty()) return fallback;
  int v = 0;
  auto [p, ec] = std::from_chars(i->second.data(), i->second.data() + i->second.size(), v);
  if (ec != std::errc{} || p != i->second.data() + i->second.size() || v < min)
    return make_error(errc::invalid_argument, "environment variable " + key + "='" + i->second +
                                                "' is not an integer >= " + std::to_string(min));
  return v;
}

std::string read_str(const Env& env, const std::string& key, std::string fallback) {
  auto i = env.find(key);
  return i == env.end() || i->second.empty() ? fallback : i->second;
}

}  // namespace

Result<ClusterEnv> ClusterEnv::from_environment(const Env& env) {
  ClusterEnv c;
  struct Names {
    const char *rank, *world, *local_rank, *local_world, *node_rank, *nnodes, *addr, *port, *source;
  };
  static const Names schemes[] = {
      {"GLINT_RANK", "GLINT_WORLD_SIZE", "GLINT_LOCAL_RANK", "GLINT_LOCAL_WORLD_SIZE", "GLINT_NODE_RANK",
       "GLINT_NNODES", "GLINT_MASTER_ADDR", "GLINT_MASTER_PORT", "glint run"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NNODES", "MASTER_ADDR",
       "MASTER_PORT", "torchrun"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID", "SLURM_NNODES",
       "MASTER_ADDR", "MASTER_PORT", "slurm"},
  };
  for (const auto& s : schemes) {
    if (!env.count(s.rank) || !env.count(s.world)) continue;
    c.source = s.source;
    auto rank = read_int(env, s.rank, 0);
    auto world = read_int(env, s.world, 1, 1);
    auto local_rank = read_int(env, s.local_rank, 0);
    auto node_rank = read_int(env, s.node_rank, 0);
    auto nnodes = read_int(env, s.nnodes, 1, 1);
    auto port = read_int(env, s.port, 0);
    for (auto* r : {&rank, &world, &local_rank, &node_rank, &nnodes, &port})
      if (!*r) return r->error();
    c.rank = *rank;
    c.world_size = *world;
    c.local_rank = *local_rank;
    c.node_rank = *node_rank;
    c.nnodes = *nnodes;
    auto local_world = read_int(env, s.local_world, std::max(1, *world / std::max(1, *nnodes)), 1);
    if (!local_world) return local_world.error();
    c.local_world_size = *local_world;
    c.master_addr = read_str(env, s.addr, "127.0.0.1");
    c.join_report = read_str(env, "GLINT_JOIN_REPORT", "");
    if (*port > 65535) return make_error(errc::invalid_argument, std::string{s.port} + " is not a TCP port");
    c.master_port = static_cast<uint16_t>(*port);
    if (auto ok = c.validate(); !ok) return ok.error();
    return c;
  }
  return c;
}

Result<ClusterEnv> ClusterEnv::from_environment() {
  Env env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv{*e};
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return from_environment(env);
}

std::map<std::string, std::string> ClusterEnv::to_environment() const {
  std::map<std::string, std::string> env{{"GLINT_MODE", "cluster"},
                                         {"GLINT_RANK", std::to_string(rank)},
                                         {"GLINT_WORLD_SIZE", std::to_string(world_size)},
                                         {"GLINT_LOCAL_RANK", std::to_string(local_rank)},
                                         {"GLINT_LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
                                         {"GLINT_NODE_RANK", std::to_string(node_rank)},
                                         {"GLINT_NNODES", std::to_string(nnodes)},
                                         {"GLINT_MASTER_ADDR", master_addr},
                                         {"GLINT_MASTER_PORT", std::to_string(master_port)}};
  if (!join_report.empty()) env["GLINT_JOIN_REPORT"] = join_report;
  return env;
}

Result<void> ClusterEnv::validate() const {
  if (world_size < 1) return make_error(errc::invalid_argument, "world size must be at least 1");
  if (rank < 0 || rank >= world_size)
    return make_error(errc::invalid_argument, "process rank " + std::to_string(rank) + " is outside world size " +
                                                std::to_string(world_size));
  if (local_rank < 0 || local_rank >= local_world_size)
    return make_error(errc::invalid_argument, "local rank " + std::to_string(local_rank) +
                                                " is outside local world size " + std::to_string(local_world_size));
  if (node_rank < 0 || node_rank >= nnodes)
    return make_error(errc::invalid_argument, "node rank " + std::to_string(node_rank) + " is outside " +
                                                std::to_string(nnodes) + " nodes");
  if (world_size > 1 && master_port == 0)
    return make_error(errc::invalid_argument, "a cluster job of " + std::to_string(world_size) +
                                                " processes needs a master port (GLINT_MASTER_PORT or MASTER_PORT)");
  return {};
}

Result<Options> Options::from_environment() {
  Options o;
  auto c = ClusterEnv::from_environment();
  if (!c) return c.error();
  o.cluster = *c;
  if (!c->source.empty() && c->world_size > 1) o.mode = Mode::cluster;
  if (const char* m = std::getenv("GLINT_MODE"); m && *m) {
    auto mode = parse_mode(m);
    if (!mode) return with_context(mode.error(), "GLINT_MODE");
    o.mode = *mode;
  }
  // GLINT_REMOTE_URL (GLINT_REMOTE, its older name) attaches to a server:
  // remote mode unless GLINT_MODE says otherwise.
  for (const char* name : {"GLINT_REMOTE", "GLINT_REMOTE_URL"})
    if (const char* r = std::getenv(name); r && *r) o.remote_endpoint = r;
  if (const char* k = std::getenv("GLINT_API_KEY"); k && *k) o.remote_api_key = k;
  if (const char* c = std::getenv("GLINT_REMOTE_CA"); c && *c) o.remote_ca_file = c;
  const char* mode_env = std::getenv("GLINT_MODE");
  if (!o.remote_endpoint.empty() && (!mode_env || !*mode_env) && o.mode == Mode::local) o.mode = Mode::remote;
  {
    Env env;
    for (const char* name : {"GLINT_HEARTBEAT_MS", "GLINT_PEER_TIMEOUT_MS"})
      if (const char* v = std::getenv(name)) env[name] = v;
    auto heartbeat = read_int(env, "GLINT_HEARTBEAT_MS", static_cast<int>(o.heartbeat.count()), 1);
    if (!heartbeat) return heartbeat.error();
    auto peer = read_int(env, "GLINT_PEER_TIMEOUT_MS", static_cast<int>(o.peer_timeout.count()), 1);
    if (!peer) return peer.error();
    o.heartbeat = std::chrono::milliseconds(*heartbeat);
    o.peer_timeout = std::chrono::milliseconds(*peer);
  }
  if (const char* m = std::getenv("GLINT_MAX_MESSAGE_BYTES"); m && *m) {
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(m, m + std::strlen(m), v);
    if (ec != std::errc{} || *p != 0 || v == 0)
      return make_error(errc::invalid_argument, std::string{"GLINT_MAX_MESSAGE_BYTES='"} + m + "' is not a positive byte count");
    o.max_message_bytes = v;
  }
  return o;
}

Result<void> Options::validate() const {
  using namespace std::chrono_literals;
  if (call_timeout <= 0ms || connect_timeout <= 0ms || spawn_timeout <= 0ms || heartbeat <= 0ms || exit_grace <= 0ms)
    return make_error(errc::invalid_argument, "timeouts and the heartbeat must be positive");
  if (peer_timeout < 2 * heartbeat)
    return make_error(errc::invalid_argument,
                      "the peer timeout (" + std::to_string(peer_timeout.count()) + " ms, GLINT_PEER_TIMEOUT_MS) must be at least two heartbeats (" +
                          std::to_string(heartbeat.count()) + " ms each, GLINT_HEARTBEAT_MS)");
  if (max_message_bytes == 0) return make_error(errc::invalid_argument, "max_message_bytes must be positive");
  if (threads < 0) return make_error(errc::invalid_argument, "threads must be >= 0");
  if (mode == Mode::cluster) return cluster.validate();
  return {};
}

}  // namespace glint
