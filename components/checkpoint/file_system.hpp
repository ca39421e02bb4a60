#pragma once
/// `FileSystem`: the few writes that make a checkpoint durable (create a
/// directory, write or append to a file, fsync a file or a directory,
/// rename, remove), behind one small interface, so tests can crash a save
/// at any of them and see what a power loss would leave (LevelDB's Env and
/// FaultInjectionTestEnv are the model). The run index's RocksDB writes go
/// through it too when it is given one (components/store), so one crash
/// counter covers a checkpoint directory and its index entry:
///
///   FaultInjectionFileSystem faulty;
///   faulty.crash_after(7);                        // the 8th write and all later fail
///   auto dir = AtomicDir::begin(path, faulty);    // ... save, commit: fails at the crash
///   faulty.drop_unsynced();                       // what the disk holds after the crash
///
/// Reads go straight to the disk: a crash loses writes, not reads. Files
/// that other code writes into a checkpoint directory (the model's
/// safetensors) are not written through it, but they are fsynced through
/// it at commit, which is what makes them durable.

#include "runtime/error.hpp"

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace glint::components {

class FileSystem {
public:
  virtual ~FileSystem() = default;
  /// Creates `path` and its missing parents (no error if it exists).
  virtual Result<void> create_dirs(const std::string& path) = 0;
  /// Creates or truncates `path` and writes `data` (not synced).
  virtual Result<void> write_file(const std::string& path, std::string_view data) = 0;
  /// Appends `data` to `path`, creating it if absent (not synced).
  virtual Result<void> append_file(const std::string& path, std::string_view data) = 0;
  virtual Result<void> sync_file(const std::string& path) = 0;
  /// Makes the entries of directory `path` (files made or renamed into it) durable.
  virtual Result<void> sync_dir(const std::string& path) = 0;
  virtual Result<void> rename(const std::string& from, const std::string& to) = 0;
  /// Swaps two existing paths in one step (Linux's renameat2 with
  /// RENAME_EXCHANGE): at every moment each name holds one of the two
  /// whole. `unimplemented` where the file system cannot (the caller may
  /// then fall back to two renames).
  virtual Result<void> swap_paths(const std::string& a, const std::string& b) = 0;
  /// Removes `path` and everything below it (no error if it is absent).
  virtual Result<void> remove_all(const std::string& path) = 0;
};

/// The real one (POSIX calls).
FileSystem& local_file_system();

/// A FileSystem over another (the local one by default) that fails on
/// purpose: after crash_after(n), the first n writes succeed and every
/// later one fails with `unavailable` and does nothing, as if the process
/// had died there. It tracks what was not yet durable: drop_unsynced then
/// truncates each file written since its last fsync to its synced length
/// (removing it if never synced) and undoes, newest first, the directory
/// entries made since their directory's last fsync (renames and swaps
/// reversed, new files and directories removed). Removals count as durable
/// at once.
/// Thread-safe (RocksDB writes from its background threads too).
class FaultInjectionFileSystem : public FileSystem {
public:
  explicit FaultInjectionFileSystem(FileSystem& base = local_file_system()) : base_(&base) {}

  /// Writes so far (every call of the interface counts, failed ones too).
  int64_t writes() const {
    std::lock_guard<std::recursive_mutex> guard{mx_};
    return writes_;
  }
  /// Crash once `n` more writes have been done (n = 0: at the next one).
  void crash_after(int64_t n) {
    std::lock_guard<std::recursive_mutex> guard{mx_};
    crash_at_ = writes_ + n;
  }
  bool crashed() const {
    std::lock_guard<std::recursive_mutex> guard{mx_};
    return crash_at_ && writes_ > *crash_at_;
  }
  /// What a power loss would leave on the base file system; the crash is
  /// over afterwards (writes work again).
  Result<void> drop_unsynced();

  Result<void> create_dirs(const std::string& path) override;
  Result<void> write_file(const std::string& path, std::string_view data) override;
  Result<void> append_file(const std::string& path, std::string_view data) override;
  Result<void> sync_file(const std::string& path) override;
  Result<void> sync_dir(const std::string& path) override;
  Result<void> rename(const std::string& from, const std::string& to) override;
  Result<void> swap_paths(const std::string& a, const std::string& b) override;
  Result<void> remove_all(const std::string& path) override;

private:
  /// Counts a write; false once the crash point is passed.
  bool go(std::string_view what, const std::string& path);
  /// Moves what is tracked under `from` (and below it) to `to`.
  void move_tracked(const std::string& from, const std::string& to);
  caf::error crash_error(std::string_view what, const std::string& path) const;

  struct Entry {  ///< a directory entry not yet durable
    enum Kind { made_file, made_dir, renamed, exchanged } kind;
    std::string path, from;  ///< from: the old name of a rename, the other name of an exchange
  };
  FileSystem* base_;
  mutable std::recursive_mutex mx_;  ///< every member below
  int64_t writes_ = 0;
  std::optional<int64_t> crash_at_;
  std::map<std::string, int64_t> synced_size_;  ///< files written or synced through here: their durable length (-1: none)
  std::vector<Entry> pending_;
};

}  // namespace glint::components
