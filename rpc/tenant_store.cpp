#include "rpc/tenant_store.hpp"

#include "components/checkpoint/atomic_dir.hpp"

#include <nlohmann/json.hpp>
#include <rocksdb/db.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <mutex>

namespace glint::rpc {

namespace fs = std::filesystem;

struct TenantStore::Impl {
  std::string state_dir;
  std::unique_ptr<rocksdb::DB> db;
  mutable std::mutex mx;
};

namespace {

std::string key_of(const std::string& tenant, const std::string& name) { return "ckpt/" + tenant + "/" + name; }

caf::error from_status(const rocksdb::Status& s, const std::string& what) {
  return make_error(s.IsCorruption() ? errc::internal : errc::unavailable, what + ": " + s.ToString());
}

std::string json_of(const CheckpointInfo& c) {
  return nlohmann::json{{"adapter", c.adapter}, {"created_ms", c.created_ms}, {"with_optimizer", c.with_optimizer}}
      .dump();
}

CheckpointInfo info_of(const std::string& name, const std::string& value) {
  CheckpointInfo c{.name = name};
  auto j = nlohmann::json::parse(value, nullptr, false);
  if (!j.is_object()) return c;
  if (j["adapter"].is_string()) c.adapter = j["adapter"];
  if (j["created_ms"].is_number_integer()) c.created_ms = j["created_ms"];
  if (j["with_optimizer"].is_boolean()) c.with_optimizer = j["with_optimizer"];
  return c;
}

}  // namespace

TenantStore::~TenantStore() = default;

std::string TenantStore::checkpoint_dir(const std::string& tenant, const std::string& name) const {
  return (fs::path{impl_->state_dir} / "checkpoints" / tenant / name).string();
}

Result<std::unique_ptr<TenantStore>> TenantStore::open(const std::string& state_dir) {
  std::unique_ptr<TenantStore> store{new TenantStore()};
  store->impl_ = std::make_unique<Impl>();
  store->impl_->state_dir = state_dir;
  std::error_code ec;
  fs::create_directories(fs::path{state_dir} / "checkpoints", ec);
  if (ec) return make_error(errc::unavailable, "cannot create " + state_dir + "/checkpoints: " + ec.message());
  rocksdb::Options o;
  o.create_if_missing = true;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  o.keep_log_file_num = 2;
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  rocksdb::DB* db = nullptr;
  auto path = (fs::path{state_dir} / "tenants").string();
  auto s = rocksdb::DB::Open(o, path, &db);
  if (!s.ok())
    return make_error(errc::unavailable, "cannot open the tenant index " + path + " (is another glint serve using " +
                                             state_dir + "?): " + s.ToString());
  store->impl_->db.reset(db);

  // Reconcile the index with the directories.
  std::vector<std::string> stale;
  std::unique_ptr<rocksdb::Iterator> it{db->NewIterator(rocksdb::ReadOptions{})};
  for (it->Seek("ckpt/"); it->Valid() && it->key().starts_with("ckpt/"); it->Next()) {
    auto rest = it->key().ToString().substr(5);
    auto slash = rest.find('/');
    if (slash == std::string::npos) {
      stale.push_back(it->key().ToString());
      continue;
    }
    auto dir = store->checkpoint_dir(rest.substr(0, slash), rest.substr(slash + 1));
    if (!components::verify_dir(dir, components::Verify::sizes)) stale.push_back(it->key().ToString());
  }
  it.reset();
  rocksdb::WriteOptions w;
  w.sync = true;
  for (const auto& k : stale)
    if (auto st = db->Delete(w, k); !st.ok()) return from_status(st, "reconciling the tenant index");
  for (const auto& tenant_dir : fs::directory_iterator(fs::path{state_dir} / "checkpoints", ec)) {
    if (!tenant_dir.is_directory()) continue;
    components::remove_temporaries(tenant_dir.path().string());
    for (const auto& c : fs::directory_iterator(tenant_dir.path(), ec)) {
      auto tenant = tenant_dir.path().filename().string(), name = c.path().filename().string();
      if (name.starts_with(".")) {  // a deletion a killed server did not finish
        fs::remove_all(c.path(), ec);
        continue;
      }
      std::string value;
      if (db->Get(rocksdb::ReadOptions{}, key_of(tenant, name), &value).ok()) continue;
      if (!components::verify_dir(c.path().string(), components::Verify::sizes)) {
        fs::remove_all(c.path(), ec);  // neither committed nor indexed
        continue;
      }
      CheckpointInfo info{.name = name,
                          .created_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                            fs::last_write_time(c.path(), ec).time_since_epoch())
                                            .count(),
                          .with_optimizer = fs::exists(c.path() / "optimizer.safetensors")};
      if (auto st = db->Put(w, key_of(tenant, name), json_of(info)); !st.ok())
        return from_status(st, "reconciling the tenant index");
    }
  }
  return store;
}

Result<void> TenantStore::add(const std::string& tenant, const CheckpointInfo& info) {
  std::lock_guard<std::mutex> guard{impl_->mx};
  rocksdb::WriteOptions w;
  w.sync = true;
  if (auto s = impl_->db->Put(w, key_of(tenant, info.name), json_of(info)); !s.ok())
    return from_status(s, "indexing checkpoint " + info.name);
  return {};
}

Result<std::vector<CheckpointInfo>> TenantStore::list(const std::string& tenant) const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  std::vector<CheckpointInfo> out;
  auto prefix = "ckpt/" + tenant + "/";
  std::unique_ptr<rocksdb::Iterator> it{impl_->db->NewIterator(rocksdb::ReadOptions{})};
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
    out.push_back(info_of(it->key().ToString().substr(prefix.size()), it->value().ToString()));
  if (!it->status().ok()) return from_status(it->status(), "reading the tenant index");
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.created_ms < b.created_ms; });
  return out;
}

Result<CheckpointInfo> TenantStore::find(const std::string& tenant, const std::string& name) const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  std::string value;
  auto s = impl_->db->Get(rocksdb::ReadOptions{}, key_of(tenant, name), &value);
  if (s.IsNotFound()) return make_error(errc::not_found, "you have no checkpoint '" + name + "'");
  if (!s.ok()) return from_status(s, "reading the tenant index");
  return info_of(name, value);
}

Result<void> TenantStore::remove(const std::string& tenant, const std::string& name) {
  if (auto found = find(tenant, name); !found) return found.error();
  std::lock_guard<std::mutex> guard{impl_->mx};
  rocksdb::WriteOptions w;
  w.sync = true;
  // Out of its name first (a hidden name is never indexed again), then out
  // of the index, then off the disk; a server killed in between finishes
  // the removal at its next open.
  std::error_code ec;
  auto dir = fs::path{checkpoint_dir(tenant, name)};
  auto doomed = dir.parent_path() / ("." + name + ".deleted");
  fs::remove_all(doomed, ec);
  fs::rename(dir, doomed, ec);
  if (ec) return make_error(errc::unavailable, "cannot delete checkpoint " + name + ": " + ec.message());
  if (auto s = impl_->db->Delete(w, key_of(tenant, name)); !s.ok()) return from_status(s, "deleting " + name);
  fs::remove_all(doomed, ec);
  return {};
}

}  // namespace glint::rpc
