#include "components/store/kv_store.hpp"

#include <rocksdb/db.h>

#include <thread>

namespace glint::components {

struct KvStore::Impl {
  std::unique_ptr<rocksdb::DB> db;
  std::string path;
};

namespace {
caf::error from_status(const rocksdb::Status& s, const std::string& what) {
  return make_error(s.IsCorruption() ? errc::internal : errc::unavailable, what + ": " + s.ToString());
}
}  // namespace

KvStore::~KvStore() = default;

Result<std::unique_ptr<KvStore>> KvStore::open(const std::string& path, Options options) {
  rocksdb::Options o;
  o.create_if_missing = !options.read_only;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  o.keep_log_file_num = 2;
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  const auto until = std::chrono::steady_clock::now() + options.lock_wait;
  rocksdb::Status s;
  for (;;) {
    rocksdb::DB* db = nullptr;
    s = options.read_only ? rocksdb::DB::OpenForReadOnly(o, path, &db) : rocksdb::DB::Open(o, path, &db);
    if (s.ok()) {
      std::unique_ptr<KvStore> store{new KvStore()};
      store->impl_ = std::make_unique<Impl>();
      store->impl_->db.reset(db);
      store->impl_->path = path;
      return store;
    }
    // Another writer holds the lock (an I/O error on LOCK): wait for it.
    if (options.read_only || !s.IsIOError() || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return from_status(s, "cannot open " + path);
}

Result<std::optional<std::string>> KvStore::get(const std::string& key) const {
  std::string value;
  auto s = impl_->db->Get(rocksdb::ReadOptions{}, key, &value);
  if (s.IsNotFound()) return std::optional<std::string>{};
  if (!s.ok()) return from_status(s, "reading " + impl_->path);
  return std::optional<std::string>{std::move(value)};
}

Result<void> KvStore::put(const std::string& key, const std::string& value) {
  rocksdb::WriteOptions w;
  w.sync = true;
  if (auto s = impl_->db->Put(w, key, value); !s.ok()) return from_status(s, "writing " + impl_->path);
  return {};
}

Result<void> KvStore::remove(const std::string& key) {
  rocksdb::WriteOptions w;
  w.sync = true;
  if (auto s = impl_->db->Delete(w, key); !s.ok()) return from_status(s, "writing " + impl_->path);
  return {};
}

Result<std::vector<std::pair<std::string, std::string>>> KvStore::scan(const std::string& prefix) const {
  std::vector<std::pair<std::string, std::string>> out;
  std::unique_ptr<rocksdb::Iterator> it{impl_->db->NewIterator(rocksdb::ReadOptions{})};
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
    out.emplace_back(it->key().ToString(), it->value().ToString());
  if (!it->status().ok()) return from_status(it->status(), "reading " + impl_->path);
  return out;
}

}  // namespace glint::components
