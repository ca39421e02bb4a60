#pragma once
// The collective transport of a weight sync: the c10d group a model or
// sampler rank joins (CheckpointEngine's "collective"), made at the first
// sync, kept while its store address stays the same (actors' own; no other
// layer includes it).

#include "components/comm/process_group.hpp"

#include <memory>
#include <string>

namespace glint::actors::weight_sync {

class SyncGroup {
public:
  /// The group at host:port as `rank` of `world` (rank 0 hosts the store).
  Result<components::ProcessGroup*> join(const std::string& host, int32_t port, int rank, int world) {
    // A group that gave up on a silent rank is broken: join a new one.
    if (pg_ && port_ == port && !pg_->broken()) return pg_.get();
    pg_.reset();
    // Its own store: no other group shares the keys.
    auto pg = components::ProcessGroup::create({.store_host = host, .store_port = static_cast<uint16_t>(port),
                                                .rank = rank, .world_size = world, .prefix = "glint/sync"});
    if (!pg) return with_context(pg.error(), "joining the weight-sync group at " + host + ":" + std::to_string(port));
    pg_ = *pg;
    port_ = port;
    return pg_.get();
  }

private:
  std::shared_ptr<components::ProcessGroup> pg_;
  int32_t port_ = 0;
};

}  // namespace glint::actors::weight_sync
