#include "rpc/tenant_store.hpp"

#include "components/checkpoint/atomic_dir.hpp"
#include "components/store/kv_store.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <mutex>

namespace glint::rpc {

namespace fs = std::filesystem;

struct TenantStore::Impl {
  std::string state_dir;
  std::unique_ptr<components::KvStore> db;
  mutable std::mutex mx;
};

namespace {

std::string key_of(const std::string& tenant, const std::string& name) { return "ckpt/" + tenant + "/" + name; }

std::string json_of(const CheckpointInfo& c) {
  return nlohmann::json{{"adapter", c.adapter},
                        {"created_ms", c.created_ms},
                        {"with_optimizer", c.with_optimizer},
                        {"expires_ms", c.expires_ms}}
      .dump();
}

CheckpointInfo info_of(const std::string& name, const std::string& value) {
  CheckpointInfo c{.name = name};
  auto j = nlohmann::json::parse(value, nullptr, false);
  if (!j.is_object()) return c;
  if (j["adapter"].is_string()) c.adapter = j["adapter"];
  if (j["created_ms"].is_number_integer()) c.created_ms = j["created_ms"];
  if (j["with_optimizer"].is_boolean()) c.with_optimizer = j["with_optimizer"];
  if (j["expires_ms"].is_number_integer()) c.expires_ms = j["expires_ms"];
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
  auto path = (fs::path{state_dir} / "tenants").string();
  auto db = components::KvStore::open(path, {});
  if (!db)
    return with_context(db.error(), "the tenant index (is another glint serve using " + state_dir + "?)");
  store->impl_->db = std::move(*db);
  auto& kv = *store->impl_->db;

  // Reconcile the index with the directories: first the temporaries of
  // killed saves go (and a replaced checkpoint a killed replace left aside
  // comes back), so what the index is checked against is what stays.
  for (const auto& tenant_dir : fs::directory_iterator(fs::path{state_dir} / "checkpoints", ec))
    if (tenant_dir.is_directory()) components::remove_temporaries(tenant_dir.path().string());
  std::vector<std::string> stale;
  auto entries = kv.scan("ckpt/");
  if (!entries) return with_context(entries.error(), "reading the tenant index");
  for (const auto& [key, _] : *entries) {
    auto rest = key.substr(5);
    auto slash = rest.find('/');
    if (slash == std::string::npos) {
      stale.push_back(key);
      continue;
    }
    auto dir = store->checkpoint_dir(rest.substr(0, slash), rest.substr(slash + 1));
    if (!components::verify_dir(dir, components::Verify::sizes)) stale.push_back(key);
  }
  for (const auto& k : stale)
    if (auto ok = kv.remove(k); !ok) return with_context(ok.error(), "reconciling the tenant index");
  for (const auto& tenant_dir : fs::directory_iterator(fs::path{state_dir} / "checkpoints", ec)) {
    if (!tenant_dir.is_directory()) continue;
    for (const auto& c : fs::directory_iterator(tenant_dir.path(), ec)) {
      auto tenant = tenant_dir.path().filename().string(), name = c.path().filename().string();
      if (name.starts_with(".")) {  // a deletion a killed server did not finish
        fs::remove_all(c.path(), ec);
        continue;
      }
      auto indexed = kv.get(key_of(tenant, name));
      if (!indexed) return with_context(indexed.error(), "reconciling the tenant index");
      if (*indexed) continue;
      if (!components::verify_dir(c.path().string(), components::Verify::sizes)) {
        fs::remove_all(c.path(), ec);  // neither committed nor indexed
        continue;
      }
      CheckpointInfo info{.name = name,
                          .created_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                            fs::last_write_time(c.path(), ec).time_since_epoch())
                                            .count(),
                          .with_optimizer = fs::exists(c.path() / "optimizer.safetensors")};
      if (auto ok = kv.put(key_of(tenant, name), json_of(info)); !ok)
        return with_context(ok.error(), "reconciling the tenant index");
    }
  }
  return store;
}

Result<void> TenantStore::add(const std::string& tenant, const CheckpointInfo& info) {
  std::lock_guard<std::mutex> guard{impl_->mx};
  if (auto ok = impl_->db->put(key_of(tenant, info.name), json_of(info)); !ok)
    return with_context(ok.error(), "indexing checkpoint " + info.name);
  return {};
}

Result<std::vector<CheckpointInfo>> TenantStore::list(const std::string& tenant) const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  std::vector<CheckpointInfo> out;
  auto prefix = "ckpt/" + tenant + "/";
  auto entries = impl_->db->scan(prefix);
  if (!entries) return with_context(entries.error(), "reading the tenant index");
  for (const auto& [key, value] : *entries) out.push_back(info_of(key.substr(prefix.size()), value));
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.created_ms < b.created_ms; });
  return out;
}

Result<CheckpointInfo> TenantStore::find(const std::string& tenant, const std::string& name) const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  auto value = impl_->db->get(key_of(tenant, name));
  if (!value) return with_context(value.error(), "reading the tenant index");
  if (!*value) return make_error(errc::not_found, "you have no checkpoint '" + name + "'");
  return info_of(name, **value);
}

Result<std::vector<std::pair<std::string, std::string>>> TenantStore::remove_expired(
    int64_t now_ms, const std::function<bool(const std::string& tenant)>& busy) {
  std::vector<std::pair<std::string, std::string>> doomed;
  {
    std::lock_guard<std::mutex> guard{impl_->mx};
    auto entries = impl_->db->scan("ckpt/");
    if (!entries) return with_context(entries.error(), "reading the tenant index");
    for (const auto& [key, value] : *entries) {
      auto rest = key.substr(5);
      auto slash = rest.find('/');
      if (slash == std::string::npos) continue;
      auto info = info_of(rest.substr(slash + 1), value);
      if (info.expires_ms > 0 && info.expires_ms <= now_ms && !(busy && busy(rest.substr(0, slash))))
        doomed.emplace_back(rest.substr(0, slash), info.name);
    }
  }
  std::vector<std::pair<std::string, std::string>> removed;
  for (const auto& [tenant, name] : doomed)
    if (remove(tenant, name)) removed.emplace_back(tenant, name);
  return removed;
}

Result<void> TenantStore::remove(const std::string& tenant, const std::string& name) {
  if (auto found = find(tenant, name); !found) return found.error();
  std::lock_guard<std::mutex> guard{impl_->mx};
  // Out of its name first (a hidden name is never indexed again), then out
  // of the index, then off the disk; a server killed in between finishes
  // the removal at its next open.
  std::error_code ec;
  auto dir = fs::path{checkpoint_dir(tenant, name)};
  auto doomed = dir.parent_path() / ("." + name + ".deleted");
  fs::remove_all(doomed, ec);
  fs::rename(dir, doomed, ec);
  if (ec) return make_error(errc::unavailable, "cannot delete checkpoint " + name + ": " + ec.message());
  if (auto ok = impl_->db->remove(key_of(tenant, name)); !ok) return with_context(ok.error(), "deleting " + name);
  fs::remove_all(doomed, ec);
  return {};
}

}  // namespace glint::rpc
