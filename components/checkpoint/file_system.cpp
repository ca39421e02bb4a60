#include "components/checkpoint/file_system.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace glint::components {

namespace fs = std::filesystem;

namespace {

std::string parent_of(const std::string& path) {
  auto p = fs::path{path}.lexically_normal().parent_path();
  return p.empty() ? "." : p.string();
}

std::string normal(const std::string& path) {
  auto p = fs::path{path}.lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

class LocalFileSystem final : public FileSystem {
public:
  Result<void> create_dirs(const std::string& path) override {
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec) return make_error(errc::unavailable, "cannot create " + path + ": " + ec.message());
    return {};
  }

  Result<void> write_file(const std::string& path, std::string_view data) override {
    return write(path, data, O_TRUNC);
  }

  Result<void> append_file(const std::string& path, std::string_view data) override {
    return write(path, data, O_APPEND);
  }

  Result<void> sync_file(const std::string& path) override { return sync(path, false); }
  Result<void> sync_dir(const std::string& path) override { return sync(path, true); }

  Result<void> rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return make_error(errc::unavailable, "cannot rename " + from + " to " + to + ": " + std::strerror(errno));
    return {};
  }

  Result<void> swap_paths(const std::string& a, const std::string& b) override {
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return {};
    const int e = errno;
    if (e == EINVAL || e == ENOSYS || e == ENOTSUP)
      return make_error(errc::unimplemented, "this file system cannot swap " + a + " and " + b + " in one step: " +
                                                 std::strerror(e));
    return make_error(errc::unavailable, "cannot swap " + a + " and " + b + ": " + std::strerror(e));
  }

  Result<void> remove_all(const std::string& path) override {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) return make_error(errc::unavailable, "cannot remove " + path + ": " + ec.message());
    return {};
  }

private:
  static Result<void> write(const std::string& path, std::string_view data, int mode) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | mode | O_CLOEXEC, 0644);
    if (fd < 0) return io_error("cannot create", path, errno);
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      auto n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int saved = errno;
        ::close(fd);
        return io_error("cannot write", path, saved);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    if (::close(fd) != 0) return io_error("cannot write", path, errno);
    return {};
  }

  static caf::error io_error(const char* what, const std::string& path, int err) {
    // A full disk is the caller's to free; anything else is the machine's.
    return make_error(err == ENOSPC || err == EDQUOT ? errc::resource_exhausted : errc::unavailable,
                      std::string{what} + " " + path + ": " + std::strerror(err));
  }

  static Result<void> sync(const std::string& path, bool directory) {
    int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return make_error(errc::unavailable, "cannot open " + path + " to sync it: " + std::strerror(errno));
    int rc = ::fsync(fd);
    int saved = errno;
    ::close(fd);
    if (rc != 0) return make_error(errc::unavailable, "fsync of " + path + " failed: " + std::strerror(saved));
    return {};
  }
};

}  // namespace

FileSystem& local_file_system() {
  static LocalFileSystem fs;
  return fs;
}

// -- fault injection ----------------------------------------------------------

bool FaultInjectionFileSystem::go(std::string_view, const std::string&) {
  ++writes_;
  return !crashed();
}

caf::error FaultInjectionFileSystem::crash_error(std::string_view what, const std::string& path) const {
  return make_error(errc::unavailable, "simulated crash at write " + std::to_string(writes_) + " (" +
                                           std::string{what} + " " + path + ")");
}

Result<void> FaultInjectionFileSystem::create_dirs(const std::string& path) {
  std::lock_guard<std::recursive_mutex> guard{mx_};
  if (!go("create_dirs", path)) return crash_error("create_dirs", path);
  // The directories that do not exist yet are new entries of their parents.
  std::vector<std::string> made;
  for (fs::path p = fs::path{normal(path)}; !p.empty() && !fs::exists(p); p = p.parent_path()) {
    made.push_back(p.string());
    if (p == p.parent_path()) break;
  }
  if (auto ok = base_->create_dirs(path); !ok) return ok;
  for (auto it = made.rbegin(); it != made.rend(); ++it) pending_.push_back({Entry::made_dir, *it, {}});
  return {};
}

Result<void> FaultInjectionFileSystem::write_file(const std::string& path, std::string_view data) {
  std::lock_guard<std::recursive_mutex> guard{mx_};
  if (!go("write_file", path)) return crash_error("write_file", path);
  const auto p = normal(path);
  const bool existed = fs::exists(p);
  if (auto ok = base_->write_file(p, data); !ok) return ok;
  if (!existed) pending_.push_back({Entry::made_file, p, {}});
  // Truncated and rewritten: nothing of it is durable until it is synced.
  synced_size_[p] = existed ? 0 : -1;
  return {};
}

