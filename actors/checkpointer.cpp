#include "actors/checkpointer.hpp"

#include "components/checkpoint/atomic_dir.hpp"
#include "components/store/index.hpp"
#include "runtime/clock.hpp"
#include "runtime/file.hpp"
#include "runtime/log.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

namespace glint::actors {

namespace fs = std::filesystem;

namespace {

constexpr const char* kState = "trainer_state.json";

constexpr const char* kResetMarker = ".reset";

// The subdirectories of a run directory that are checkpoints (they have a
// manifest), by name; temporaries, abandoned branches and other files are not.
std::vector<std::string> checkpoint_dirs(const std::string& run_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(run_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.empty() || name[0] == '.' || !it->is_directory()) continue;
    if (fs::exists(it->path() / "manifest.json")) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What a checkpoint directory says of itself, for its index entry.
Result<components::CheckpointRecord> describe_dir(const std::string& run, const std::string& name,
                                                  const std::string& dir) {
  if (auto ok = components::verify_dir(dir, components::Verify::sizes); !ok) return ok.error();
  const auto path = dir + "/" + kState;
  auto text = read_text_file(path);
  if (!text) return make_error(errc::invalid_argument, path + " is missing");
  auto c = parse_checkpoint_summary(*text, path);
  if (!c) return c.error();
  return components::CheckpointRecord{.run = run,
                                      .name = name,
                                      .path = dir,
                                      .step = c->step,
                                      .created_ms = c->saved_ms,
                                      .summary = std::move(c->summary)};
}

// Indexes the whole checkpoint directories of `run_dir` that `known` lacks,
// oldest step first; the others go to `damaged` as "name: why".
Result<std::vector<std::string>> adopt(components::RunIndex& index, const std::string& run, const std::string& run_dir,
                                       const std::set<std::string>& known, std::vector<std::string>& damaged) {
  std::vector<components::CheckpointRecord> found;
  for (const auto& name : checkpoint_dirs(run_dir)) {
    if (known.contains(name)) continue;
    auto r = describe_dir(run, name, run_dir + "/" + name);
    if (!r) {
      damaged.push_back(name + ": " + describe(r.error()));
      continue;
    }
    found.push_back(std::move(*r));
  }
  // In the order they were saved, so that "latest" among equal steps is
  // the one saved last.
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return std::pair{a.step, a.created_ms} < std::pair{b.step, b.created_ms};
  });
  std::vector<std::string> adopted;
  for (auto& r : found) {
    adopted.push_back(r.name);
    if (auto ok = index.add_checkpoint(std::move(r)); !ok) return ok.error();
  }
  return adopted;
}

}  // namespace

Checkpointer::Checkpointer(Checkpointer&&) noexcept = default;
Checkpointer& Checkpointer::operator=(Checkpointer&&) noexcept = default;
Checkpointer::~Checkpointer() = default;

Result<Checkpointer> Checkpointer::open(const std::string& root, const std::string& run, components::FileSystem* fs) {
  if (run.empty() || run.find('/') != std::string::npos || run[0] == '.' || run == "index")
    return make_error(errc::invalid_argument, "run name '" + run +
                                                  "' must be non-empty, without '/', not start with '.' and not be "
                                                  "'index' (the run index's own directory)");
  auto idx = components::RunIndex::open(root, {.fs = fs});
  if (!idx) return idx.error();
  Checkpointer c;
  c.root_ = fs::absolute(root).string();
  c.run_ = run;
  c.fs_ = fs ? fs : &components::local_file_system();
  c.index_ = std::make_unique<components::RunIndex>(std::move(*idx));
  components::remove_temporaries(c.run_dir(), *c.fs_);  // of saves a killed process left
  if (fs::exists(c.run_dir() + "/" + kResetMarker)) {
    if (auto ok = c.finish_reset(); !ok) return with_context(ok.error(), "finishing the reset of run " + run);
    c.reconciled_.finished_reset = true;
  }
  if (auto ok = c.reconcile(); !ok) return with_context(ok.error(), "reconciling run " + run + " with its index");
  const auto& r = c.reconciled_;
  auto names = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& n : v) out += (out.empty() ? "" : ", ") + n;
    return out;
  };
  if (r.finished_reset) log::warn("run " + run + ": finished a reset that a killed process had begun");
  if (!r.adopted.empty())
    log::warn("run " + run + ": indexed whole checkpoints the index lacked (a process killed after saving them): " +
              names(r.adopted));
  if (!r.forgotten.empty())
    log::warn("run " + run + ": forgot index entries whose directories are gone: " + names(r.forgotten));
  for (const auto& d : r.damaged)
    log::warn("run " + run + ": damaged checkpoint, not resumable (kept on disk): " + d);
  return c;
}

