#pragma once
/// `RunIndex`: the durable list of runs and their checkpoints, kept in
/// RocksDB under a root directory (root/index), so `glint runs` and
/// `glint checkpoints RUN` can list them and `--resume latest` find the
/// newest:
///
///   auto index = RunIndex::open("runs");
///   index->add_checkpoint({.run = "grpo", .name = "step-40", .path = "runs/grpo/step-40", .step = 40});
///   auto last = index->latest("grpo");     // optional<CheckpointRecord>
///
/// A checkpoint is indexed after its directory is committed (AtomicDir), so
/// an indexed checkpoint is complete when it is added; the directories
/// describe themselves, and the Checkpointer reconciles the two when it
/// opens a run. Paths under the root are stored relative to it (a copied
/// root resumes from its own files) and returned joined to it. A log
/// damaged anywhere but in its last record is an error naming the repair
/// (`glint runs --repair`), never a silent truncation. One process opens the index
/// for writing (RocksDB's lock; a second gets `unavailable` naming the
/// holder's lock file); any number may open it read-only meanwhile.
/// Thread-safe as RocksDB is.
///
/// Among checkpoints of equal step, "latest" is the one added last: the
/// index numbers its additions, because a wall clock that steps back must
/// not reorder them (created_ms is for people to read, never for ordering).

#include "runtime/clock.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace glint::components {

struct CheckpointRecord {
  std::string run;
  std::string name;
  std::string path;
  int64_t step = 0;
  int64_t created_ms = 0;  ///< Unix time; filled in by add_checkpoint when 0
  std::string summary{};   ///< a short line: "loss 0.42, reward 1.3"
};

class FileSystem;

struct RunIndexOptions {
  /// Opened read-only: no lock taken; never creates the index.
  bool read_only = false;
  /// Where the index's writes go: the machine's file system when null.
  /// Tests pass a FaultInjectionFileSystem to crash the index mid-write.
  FileSystem* fs = nullptr;
  /// Where created_ms comes from: the machine's clock when null.
  const Clock* clock = nullptr;
};

struct RunRecord {
  std::string run;
  int64_t created_ms = 0;
  int64_t checkpoints = 0;
  std::optional<CheckpointRecord> latest;
};

class RunIndex {
public:
  /// `fs` and `clock` of `opts` must outlive the index.
  static Result<RunIndex> open(const std::string& root, RunIndexOptions opts = {});
  RunIndex(RunIndex&&) noexcept;
  RunIndex& operator=(RunIndex&&) noexcept;
  ~RunIndex();

  /// Records the run (first time) and the checkpoint, in one atomic write.
  Result<void> add_checkpoint(CheckpointRecord record);
  Result<std::vector<RunRecord>> runs() const;
  /// By step, oldest first. Error: an unknown run.
  Result<std::vector<CheckpointRecord>> checkpoints(const std::string& run) const;
  /// The one with the highest step (the last added among equal steps);
  /// nullopt for a run without checkpoints.
  Result<std::optional<CheckpointRecord>> latest(const std::string& run) const;
  /// Forgets a run and its checkpoints (their directories are the caller's).
  Result<void> remove_run(const std::string& run);
  /// Forgets these checkpoints of `run`, in one durable write (names it
  /// does not hold are skipped). Error: an unknown run.
  Result<void> remove_checkpoints(const std::string& run, const std::vector<std::string>& names);

private:
  RunIndex() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace glint::components
