#include "components/rl/rewards.hpp"

#include "runtime/text.hpp"

#include <cmath>
#include <cstdlib>

namespace glint::components::rl {

namespace {

// The content of the last \boxed{...} and where it starts, or npos.
std::pair<size_t, std::string> last_boxed(std::string_view s) {
  static constexpr std::string_view open = "\\boxed{";
  for (size_t at = s.rfind(open); at != std::string_view::npos; at = at == 0 ? std::string_view::npos : s.rfind(open, at - 1)) {
    int depth = 1;
    size_t i = at + open.size();
    for (; i < s.size() && depth > 0; ++i) {
      if (s[i] == '{') ++depth;
      else if (s[i] == '}') --depth;
    }
    if (depth == 0) return {at, std::string{s.substr(at + open.size(), i - 1 - at - open.size())}};
  }
  return {std::string_view::npos, {}};
}

// The text after the last "####" up to the end of its line, or npos.
std::pair<size_t, std::string> last_hashes(std::string_view s) {
  auto at = s.rfind("####");
  if (at == std::string_view::npos) return {std::string_view::npos, {}};
  auto rest = s.substr(at + 4);
  rest = rest.substr(0, rest.find('\n'));
  return {at, std::string{trim(rest)}};
}

}  // namespace

std::optional<std::string> extract_final_answer(std::string_view completion) {
  auto [b_at, boxed] = last_boxed(completion);
  auto [h_at, hashes] = last_hashes(completion);
  if (b_at == std::string_view::npos && h_at == std::string_view::npos) return std::nullopt;
  if (h_at == std::string_view::npos || (b_at != std::string_view::npos && b_at > h_at)) return std::string{trim(boxed)};
  return hashes;
}

std::optional<double> parse_number(std::string_view text) {
  std::string s;
  for (char c : trim(text))
    if (c != ',' && c != '$' && c != ' ') s.push_back(c);
  while (!s.empty() && (s.back() == '.' || s.back() == '%')) s.pop_back();
  if (s.empty()) return std::nullopt;
  auto number = [](const std::string& t) -> std::optional<double> {
    if (t.empty()) return std::nullopt;
    char* end = nullptr;
    double v = std::strtod(t.c_str(), &end);
    // strtod also reads "inf", "nan" and hex: refuse them.
    if (end != t.c_str() + t.size() || !std::isfinite(v)) return std::nullopt;
    for (char c : t)
      if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '+')) return std::nullopt;
    return v;
  };
  if (auto slash = s.find('/'); slash != std::string::npos) {
    auto n = number(s.substr(0, slash)), d = number(s.substr(slash + 1));
    if (!n || !d || *d == 0) return std::nullopt;
    return *n / *d;
  }
  return number(s);
}

Result<std::vector<double>> gsm8k_accuracy(std::span<const std::string> completions,
                                           std::span<const std::string> solutions, double tolerance) {
  if (completions.size() != solutions.size())
    return make_error(errc::invalid_argument, std::to_string(completions.size()) + " completions but " +
                                                  std::to_string(solutions.size()) + " solutions");
  std::vector<double> out(completions.size(), 0.0);
  for (size_t i = 0; i < completions.size(); ++i) {
    auto answer = extract_final_answer(completions[i]);
    if (!answer) continue;
    auto got = parse_number(*answer), want = parse_number(solutions[i]);
    if (got && want) out[i] = std::abs(*got - *want) <= tolerance * std::max(1.0, std::abs(*want)) ? 1.0 : 0.0;
    else if (!got && !want) out[i] = trim(*answer) == trim(solutions[i]) ? 1.0 : 0.0;
  }
  return out;
}

std::vector<double> gsm8k_format(std::span<const std::string> completions) {
  std::vector<double> out(completions.size(), 0.0);
  for (size_t i = 0; i < completions.size(); ++i) {
    std::string_view c = trim(completions[i]);
    for (std::string_view eot : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>"})
      if (c.size() >= eot.size() && c.substr(c.size() - eot.size()) == eot) c = trim(c.substr(0, c.size() - eot.size()));
    if (c.empty()) continue;
    auto line_start = c.rfind('\n');
    auto last_line = trim(line_start == std::string_view::npos ? c : c.substr(line_start + 1));
    bool hashes = last_line.substr(0, 4) == "####" && parse_number(last_line.substr(4)).has_value();
    auto [b_at, boxed] = last_boxed(c);
    bool boxed_ok = b_at != std::string_view::npos && parse_number(boxed).has_value() &&
                    trim(c.substr(b_at)).size() <= boxed.size() + 10;  // \boxed{...} closes the text (a "." or "$" may follow)
    out[i] = hashes || boxed_ok ? 1.0 : 0.0;
  }
  return out;
}

Result<Scale> parse_scale(std::string_view name) {
  if (name == "group") return Scale::group;
  if (name == "batch") return Scale::batch;
  if (name == "none") return Scale::none;
  return make_error(errc::invalid_argument, "unknown advantage scale '" + std::string{name} + "'; use group, batch or none");
}

Result<std::vector<double>> advantages(std::span<const double> rewards, const AdvantageOptions& o) {
  const auto n = static_cast<int64_t>(rewards.size());
  const int64_t g = o.group_size;
  if (g < 1 || (o.leave_one_out && g < 2))
    return make_error(errc::invalid_argument, "group_size " + std::to_string(g) + " is too small" +
                                                  (o.leave_one_out ? " for leave-one-out (RLOO needs 2 or more)" : ""));
  if (n % g != 0)
    return make_error(errc::invalid_argument, std::to_string(n) + " rewards do not make groups of " + std::to_string(g));
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(rewards[static_cast<size_t>(i)]))
      return make_error(errc::invalid_argument, "reward " + std::to_string(i) + " is not finite");
  auto sample_std = [](std::span<const double> r, double mean) {
    if (r.size() < 2) return 0.0;
    double ss = 0;
    for (double x : r) ss += (x - mean) * (x - mean);
    return std::sqrt(ss / static_cast<double>(r.size() - 1));
  };
  auto mean_of = [](std::span<const double> r) {
    double s = 0;
    for (double x : r) s += x;
    return r.empty() ? 0.0 : s / static_cast<double>(r.size());
  };
  const double batch_std = sample_std(rewards, mean_of(rewards));
  std::vector<double> out(rewards.size());
  for (int64_t k = 0; k < n / g; ++k) {
    auto group = rewards.subspan(static_cast<size_t>(k * g), static_cast<size_t>(g));
    const double mean = mean_of(group);
    const double std = o.scale == Scale::group ? sample_std(group, mean) : batch_std;
    for (int64_t j = 0; j < g; ++j) {
      const double r = group[static_cast<size_t>(j)];
      double a;
      if (o.leave_one_out) a = (r - mean) * static_cast<double>(g) / static_cast<double>(g - 1);
      else if (o.scale == Scale::none) a = r - mean;
      else a = r == mean ? 0.0 : (r - mean) / (std + o.eps);  // an all-equal group teaches nothing, even with eps 0
      out[static_cast<size_t>(k * g + j)] = a;
    }
  }
  return out;
}

}  // namespace glint::components::rl