Result<void> Checkpointer::reconcile() {
  std::set<std::string> known;
  std::vector<std::string> forget;
  auto indexed = index_->checkpoints(run_);
  if (!indexed && code_of(indexed.error()) != errc::not_found) return indexed.error();
  if (indexed) {
    std::vector<components::CheckpointRecord> moved;
    for (const auto& c : *indexed) {
      known.insert(c.name);
      // An entry an older glint stored as an absolute path into another
      // root (this root was copied): the copy's own directory wins.
      const auto own = run_dir() + "/" + c.name;
      if (fs::path{c.path}.lexically_normal() != fs::path{own}.lexically_normal() && fs::exists(own)) {
        auto r = c;
        r.path = own;
        moved.push_back(std::move(r));
        forget.push_back(c.name);
        continue;
      }
      if (!fs::exists(c.path)) {
        forget.push_back(c.name);
        reconciled_.forgotten.push_back(c.name);
      } else if (auto ok = components::verify_dir(c.path, components::Verify::sizes); !ok) {
        forget.push_back(c.name);
        reconciled_.damaged.push_back(c.name + ": " + describe(ok.error()));
      }
    }
    if (!forget.empty())
      if (auto ok = index_->remove_checkpoints(run_, forget); !ok) return ok;
    for (auto& r : moved)
      if (auto ok = index_->add_checkpoint(std::move(r)); !ok) return ok;
  }
  auto adopted = adopt(*index_, run_, run_dir(), known, reconciled_.damaged);
  if (!adopted) return adopted.error();
  reconciled_.adopted = std::move(*adopted);
  return {};
}

Result<RepairReport> Checkpointer::repair(const std::string& root) {
  RepairReport report;
  const auto index_dir = root + "/index";
  if (fs::exists(index_dir)) {
    // A run writing to the index would go on writing into the new one:
    // refuse while another process holds it (RocksDB's lock says so).
    if (auto probe = components::RunIndex::open(root); !probe && code_of(probe.error()) == errc::unavailable)
      return with_context(probe.error(), "repairing the run index");
    report.set_aside = index_dir + ".damaged-" + std::to_string(real_clock().unix_ms());
    std::error_code ec;
    fs::rename(index_dir, report.set_aside, ec);
    if (ec) return make_error(errc::unavailable, "cannot set the index " + index_dir + " aside: " + ec.message());
  }
  auto idx = components::RunIndex::open(root);
  if (!idx) return idx.error();
  std::error_code ec;
  std::vector<std::string> runs;
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (it->is_directory() && !name.empty() && name[0] != '.' && name != "index" && name.rfind("index.damaged-", 0) != 0)
      runs.push_back(name);
  }
  std::sort(runs.begin(), runs.end());
  for (const auto& run : runs) {
    std::vector<std::string> damaged;
    auto adopted = adopt(*idx, run, root + "/" + run, {}, damaged);
    if (!adopted) return adopted.error();
    for (auto& d : damaged) report.damaged.push_back(run + "/" + d);
    if (adopted->empty()) continue;
    ++report.runs;
    report.checkpoints += static_cast<int64_t>(adopted->size());
  }
  return report;
}