Result<void> FaultInjectionFileSystem::append_file(const std::string& path, std::string_view data) {
  std::lock_guard<std::recursive_mutex> guard{mx_};
  if (!go("append_file", path)) return crash_error("append_file", path);
  const auto p = normal(path);
  std::error_code ec;
  const bool existed = fs::exists(p, ec);
  // A file first seen here was durable as it stands (written before this
  // file system tracked it, or before the last drop_unsynced).
  if (!synced_size_.contains(p)) synced_size_[p] = existed ? static_cast<int64_t>(fs::file_size(p, ec)) : -1;
  if (auto ok = base_->append_file(p, data); !ok) return ok;
  if (!existed) pending_.push_back({Entry::made_file, p, {}});
  return {};
}

Result<void> FaultInjectionFileSystem::sync_file(const std::string& path) {
  std::lock_guard<std::recursive_mutex> guard{mx_};
  if (!go("sync_file", path)) return crash_error("sync_file", path);
  if (auto ok = base_->sync_file(path); !ok) return ok;
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  synced_size_[normal(path)] = ec ? -1 : static_cast<int64_t>(size);
  return {};
}

Result<void> FaultInjectionFileSystem::sync_dir(const std::string& path) {
  std::lock_guard<std::recursive_mutex> guard{mx_};
  if (!go("sync_dir", path)) return crash_error("sync_dir", path);
  if (auto ok = base_->sync_dir(path); !ok) return ok;
  const auto dir = normal(path);
  std::erase_if(pending_, [&](const Entry& e) {
    const bool two_names = e.kind == Entry::renamed || e.kind == Entry::exchanged;
    return parent_of(e.path) == dir && (!two_names || parent_of(e.from) == dir);
  });
  return {};
}

Result<void> FaultInjectionFileSystem::rename(const std::string& from, const std::string& to) {
  std::lock_guard<std::recursive_mutex> guard{mx_};
  if (!go("rename", from)) return crash_error("rename", from);
  if (auto ok = base_->rename(from, to); !ok) return ok;
  const auto f = normal(from), t = normal(to);
  pending_.push_back({Entry::renamed, t, f});
  move_tracked(f, t);
  return {};
}

Result<void> FaultInjectionFileSystem::swap_paths(const std::string& a, const std::string& b) {
  std::lock_guard<std::recursive_mutex> guard{mx_};
  if (!go("swap_paths", a)) return crash_error("swap_paths", a);
  if (auto ok = base_->swap_paths(a, b); !ok) return ok;
  const auto x = normal(a), y = normal(b);
  pending_.push_back({Entry::exchanged, x, y});
  const auto aside = "\n" + x;  // a key no normalised path has
  move_tracked(x, aside);
  move_tracked(y, x);
  move_tracked(aside, y);
  return {};
}

void FaultInjectionFileSystem::move_tracked(const std::string& from, const std::string& to) {
  std::map<std::string, int64_t> moved;
  for (auto it = synced_size_.begin(); it != synced_size_.end();) {
    if (it->first == from || it->first.rfind(from + "/", 0) == 0) {
      moved[to + it->first.substr(from.size())] = it->second;
      it = synced_size_.erase(it);
    } else {
      ++it;
    }
  }
  synced_size_.merge(moved);
}

Result<void> FaultInjectionFileSystem::remove_all(const std::string& path) {
  std::lock_guard<std::recursive_mutex> guard{mx_};
  if (!go("remove_all", path)) return crash_error("remove_all", path);
  return base_->remove_all(path);
}

Result<void> FaultInjectionFileSystem::drop_unsynced() {
  std::lock_guard<std::recursive_mutex> guard{mx_};
  // File contents first, under the names they have now.
  for (const auto& [path, size] : synced_size_) {
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    if (size < 0) fs::remove(path, ec);
    else if (static_cast<int64_t>(fs::file_size(path, ec)) > size) fs::resize_file(path, static_cast<uintmax_t>(size), ec);
    if (ec) return make_error(errc::unavailable, "dropping the unsynced data of " + path + ": " + ec.message());
  }
  // Then the directory entries that were not durable, newest first.
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
    std::error_code ec;
    switch (it->kind) {
      case Entry::made_file: fs::remove(it->path, ec); break;
      case Entry::made_dir: fs::remove_all(it->path, ec); break;
      case Entry::renamed:
        if (fs::exists(it->path, ec)) fs::rename(it->path, it->from, ec);
        break;
      case Entry::exchanged:
        if (fs::exists(it->path, ec) && fs::exists(it->from, ec)) {
          if (auto ok = base_->swap_paths(it->path, it->from); !ok) return ok;
        }
        break;
    }
    if (ec) return make_error(errc::unavailable, "undoing an unsynced entry " + it->path + ": " + ec.message());
  }
  pending_.clear();
  synced_size_.clear();
  crash_at_.reset();
  return {};
}

}  // namespace glint::components
