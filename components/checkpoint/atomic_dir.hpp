#pragma once
/// `AtomicDir`: a directory that appears whole or not at all, so a process
/// killed at any moment while saving a checkpoint leaves the previous ones
/// intact and no half-written one under a real name:
///
///   auto dir = AtomicDir::begin("runs/grpo/step-40");   // writes go to runs/grpo/.step-40.tmp-<pid>
///   write files under dir->path() ...
///   dir->commit();   // manifest.json (sizes, FNV-1a hashes), fsync files and
///                    // directory, rename into place, fsync the parent
///
/// A temporary left by a killed process is never read; remove_temporaries
/// clears them. Every write goes through a FileSystem (the local one unless
/// given), so tests can crash a save at each of them. verify_dir checks a committed directory against its
/// manifest (a file truncated or changed later is found). Not thread-safe;
/// one AtomicDir per directory.

#include "components/checkpoint/file_system.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace glint::components {

class AtomicDir {
public:
  /// Error: the final path exists already (a checkpoint is never
  /// overwritten), or the temporary cannot be created.
  static Result<AtomicDir> begin(const std::string& final_path, FileSystem& fs = local_file_system());
  /// The same for a directory that may exist already and is replaced:
  /// commit swaps the new one in with FileSystem::swap_paths, makes that
  /// durable, then removes the old, so a crash at any moment leaves the
  /// old or the new one whole under the final name, never neither (the
  /// old, if left at the temporary's name, is a temporary like any
  /// other). Where the file system cannot swap, the old is renamed aside
  /// first: a crash between the two renames leaves the final name empty
  /// for a moment, with the old whole at `.<name>.old-<pid>`.
  static Result<AtomicDir> begin_replacing(const std::string& final_path, FileSystem& fs = local_file_system());
  AtomicDir(AtomicDir&&) noexcept;
  AtomicDir& operator=(AtomicDir&&) noexcept;
  AtomicDir(const AtomicDir&) = delete;
  ~AtomicDir();  ///< removes the temporary unless committed

  /// Where to write.
  const std::string& path() const { return tmp_; }
  const std::string& final_path() const { return final_; }
  /// Writes a small file below path() (`rel` relative to it), through the FileSystem.
  Result<void> write_file(const std::string& rel, std::string_view data);
  /// Error (nothing new appears under the final name): a file that cannot
  /// be read back or synced, a failed rename.
  Result<void> commit();

private:
  AtomicDir() = default;
  FileSystem* fs_ = nullptr;
  std::string tmp_, final_;
  bool done_ = false;
  bool replacing_ = false;
  /// Puts tmp_ under the final name, replacing what is there.
  Result<void> swap_in();
};

/// One file a committed directory's manifest.json lists.
struct ManifestEntry {
  std::string path;   ///< relative to the directory
  uint64_t bytes = 0;
  std::string fnv1a;  ///< FNV-1a 64 of the bytes, 16 hex digits
};

/// Parses the text of a manifest.json; `origin` names it in errors.
/// Error (invalid_argument): not JSON, no "files" object, an entry that is
/// not {"bytes": n, "fnv1a": "..."}, or a path that is not a file below
/// the directory (empty, absolute, or with a ".", ".." or empty part).
Result<std::vector<ManifestEntry>> parse_manifest(std::string_view text, const std::string& origin);

/// How much verify_dir reads.
enum class Verify : uint8_t {
  full,   ///< every byte: sizes and hashes
  sizes,  ///< the manifest and each file's size, without reading the files (cheap)
};
/// Checks every file listed in dir/manifest.json. Errors: no manifest (not
/// a committed directory), a missing or changed file.
Result<void> verify_dir(const std::string& dir, Verify how = Verify::full);

/// Removes the temporaries of killed saves under `parent`, and puts back a
/// replaced directory a killed replace left aside with nothing under its
/// name (see begin_replacing); returns how many it dealt with.
int remove_temporaries(const std::string& parent, FileSystem& fs = local_file_system());

}  // namespace glint::components
