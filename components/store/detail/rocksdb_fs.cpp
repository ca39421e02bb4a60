#include "components/store/detail/rocksdb_fs.hpp"

#include <rocksdb/file_system.h>

#include <string>
#include <utility>

namespace glint::components::detail {

namespace {

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
// glint's interface; inside classes derived from RocksDB's, a bare
// `FileSystem` would name rocksdb::FileSystem.
using Seam = glint::components::FileSystem;

IOStatus status_of(const Result<void>& r) {
  if (r) return IOStatus::OK();
  if (code_of(r.error()) == errc::resource_exhausted) return IOStatus::NoSpace(describe(r.error()));
  return IOStatus::IOError(describe(r.error()));
}

class WritableFile final : public rocksdb::FSWritableFile {
public:
  WritableFile(Seam& fs, std::string path, uint64_t size) : fs_(&fs), path_(std::move(path)), size_(size) {}

  IOStatus Append(const rocksdb::Slice& data, const IOOptions&, IODebugContext*) override {
    auto s = status_of(fs_->append_file(path_, {data.data(), data.size()}));
    if (s.ok()) size_ += data.size();
    return s;
  }
  IOStatus Close(const IOOptions&, IODebugContext*) override { return IOStatus::OK(); }
  // Every append is written through at once: nothing is buffered here.
  IOStatus Flush(const IOOptions&, IODebugContext*) override { return IOStatus::OK(); }
  IOStatus Sync(const IOOptions&, IODebugContext*) override { return status_of(fs_->sync_file(path_)); }
  IOStatus Fsync(const IOOptions&, IODebugContext*) override { return status_of(fs_->sync_file(path_)); }
  uint64_t GetFileSize(const IOOptions&, IODebugContext*) override { return size_; }

private:
  Seam* fs_;
  std::string path_;
  uint64_t size_;
};

class Directory final : public rocksdb::FSDirectory {
public:
  Directory(Seam& fs, std::string path) : fs_(&fs), path_(std::move(path)) {}
  IOStatus Fsync(const IOOptions&, IODebugContext*) override { return status_of(fs_->sync_dir(path_)); }
  IOStatus Close(const IOOptions&, IODebugContext*) override { return IOStatus::OK(); }

private:
  Seam* fs_;
  std::string path_;
};

class GlintFileSystem final : public rocksdb::FileSystemWrapper {
public:
  explicit GlintFileSystem(Seam& fs) : FileSystemWrapper(rocksdb::FileSystem::Default()), fs_(&fs) {}

  const char* Name() const override { return "GlintFileSystem"; }

  IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions&,
                           std::unique_ptr<rocksdb::FSWritableFile>* r, IODebugContext*) override {
    if (auto s = status_of(fs_->write_file(f, {})); !s.ok()) return s;
    *r = std::make_unique<WritableFile>(*fs_, f, 0);
    return IOStatus::OK();
  }
  IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                              std::unique_ptr<rocksdb::FSWritableFile>* r, IODebugContext* dbg) override {
    uint64_t size = 0;
    if (!target_->GetFileSize(f, o.io_options, &size, dbg).ok()) {
      if (auto s = status_of(fs_->append_file(f, {})); !s.ok()) return s;
      size = 0;
    }
    *r = std::make_unique<WritableFile>(*fs_, f, size);
    return IOStatus::OK();
  }
  IOStatus ReuseWritableFile(const std::string& f, const std::string& old, const rocksdb::FileOptions& o,
                             std::unique_ptr<rocksdb::FSWritableFile>* r, IODebugContext* dbg) override {
    if (auto s = status_of(fs_->rename(old, f)); !s.ok()) return s;
    return NewWritableFile(f, o, r, dbg);
  }
  // Neither is used by a database opened with the run index's options; a
  // write that bypassed the seam would make the crash tests lie.
  IOStatus NewRandomRWFile(const std::string& f, const rocksdb::FileOptions&,
                           std::unique_ptr<rocksdb::FSRandomRWFile>*, IODebugContext*) override {
    return IOStatus::NotSupported("random read-write files are not under glint's file system seam: " + f);
  }
  IOStatus LinkFile(const std::string& from, const std::string&, const IOOptions&, IODebugContext*) override {
    return IOStatus::NotSupported("hard links are not under glint's file system seam: " + from);
  }
  IOStatus NewDirectory(const std::string& d, const IOOptions& o, std::unique_ptr<rocksdb::FSDirectory>* r,
                        IODebugContext* dbg) override {
    bool is_dir = false;
    if (auto s = target_->IsDirectory(d, o, &is_dir, dbg); !s.ok()) return s;
    if (!is_dir) return IOStatus::IOError("not a directory: " + d);
    *r = std::make_unique<Directory>(*fs_, d);
    return IOStatus::OK();
  }
  IOStatus DeleteFile(const std::string& f, const IOOptions&, IODebugContext*) override {
    return status_of(fs_->remove_all(f));
  }
  IOStatus CreateDir(const std::string& d, const IOOptions&, IODebugContext*) override {
    return status_of(fs_->create_dirs(d));
  }
  IOStatus CreateDirIfMissing(const std::string& d, const IOOptions&, IODebugContext*) override {
    return status_of(fs_->create_dirs(d));
  }
  IOStatus DeleteDir(const std::string& d, const IOOptions&, IODebugContext*) override {
    return status_of(fs_->remove_all(d));
  }
  IOStatus RenameFile(const std::string& from, const std::string& to, const IOOptions&, IODebugContext*) override {
    return status_of(fs_->rename(from, to));
  }

private:
  Seam* fs_;
};

}  // namespace

std::unique_ptr<rocksdb::Env> rocksdb_env_over(FileSystem& fs) {
  return rocksdb::NewCompositeEnv(std::make_shared<GlintFileSystem>(fs));
}

}  // namespace glint::components::detail
