#include "components/store/index.hpp"

#include "components/checkpoint/file_system.hpp"
#include "components/store/detail/rocksdb_fs.hpp"

#include <nlohmann/json.hpp>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

namespace glint::components {

namespace {

// Keys: "run/<run>" -> {"created_ms", "added"}; "ckpt/<run>/<step, 20 digits>/<name>" -> the record,
// whose "seq" is the run's "added" count when it was added (absent in indexes
// written before it existed: those order by created_ms among equal steps).
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

// Paths are stored relative to the run root when they lie under it, so a
// copied or moved root resumes from its own files.
CheckpointRecord record_of(const std::string& value, const std::filesystem::path& root) {
  auto j = nlohmann::json::parse(value, nullptr, false);
  CheckpointRecord r;
  if (j.is_discarded()) return r;
  r.run = j.value("run", "");
  r.name = j.value("name", "");
  r.path = j.value("path", "");
  if (!r.path.empty() && std::filesystem::path{r.path}.is_relative()) r.path = (root / r.path).string();
  r.step = j.value("step", int64_t{0});
  r.created_ms = j.value("created_ms", int64_t{0});
  r.summary = j.value("summary", "");
  return r;
}

int64_t seq_of(const std::string& value) {
  auto j = nlohmann::json::parse(value, nullptr, false);
  return j.is_object() ? j.value("seq", int64_t{-1}) : -1;
}

}  // namespace

struct RunIndex::Impl {
  std::unique_ptr<rocksdb::Env> env;  ///< over a FileSystem given in the options; outlives db
  std::unique_ptr<rocksdb::DB> db;
  std::string path;
  std::filesystem::path root;  ///< absolute
  const Clock* clock = nullptr;
  std::mutex add;  ///< add_checkpoint reads and rewrites the run's counter

  // Relative to the root when under it, else absolute (a path relative to
  // the process's directory would be read back relative to the root).
  std::string stored_path(const std::string& path) const {
    auto abs = std::filesystem::absolute(path).lexically_normal();
    auto rel = abs.lexically_relative(root);
    if (rel.empty() || *rel.begin() == "..") return abs.string();
    return rel.string();
  }
};

RunIndex::RunIndex(RunIndex&&) noexcept = default;
RunIndex& RunIndex::operator=(RunIndex&&) noexcept = default;
RunIndex::~RunIndex() = default;

Result<RunIndex> RunIndex::open(const std::string& root, RunIndexOptions opts) {
  const bool read_only = opts.read_only;
  auto path = (std::filesystem::path{root} / "index").string();
  auto impl = std::make_unique<Impl>();
  impl->clock = opts.clock ? opts.clock : &real_clock();
  rocksdb::Options o;
  impl->root = std::filesystem::absolute(root).lexically_normal();
  if (opts.fs) {
    impl->env = detail::rocksdb_env_over(*opts.fs);
    o.env = impl->env.get();
  }
  // A record damaged in the middle of the log is an error, not a silent
  // truncation of everything after it (RocksDB's default point-in-time
  // recovery dropped 7 of 12 checkpoints after one flipped byte); only an
  // incomplete last record, which a crash leaves, is tolerated.
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  o.paranoid_checks = true;
  o.create_if_missing = !read_only;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  o.keep_log_file_num = 2;
  if (!read_only) {
    // RocksDB makes its directory durable inside, never in its parent: a
    // power loss after the first checkpoint could take the whole index with
    // it (the crash test found this). So the directory is made here, and
    // each directory made is synced into its parent.
    auto& fs = opts.fs ? *opts.fs : local_file_system();
    std::vector<std::filesystem::path> made;
    for (auto p = std::filesystem::path{path}.lexically_normal(); !p.empty() && !std::filesystem::exists(p);
         p = p.parent_path()) {
      made.push_back(p);
      if (p == p.parent_path()) break;
    }
    if (auto ok = fs.create_dirs(path); !ok) return with_context(ok.error(), "creating the run index");
    // Always the root, even when the directory was there: a process killed
    // between making it and syncing it left it not yet durable.
    made.push_back(std::filesystem::path{path}.lexically_normal());
    std::set<std::string> synced;
    for (const auto& p : made) {
      auto parent = (p.parent_path().empty() ? std::filesystem::path{"."} : p.parent_path()).string();
      if (!synced.insert(parent).second) continue;
      if (auto ok = fs.sync_dir(parent); !ok) return with_context(ok.error(), "creating the run index");
    }
  } else if (!std::filesystem::exists(path)) {
    return make_error(errc::not_found, "no run index under " + root + " (has a run saved a checkpoint there?)");
  }
  rocksdb::DB* db = nullptr;
  auto s = read_only ? rocksdb::DB::OpenForReadOnly(o, path, &db) : rocksdb::DB::Open(o, path, &db);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos)
      return make_error(errc::unavailable, "the run index " + path + " is open in another process (" + s.ToString() +
                                               "); open it read-only or wait for that run");
    if (s.IsCorruption())
      return make_error(errc::failed_precondition,
                        "the run index " + path + " is damaged (" + s.ToString() +
                            "); the checkpoint directories are whole and describe themselves: rebuild the index "
                            "from them with `glint runs --root " + root + " --repair`");
    return from_status(s, "opening the run index " + path);
  }
  RunIndex idx;
  idx.impl_ = std::move(impl);
  idx.impl_->db.reset(db);
  idx.impl_->path = path;
  return idx;
}

