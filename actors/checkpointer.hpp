#pragma once
/// `Checkpointer`: saves and resumes a training run. A checkpoint is one
/// directory, root/run/name, written atomically (components::AtomicDir:
/// killing the process at any moment leaves earlier checkpoints intact) and
/// then recorded in the run index (components::RunIndex, RocksDB), which
/// `glint runs` and `glint checkpoints RUN` list:
///
///   auto ckpt = actors::Checkpointer::open("runs", "grpo");
///   ckpt->save("step-40", model, &loader, {.step = 40, .seed = 1});
///   // ...a new process...
///   auto state = ckpt->resume(model, &loader);   // latest; nullopt: start afresh
///
/// What is saved is what the ModelGroup handle trains: the full model, or
/// its adapter (model.with_adapter(name)).
///
/// It holds: model/ (the full model in Hugging Face layout, or the adapter
/// in PEFT layout, with optimizer.safetensors: moments and step, so the
/// learning-rate schedule continues), trainer_state.json (step, consumed
/// samples, gradient accumulation, the driver's seed for its random
/// streams, the dataloader's position, the model's train configs, the
/// caller's metrics), and manifest.json (sizes and hashes, checked before a
/// resume loads anything).
///
/// The directories describe themselves (manifest.json, trainer_state.json
/// with step, summary and time); the index is a cache of them. open()
/// reconciles the two (reconciled() says what it did): a whole directory
/// the index lacks (a kill between its rename and its index write) is
/// adopted, an index entry whose directory is gone is forgotten, a
/// directory that does not match its manifest is reported by name and not
/// resumed. repair() rebuilds a damaged index from the directories.
/// Resuming an older checkpoint than the newest moves the newer ones aside
/// as an abandoned branch (run/abandoned-<unix ms>/), which nothing lists
/// or deletes; reset() is one durable decision (run/.reset) carried out
/// again by the next open() if the process dies during it.
///
/// The model rank 0 writes the model files and the driver the rest, into
/// the same directory: in cluster mode the job's processes must share the
/// file system under root (one machine, or a shared mount). Not
/// thread-safe: the driver owns it. One process opens a run index for
/// writing at a time.

#include "actors/dataloader_group.hpp"
#include "actors/model_group.hpp"
#include "actors/trainer_state.hpp"

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace glint::components {
class FileSystem;
class RunIndex;
}

namespace glint::actors {

/// What Checkpointer::open found and mended (names of checkpoints).
struct ReconcileReport {
  std::vector<std::string> adopted;    ///< whole directories the index lacked, now indexed
  std::vector<std::string> forgotten;  ///< index entries whose directory was gone, dropped
  std::vector<std::string> damaged;    ///< "name: why": not matching their manifest, not indexed
  bool finished_reset = false;         ///< a reset that a killed process began was completed
  bool empty() const { return adopted.empty() && forgotten.empty() && damaged.empty() && !finished_reset; }
};

/// What Checkpointer::repair rebuilt.
struct RepairReport {
  std::string set_aside;               ///< where the old index went ("" when there was none)
  int64_t runs = 0, checkpoints = 0;   ///< indexed anew
  std::vector<std::string> damaged;    ///< "run/name: why", left out
};

class Checkpointer {
public:
  /// Opens (creating) the run index under `root` and reconciles it with
  /// the run's directories. Everything is written through `fs` (the local
  /// file system when null; tests pass a FaultInjectionFileSystem to crash
  /// saves). Error: another process holds the index for writing, a damaged
  /// index (failed_precondition naming `glint runs --repair`), root cannot
  /// be created, a run name that is empty, has '/', starts with '.' or is
  /// "index" (the index's own directory).
  static Result<Checkpointer> open(const std::string& root, const std::string& run,
                                   components::FileSystem* fs = nullptr);
  /// Rebuilds the run index under `root` from the checkpoint directories of
  /// every run there; a damaged index is kept beside it as
  /// index.damaged-<unix ms>. No process may have the index open.
  static Result<RepairReport> repair(const std::string& root);
  Checkpointer(Checkpointer&&) noexcept;
  Checkpointer& operator=(Checkpointer&&) noexcept;
  ~Checkpointer();

  /// Saves checkpoint `name` (a new name: checkpoints are never
  /// overwritten) and indexes it with `summary`. Returns its directory.
  /// With `loader`, its position goes into state.loader; without, state.loader
  /// is saved as given (an asynchronous loop's loader is ahead of the step
  /// by the batches in flight: RolloutBatch::loader_state).
  Result<std::string> save(const std::string& name, const ModelGroup& model, const DataLoaderGroup* loader,
                           TrainerState state, const std::string& summary = "");
  /// Loads checkpoint `which` ("latest", or a name) into every model rank
  /// (weights and optimizer state) and the loader, and answers its trainer
  /// state; nullopt when the run has no checkpoint yet (and `which` is
  /// "latest"). Checkpoints of a later step than `which` are then moved to
  /// run/abandoned-<unix ms>/ and forgotten: the run continues from
  /// `which`. Error: a damaged checkpoint (nothing is loaded then), one of
  /// another model, an unknown name.
  Result<std::optional<TrainerState>> resume(const ModelGroup& model, const DataLoaderGroup* loader,
                                             const std::string& which = "latest");

  /// The run's checkpoints, newest last (empty for a new run).
  Result<std::vector<std::string>> list() const;
  /// What open() found and mended.
  const ReconcileReport& reconciled() const { return reconciled_; }
  /// Starts the run over: deletes its checkpoint directories (abandoned
  /// branches included) and forgets them in the index (other files of the
  /// run directory stay). Crash-safe: once it has begun, a later open()
  /// finishes it.
  Result<void> reset();
  /// A new run under this name: reset() when the run has no checkpoint or
  /// `fresh` is set; else failed_precondition naming the latest checkpoint
  /// (a run's history is deleted only when asked).
  Result<void> start_over(bool fresh);

  const std::string& run() const { return run_; }
  std::string run_dir() const { return root_ + "/" + run_; }

private:
  Checkpointer() = default;
  Result<void> reconcile();
  Result<void> finish_reset();
  Result<void> abandon_after(int64_t step);
  std::string root_, run_;
  ReconcileReport reconciled_;
  components::FileSystem* fs_ = nullptr;
  std::unique_ptr<components::RunIndex> index_;
};

}  // namespace glint::actors
