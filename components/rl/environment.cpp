#include "components/rl/environment.hpp"

#include "components/rl/detail/process_status.hpp"

#include "components/data/dataset.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <random>
#include <regex>

extern char** environ;

namespace glint::components::rl {

using json = nlohmann::ordered_json;

Result<std::unique_ptr<Environment>> make_environment(const std::string& spec, const EnvironmentOptions& options) {
  if (spec.starts_with("builtin:")) {
    if (spec == "builtin:calculator") return std::unique_ptr<Environment>{std::make_unique<CalculatorEnvironment>()};
    return make_error(errc::invalid_argument, "unknown built-in environment '" + spec + "'; there is builtin:calculator");
  }
  if (spec.empty()) return make_error(errc::invalid_argument, "the environment command is empty");
  if (options.timeout.count() <= 0) return make_error(errc::invalid_argument, "the environment's timeout must be positive");
  return std::unique_ptr<Environment>{std::make_unique<CommandEnvironment>(spec, options)};
}

// -- a program speaking JSON lines -------------------------------------------

CommandEnvironment::CommandEnvironment(std::string command, EnvironmentOptions options)
    : command_(std::move(command)), options_(options) {}

CommandEnvironment::~CommandEnvironment() { stop(); }

void CommandEnvironment::stop() {
  if (to_child_ >= 0) ::close(to_child_);
  to_child_ = from_child_ = -1;
  pending_.clear();
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  pid_ = -1;
}

Result<void> CommandEnvironment::start() {
  // A socket pair, not pipes: a write to a program that has gone is an
  // error (MSG_NOSIGNAL), not a SIGPIPE that ends glint.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return make_error(errc::unavailable, "cannot make a socket pair for environment '" + command_ + "': " + std::strerror(errno));
  posix_spawn_file_actions_t files;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&files);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&files, sv[1], 0);
  posix_spawn_file_actions_adddup2(&files, sv[1], 1);
  posix_spawn_file_actions_addclosefrom_np(&files, 3);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  const char* argv[] = {"sh", "-c", command_.c_str(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/bin/sh", &files, &attr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  ::close(sv[1]);
  if (rc != 0) {
    ::close(sv[0]);
    return make_error(errc::unavailable, "cannot start environment '" + command_ + "': " + std::strerror(rc));
  }
  pid_ = pid;
  to_child_ = from_child_ = sv[0];
  return {};
}


Result<json> CommandEnvironment::ask(const json& request) {
  const std::string what = "environment '" + command_ + "'";
  if (pid_ < 0)
    if (auto s = start(); !s) return s.error();
  auto gone = [&](const std::string& doing) -> caf::error {
    int status = 0;
    std::string how = "closed its output";
    // It closed its end: most often it is exiting; wait a moment for its status.
    for (int k = 0; pid_ > 0 && k < 100; ++k) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        how = detail::status_text(status);
        pid_ = -1;
        break;
      }
      ::usleep(10000);
    }
    stop();
    return make_error(errc::unavailable, what + " " + how + " " + doing + " (it is started again at the next reset)");
  };
  const std::string line = request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  auto left_ms = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count()));
  };
  for (size_t sent = 0; sent < line.size();) {
    pollfd p{to_child_, POLLOUT, 0};
    if (::poll(&p, 1, left_ms()) <= 0) {
      stop();
      return make_error(errc::deadline_exceeded, what + " did not read its input within the timeout; it was killed");
    }
    const ssize_t n = ::send(to_child_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return gone("before reading its request");
    sent += static_cast<size_t>(n);
  }
  constexpr size_t kMaxAnswerBytes = size_t{16} << 20;
  for (;;) {
    if (auto nl = pending_.find('\n'); nl != std::string::npos) {
      std::string answer = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      if (!answer.empty() && answer.back() == '\r') answer.pop_back();
      json j = json::parse(answer, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        stop();  // what it writes next would answer the wrong request
        return make_error(errc::invalid_argument, what + " answered a line that is not a JSON object: " + answer.substr(0, 200) +
                                                      " (it was stopped; it starts again at the next reset)");
      }
      return j;
    }
    if (pending_.size() > kMaxAnswerBytes) {
      stop();
      return make_error(errc::resource_exhausted, what + " answered more than 16 MiB without a line end");
    }
    pollfd p{from_child_, POLLIN, 0};
    const int r = ::poll(&p, 1, left_ms());
    if (r == 0) {
      stop();
      char limit[32];
      std::snprintf(limit, sizeof limit, "%.3g", std::chrono::duration<double>(options_.timeout).count());
      return make_error(errc::deadline_exceeded, what + " did not answer within " + limit + " s; it was killed");
    }
    if (r < 0 && errno == EINTR) continue;
    char buf[65536];
    const ssize_t n = ::recv(from_child_, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return gone("before answering");
    pending_.append(buf, static_cast<size_t>(n));
  }
}

Result<EpisodeStart> CommandEnvironment::reset(const std::map<std::string, std::string>& row) {
  json fields = json::object();
  for (const auto& [k, v] : row) fields[k] = v;
  auto j = ask({{"type", "reset"}, {"row", fields}});
  if (!j) return j.error();
  EpisodeStart out;
  if (!j->contains("messages") || !(*j)["messages"].is_array() || (*j)["messages"].empty())
    return make_error(errc::invalid_argument, "environment '" + command_ + "' answered reset without \"messages\" (a non-empty list)");
  out.messages = (*j)["messages"];
  if (j->contains("tools") && !(*j)["tools"].is_null()) {
    if (!(*j)["tools"].is_array())
      return make_error(errc::invalid_argument, "environment '" + command_ + "' answered reset with \"tools\" that is not a list");
    out.tools = (*j)["tools"];
  }
  return out;
}

Result<StepResult> CommandEnvironment::step(const AgentTurn& turn) {
  json message = {{"role", "assistant"}, {"content", turn.content}};
  if (!turn.calls.empty()) message["tool_calls"] = to_openai(turn.calls);
  auto j = ask({{"type", "step"}, {"message", message}, {"errors", turn.errors}});
  if (!j) return j.error();
  const std::string what = "environment '" + command_ + "' answered step ";
  StepResult out;
  if (j->contains("messages")) {
    if (!(*j)["messages"].is_array()) return make_error(errc::invalid_argument, what + "with \"messages\" that is not a list");
    out.messages = (*j)["messages"];
  }
  if (!j->contains("reward") || !(*j)["reward"].is_number() || !std::isfinite((*j)["reward"].get<double>()))
    return make_error(errc::invalid_argument, what + "without a finite \"reward\"");
  out.reward = (*j)["reward"].get<double>();
  if (!j->contains("done") || !(*j)["done"].is_boolean()) return make_error(errc::invalid_argument, what + "without a boolean \"done\"");
  out.done = (*j)["done"].get<bool>();
  if (!out.done && out.messages.empty())
    return make_error(errc::invalid_argument, what + "with no messages and done false: the model would have nothing to answer");
  if (j->contains("metrics") && (*j)["metrics"].is_object())
    for (const auto& [k, v] : (*j)["metrics"].items())
      if (v.is_number()) out.metrics[k] = v.get<double>();
  return out;
}

// -- builtin:calculator -------------------------------------------------------

namespace {

struct Calc {
  const std::string& s;
  size_t i = 0;
  int depth = 0;
  std::string error;

  void space() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  }
  bool fail(std::string why) {
    if (error.empty()) error = std::move(why);
    return false;
  }
  bool expr(double& v) {
    if (!term(v)) return false;
    for (;;) {
      space();
      if (i >= s.size() || (s[i] != '+' && s[i] != '-')) return true;
      const char op = s[i++];
      double r;
      if (!term(r)) return false;
      v = op == '+' ? v + r : v - r;
    }
  }
  bool term(double& v) {
    if (!factor(v)) return false;
    for (;;) {
      space();
      if (i >= s.size() || (s[i] != '*' && s[i] != '/')) return true;
      const char op = s[i++];
      double r;
      if (!factor(r)) return false;
      if (op == '/' && r == 0) return fail("division by zero");
      v = op == '*' ? v * r : v / r;
    }
  }
  bool factor(double& v) {
    space();
    if (++depth > 50) return fail("parentheses nest too deep");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth};
    if (i >= s.size()) return fail("the expression ends early");
    if (s[i] == '-' || s[i] == '+') {
      const bool neg = s[i++] == '-';
      if (!factor(v)) return false;
      if (neg) v = -v;
      return true;
    }
    if (s[i] == '(') {
      ++i;
      if (!expr(v)) return false;
      space();
      if (i >= s.size() || s[i] != ')') return fail("a '(' is not closed");
      ++i;
      return true;
    }
    const size_t start = i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    if (start == i) return fail(std::string{"unexpected '"} + s[i] + "'");
    char* end = nullptr;
    const std::string num = s.substr(start, i - start);
    v = std::strtod(num.c_str(), &end);
    if (*end != 0) return fail("'" + num + "' is not a number");
    return true;
  }
};

