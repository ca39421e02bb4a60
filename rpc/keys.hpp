#pragma once
// API keys of a `glint serve` deployment, kept in RocksDB under the server's
// state directory (state/keys). A key is shown once, when it is made; the
// store keeps only a random salt and SHA-256(salt || key), so a copy of
// the store gives no key away. Keys hold 192 random bits, so a salted
// hash suffices (a slow KDF protects guessable passwords, not these).
//
// Writers: the `glint serve keys` commands, which open the store for a
// moment (RocksDB's lock makes them wait for each other, not for the
// server). The server only reads: it re-reads the store when the
// generation file next to it changes, which every write updates, and it
// checks that file before each call, so a revoked key stops working at the
// next call. Thread-safe.

#include "runtime/error.hpp"

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace glint::rpc {

struct KeyRecord {
  std::string id;      ///< the public part of the key (16 hex digits), shown by `list`
  std::string tenant;  ///< whose key it is
  int64_t created_ms = 0;
  bool revoked = false;
};

/// Key format: "tml-" + 16 hex digits of id + 48 hex digits of secret (the
/// "tml-" prefix is the shape Tinker clients require).
inline constexpr size_t key_length = 4 + 16 + 48;

class KeyStore {
public:
  /// Creates a key for `tenant` (1-64 bytes of [A-Za-z0-9._-]); answers the
  /// whole key, the only time it exists outside the caller.
  static Result<std::string> create(const std::string& state_dir, const std::string& tenant);
  /// Every key, revoked ones included, by tenant then creation.
  static Result<std::vector<KeyRecord>> list(const std::string& state_dir);
  /// Revokes key `id` (or a whole key); not_found for an unknown one.
  static Result<KeyRecord> revoke(const std::string& state_dir, const std::string& id_or_key);

  /// The server's reader of the store (created empty when absent).
  static Result<std::unique_ptr<KeyStore>> open_reader(const std::string& state_dir);
  /// The tenant of a valid, unrevoked key; permission_denied otherwise,
  /// with the same message whatever was wrong. Re-reads the store first
  /// when a writer changed it.
  Result<std::string> authenticate(const std::string& key);
  /// Whether key `id` is still valid, for each call of an open session:
  /// permission_denied once it is revoked, unavailable when the store
  /// cannot be read (which is not a revocation).
  Result<void> check(const std::string& id);
  /// The id part of a well-formed key; empty otherwise.
  static std::string id_of(const std::string& key);

  ~KeyStore();

private:
  KeyStore() = default;
  Result<void> reload_if_changed();
  struct Entry {
    KeyRecord record;
    std::string salt, hash;  ///< raw bytes
  };
  std::string dir_;
  std::mutex mx_;
  std::string generation_;  ///< the generation file's content when last read
  std::chrono::steady_clock::time_point checked_{};
  std::map<std::string, Entry> keys_;
};

}  // namespace glint::rpc
