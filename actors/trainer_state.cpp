#include "actors/trainer_state.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace glint::actors {

namespace {

using json = nlohmann::json;

// Reads field `key` of object `j` into `out` when present (and not null for
// optional fields): "" when it is well-typed, else what is wrong with it.
template <class T>
std::string read(const json& j, const char* key, T& out, bool required) {
  auto it = j.find(key);
  if (it == j.end()) return required ? std::string{"lacks '"} + key + "'" : "";
  bool ok = false;
  if constexpr (std::is_same_v<T, std::string>) ok = it->is_string();
  else if constexpr (std::is_same_v<T, uint64_t>) ok = it->is_number_unsigned();
  else ok = it->is_number_integer() && (!it->is_number_unsigned() || it->get<uint64_t>() <= INT64_MAX);
  if (!ok) return std::string{"has '"} + key + "' = " + it->dump() + ", not " +
                  (std::is_same_v<T, std::string> ? "a string"
                   : std::is_same_v<T, uint64_t>  ? "a non-negative integer"
                                                  : "an integer");
  out = it->get<T>();
  return {};
}

}  // namespace

std::string trainer_state_json(const TrainerState& s, const std::string& summary, int64_t saved_ms) {
  // nlohmann writes a NaN or an infinity as null; parse reads null as NaN.
  return json{{"step", s.step},
              {"consumed_samples", s.consumed_samples},
              {"gradient_accumulation", s.gradient_accumulation},
              {"seed", s.seed},
              {"phase", s.phase},
              {"loader", {{"seed", s.loader.seed}, {"epoch", s.loader.epoch}, {"position", s.loader.position}}},
              {"metrics", s.metrics},
              {"train_configs", s.train_configs},
              {"summary", summary},
              {"saved_ms", saved_ms}}
      .dump(2);
}

Result<TrainerState> parse_trainer_state(std::string_view text, const std::string& origin) {
  auto j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_argument, origin + " is not a trainer state");
  TrainerState s;
  std::string why;
  auto field = [&](const json& o, const char* key, auto& out, bool required) {
    if (why.empty()) why = read(o, key, out, required);
  };
  field(j, "step", s.step, true);
  field(j, "consumed_samples", s.consumed_samples, false);
  field(j, "gradient_accumulation", s.gradient_accumulation, false);
  field(j, "seed", s.seed, false);
  field(j, "phase", s.phase, false);
  field(j, "train_configs", s.train_configs, false);
  if (why.empty()) {
    auto l = j.find("loader");
    if (l == j.end() || !l->is_object()) {
      why = "lacks a 'loader' object";
    } else {
      field(*l, "seed", s.loader.seed, true);
      field(*l, "epoch", s.loader.epoch, true);
      field(*l, "position", s.loader.position, true);
      if (!why.empty()) why = "'loader' " + why;
    }
  }
  if (auto m = j.find("metrics"); why.empty() && m != j.end()) {
    if (!m->is_object()) why = "has 'metrics' = " + m->dump() + ", not an object";
    for (auto it = m->begin(); why.empty() && it != m->end(); ++it) {
      if (it->is_null()) s.metrics[it.key()] = std::numeric_limits<double>::quiet_NaN();  // written for NaN
      else if (it->is_number()) s.metrics[it.key()] = it->get<double>();
      else why = "has metric '" + it.key() + "' = " + it->dump() + ", not a number";
    }
  }
  if (!why.empty()) return make_error(errc::invalid_argument, origin + " " + why);
  return s;
}

Result<CheckpointSummary> parse_checkpoint_summary(std::string_view text, const std::string& origin) {
  auto j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_argument, origin + " is not a trainer state");
  CheckpointSummary c;
  std::string why = read(j, "step", c.step, true);
  if (why.empty()) why = read(j, "saved_ms", c.saved_ms, false);
  if (why.empty()) why = read(j, "summary", c.summary, false);
  if (!why.empty()) return make_error(errc::invalid_argument, origin + " " + why);
  return c;
}

}  // namespace glint::actors