std::string number_text(double v) {
  if (std::fabs(v) < 1e15 && v == std::floor(v)) return std::to_string(static_cast<long long>(v));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

const char* kCalculatorSystem =
    "You can use a calculator. To compute, answer with a tool call; the result comes back as a tool message. "
    "Then give the final answer as a number.";

}  // namespace

Result<double> CalculatorEnvironment::evaluate(const std::string& expression) {
  if (expression.size() > 200) return make_error(errc::invalid_argument, "the expression is longer than 200 characters");
  Calc c{expression, 0, 0, {}};
  double v = 0;
  if (!c.expr(v)) return make_error(errc::invalid_argument, c.error);
  c.space();
  if (c.i != expression.size()) return make_error(errc::invalid_argument, "unexpected '" + expression.substr(c.i, 10) + "'");
  if (!std::isfinite(v)) return make_error(errc::invalid_argument, "the result is not a finite number");
  return v;
}

Result<EpisodeStart> CalculatorEnvironment::reset(const std::map<std::string, std::string>& row) {
  auto q = row.find("question");
  auto a = row.find("answer");
  if (q == row.end() || a == row.end())
    return make_error(errc::invalid_argument, "builtin:calculator needs arithmetic rows with \"question\" and \"answer\"");
  auto final = gsm8k_final_answer(a->second);
  if (!final) return make_error(errc::invalid_argument, "builtin:calculator: the row's answer has no '#### n' final answer");
  answer_ = *final;
  EpisodeStart out;
  out.messages = json::array({{{"role", "system"}, {"content", kCalculatorSystem}}, {{"role", "user"}, {"content", q->second}}});
  out.tools = json::parse(R"([{"type": "function", "function": {"name": "calculator",
      "description": "Evaluates an arithmetic expression with + - * / and parentheses.",
      "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 12*7"}},
      "required": ["expression"]}}}])");
  return out;
}

