#include "components/checkpoint/atomic_dir.hpp"

#include "runtime/file.hpp"
#include "runtime/hash.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace glint::components {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";

// Size and FNV-1a 64 of a file.
Result<std::pair<uint64_t, uint64_t>> digest(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  if (!in) return make_error(errc::not_found, "cannot read " + path);
  // Manifests have always started from 1469598103934665603 (the standard
  // basis with its last digit lost): kept, so that every checkpoint written
  // so far still verifies.
  Fnv1a h{1469598103934665603ULL};
  uint64_t size = 0;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    auto n = static_cast<size_t>(in.gcount());
    h.add(buf.data(), n);
    size += n;
  }
  return std::pair{size, h.value};
}

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace

Result<AtomicDir> AtomicDir::begin(const std::string& final_path, FileSystem& fsys) {
  fs::path f{final_path};
  if (f.filename().empty()) f = f.parent_path();
  std::error_code ec;
  if (fs::exists(f, ec))
    return make_error(errc::failed_precondition, final_path + " exists already; checkpoints are never overwritten");
  auto d = begin_replacing(final_path, fsys);
  if (d) d->replacing_ = false;
  return d;
}

Result<AtomicDir> AtomicDir::begin_replacing(const std::string& final_path, FileSystem& fsys) {
  fs::path f{final_path};
  if (f.filename().empty()) f = f.parent_path();
  std::error_code ec;
  // Parents made here are fsynced into their own parents: else a power loss
  // could take the run directory, and every checkpoint in it, away.
  std::vector<fs::path> made;
  for (auto p = f.parent_path(); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    made.push_back(p);
    if (p == p.parent_path()) break;
  }
  if (auto ok = fsys.create_dirs(f.parent_path().empty() ? "." : f.parent_path().string()); !ok) return ok.error();
  for (auto it = made.rbegin(); it != made.rend(); ++it) {
    auto up = it->parent_path();
    if (auto ok = fsys.sync_dir(up.empty() ? "." : up.string()); !ok) return ok.error();
  }
  AtomicDir d;
  d.fs_ = &fsys;
  d.replacing_ = true;
  d.final_ = f.string();
  d.tmp_ = (f.parent_path() / ("." + f.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
  if (auto ok = fsys.remove_all(d.tmp_); !ok) return ok.error();  // a leftover of a killed process with our pid
  if (auto ok = fsys.create_dirs(d.tmp_); !ok) return ok.error();
  return d;
}

AtomicDir::AtomicDir(AtomicDir&& o) noexcept
    : fs_(o.fs_), tmp_(std::move(o.tmp_)), final_(std::move(o.final_)), done_(o.done_), replacing_(o.replacing_) {
  o.done_ = true;
}
AtomicDir& AtomicDir::operator=(AtomicDir&& o) noexcept {
  std::swap(fs_, o.fs_);
  std::swap(tmp_, o.tmp_);
  std::swap(final_, o.final_);
  std::swap(done_, o.done_);
  std::swap(replacing_, o.replacing_);
  return *this;
}
AtomicDir::~AtomicDir() {
  if (!done_ && !tmp_.empty()) (void)fs_->remove_all(tmp_);
}

Result<void> AtomicDir::write_file(const std::string& rel, std::string_view data) {
  if (done_) return make_error(errc::failed_precondition, final_ + " is committed already");
  return fs_->write_file(tmp_ + "/" + rel, data);
}

Result<void> AtomicDir::commit() {
  if (done_) return make_error(errc::failed_precondition, final_ + " is committed already");
  // The manifest: every regular file below, with its size and hash.
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  std::vector<std::string> dirs{tmp_};
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(tmp_, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    auto rel = fs::relative(it->path(), tmp_).string();
    if (it->is_directory()) {
      dirs.push_back(it->path().string());
      continue;
    }
    if (rel == kManifest) continue;
    auto d = digest(it->path().string());
    if (!d) return d.error();
    files[rel] = {{"bytes", d->first}, {"fnv1a", hex(d->second)}};
    if (auto ok = fs_->sync_file(it->path().string()); !ok) return ok;
  }
  if (ec) return make_error(errc::unavailable, "cannot list " + tmp_ + ": " + ec.message());
  if (auto ok = fs_->write_file(tmp_ + "/" + kManifest, nlohmann::ordered_json{{"files", files}}.dump(1)); !ok)
    return with_context(ok.error(), "writing the manifest of " + final_);
  if (auto ok = fs_->sync_file(tmp_ + "/" + kManifest); !ok) return ok;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
    if (auto ok = fs_->sync_dir(*it); !ok) return ok;
  return swap_in();
}

Result<void> AtomicDir::swap_in() {
  auto parent = fs::path{final_}.parent_path();
  const std::string up = parent.empty() ? "." : parent.string();
  std::error_code ec;
  if (!replacing_ || !fs::exists(final_, ec)) {
    if (auto ok = fs_->rename(tmp_, final_); !ok) return ok;
    done_ = true;
    return fs_->sync_dir(up);
  }
  // Replacing: the new one in, in one step; durable; then the old (now at
  // the temporary's name) removed.
  auto swapped = fs_->swap_paths(tmp_, final_);
  if (swapped) {
    done_ = true;
    if (auto ok = fs_->sync_dir(up); !ok) return ok;
    (void)fs_->remove_all(tmp_);  // else a temporary, removed with the others
    return {};
  }
  if (code_of(swapped.error()) != errc::unimplemented) return swapped;
  auto old = (parent / ("." + fs::path{final_}.filename().string() + ".old-" + std::to_string(::getpid()))).string();
  if (auto ok = fs_->remove_all(old); !ok) return ok;
  if (auto ok = fs_->rename(final_, old); !ok) return ok;
  if (auto ok = fs_->rename(tmp_, final_); !ok) {
    (void)fs_->rename(old, final_);
    return ok;
  }
  done_ = true;
  if (auto ok = fs_->sync_dir(up); !ok) return ok;
  (void)fs_->remove_all(old);  // else remove_temporaries does
  return {};
}

Result<std::vector<ManifestEntry>> parse_manifest(std::string_view text, const std::string& origin) {
  auto damaged = [&](const std::string& why) {
    return make_error(errc::invalid_argument, origin + " is damaged: " + why);
  };
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return damaged("not JSON");
  if (!j.is_object() || !j.contains("files") || !j["files"].is_object()) return damaged("no \"files\" object");
  std::vector<ManifestEntry> out;
  for (const auto& [rel, want] : j["files"].items()) {
    // The manifest names files below its own directory, as commit writes
    // them: never one elsewhere that verify_dir would read.
    const fs::path p{rel};
    if (rel.empty() || p.is_absolute() || std::any_of(p.begin(), p.end(), [](const fs::path& part) {
          return part.empty() || part == "." || part == "..";
        }))
      return damaged("it lists '" + rel + "', which is not a path below the directory");
    auto bytes = want.is_object() ? want.find("bytes") : want.end();
    auto hash = want.is_object() ? want.find("fnv1a") : want.end();
    if (!want.is_object() || bytes == want.end() || !bytes->is_number_unsigned() || hash == want.end() ||
        !hash->is_string())
      return damaged("the entry of " + rel + " is " + want.dump() + ", not {\"bytes\": n, \"fnv1a\": \"hash\"}");
    out.push_back({rel, bytes->get<uint64_t>(), hash->get<std::string>()});
  }
  return out;
}

Result<void> verify_dir(const std::string& dir, Verify how) {
  const auto path = dir + "/" + kManifest;
  auto text = read_text_file(path);
  if (!text) return make_error(errc::not_found, dir + " has no " + kManifest + ": not a complete checkpoint");
  auto files = parse_manifest(*text, path);
  if (!files) return files.error();
  // Every file of the directory is in its manifest, and a manifest lists
  // something: an emptied manifest would otherwise vouch for any weights.
  if (files->empty()) return make_error(errc::invalid_argument, path + " is damaged: it lists no files");
  {
    std::set<std::string> listed;
    for (const auto& f : *files) listed.insert(f.path);
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      const auto rel = fs::path{it->path()}.lexically_relative(dir).generic_string();
      if (rel == kManifest || listed.count(rel)) continue;
      return make_error(errc::invalid_argument, dir + "/" + rel + " is not in " + path +
                                                    ": the manifest was changed, or a file was added after the save");
    }
  }
  for (const auto& want : *files) {
    const auto file = dir + "/" + want.path;
    if (how == Verify::sizes) {
      std::error_code ec;
      auto size = fs::file_size(file, ec);
      if (ec) return make_error(errc::not_found, dir + " lacks " + want.path + ", which its manifest lists");
      if (size != want.bytes)
        return make_error(errc::invalid_argument, file + " differs from its manifest (" + std::to_string(size) +
                                                      " bytes; changed or truncated)");
      continue;
    }
    auto d = digest(file);
    if (!d) return make_error(errc::not_found, dir + " lacks " + want.path + ", which its manifest lists");
    if (d->first != want.bytes || hex(d->second) != want.fnv1a)
      return make_error(errc::invalid_argument, file + " differs from its manifest (" + std::to_string(d->first) +
                                                    " bytes; changed or truncated)");
  }
  return {};
}

int remove_temporaries(const std::string& parent, FileSystem& fsys) {
  int n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    if (name.size() > 1 && name[0] == '.' && name.find(".tmp-") != std::string::npos) {
      if (fsys.remove_all(it->path().string())) ++n;
    } else if (auto at = name.rfind(".old-"); name.size() > 1 && name[0] == '.' && at != std::string::npos && at > 1) {
      // A replaced directory renamed aside (no swap on this file system): if
      // the process died before the new one was renamed in, it is put back.
      auto final_path = (fs::path{parent} / name.substr(1, at - 1)).string();
      std::error_code e2;
      auto ok = fs::exists(final_path, e2) ? fsys.remove_all(it->path().string())
                                           : fsys.rename(it->path().string(), final_path);
      if (ok) ++n;
    }
  }
  return n;
}

}  // namespace glint::components
