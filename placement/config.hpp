#pragma once
/// Job placement config in TOML, as `glint info --config` and drivers read it:
///
///   strategy = "pack"            # or "spread"
///   allow_cpu_oversubscribe = true
///
///   [[group]]
///   name = "model"
///   ranks = 2                    # a count, or a list of device indices: [0, 1]
///   device_type = "cpu"          # or "cuda"
///   mesh = { dp = 2 }            # dp, fsdp, tp, pp, cp, ep; default: dp = ranks
///
/// Errors name the file, the line and the key.

#include "placement/plan.hpp"

#include <string>
#include <vector>

namespace glint::placement {

/// Refuses what Debian's toml++ 3.3.0 must not parse (undefined behaviour
/// on some non-ASCII bytes outside strings and comments, which TOML does not
/// allow there anyway): call it on any TOML text before toml::parse.
Result<void> check_toml_text(std::string_view toml_text, std::string_view source);

struct JobConfig {
  PlanOptions options;
  std::vector<GroupRequest> groups;

  static Result<JobConfig> parse(std::string_view toml_text, std::string_view source = "config");
  static Result<JobConfig> load(const std::string& path);
};

}  // namespace glint::placement
