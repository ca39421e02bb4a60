#pragma once
/// DeviceGroup and DeviceMesh: how many devices a component gets, and how its
/// ranks are arranged for parallelism (the ideas users know from Twinkle).
///
/// Mesh layout: dimensions from outermost to innermost are pp, dp, fsdp, ep,
/// cp, tp, so tp neighbours have consecutive ranks (they talk the most). The
/// data-parallel coordinate of a rank, used by Dispatch::slice_dp, combines dp,
/// fsdp and ep (all consume different data): data_rank = (dp * fsdp_size +
/// fsdp) * ep_size + ep.

#include "runtime/error.hpp"

#include <caf/meta/type_name.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace glint::placement {

enum class DeviceType : uint8_t { cpu, cuda };
std::string_view to_string(DeviceType t);
Result<DeviceType> parse_device_type(std::string_view s);

/// A named set of devices. Either a count (`ranks = 4`: any four devices of
/// the type) or an explicit list of global device indices (`ranks = [4, 5]`:
/// devices numbered across nodes in node order).
struct DeviceGroup {
  std::string name;
  int count = 0;
  std::vector<int> ranks;
  DeviceType device_type = DeviceType::cpu;

  static DeviceGroup of(std::string name, int count, DeviceType type = DeviceType::cpu);
  static DeviceGroup on(std::string name, std::vector<int> devices, DeviceType type = DeviceType::cpu);

  /// Number of ranks.
  int size() const { return ranks.empty() ? count : static_cast<int>(ranks.size()); }
  Result<void> validate() const;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DeviceGroup& x) {
  return f(caf::meta::type_name("glint.device_group"), x.name, x.count, x.ranks, x.device_type);
}

enum class Dim : uint8_t { pp = 0, dp, fsdp, ep, cp, tp };
inline constexpr size_t num_dims = 6;
std::string_view to_string(Dim d);

struct MeshSizes {
  int dp = 1, fsdp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  /// 0: the product of the sizes; else it must equal that product.
  int world_size = 0;
};

using Coords = std::array<int, num_dims>;

class DeviceMesh {
public:
  DeviceMesh() = default;
  /// Validates: every size >= 1, and world_size (if given) equals their product.
  static Result<DeviceMesh> from_sizes(MeshSizes s);

  int world_size() const { return world_; }
  int size(Dim d) const { return sizes_[static_cast<size_t>(d)]; }

  /// Coordinates of `rank` (indexed by Dim); rank must be in [0, world_size).
  Result<Coords> coords(int rank) const;
  int coord(int rank, Dim d) const;
  Result<int> rank_of(const Coords& c) const;

  /// All rank sets along `d`: each holds the ranks that differ only in `d`,
  /// in coordinate order. E.g. groups(Dim::tp) are the tensor-parallel groups.
  std::vector<std::vector<int>> groups(Dim d) const;
  /// The set along `d` that contains `rank`.
  std::vector<int> group_of(int rank, Dim d) const;

  /// The sizes by Dim (RankContext::mesh), and back (every size >= 1).
  std::vector<int32_t> sizes() const;
  static Result<DeviceMesh> from_dims(const std::vector<int32_t>& sizes);
  /// A mesh from "fsdp=2,dp=2" (any of pp, dp, fsdp, ep, cp, tp, each once;
  /// the others 1): what the examples' and recipes' --mesh flag takes.
  static Result<DeviceMesh> parse(std::string_view text);

  int data_rank(int rank) const;
  int data_size() const { return size(Dim::dp) * size(Dim::fsdp) * size(Dim::ep); }

  /// "dp=2 x tp=2 (4 ranks)"; dims of size 1 are left out.
  std::string describe() const;
  /// An error when a dimension outside `built` has a size above 1: for a
  /// component that runs only those (`who`: "model group 'policy'"), so
  /// that a mesh it cannot honour is refused, not run as something else.
  Result<void> require_only(std::initializer_list<Dim> built, const std::string& who) const;

private:
  std::array<int, num_dims> sizes_{1, 1, 1, 1, 1, 1};
  int world_ = 1;
};

}  // namespace glint::placement