Result<StepResult> CalculatorEnvironment::step(const AgentTurn& turn) {
  StepResult out;
  if (turn.calls.empty() && turn.errors.empty()) {
    // The final answer: its last number against the row's.
    static const std::regex number{R"(-?\d+(?:\.\d+)?)"};
    std::string last;
    for (auto it = std::sregex_iterator(turn.content.begin(), turn.content.end(), number); it != std::sregex_iterator(); ++it)
      last = it->str();
    out.done = true;
    out.reward = !last.empty() && std::fabs(std::strtod(last.c_str(), nullptr) - std::strtod(answer_.c_str(), nullptr)) < 1e-9;
    return out;
  }
  double valid = 0;
  for (const auto& e : turn.errors) out.messages.push_back({{"role", "tool"}, {"content", "error: " + e}});
  for (const auto& c : turn.calls) {
    std::string content;
    if (c.name != "calculator") {
      content = "error: no tool named '" + c.name + "'; there is calculator";
    } else if (!c.arguments.contains("expression") || !c.arguments["expression"].is_string()) {
      content = "error: calculator takes {\"expression\": \"...\"}";
    } else {
      auto v = evaluate(c.arguments["expression"].get<std::string>());
      if (v) {
        content = number_text(*v);
        valid += 1;
      } else {
        content = "error: " + context_of(v.error());
      }
    }
    out.messages.push_back({{"role", "tool"}, {"name", "calculator"}, {"content", content}});
  }
  out.metrics = {{"tool_calls", static_cast<double>(turn.calls.size() + turn.errors.size())}, {"tool_calls_valid", valid}};
  return out;
}

std::vector<Row> calculator_rows(const std::vector<Row>& arithmetic, double tool_share, uint64_t seed) {
  std::vector<Row> out;
  std::mt19937_64 rng{seed};
  std::uniform_real_distribution<double> draw{0.0, 1.0};
  for (const auto& r : arithmetic) {
    auto q = r.fields.find("question");
    auto a = r.fields.find("answer");
    if (q == r.fields.end() || a == r.fields.end()) continue;
    const std::string& question = q->second;
    if (question.rfind("What is ", 0) != 0 || question.size() < 10 || question.back() != '?') continue;
    const std::string expression = question.substr(8, question.size() - 9);
    auto value = CalculatorEnvironment::evaluate(expression);
    auto final = gsm8k_final_answer(a->second);
    if (!value || !final) continue;
    CalculatorEnvironment env;
    auto start = env.reset(r.fields);
    if (!start) continue;
    Row row;
    row.origin = r.origin;
    row.fields = {{"question", question}, {"answer", a->second}};
    row.tools = start->tools.dump();
    for (const auto& m : start->messages) row.messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    if (draw(rng) < tool_share) {
      json calls = json::array({{{"type", "function"},
                                 {"function", {{"name", "calculator"}, {"arguments", {{"expression", expression}}}}}}});
      row.messages.push_back({"assistant", "", json{{"tool_calls", calls}}.dump()});
      row.messages.push_back({"tool", number_text(*value), json{{"name", "calculator"}}.dump()});
      row.messages.push_back({"assistant", "#### " + *final});
    } else {
      row.messages.push_back({"assistant", a->second});
    }
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace glint::components::rl
