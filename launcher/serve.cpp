// `glint serve`: the remote-mode server (rpc/server.hpp) and its key
// management. docs/remote.md is the user's guide.
#include "launcher/commands.hpp"
#include "rpc/keys.hpp"
#include "rpc/server.hpp"
#include "runtime/runtime.hpp"

#include <csignal>
#include <cstdio>
#include <ctime>
#include <pthread.h>

namespace glint::launcher {

namespace {

int fail(const char* what, const caf::error& e) {
  std::fprintf(stderr, "glint serve%s: %s\n", what, describe(e).c_str());
  return code_of(e) == errc::invalid_argument || code_of(e) == errc::not_found ||
                 code_of(e) == errc::permission_denied
             ? 2
             : 1;
}

Result<std::string> state_dir_of(const ServeKeysArgs& a) {
  if (!a.state_dir.empty()) return a.state_dir;
  if (a.config.empty())
    return make_error(errc::invalid_argument, "name the server's state with --config serve.toml or --state-dir DIR");
  auto c = rpc::ServeConfig::load(a.config);
  if (!c) return c.error();
  return c->state_dir;
}

}  // namespace

int serve(const ServeArgs& a) {
  auto config = rpc::ServeConfig::load(a.config);
  if (!config) return fail("", config.error());
  config->insecure = a.insecure;
  if (a.port >= 0) config->port = a.port;
  if (auto ok = config->validate(); !ok) return fail("", ok.error());
  if (!config->loopback() && !config->tls())
    std::fprintf(stderr,
                 "glint serve: WARNING: --insecure: listening on %s without TLS; API keys and every tenant's data "
                 "cross the network in clear text\n",
                 config->host.c_str());
  ::setenv("GLINT_LOG", "info", 0);  // one line per call (tenant, method, tokens, latency, outcome)
  // SIGTERM and SIGINT are taken by the driver thread below (sigwait): block
  // them before the runtime starts its threads, which inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return run_main([&](Runtime& rt) -> int {
    auto server = rpc::Server::start(rt, *config);
    if (!server) return fail("", server.error());
    std::printf("glint serve: %s on %s:%d (%s), state in %s\n", config->model_dir.c_str(), config->host.c_str(),
                (*server)->port(), config->tls() ? "TLS" : "plain TCP", config->state_dir.c_str());
    std::printf("glint serve: base fingerprint %s\n", (*server)->fingerprint().c_str());
    if ((*server)->tinker_port() >= 0)
      std::printf("glint serve: Tinker-compatible API on %s://%s:%d (TINKER_BASE_URL)\n", config->tls() ? "https" : "http",
                  config->tinker_host.c_str(), (*server)->tinker_port());
    if ((*server)->metrics_port() >= 0)
      std::printf("glint serve: metrics on http://%s:%d/metrics (%s)\n", config->metrics_host.c_str(),
                  (*server)->metrics_port(),
                  config->metrics_token_file.empty() ? "no token: loopback only"
                                                     : "Authorization: Bearer <the token_file's token>");
    // Where the groups run (under `glint run --nproc N`, across processes).
    auto nodes = [](const GroupInfo& g) {
      std::string out;
      for (const auto& r : g.ranks) out += (out.empty() ? "" : ",") + std::to_string(r.node);
      return out;
    };
    std::printf("glint serve: model group of %d ranks on nodes %s, sampler group of %d ranks on nodes %s\n",
                (*server)->model_group().info().size(), nodes((*server)->model_group().info()).c_str(),
                (*server)->sampler_group().info().size(), nodes((*server)->sampler_group().info()).c_str());
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "glint serve: %s: finishing the calls in flight, then stopping\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT");
    (*server)->shutdown(std::chrono::seconds(a.grace_seconds));
    std::fprintf(stderr, "glint serve: stopped\n");
    return 0;
  });
}

int serve_keys(const ServeKeysArgs& a) {
  auto dir = state_dir_of(a);
  if (!dir) return fail(" keys", dir.error());
  if (a.action == "create") {
    auto key = rpc::KeyStore::create(*dir, a.tenant);
    if (!key) return fail(" keys create", key.error());
    std::printf("%s\n", key->c_str());
    std::fprintf(stderr, "glint serve keys: key %s for tenant %s; it is shown only now (the server keeps a salted hash)\n",
                 rpc::KeyStore::id_of(*key).c_str(), a.tenant.c_str());
    return 0;
  }
  if (a.action == "list") {
    auto keys = rpc::KeyStore::list(*dir);
    if (!keys) return fail(" keys list", keys.error());
    std::printf("%-18s %-24s %-20s %s\n", "ID", "TENANT", "CREATED (UTC)", "STATE");
    for (const auto& k : *keys) {
      std::time_t t = static_cast<std::time_t>(k.created_ms / 1000);
      char when[32];
      std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
      std::printf("%-18s %-24s %-20s %s\n", k.id.c_str(), k.tenant.c_str(), when, k.revoked ? "revoked" : "active");
    }
    return 0;
  }
  auto r = rpc::KeyStore::revoke(*dir, a.key);
  if (!r) return fail(" keys revoke", r.error());
  std::printf("revoked key %s of tenant %s\n", r->id.c_str(), r->tenant.c_str());
  return 0;
}

}  // namespace glint::launcher
