#pragma once
// llama.cpp as a baseline and a cross-check: node-llama-cpp's prebuilt
// llama.cpp (installed from npm by scripts/setup_llamacpp.sh) driven through
// bench/llamacpp/llamacpp_child.mjs, one line per command. Used by `glint
// bench sample` and by the GGUF export test.

#include "bench/line_child.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace glint::bench {

/// Where scripts/setup_llamacpp.sh installs node-llama-cpp:
/// $GLINT_LLAMACPP_DIR, else $XDG_CACHE_HOME/glint/llamacpp, else
/// ~/.cache/glint/llamacpp.
inline std::string llamacpp_dir() {
  if (const char* d = std::getenv("GLINT_LLAMACPP_DIR"); d && *d) return d;
  if (const char* c = std::getenv("XDG_CACHE_HOME"); c && *c) return std::string{c} + "/glint/llamacpp";
  const char* home = std::getenv("HOME");
  return std::string{home ? home : "/root"} + "/.cache/glint/llamacpp";
}

/// Whether the setup script finished there.
inline bool llamacpp_installed(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(".glint-node-llama-cpp-", 0) == 0) return true;
  return false;
}

struct LlamaCppOptions {
  std::string modules;     ///< llamacpp_dir()
  std::string script;      ///< bench/llamacpp/llamacpp_child.mjs
  std::string model;       ///< the .gguf file
  int threads = 1;
  int64_t sequences = 1;   ///< run()'s parallel sequences (its context is made at the first run)
  int64_t context = 512;   ///< tokens per sequence
  int64_t batch = 2048;    ///< tokens per llama_decode
};

class LlamaCpp {
public:
  static Result<LlamaCpp> start(const LlamaCppOptions& o, std::chrono::milliseconds timeout = 300s) {
    auto child = LineChild::start({"node", o.script, "--modules", o.modules, "--model", o.model, "--threads",
                                   std::to_string(o.threads), "--sequences", std::to_string(o.sequences), "--context",
                                   std::to_string(o.context), "--batch", std::to_string(o.batch)},
                                  "llama.cpp (node " + o.script + ")");
    if (!child) return make_error(errc::not_found, describe(child.error()) + " (node must be on PATH: apt-get install nodejs)");
    LlamaCpp l{std::move(*child)};
    auto ready = l.child_.read_line(timeout);
    if (!ready) return ready.error();
    if (ready->rfind("ready: ", 0) != 0) return make_error(errc::unavailable, "llama.cpp says: " + *ready);
    l.banner_ = ready->substr(7);
    return l;
  }

  /// "llama.cpp b1234 (prebuilt, 2 math cores, 2 threads)".
  const std::string& banner() const { return banner_; }

  /// `n` greedy tokens after `prompt` (fewer if the context fills).
  Result<std::vector<int64_t>> greedy(int64_t n, const std::vector<int64_t>& prompt) {
    std::string line = "greedy " + std::to_string(n);
    for (auto t : prompt) line += " " + std::to_string(t);
    return ids(ask(line + "\n", "greedy: ", 300s));
  }
  /// The raw logits after every position of `ids`: [T][vocab].
  Result<std::vector<std::vector<double>>> logits(const std::vector<int64_t>& ids) {
    std::string line = "logits";
    for (auto t : ids) line += " " + std::to_string(t);
    auto r = ask(line + "\n", "logits: ", 300s);
    if (!r) return r.error();
    try {
      return nlohmann::json::parse(*r).get<std::vector<std::vector<double>>>();
    } catch (const std::exception& e) {
      return make_error(errc::internal, std::string{"llama.cpp's logits do not parse: "} + e.what());
    }
  }
  /// llama.cpp's ids for `text`, no special tokens added.
  Result<std::vector<int64_t>> tokenize(const std::string& text) {
    return ids(ask("tokenize " + nlohmann::json(text).dump() + "\n", "tokens: ", 60s));
  }
  /// The file as node-llama-cpp's own GGUF reader sees it (JSON text:
  /// version, flattened metadata with arrays as {length, head}, tensors).
  Result<std::string> inspect() { return ask("inspect\n", "inspect: ", 60s); }
  /// Every prompt of the file `prompts_path` (a JSON list of id lists) x
  /// samples, max_tokens each at temperature 1, through `sequences` slots:
  /// (seconds, tokens).
  Result<std::pair<double, int64_t>> run(const std::string& prompts_path, int64_t samples, int64_t max_tokens,
                                         uint64_t seed, std::chrono::milliseconds timeout) {
    auto r = ask("run " + std::to_string(samples) + " " + std::to_string(max_tokens) + " " + std::to_string(seed) +
                     " " + nlohmann::json(prompts_path).dump() + "\n",
                 "ran: ", timeout);
    if (!r) return r.error();
    std::istringstream in{*r};
    double seconds = 0;
    int64_t tokens = 0;
    if (!(in >> seconds >> tokens)) return make_error(errc::internal, "llama.cpp answered 'ran: " + *r + "'");
    return std::pair{seconds, tokens};
  }
  ~LlamaCpp() {
    if (started_) child_.send("quit\n");
  }
  LlamaCpp(LlamaCpp&& o) noexcept
      : child_(std::move(o.child_)), banner_(std::move(o.banner_)), started_(std::exchange(o.started_, false)) {}
  LlamaCpp& operator=(LlamaCpp&&) = delete;

private:
  explicit LlamaCpp(LineChild c) : child_(std::move(c)), started_(true) {}
  Result<std::string> ask(const std::string& line, const std::string& tag, std::chrono::milliseconds timeout) {
    if (!child_.send(line)) return make_error(errc::unavailable, "llama.cpp closed its input");
    auto reply = child_.read_line(timeout);
    if (!reply) return reply.error();
    if (reply->rfind(tag, 0) != 0)
      return make_error(errc::unavailable, "llama.cpp answered '" + reply->substr(0, 400) + "' to '" +
                                               line.substr(0, line.find(' ')) + "'");
    return reply->substr(tag.size());
  }
  static Result<std::vector<int64_t>> ids(Result<std::string> r) {
    if (!r) return r.error();
    std::vector<int64_t> out;
    std::istringstream in{*r};
    for (int64_t t; in >> t;) out.push_back(t);
    return out;
  }
  LineChild child_;
  std::string banner_;
  bool started_ = false;
};

}  // namespace glint::bench
