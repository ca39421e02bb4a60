#include "components/store/index.hpp"

#include <nlohmann/json.hpp>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

namespace glint::components {

namespace {

// Keys: "run/<run>" -> {"created_ms"}; "ckpt/<run>/<step, 20 digits>/<name>" -> the record.
std::string run_key(const std::string& run) { return "run/" + run; }
std::string ckpt_prefix(const std::string& run) { return "ckpt/" + run + "/"; }
std::string ckpt_key(const CheckpointRecord& r) {
  char step[24];
  std::snprintf(step, sizeof step, "%020lld", static_cast<long long>(r.step));
  return ckpt_prefix(r.run) + step + "/" + r.name;
}

caf::error from_status(const rocksdb::Status& s, const std::string& what) {
  auto code = s.IsNotFound() ? errc::not_found : s.IsIOError() || s.IsBusy() || s.IsTimedOut() ? errc::unavailable
              : s.IsCorruption()                                                             ? errc::internal
                                                                                               : errc::unavailable;
  return make_error(code, what + ": " + s.ToString());
}

CheckpointRecord record_of(const std::string& value) {
  auto j = nlohmann::json::parse(value, nullptr, false);
  CheckpointRecord r;
  if (j.is_discarded()) return r;
  r.run = j.value("run", "");
  r.name = j.value("name", "");
  r.path = j.value("path", "");
  r.step = j.value("step", int64_t{0});
  r.created_ms = j.value("created_ms", int64_t{0});
  r.summary = j.value("summary", "");
  return r;
}

}  // namespace

struct RunIndex::Impl {
  std::unique_ptr<rocksdb::DB> db;
  std::string path;
};

RunIndex::RunIndex(RunIndex&&) noexcept = default;
RunIndex& RunIndex::operator=(RunIndex&&) noexcept = default;
RunIndex::~RunIndex() = default;

Result<RunIndex> RunIndex::open(const std::string& root, bool read_only) {
  auto path = (std::filesystem::path{root} / "index").string();
  rocksdb::Options o;
  o.create_if_missing = !read_only;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  o.keep_log_file_num = 2;
  if (!read_only) {
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec) return make_error(errc::unavailable, "cannot create " + root + ": " + ec.message());
  } else if (!std::filesystem::exists(path)) {
    return make_error(errc::not_found, "no run index under " + root + " (has a run saved a checkpoint there?)");
  }
  rocksdb::DB* db = nullptr;
  auto s = read_only ? rocksdb::DB::OpenForReadOnly(o, path, &db) : rocksdb::DB::Open(o, path, &db);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos)
      return make_error(errc::unavailable, "the run index " + path + " is open in another process (" + s.ToString() +
                                               "); open it read-only or wait for that run");
    return from_status(s, "opening the run index " + path);
  }
  RunIndex idx;
  idx.impl_ = std::make_unique<Impl>();
  idx.impl_->db.reset(db);
  idx.impl_->path = path;
  return idx;
}

Result<void> RunIndex::add_checkpoint(CheckpointRecord r) {
  if (r.run.empty() || r.name.empty() || r.run.find('/') != std::string::npos || r.name.find('/') != std::string::npos)
    return make_error(errc::invalid_argument, "a checkpoint needs a run and a name without '/' (got '" + r.run + "', '" +
                                                  r.name + "')");
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  if (r.created_ms == 0) r.created_ms = now;
  rocksdb::WriteBatch batch;
  std::string existing;
  if (impl_->db->Get(rocksdb::ReadOptions{}, run_key(r.run), &existing).IsNotFound())
    batch.Put(run_key(r.run), nlohmann::json{{"created_ms", now}}.dump());
  batch.Put(ckpt_key(r), nlohmann::json{{"run", r.run},
                                        {"name", r.name},
                                        {"path", r.path},
                                        {"step", r.step},
                                        {"created_ms", r.created_ms},
                                        {"summary", r.summary}}
                             .dump());
  rocksdb::WriteOptions w;
  w.sync = true;  // indexed means durable
  auto s = impl_->db->Write(w, &batch);
  if (!s.ok()) return from_status(s, "indexing checkpoint " + r.name + " of run " + r.run);
  return {};
}

Result<std::vector<CheckpointRecord>> RunIndex::checkpoints(const std::string& run) const {
  std::string meta;
  auto s = impl_->db->Get(rocksdb::ReadOptions{}, run_key(run), &meta);
  if (s.IsNotFound()) return make_error(errc::not_found, "no run '" + run + "' in " + impl_->path);
  if (!s.ok()) return from_status(s, "reading run " + run);
  std::vector<CheckpointRecord> out;
  std::unique_ptr<rocksdb::Iterator> it{impl_->db->NewIterator(rocksdb::ReadOptions{})};
  const auto prefix = ckpt_prefix(run);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
    out.push_back(record_of(it->value().ToString()));
  if (!it->status().ok()) return from_status(it->status(), "listing checkpoints of " + run);
  return out;
}

Result<std::optional<CheckpointRecord>> RunIndex::latest(const std::string& run) const {
  auto all = checkpoints(run);
  if (!all) return all.error();
  if (all->empty()) return std::optional<CheckpointRecord>{};
  // Steps are ordered by key; among equal steps, the latest created.
  auto best = all->back();
  for (const auto& r : *all)
    if (r.step == best.step && r.created_ms > best.created_ms) best = r;
  return std::optional<CheckpointRecord>{best};
}

Result<void> RunIndex::remove_run(const std::string& run) {
  auto all = checkpoints(run);
  if (!all) return code_of(all.error()) == errc::not_found ? Result<void>{} : Result<void>{all.error()};
  rocksdb::WriteBatch batch;
  for (const auto& r : *all) batch.Delete(ckpt_key(r));
  batch.Delete(run_key(run));
  rocksdb::WriteOptions w;
  w.sync = true;
  auto s = impl_->db->Write(w, &batch);
  if (!s.ok()) return from_status(s, "removing run " + run);
  return {};
}

Result<std::vector<RunRecord>> RunIndex::runs() const {
  std::vector<RunRecord> out;
  std::unique_ptr<rocksdb::Iterator> it{impl_->db->NewIterator(rocksdb::ReadOptions{})};
  for (it->Seek("run/"); it->Valid() && it->key().starts_with("run/"); it->Next()) {
    RunRecord r;
    r.run = it->key().ToString().substr(4);
    auto j = nlohmann::json::parse(it->value().ToString(), nullptr, false);
    if (!j.is_discarded()) r.created_ms = j.value("created_ms", int64_t{0});
    out.push_back(std::move(r));
  }
  if (!it->status().ok()) return from_status(it->status(), "listing runs");
  for (auto& r : out) {
    auto c = checkpoints(r.run);
    if (!c) return c.error();
    r.checkpoints = static_cast<int64_t>(c->size());
    auto l = latest(r.run);
    if (!l) return l.error();
    r.latest = *l;
  }
  return out;
}

}  // namespace glint::components
