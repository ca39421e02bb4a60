#include "placement/device_mesh.hpp"

#include <algorithm>

#include <set>

namespace glint::placement {

std::string_view to_string(DeviceType t) { return t == DeviceType::cuda ? "cuda" : "cpu"; }

Result<DeviceType> parse_device_type(std::string_view s) {
  if (s == "cpu" || s == "CPU") return DeviceType::cpu;
  if (s == "cuda" || s == "gpu" || s == "GPU" || s == "CUDA") return DeviceType::cuda;
  return make_error(errc::invalid_argument, "unknown device type '" + std::string{s} + "'; expected cpu or cuda");
}

DeviceGroup DeviceGroup::of(std::string name, int count, DeviceType type) {
  DeviceGroup g;
  g.name = std::move(name);
  g.count = count;
  g.device_type = type;
  return g;
}

DeviceGroup DeviceGroup::on(std::string name, std::vector<int> devices, DeviceType type) {
  DeviceGroup g;
  g.name = std::move(name);
  g.ranks = std::move(devices);
  g.device_type = type;
  return g;
}

Result<void> DeviceGroup::validate() const {
  if (name.empty()) return make_error(errc::invalid_argument, "a device group needs a name");
  if (!ranks.empty() && count != 0 && count != static_cast<int>(ranks.size()))
    return make_error(errc::invalid_argument, "group '" + name + "' gives both a count (" + std::to_string(count) +
                                                  ") and a list of " + std::to_string(ranks.size()) + " devices");
  if (size() <= 0)
    return make_error(errc::invalid_argument, "group '" + name + "' has " + std::to_string(size()) +
                                                  " ranks; a group needs at least one");
  std::set<int> seen;
  for (int d : ranks) {
    if (d < 0) return make_error(errc::invalid_argument, "group '" + name + "' lists negative device " + std::to_string(d));
    if (!seen.insert(d).second)
      return make_error(errc::invalid_argument, "group '" + name + "' lists device " + std::to_string(d) + " twice");
  }
  return {};
}

std::string_view to_string(Dim d) {
  static constexpr std::string_view names[] = {"pp", "dp", "fsdp", "ep", "cp", "tp"};
  return names[static_cast<size_t>(d)];
}

Result<DeviceMesh> DeviceMesh::from_sizes(MeshSizes s) {
  DeviceMesh m;
  m.sizes_ = {s.pp, s.dp, s.fsdp, s.ep, s.cp, s.tp};
  int64_t world = 1;
  for (size_t i = 0; i < num_dims; ++i) {
    if (m.sizes_[i] < 1)
      return make_error(errc::invalid_argument, std::string{"mesh size "} + std::string{to_string(static_cast<Dim>(i))} +
                                                    "=" + std::to_string(m.sizes_[i]) + " must be at least 1");
    world *= m.sizes_[i];
    if (world > (1 << 24)) return make_error(errc::invalid_argument, "mesh has more than 16M ranks");
  }
  if (s.world_size < 0) return make_error(errc::invalid_argument, "mesh world_size must not be negative");
  if (s.world_size != 0 && s.world_size != world) {
    m.world_ = static_cast<int>(world);
    return make_error(errc::invalid_argument, "mesh " + m.describe() + " needs " + std::to_string(world) +
                                                  " ranks, but world_size is " + std::to_string(s.world_size) +
                                                  "; the sizes must multiply to the world size");
  }
  m.world_ = static_cast<int>(world);
  return m;
}

std::vector<int32_t> DeviceMesh::sizes() const { return {sizes_.begin(), sizes_.end()}; }

Result<DeviceMesh> DeviceMesh::from_dims(const std::vector<int32_t>& sizes) {
  if (sizes.size() != num_dims)
    return make_error(errc::invalid_argument, "a mesh has " + std::to_string(num_dims) +
                                                  " sizes (pp, dp, fsdp, ep, cp, tp), not " +
                                                  std::to_string(sizes.size()));
  auto at = [&](Dim d) { return static_cast<int>(sizes[static_cast<size_t>(d)]); };
  return from_sizes({.dp = at(Dim::dp), .fsdp = at(Dim::fsdp), .tp = at(Dim::tp), .pp = at(Dim::pp),
                     .cp = at(Dim::cp), .ep = at(Dim::ep)});
}

Result<DeviceMesh> DeviceMesh::parse(std::string_view text) {
  std::vector<int32_t> sizes(num_dims, 1);
  std::vector<char> named(num_dims, 0);
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument, "mesh '" + std::string{text} + "': " + why +
                                                  " (write it as dim=size,..., e.g. fsdp=2,dp=2; dims: pp, dp, fsdp, "
                                                  "ep, cp, tp)");
  };
  size_t at = 0;
  while (at <= text.size()) {
    const auto end = std::min(text.find(',', at), text.size());
    const auto part = text.substr(at, end - at);
    const auto eq = part.find('=');
    if (eq == std::string_view::npos) return bad("'" + std::string{part} + "' has no '='");
    const auto name = part.substr(0, eq), value = part.substr(eq + 1);
    size_t d = 0;
    while (d < num_dims && to_string(static_cast<Dim>(d)) != name) ++d;
    if (d == num_dims) return bad("no dimension '" + std::string{name} + "'");
    if (named[d]) return bad("'" + std::string{name} + "' is named twice");
    named[d] = 1;
    int32_t n = 0;
    if (value.empty() || value.size() > 7) return bad("'" + std::string{part} + "' needs a size from 1");
    for (char c : value) {
      if (c < '0' || c > '9') return bad("'" + std::string{part} + "' needs a size from 1");
      n = n * 10 + (c - '0');
    }
    sizes[d] = n;
    at = end + 1;
  }
  auto m = from_dims(sizes);
  if (!m) return with_context(m.error(), "mesh '" + std::string{text} + "'");
  return m;
}

