#pragma once
// What `glint serve` keeps of its tenants across restarts, under its state
// directory: each tenant's checkpoints (adapters in PEFT layout, with their
// optimizer state when asked) in state/checkpoints/<tenant>/<name>/, each
// written as an AtomicDir (whole or absent, with a manifest), and indexed in
// RocksDB (state/tenants) after it is committed, so an indexed checkpoint is
// complete. Opening reconciles the two: an index entry whose directory is
// gone or fails verification is dropped, a directory nobody indexed (a
// server killed between commit and index) is indexed from its files, and the
// temporaries of killed saves are removed. One server per state directory
// (RocksDB's lock: a second gets `unavailable`). Thread-safe.

#include "runtime/error.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace glint::rpc {

struct CheckpointInfo {
  std::string name;
  std::string adapter;  ///< the adapter it was saved from
  int64_t created_ms = 0;
  bool with_optimizer = false;
  int64_t expires_ms = 0;  ///< when it is deleted (ms since the epoch); 0: never
};

class TenantStore {
public:
  static Result<std::unique_ptr<TenantStore>> open(const std::string& state_dir);
  ~TenantStore();

  /// Where a new checkpoint's directory goes (it must not exist yet).
  std::string checkpoint_dir(const std::string& tenant, const std::string& name) const;
  /// Indexes a committed checkpoint directory.
  Result<void> add(const std::string& tenant, const CheckpointInfo& info);
  /// The tenant's checkpoints, oldest first.
  Result<std::vector<CheckpointInfo>> list(const std::string& tenant) const;
  /// not_found for a name the tenant does not have.
  Result<CheckpointInfo> find(const std::string& tenant, const std::string& name) const;
  /// Forgets and deletes it; not_found for a name the tenant does not have.
  Result<void> remove(const std::string& tenant, const std::string& name);
  /// Deletes every checkpoint whose expires_ms is at or before `now_ms`,
  /// but those of tenants `busy` answers true for; answers the (tenant,
  /// name) it deleted.
  Result<std::vector<std::pair<std::string, std::string>>> remove_expired(
      int64_t now_ms, const std::function<bool(const std::string& tenant)>& busy = {});

private:
  TenantStore() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace glint::rpc
