#pragma once
/// `KvStore`: a small durable key-value store (RocksDB under `path`), for
/// upper layers' metadata: `glint serve`'s API keys and tenant checkpoint
/// index. Writes are synced (a put that returned survives a crash). One
/// process opens a store for writing (RocksDB's lock; `lock_wait` retries
/// while another holds it); any number may open it read-only meanwhile.
/// Thread-safe.

#include "runtime/error.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {

class KvStore {
public:
  struct Options {
    bool read_only = false;                      ///< no lock taken; never creates the store
    std::chrono::milliseconds lock_wait{0};      ///< how long a writer waits for another's lock
  };
  /// Errors: unavailable (locked by another writer past lock_wait, or
  /// unreadable), internal (corrupt).
  static Result<std::unique_ptr<KvStore>> open(const std::string& path, Options options);
  ~KvStore();

  /// nullopt for a key that is not there.
  Result<std::optional<std::string>> get(const std::string& key) const;
  Result<void> put(const std::string& key, const std::string& value);
  Result<void> remove(const std::string& key);
  /// Every entry whose key starts with `prefix`, in key order.
  Result<std::vector<std::pair<std::string, std::string>>> scan(const std::string& prefix) const;

private:
  KvStore() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace glint::components
