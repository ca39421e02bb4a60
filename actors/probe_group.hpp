#pragma once
/// `ProbeGroup`: a driver's typed client of a group of probe actors
/// (actors/probe.hpp), the smallest example of a typed client: each method
/// fixes how it is spread over the ranks.
///
///   auto probes = actors::open_probe_group(rt, DeviceGroup::of("workers", 2), mesh);
///   auto total = probes->sum({1, 2, 3, 4, 5, 6}).take();   // each dp rank sums its half; added up
///
/// Used by hello_group, `glint bench actors` (what a typed call costs over
/// the raw Group call) and tests. A cheap, copyable handle; thread-safe.

#include "actors/probe.hpp"
#include "placement/device_mesh.hpp"
#include "runtime/future.hpp"
#include "runtime/group.hpp"

#include <memory>
#include <vector>

namespace glint::actors {

/// The contract of a probe group, whatever carries its calls.
class ProbeBackend {
public:
  virtual ~ProbeBackend() = default;
  virtual const GroupInfo& info() const = 0;
  virtual Future<int64_t> echo(int64_t x) = 0;
  virtual Future<int64_t> sum(const std::vector<int64_t>& xs) = 0;
  virtual Future<std::vector<ProbeInfo>> where() = 0;
};

class ProbeGroup {
public:
  explicit ProbeGroup(std::shared_ptr<ProbeBackend> backend) : backend_(std::move(backend)) {}

  /// Rank 0 answers `x` (a round trip).
  Future<int64_t> echo(int64_t x) const { return backend_->echo(x); }
  /// `xs` sliced by data-parallel rank; each rank sums its part; the parts
  /// are added up.
  Future<int64_t> sum(const std::vector<int64_t>& xs) const { return backend_->sum(xs); }
  /// Where every rank runs, in rank order.
  Future<std::vector<ProbeInfo>> where() const { return backend_->where(); }

  const GroupInfo& info() const { return backend_->info(); }

private:
  std::shared_ptr<ProbeBackend> backend_;
};

/// Places and spawns a probe group (each rank on a thread of its own, bound
/// to its cpus). Remote mode: `unimplemented`.
Result<ProbeGroup> open_probe_group(Runtime& rt, const placement::DeviceGroup& group,
                                    const placement::DeviceMesh& mesh);

/// A client over an existing CAF group of probes.
ProbeGroup probe_group_of(Group<probe_actor> group);

}  // namespace glint::actors
