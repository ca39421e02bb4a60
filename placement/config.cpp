#include "placement/config.hpp"

#include <toml++/toml.h>

#include <fstream>
#include <set>
#include <sstream>

namespace glint::placement {

namespace {

// A group's ranks, and a device index: TOML integers are 64-bit, glint's
// ranks int; 4294967297 must not become 1.
constexpr int64_t kMaxGroupRanks = int64_t{1} << 16;

std::string where(std::string_view source, const toml::node& n) {
  const auto& src = n.source();
  return std::string{source} + ":" + std::to_string(src.begin.line);
}

Result<int> read_positive(const toml::table& t, const char* key, int fallback, std::string_view source) {
  auto* n = t.get(key);
  if (!n) return fallback;
  auto v = n->value<int64_t>();
  if (!v || *v < 1 || *v > (1 << 24))
    return make_error(errc::invalid_argument, where(source, *n) + ": '" + key + "' must be a positive integer");
  return static_cast<int>(*v);
}

}  // namespace

Result<JobConfig> JobConfig::parse(std::string_view text, std::string_view source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
    return make_error(errc::invalid_argument, "malformed TOML: " + msg.str());
  }
  JobConfig cfg;
  static const std::set<std::string> top_keys{"strategy", "allow_cpu_oversubscribe", "group"};
  for (auto&& [k, v] : root)
    if (!top_keys.count(std::string{k.str()}))
      return make_error(errc::invalid_argument, where(source, v) + ": unknown key '" + std::string{k.str()} +
                                                    "' (expected strategy, allow_cpu_oversubscribe, [[group]])");
  if (auto* s = root.get("strategy")) {
    auto str = s->value<std::string>();
    if (!str) return make_error(errc::invalid_argument, where(source, *s) + ": 'strategy' must be a string");
    auto st = parse_strategy(*str);
    if (!st) return with_context(st.error(), where(source, *s));
    cfg.options.strategy = *st;
  }
  if (auto* o = root.get("allow_cpu_oversubscribe")) {
    auto b = o->value<bool>();
    if (!b) return make_error(errc::invalid_argument, where(source, *o) + ": 'allow_cpu_oversubscribe' must be true or false");
    cfg.options.allow_cpu_oversubscribe = *b;
  }
  auto* groups = root.get("group");
  if (!groups) return cfg;
  auto* arr = groups->as_array();
  if (!arr) return make_error(errc::invalid_argument, where(source, *groups) + ": 'group' must be an array of tables ([[group]])");
  static const std::set<std::string> group_keys{"name", "ranks", "device_type", "mesh"};
  for (auto& node : *arr) {
    auto* t = node.as_table();
    if (!t) return make_error(errc::invalid_argument, where(source, node) + ": each [[group]] must be a table");
    for (auto&& [k, v] : *t)
      if (!group_keys.count(std::string{k.str()}))
        return make_error(errc::invalid_argument, where(source, v) + ": unknown group key '" + std::string{k.str()} +
                                                      "' (expected name, ranks, device_type, mesh)");
    GroupRequest req;
    auto name = (*t)["name"].value<std::string>();
    if (!name || name->empty())
      return make_error(errc::invalid_argument, where(source, node) + ": a group needs a non-empty 'name'");
    req.group.name = *name;
    auto* ranks = t->get("ranks");
    if (!ranks) return make_error(errc::invalid_argument, where(source, node) + ": group '" + *name + "' needs 'ranks'");
    if (auto n = ranks->value<int64_t>()) {
      if (*n < 1 || *n > kMaxGroupRanks)
        return make_error(errc::invalid_argument, where(source, *ranks) + ": group '" + *name + "' has " +
                                                      std::to_string(*n) + " ranks; a group has 1 to " +
                                                      std::to_string(kMaxGroupRanks));
      req.group.count = static_cast<int>(*n);
    } else if (auto* list = ranks->as_array()) {
      for (auto& e : *list) {
        auto d = e.value<int64_t>();
        if (!d || *d < 0 || *d >= kMaxGroupRanks)
          return make_error(errc::invalid_argument, where(source, e) + ": device indices in 'ranks' must be integers from 0 to " +
                                                        std::to_string(kMaxGroupRanks - 1));
        if (list->size() > static_cast<size_t>(kMaxGroupRanks))
          return make_error(errc::invalid_argument, where(source, *ranks) + ": more than " +
                                                        std::to_string(kMaxGroupRanks) + " ranks");
        req.group.ranks.push_back(static_cast<int>(*d));
      }
    } else {
      return make_error(errc::invalid_argument, where(source, *ranks) + ": 'ranks' must be a count or a list of device indices");
    }
    if (auto* dt = t->get("device_type")) {
      auto str = dt->value<std::string>();
      auto type = str ? parse_device_type(*str) : Result<DeviceType>{make_error(errc::invalid_argument, "not a string")};
      if (!type) return with_context(type.error(), where(source, *dt) + ": 'device_type'");
      req.group.device_type = *type;
    }
    if (auto ok = req.group.validate(); !ok) return with_context(ok.error(), where(source, node));
    MeshSizes sizes;
    sizes.dp = req.group.size();
    if (auto* m = t->get("mesh")) {
      auto* mt = m->as_table();
      if (!mt) return make_error(errc::invalid_argument, where(source, *m) + ": 'mesh' must be a table like { dp = 2 }");
      static const std::set<std::string> dims{"dp", "fsdp", "tp", "pp", "cp", "ep"};
      for (auto&& [k, v] : *mt)
        if (!dims.count(std::string{k.str()}))
          return make_error(errc::invalid_argument, where(source, v) + ": unknown mesh dimension '" + std::string{k.str()} +
                                                        "' (expected dp, fsdp, tp, pp, cp, ep)");
      MeshSizes given;
      int* fields[] = {&given.dp, &given.fsdp, &given.tp, &given.pp, &given.cp, &given.ep};
      const char* keys[] = {"dp", "fsdp", "tp", "pp", "cp", "ep"};
      for (int i = 0; i < 6; ++i) {
        auto v = read_positive(*mt, keys[i], 1, source);
        if (!v) return v.error();
        *fields[i] = *v;
      }
      sizes = given;
    }
    sizes.world_size = req.group.size();
    auto mesh = DeviceMesh::from_sizes(sizes);
    if (!mesh) return with_context(mesh.error(), where(source, node) + ": group '" + *name + "'");
    req.mesh = *mesh;
    cfg.groups.push_back(std::move(req));
  }
  return cfg;
}

Result<JobConfig> JobConfig::load(const std::string& path) {
  std::ifstream in{path};
  if (!in) return make_error(errc::not_found, "cannot read config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

}  // namespace glint::placement