Result<std::vector<std::string>> Checkpointer::list() const {
  auto all = index_->checkpoints(run_);
  if (!all) {
    if (code_of(all.error()) == errc::not_found) return std::vector<std::string>{};
    return all.error();
  }
  std::vector<std::string> names;
  for (const auto& c : *all) names.push_back(c.name);
  return names;
}

Result<void> Checkpointer::reset() {
  // One durable decision first: once the marker is on disk, the reset
  // happens, now or, if this process dies, at the next open().
  if (fs::exists(run_dir())) {
    const auto marker = run_dir() + "/" + kResetMarker;
    if (auto ok = fs_->write_file(marker, "reset in progress\n"); !ok) return ok;
    if (auto ok = fs_->sync_file(marker); !ok) return ok;
    if (auto ok = fs_->sync_dir(run_dir()); !ok) return ok;
  }
  return finish_reset();
}

Result<void> Checkpointer::finish_reset() {
  if (auto ok = index_->remove_run(run_); !ok) return ok;
  std::error_code ec;
  std::vector<std::string> doomed;
  for (auto it = fs::directory_iterator(run_dir(), ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (it->is_directory() && (fs::exists(it->path() / "manifest.json") || name.rfind("abandoned-", 0) == 0 ||
                               name.rfind("damaged-", 0) == 0))
      doomed.push_back(it->path().string());
  }
  // Each is renamed to a temporary name first (remove_temporaries clears
  // those at the next open), so a kill midway through deleting one cannot
  // leave a half-deleted directory that still looks like a checkpoint.
  for (const auto& d : doomed) {
    const auto p = fs::path{d};
    const auto trash = (p.parent_path() / ("." + p.filename().string() + ".tmp-reset")).string();
    if (auto ok = fs_->rename(d, trash); !ok) return ok;
    if (auto ok = fs_->remove_all(trash); !ok) return ok;
  }
  if (!fs::exists(run_dir())) return {};
  if (auto ok = fs_->remove_all(run_dir() + "/" + kResetMarker); !ok) return ok;
  return fs_->sync_dir(run_dir());
}

Result<void> Checkpointer::abandon_after(int64_t step) {
  auto all = index_->checkpoints(run_);
  if (!all) return all.error();
  std::vector<components::CheckpointRecord> newer;
  for (const auto& c : *all)
    if (c.step > step) newer.push_back(c);
  if (newer.empty()) return {};
  // Renamed first, then forgotten: a kill in between leaves index entries
  // without directories, which the next open() forgets.
  const auto branch = run_dir() + "/abandoned-" + std::to_string(real_clock().unix_ms());
  if (auto ok = fs_->create_dirs(branch); !ok) return ok;
  if (auto ok = fs_->sync_dir(run_dir()); !ok) return ok;
  // Newest first: a kill midway leaves the indexed checkpoints a prefix of
  // the run's history, never one with a hole in it.
  std::vector<std::string> names;
  for (auto it = newer.rbegin(); it != newer.rend(); ++it) {
    if (auto ok = fs_->rename(it->path, branch + "/" + it->name); !ok) return ok;
    names.push_back(it->name);
  }
  if (auto ok = fs_->sync_dir(branch); !ok) return ok;
  if (auto ok = fs_->sync_dir(run_dir()); !ok) return ok;
  if (auto ok = index_->remove_checkpoints(run_, names); !ok) return ok;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  log::warn("run " + run_ + " continues from step " + std::to_string(step) + "; its later checkpoints (" + list +
            ") were moved to " + branch + " (delete it when you no longer need them)");
  return {};
}

Result<void> Checkpointer::start_over(bool fresh) {
  auto earlier = list();
  if (!earlier) return earlier.error();
  if (!earlier->empty() && !fresh)
    return make_error(errc::failed_precondition,
                      "run " + run_ + " has checkpoints already (latest " + earlier->back() + ")");
  return reset();
}

Result<std::string> Checkpointer::save(const std::string& name, const ModelGroup& model, const DataLoaderGroup* loader,
                                       TrainerState state, const std::string& summary) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
    return make_error(errc::invalid_argument, "checkpoint name '" + name + "' must be non-empty, without '/'");
  const auto final_path = run_dir() + "/" + name;
  if (fs::exists(final_path)) {
    // A directory under this name that the index does not hold (open()
    // adopts the whole ones) is damaged or foreign: kept, moved aside.
    auto listed = list();
    if (!listed) return listed.error();
    if (std::find(listed->begin(), listed->end(), name) == listed->end()) {
      const auto aside = run_dir() + "/damaged-" + std::to_string(real_clock().unix_ms());
      if (auto ok = fs_->create_dirs(aside); !ok) return ok.error();
      if (auto ok = fs_->rename(final_path, aside + "/" + name); !ok) return ok.error();
      if (auto ok = fs_->sync_dir(run_dir()); !ok) return ok.error();
      log::warn("run " + run_ + ": " + final_path + " was not a whole checkpoint; moved to " + aside);
    }
  }
  auto dir = components::AtomicDir::begin(final_path, *fs_);
  if (!dir) return dir.error();
  auto saved = model.save({.dir = dir->path() + "/model", .with_optimizer = true}).get();
  if (!saved) return with_context(saved.error(), "saving checkpoint " + name);
  if (loader) {
    auto pos = loader->state().get();
    if (!pos) return with_context(pos.error(), "saving checkpoint " + name + ": the dataloader's position");
    state.loader = *pos;
  }
  if (auto cfg = model.train_configs().get())
    state.train_configs = *cfg;
  // The directory describes itself: step, summary and time let repair() and
  // open() index it without the index.
  if (auto ok = dir->write_file(kState, trainer_state_json(state, summary, real_clock().unix_ms())); !ok)
    return with_context(ok.error(), "saving checkpoint " + name);
  if (auto ok = dir->commit(); !ok) return with_context(ok.error(), "saving checkpoint " + name);
  if (auto ok = index_->add_checkpoint({.run = run_, .name = name, .path = dir->final_path(), .step = state.step,
                                        .summary = summary});
      !ok)
    return ok.error();
  return dir->final_path();
}