Result<Coords> DeviceMesh::coords(int rank) const {
  if (rank < 0 || rank >= world_)
    return make_error(errc::invalid_argument, "rank " + std::to_string(rank) + " is outside mesh " + describe());
  Coords c{};
  int r = rank;
  for (size_t i = num_dims; i-- > 0;) {
    c[i] = r % sizes_[i];
    r /= sizes_[i];
  }
  return c;
}

int DeviceMesh::coord(int rank, Dim d) const {
  auto c = coords(rank);
  return c ? (*c)[static_cast<size_t>(d)] : -1;
}

Result<int> DeviceMesh::rank_of(const Coords& c) const {
  int r = 0;
  for (size_t i = 0; i < num_dims; ++i) {
    if (c[i] < 0 || c[i] >= sizes_[i])
      return make_error(errc::invalid_argument, std::string{"coordinate "} + std::string{to_string(static_cast<Dim>(i))} +
                                                    "=" + std::to_string(c[i]) + " is outside mesh " + describe());
    r = r * sizes_[i] + c[i];
  }
  return r;
}

std::vector<int> DeviceMesh::group_of(int rank, Dim d) const {
  auto c = coords(rank);
  if (!c) return {};
  std::vector<int> out;
  for (int k = 0; k < size(d); ++k) {
    auto x = *c;
    x[static_cast<size_t>(d)] = k;
    auto r = rank_of(x);
    if (!r) return {};  // coords of a valid rank always map back
    out.push_back(*r);
  }
  return out;
}

std::vector<std::vector<int>> DeviceMesh::groups(Dim d) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r)
    if (coord(r, d) == 0) out.push_back(group_of(r, d));
  return out;
}

int DeviceMesh::data_rank(int rank) const {
  return (coord(rank, Dim::dp) * size(Dim::fsdp) + coord(rank, Dim::fsdp)) * size(Dim::ep) + coord(rank, Dim::ep);
}

Result<void> DeviceMesh::require_only(std::initializer_list<Dim> built, const std::string& who) const {
  std::string not_built, names;
  for (size_t i = 0; i < num_dims; ++i) {
    const auto d = static_cast<Dim>(i);
    const bool ok = std::find(built.begin(), built.end(), d) != built.end();
    if (ok) names += (names.empty() ? "" : ", ") + std::string{to_string(d)};
    if (!ok && sizes_[i] > 1) not_built += (not_built.empty() ? "" : ", ") + std::string{to_string(d)};
  }
  if (not_built.empty()) return {};
  return make_error(errc::unimplemented, who + " cannot run on mesh " + describe() + ": it is built for " + names +
                                             " only, not " + not_built +
                                             " (docs/parallelism.md says what is built); give those dimensions size 1");
}

std::string DeviceMesh::describe() const {
  std::string out;
  for (size_t i = 0; i < num_dims; ++i) {
    if (sizes_[i] == 1) continue;
    if (!out.empty()) out += " x ";
    out += std::string{to_string(static_cast<Dim>(i))} + "=" + std::to_string(sizes_[i]);
  }
  if (out.empty()) out = "single rank";
  return out + " (" + std::to_string(world_) + (world_ == 1 ? " rank)" : " ranks)");
}

}  // namespace glint::placement
