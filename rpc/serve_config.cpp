#include "rpc/serve_config.hpp"

#include "placement/toml.hpp"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace glint::rpc {

namespace {

caf::error bad(const std::string& source, const std::string& what) {
  return make_error(errc::invalid_argument, source + ": " + what);
}

// Reads `key` of `t` into `out` when present; a value of another type, or
// out of [lo, hi], is an error naming it.
Result<void> read_int(const toml::table& t, const std::string& section, const char* key, int64_t lo, int64_t hi,
                      int64_t& out, const std::string& source) {
  auto* n = t.get(key);
  if (!n) return {};
  auto v = n->value_exact<int64_t>();
  if (!v || *v < lo || *v > hi)
    return bad(source, section + key + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  out = *v;
  return {};
}

Result<void> read_string(const toml::table& t, const std::string& section, const char* key, std::string& out,
                         const std::string& source) {
  auto* n = t.get(key);
  if (!n) return {};
  auto v = n->value_exact<std::string>();
  if (!v) return bad(source, section + key + " must be a string");
  out = *v;
  return {};
}

Result<void> only_keys(const toml::table& t, const std::string& section, std::set<std::string> known,
                       const std::string& source) {
  for (const auto& [k, _] : t)
    if (!known.count(std::string{k.str()}))
      return bad(source, "unknown key '" + section + std::string{k.str()} + "'");
  return {};
}

}  // namespace

static bool is_loopback(const std::string& h) { return h == "127.0.0.1" || h == "localhost" || h == "::1"; }
bool ServeConfig::loopback() const { return is_loopback(host); }
bool ServeConfig::tinker_loopback() const { return is_loopback(tinker_host); }

Result<ServeConfig> ServeConfig::parse(const std::string& text, const std::string& source) {
  auto parsed = placement::parse_toml(text, source);
  if (!parsed) return parsed.error();
  const toml::table& root = *parsed;
  ServeConfig c;
  if (auto ok = only_keys(root, "", {"model", "state_dir", "sampling_seed", "full_training", "listen", "tls", "groups", "limits", "metrics", "tinker"}, source);
      !ok)
    return ok.error();
  Result<void> ok;
  if (!(ok = read_string(root, "", "model", c.model_dir, source))) return ok.error();
  if (!(ok = read_string(root, "", "state_dir", c.state_dir, source))) return ok.error();
  int64_t seed = 0;
  if (!(ok = read_int(root, "", "sampling_seed", 0, INT64_MAX, seed, source))) return ok.error();
  c.sampling_seed = static_cast<uint64_t>(seed);
  std::string full = "refuse";
  if (!(ok = read_string(root, "", "full_training", full, source))) return ok.error();
  if (full != "refuse" && full != "exclusive")
    return bad(source, "full_training must be \"refuse\" or \"exclusive\", not \"" + full + "\"");
  c.exclusive_full_training = full == "exclusive";
  auto section = [&](const char* name) -> Result<const toml::table*> {
    auto* n = root.get(name);
    if (!n) return static_cast<const toml::table*>(nullptr);
    if (!n->is_table()) return bad(source, std::string{name} + " must be a table ([" + name + "])");
    return n->as_table();
  };
  auto listen = section("listen");
  if (!listen) return listen.error();
  if (*listen) {
    if (!(ok = only_keys(**listen, "listen.", {"host", "port"}, source))) return ok.error();
    if (!(ok = read_string(**listen, "listen.", "host", c.host, source))) return ok.error();
    int64_t port = c.port;
    if (!(ok = read_int(**listen, "listen.", "port", 0, 65535, port, source))) return ok.error();
    c.port = static_cast<int>(port);
  }
  auto metrics = section("metrics");
  if (!metrics) return metrics.error();
  if (*metrics) {
    if (!(ok = only_keys(**metrics, "metrics.", {"host", "port", "token_file"}, source))) return ok.error();
    if (!(ok = read_string(**metrics, "metrics.", "host", c.metrics_host, source))) return ok.error();
    if (!(ok = read_string(**metrics, "metrics.", "token_file", c.metrics_token_file, source))) return ok.error();
    int64_t port = 9464;
    if (!(ok = read_int(**metrics, "metrics.", "port", 0, 65535, port, source))) return ok.error();
    c.metrics_port = static_cast<int>(port);
  }
  auto tinker = section("tinker");
  if (!tinker) return tinker.error();
  if (*tinker) {
    if (!(ok = only_keys(**tinker, "tinker.",
                         {"host", "port", "base_model", "tokenizer_id", "max_samples_in_flight", "poll_seconds",
                          "seq_gap_seconds", "connections", "body_seconds"},
                         source)))
      return ok.error();
    if (!(ok = read_string(**tinker, "tinker.", "host", c.tinker_host, source))) return ok.error();
    int64_t port = 7734;
    if (!(ok = read_int(**tinker, "tinker.", "port", 0, 65535, port, source))) return ok.error();
    c.tinker_port = static_cast<int>(port);
    if (!(ok = read_string(**tinker, "tinker.", "base_model", c.tinker_base_model, source))) return ok.error();
    if (!(ok = read_string(**tinker, "tinker.", "tokenizer_id", c.tinker_tokenizer_id, source))) return ok.error();
    if (!(ok = read_int(**tinker, "tinker.", "max_samples_in_flight", 1, 1 << 20, c.tinker_samples_in_flight, source)))
      return ok.error();
    // The SDK gives up on a poll after 45 s: a held poll must answer before.
    if (!(ok = read_int(**tinker, "tinker.", "poll_seconds", 1, 40, c.tinker_poll_seconds, source))) return ok.error();
    if (!(ok = read_int(**tinker, "tinker.", "seq_gap_seconds", 1, 86400, c.tinker_seq_gap_seconds, source)))
      return ok.error();
    if (!(ok = read_int(**tinker, "tinker.", "connections", 1, 1 << 20, c.tinker_connections, source))) return ok.error();
    if (!(ok = read_int(**tinker, "tinker.", "body_seconds", 1, 3600, c.tinker_body_seconds, source))) return ok.error();
  }
  auto tls = section("tls");
  if (!tls) return tls.error();
  if (*tls) {
    if (!(ok = only_keys(**tls, "tls.", {"cert", "key"}, source))) return ok.error();
    if (!(ok = read_string(**tls, "tls.", "cert", c.tls_cert, source))) return ok.error();
    if (!(ok = read_string(**tls, "tls.", "key", c.tls_key, source))) return ok.error();
  }
  auto groups = section("groups");
  if (!groups) return groups.error();
  if (*groups) {
    if (!(ok = only_keys(**groups, "groups.", {"model_ranks", "sampler_ranks", "sampler_cache_mib"}, source)))
      return ok.error();
    int64_t m = c.model_ranks, s = c.sampler_ranks, cache = c.sampler_cache_bytes >> 20;
    if (!(ok = read_int(**groups, "groups.", "model_ranks", 1, 1024, m, source))) return ok.error();
    if (!(ok = read_int(**groups, "groups.", "sampler_ranks", 1, 1024, s, source))) return ok.error();
    if (!(ok = read_int(**groups, "groups.", "sampler_cache_mib", 1, int64_t{1} << 24, cache, source))) return ok.error();
    c.model_ranks = static_cast<int>(m);
    c.sampler_ranks = static_cast<int>(s);
    c.sampler_cache_bytes = cache << 20;
  }
  auto limits = section("limits");
  if (!limits) return limits.error();
  if (*limits) {
    if (!(ok = only_keys(**limits, "limits.",
                         {"adapters", "max_rank", "tokens_per_call", "calls_in_flight", "message_mib", "idle_seconds",
                          "memory_mib", "connections", "auth_seconds", "connections_per_tenant", "request_mib"},
                         source)))
      return ok.error();
    auto& l = c.limits;
    int64_t mib = c.max_message_bytes >> 20;
    if (!(ok = read_int(**limits, "limits.", "adapters", 1, 1 << 20, l.adapters, source))) return ok.error();
    if (!(ok = read_int(**limits, "limits.", "max_rank", 1, 1 << 16, l.max_rank, source))) return ok.error();
    if (!(ok = read_int(**limits, "limits.", "tokens_per_call", 1, int64_t{1} << 40, l.tokens_per_call, source)))
      return ok.error();
    if (!(ok = read_int(**limits, "limits.", "calls_in_flight", 1, 1 << 20, l.calls_in_flight, source)))
      return ok.error();
    if (!(ok = read_int(**limits, "limits.", "idle_seconds", 1, int64_t{1} << 31, l.idle_seconds, source)))
      return ok.error();
    if (!(ok = read_int(**limits, "limits.", "message_mib", 1, 4095, mib, source))) return ok.error();
    int64_t memory_mib = l.memory_bytes >> 20;
    if (!(ok = read_int(**limits, "limits.", "memory_mib", 1, int64_t{1} << 30, memory_mib, source))) return ok.error();
    l.memory_bytes = memory_mib << 20;
    if (!(ok = read_int(**limits, "limits.", "connections", 1, 1 << 20, l.connections, source))) return ok.error();
    if (!(ok = read_int(**limits, "limits.", "auth_seconds", 1, 3600, l.auth_seconds, source))) return ok.error();
    if (!(ok = read_int(**limits, "limits.", "connections_per_tenant", 1, 1 << 20, l.connections_per_tenant, source)))
      return ok.error();
    c.max_message_bytes = mib << 20;
    int64_t request_mib = l.request_bytes >> 20;
    if (!(ok = read_int(**limits, "limits.", "request_mib", 1, int64_t{1} << 30, request_mib, source))) return ok.error();
    l.request_bytes = request_mib << 20;
  }
  return c;
}

Result<ServeConfig> ServeConfig::load(const std::string& path) {
  std::ifstream in{path};
  if (!in) return make_error(errc::not_found, "cannot read the server config " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  auto c = parse(ss.str(), path);
  if (!c) return c;
  // Relative paths in the file are relative to the file.
  auto base = std::filesystem::absolute(path).parent_path();
  for (auto* p : {&c->model_dir, &c->state_dir, &c->tls_cert, &c->tls_key, &c->metrics_token_file})
    if (!p->empty() && std::filesystem::path{*p}.is_relative()) *p = (base / *p).lexically_normal().string();
  return c;
}

Result<void> ServeConfig::validate() const {
  if (model_dir.empty()) return make_error(errc::invalid_argument, "the server config names no base model (model = \"DIR\")");
  if (!std::filesystem::exists(std::filesystem::path{model_dir} / "config.json"))
    return make_error(errc::not_found, "the base model " + model_dir + " has no config.json");
  if (tls_cert.empty() != tls_key.empty())
    return make_error(errc::invalid_argument, "[tls] needs both cert and key (PEM files)");
  if (!loopback() && !tls() && !insecure)
    return make_error(errc::permission_denied,
                      "listening on " + host + " (not loopback) sends API keys and tenants' data in clear text: "
                      "configure [tls] cert and key, or pass --insecure on a network you trust");
  if (tinker_port >= 0 && tinker_samples_in_flight >= limits.calls_in_flight)
    return make_error(errc::invalid_argument,
                      "[tinker] max_samples_in_flight (" + std::to_string(tinker_samples_in_flight) +
                          ") must be below [limits] calls_in_flight (" + std::to_string(limits.calls_in_flight) +
                          "): every sample call counts against it, and training calls need room");
  if (tinker_port >= 0 && !tinker_loopback() && !tls() && !insecure)
    return make_error(errc::permission_denied,
                      "[tinker] listens on " + tinker_host + " (not loopback) and would carry API keys in clear text: "
                      "configure [tls] cert and key, or pass --insecure on a network you trust");
  if (metrics_port >= 0 && !is_loopback(metrics_host) && metrics_token_file.empty())
    return make_error(errc::permission_denied,
                      "[metrics] listens on " + metrics_host + " (not loopback) without a token: its counters name "
                      "every tenant; set [metrics] token_file (the scraper sends Authorization: Bearer <token>) or bind "
                      "it to 127.0.0.1");
  if (limits.request_bytes < max_message_bytes)
    return make_error(errc::invalid_argument,
                      "[limits] request_mib (" + std::to_string(limits.request_bytes >> 20) +
                          ") must be at least message_mib (" + std::to_string(max_message_bytes >> 20) +
                          "): a tenant must be able to send one message of the largest size");
  if (state_dir.empty()) return make_error(errc::invalid_argument, "state_dir must not be empty");
  return {};
}

}  // namespace glint::rpc