Result<std::optional<TrainerState>> Checkpointer::resume(const ModelGroup& model, const DataLoaderGroup* loader,
                                                         const std::string& which) {
  std::string path;
  if (which == "latest") {
    auto latest = index_->latest(run_);
    if (!latest) {
      if (code_of(latest.error()) == errc::not_found) return std::optional<TrainerState>{};  // a new run
      return latest.error();
    }
    if (!*latest) return std::optional<TrainerState>{};
    path = (*latest)->path;
  } else {
    auto all = index_->checkpoints(run_);
    if (!all) return all.error();
    std::string names;
    for (const auto& c : *all) {
      if (c.name == which) path = c.path;
      names += (names.empty() ? "" : ", ") + c.name;
    }
    if (path.empty())
      return make_error(errc::not_found, "run '" + run_ + "' has no checkpoint '" + which + "' (it has: " +
                                             (names.empty() ? std::string{"none"} : names) + ")");
  }
  if (auto ok = components::verify_dir(path); !ok) return with_context(ok.error(), "resuming from " + path);
  auto state_text = read_text_file(path + "/" + kState);
  if (!state_text) return state_text.error();
  auto state = parse_trainer_state(*state_text, path + "/" + kState);
  if (!state) return state.error();
  auto loaded = model.load({.dir = path + "/model", .with_optimizer = true}).get();
  if (!loaded) return with_context(loaded.error(), "resuming from " + path);
  if (loader) {
    auto ok = loader->set_state(state->loader).get();
    if (!ok) return with_context(ok.error(), "resuming from " + path + ": the dataloader's position");
  }
  if (which != "latest")
    if (auto ok = abandon_after(state->step); !ok) return with_context(ok.error(), "resuming from " + path);
  return std::optional<TrainerState>{std::move(*state)};
}

}  // namespace glint::actors