Result<void> RunIndex::add_checkpoint(CheckpointRecord r) {
  if (r.run.empty() || r.name.empty() || r.run.find('/') != std::string::npos || r.name.find('/') != std::string::npos)
    return make_error(errc::invalid_argument, "a checkpoint needs a run and a name without '/' (got '" + r.run + "', '" +
                                                  r.name + "')");
  const auto now = impl_->clock->unix_ms();
  if (r.created_ms == 0) r.created_ms = now;
  std::lock_guard<std::mutex> guard{impl_->add};
  std::string existing;
  auto got = impl_->db->Get(rocksdb::ReadOptions{}, run_key(r.run), &existing);
  if (!got.ok() && !got.IsNotFound()) return from_status(got, "reading run " + r.run);
  auto run = got.ok() ? nlohmann::json::parse(existing, nullptr, false) : nlohmann::json::object();
  if (!run.is_object()) run = nlohmann::json::object();
  if (!run.contains("created_ms")) run["created_ms"] = now;
  const int64_t seq = run.value("added", int64_t{0});
  run["added"] = seq + 1;
  rocksdb::WriteBatch batch;
  batch.Put(run_key(r.run), run.dump());
  batch.Put(ckpt_key(r), nlohmann::json{{"run", r.run},
                                        {"name", r.name},
                                        {"path", impl_->stored_path(r.path)},
                                        {"step", r.step},
                                        {"created_ms", r.created_ms},
                                        {"seq", seq},
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
    out.push_back(record_of(it->value().ToString(), impl_->root));
  if (!it->status().ok()) return from_status(it->status(), "listing checkpoints of " + run);
  return out;
}

Result<std::optional<CheckpointRecord>> RunIndex::latest(const std::string& run) const {
  std::string meta;
  auto s = impl_->db->Get(rocksdb::ReadOptions{}, run_key(run), &meta);
  if (s.IsNotFound()) return make_error(errc::not_found, "no run '" + run + "' in " + impl_->path);
  if (!s.ok()) return from_status(s, "reading run " + run);
  // Keys order by step; among equal steps, the last added (by seq, then by
  // created_ms for records older than seq).
  std::optional<CheckpointRecord> best;
  std::pair<int64_t, int64_t> best_order{};
  std::unique_ptr<rocksdb::Iterator> it{impl_->db->NewIterator(rocksdb::ReadOptions{})};
  const auto prefix = ckpt_prefix(run);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const auto value = it->value().ToString();
    auto r = record_of(value, impl_->root);
    std::pair<int64_t, int64_t> order{seq_of(value), r.created_ms};
    if (!best || r.step > best->step || (r.step == best->step && order > best_order)) {
      best = std::move(r);
      best_order = order;
    }
  }
  if (!it->status().ok()) return from_status(it->status(), "listing checkpoints of " + run);
  return best;
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

Result<void> RunIndex::remove_checkpoints(const std::string& run, const std::vector<std::string>& names) {
  auto all = checkpoints(run);
  if (!all) return all.error();
  rocksdb::WriteBatch batch;
  for (const auto& r : *all)
    if (std::find(names.begin(), names.end(), r.name) != names.end()) batch.Delete(ckpt_key(r));
  rocksdb::WriteOptions w;
  w.sync = true;
  if (auto st = impl_->db->Write(w, &batch); !st.ok()) return from_status(st, "forgetting checkpoints of run " + run);
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
