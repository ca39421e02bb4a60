#include "components/checkpoint/safetensors.hpp"

#include "runtime/text.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <thread>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace glint::components {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string_view safetensors_dtype(Dtype d) {
  switch (d) {
    case Dtype::f32: return "F32";
    case Dtype::bf16: return "BF16";
    case Dtype::f16: return "F16";
    case Dtype::i64: return "I64";
    case Dtype::i32: return "I32";
    case Dtype::u8: return "U8";
    case Dtype::boolean: return "BOOL";
    case Dtype::f64: return "F64";
  }
  return "?";
}

namespace {

Result<Dtype> parse_safetensors_dtype(const std::string& s) {
  for (auto d : {Dtype::f32, Dtype::bf16, Dtype::f16, Dtype::i64, Dtype::i32, Dtype::u8, Dtype::boolean})
    if (safetensors_dtype(d) == s) return d;
  return make_error(errc::unimplemented, "dtype " + s + " is not supported (glint reads F32, BF16, F16, I64, I32, U8, BOOL)");
}

struct Mapping {
  void* addr = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (addr != MAP_FAILED && size > 0) ::munmap(addr, size);
  }
};

caf::error io_error(const std::string& what, const std::string& path) {
  return make_error(errc::unavailable, what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return make_error(errc::not_found, "no such safetensors file: " + path);
    return io_error("cannot open", path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return io_error("cannot stat", path);
  }
  auto map = std::make_shared<Mapping>();
  map->size = static_cast<size_t>(st.st_size);
  // Private and writable: tensors from the file may be written in place
  // (pages are copied on write; the file never changes).
  if (map->size > 0) map->addr = ::mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map->size > 0 && map->addr == MAP_FAILED) return io_error("cannot map", path);
  std::span<std::byte> bytes;
  if (map->size > 0) bytes = {static_cast<std::byte*>(map->addr), map->size};
  return parse(bytes, std::move(map), path);
}

Result<SafetensorsFile> SafetensorsFile::parse(std::span<std::byte> bytes, std::shared_ptr<void> owner,
                                               const std::string& path) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument, path + " is not a valid safetensors file: " + why);
  };
  const size_t size = bytes.size();
  if (size < 8) return bad("it has " + std::to_string(size) + " bytes, fewer than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  if (header_len > size - 8)
    return bad("the header claims " + std::to_string(header_len) + " bytes but the file has " +
               std::to_string(size - 8) + " after the length (truncated?)");
  const auto* text = reinterpret_cast<const char*>(bytes.data() + 8);
  json header;
  try {
    header = json::parse(text, text + header_len);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    return bad(std::string{"the header is not valid JSON: "} + e.what());
  }
  if (!header.is_object()) return bad("the header is not a JSON object");
  SafetensorsFile f;
  f.path_ = path;
  f.data_ = bytes.data() + 8 + header_len;
  uint64_t data_size = size - 8 - header_len;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return bad("__metadata__ is not an object");
      for (auto& [k, s] : v.items())
        if (s.is_string()) f.metadata_[k] = s.get<std::string>();
      continue;
    }
    auto where = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      return bad(where + " lacks dtype, shape or data_offsets");
    if (!v["dtype"].is_string()) return bad(where + ": dtype is not a string");
    auto dtype = parse_safetensors_dtype(v["dtype"].get<std::string>());
    if (!dtype) return with_context(dtype.error(), path + ", " + where);
    Entry e;
    e.dtype = *dtype;
    if (!v["shape"].is_array() || v["shape"].size() > max_tensor_dims) return bad(where + ": bad shape");
    uint64_t numel = 1;
    for (auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad(where + ": shape has a negative or non-integer size");
      e.shape.push_back(d.get<int64_t>());
      auto dim = static_cast<uint64_t>(e.shape.back());
      if (dim != 0 && numel > UINT64_MAX / dim) return bad(where + ": shape overflows");
      numel *= dim;
    }
    auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return bad(where + ": data_offsets should be two non-negative integers");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.end < e.begin) return bad(where + ": data_offsets end before they begin");
    if (numel > UINT64_MAX / element_size(e.dtype)) return bad(where + ": shape overflows");
    if (e.end - e.begin != numel * element_size(e.dtype))
      return bad(where + ": shape and dtype need " + std::to_string(numel * element_size(e.dtype)) +
                 " bytes but data_offsets span " + std::to_string(e.end - e.begin));
    if (e.end > data_size)
      return bad(where + " needs bytes up to " + std::to_string(e.end) + " of the data section, which has only " +
                 std::to_string(data_size) + " (the file is truncated)");
    ranges.emplace_back(e.begin, e.end);
    f.entries_.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return bad("two tensors' data_offsets overlap");
  f.mapping_ = std::move(owner);
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (auto& [n, e] : entries_) out.push_back(n);
  return out;
}

Result<Tensor> SafetensorsFile::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return make_error(errc::not_found, path_ + " has no tensor '" + name + "'");
  const auto& e = it->second;
  auto* p = data_ + e.begin;
  if (reinterpret_cast<uintptr_t>(p) % element_size(e.dtype) == 0)
    return Tensor::wrap(e.dtype, e.shape, mapping_, const_cast<std::byte*>(p));
  // A writer that did not pad its header leaves tensors misaligned: copy.
  auto t = Tensor::zeros(e.dtype, e.shape);
  if (!t) return t;
  std::memcpy(t->mutable_data(), p, e.end - e.begin);
  return t;
}

std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 1000000) + "." +
         std::to_string(counter.fetch_add(1));
}

Result<AtomicFile> AtomicFile::create(const std::string& path) {
  auto tmp = temp_path_for(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("cannot create", tmp);
  return AtomicFile{path, std::move(tmp), fd};
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : path_(std::move(o.path_)), tmp_(std::move(o.tmp_)), fd_(std::exchange(o.fd_, -1)), written_(o.written_) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

Result<void> AtomicFile::write(const void* data, size_t n) {
  if (fd_ < 0) return make_error(errc::failed_precondition, "write to " + path_ + " after it was committed");
  auto* c = static_cast<const char*>(data);
  written_ += n;
  while (n > 0) {
    auto w = ::write(fd_, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error("cannot write", tmp_);
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

Result<void> AtomicFile::pad_to(uint64_t alignment) {
  static constexpr char zeros[64] = {};
  auto pad = (alignment - written_ % alignment) % alignment;
  while (pad > 0) {
    auto n = std::min<uint64_t>(pad, sizeof zeros);
    if (auto ok = write(zeros, n); !ok) return ok;
    pad -= n;
  }
  return {};
}

Result<void> AtomicFile::commit() {
  if (fd_ < 0) return make_error(errc::failed_precondition, path_ + " is committed already");
  bool ok = ::fsync(fd_) == 0;
  auto saved_errno = errno;
  ::close(fd_);
  fd_ = -1;
  if (!ok) {
    errno = saved_errno;
    auto err = io_error("cannot write", tmp_);
    ::unlink(tmp_.c_str());
    return err;
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    auto err = io_error("cannot rename into", path_);
    ::unlink(tmp_.c_str());
    return err;
  }
  return {};
}

Result<void> write_safetensors(const std::string& path, const NamedTensors& tensors,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!seen.insert(name).second) return make_error(errc::invalid_argument, "tensor '" + name + "' is given twice");
    if (!t.defined()) return make_error(errc::invalid_argument, "tensor '" + name + "' is undefined");
    if (t.dtype() == Dtype::f64)
      return make_error(errc::unimplemented, "tensor '" + name + "' is f64: glint stores F32, BF16, F16, I64, I32, U8 "
                                                                 "and BOOL in safetensors; convert it first");
    header[name] = {{"dtype", std::string{safetensors_dtype(t.dtype())}},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  auto text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // tensors start 8-byte aligned
  auto file = AtomicFile::create(path);
  if (!file) return file.error();
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  if (auto ok = file->write(len, 8); !ok) return ok;
  if (auto ok = file->write(text.data(), text.size()); !ok) return ok;
  for (const auto& [name, t] : tensors)
    if (auto ok = file->write(t.data(), t.nbytes()); !ok) return ok;
  return file->commit();
}

namespace {

// Removes `path` if it is there.
Result<void> remove_if_there(const fs::path& path) {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return make_error(errc::unavailable, "cannot remove " + path.string() + ": " + ec.message());
  return {};
}

// Whether `name` is a shard name transformers writes: model-00001-of-00002.safetensors.
bool is_shard_name(const std::string& name) {
  constexpr std::string_view prefix = "model-", middle = "-of-", suffix = ".safetensors";
  if (name.size() != prefix.size() + 5 + middle.size() + 5 + suffix.size()) return false;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  auto digits = [&](size_t at) {
    return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at), name.begin() + static_cast<std::ptrdiff_t>(at + 5),
                       [](char c) { return c >= '0' && c <= '9'; });
  };
  size_t mid = prefix.size() + 5;
  return digits(prefix.size()) && name.compare(mid, middle.size(), middle) == 0 && digits(mid + middle.size()) &&
         name.compare(mid + middle.size() + 5, suffix.size(), suffix) == 0;
}

}  // namespace

Result<void> write_safetensors_dir(const std::string& dir, const NamedTensors& tensors, int64_t max_shard_bytes,
                                   const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors)
    specs.push_back({name, t.defined() ? static_cast<uint64_t>(t.nbytes()) : 0});
  return write_safetensors_dir_streamed(
      dir, specs, [&](size_t i) -> Result<Tensor> { return tensors[i].second; }, max_shard_bytes, metadata);
}

Result<void> write_safetensors_dir_streamed(const std::string& dir, const std::vector<TensorSpec>& tensors,
                                            const std::function<Result<Tensor>(size_t)>& fetch,
                                            int64_t max_shard_bytes,
                                            const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes <= 0)
    return make_error(errc::invalid_argument,
                      "max_shard_bytes must be positive, not " + std::to_string(max_shard_bytes));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(errc::unavailable, "cannot create " + dir + ": " + ec.message());
  // huggingface_hub's split: in order; a tensor over the limit alone (its
  // shard goes before the one being filled); otherwise a new shard when the
  // next tensor would pass the limit. Planned from the sizes first (the
  // shards' names hold their count), then filled in the same order.
  const auto limit = static_cast<uint64_t>(max_shard_bytes);
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0, total_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = tensors[i].bytes;
    total_bytes += bytes;
    if (bytes > limit) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + bytes > limit) {
      shards.push_back(std::move(current));
      current = {};
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  // Tensors are fetched once each, in order; a shard is written (and its
  // tensors let go) as soon as its last one is in.
  std::map<size_t, Tensor> fetched;
  size_t next = 0;
  auto fill = [&](const std::vector<size_t>& shard) -> Result<NamedTensors> {
    const size_t last = shard.empty() ? 0 : shard.back();
    for (; !shard.empty() && next <= last; ++next) {
      auto t = fetch(next);
      if (!t) return with_context(t.error(), "fetching " + tensors[next].name + " to write it");
      if (t->defined() && static_cast<uint64_t>(t->nbytes()) != tensors[next].bytes)
        return make_error(errc::internal, tensors[next].name + " is " + t->describe() + ", not the " +
                                              std::to_string(tensors[next].bytes) + " bytes planned");
      fetched.emplace(next, std::move(*t));
    }
    NamedTensors out;
    for (size_t i : shard) {
      out.emplace_back(tensors[i].name, std::move(fetched.at(i)));
      fetched.erase(i);
    }
    return out;
  };
  const fs::path root{dir};
  const auto single = root / "model.safetensors", index = root / "model.safetensors.index.json";
  std::set<std::string> written;
  if (shards.size() == 1) {
    // The loader prefers model.safetensors: once it is in place, an old
    // index or old shards are never read; then they go.
    auto whole = fill(shards.front());
    if (!whole) return whole.error();
    if (auto ok = write_safetensors(single.string(), *whole, metadata); !ok) return ok;
    if (auto ok = remove_if_there(index); !ok) return ok;
  } else {
    // No index until every shard is written: a crash in between leaves a
    // directory that fails to load, never one that mixes old and new shards.
    if (auto ok = remove_if_there(index); !ok) return ok;
    if (auto ok = remove_if_there(single); !ok) return ok;
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    std::map<std::string, std::string> sorted_map;
    const auto n = shards.size();
    for (size_t i = 0; i < n; ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
      auto part = fill(shards[i]);
      if (!part) return part.error();
      if (auto ok = write_safetensors((root / name).string(), *part, metadata); !ok) return ok;
      written.insert(name);
      for (const auto& [tensor, t] : *part) sorted_map[tensor] = name;
    }
    for (const auto& [tensor, file] : sorted_map) weight_map[tensor] = file;
    nlohmann::ordered_json j;
    j["metadata"] = {{"total_size", total_bytes}};
    j["weight_map"] = std::move(weight_map);
    auto tmp = temp_path_for(index.string());
    {
      std::ofstream f{tmp};
      f << j.dump(2) << "\n";
      f.flush();
      if (!f) {
        fs::remove(tmp, ec);
        return make_error(errc::unavailable, "cannot write " + tmp);
      }
    }
    fs::rename(tmp, index, ec);
    if (ec) return make_error(errc::unavailable, "cannot write " + index.string() + ": " + ec.message());
  }
  // Shards of an earlier save that this one did not overwrite.
  std::vector<fs::path> stale;
  for (fs::directory_iterator it{root, ec}, end; !ec && it != end; it.increment(ec)) {
    auto name = it->path().filename().string();
    if (is_shard_name(name) && !written.count(name)) stale.push_back(it->path());
  }
  if (ec) return make_error(errc::unavailable, "cannot list " + dir + ": " + ec.message());
  for (const auto& path : stale)
    if (auto ok = remove_if_there(path); !ok) return ok;
  return {};
}

Result<std::map<std::string, Tensor>> load_safetensors(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  if (!f) return f.error();
  std::map<std::string, Tensor> out;
  for (const auto& name : f->names()) {
    auto t = f->get(name);
    if (!t) return t.error();
    out.emplace(name, std::move(*t));
  }
  return out;
}

Result<std::map<std::string, Tensor>> load_safetensors_dir(const std::string& dir) {
  std::map<std::string, Tensor> out;
  auto single = fs::path{dir} / "model.safetensors";
  auto index = fs::path{dir} / "model.safetensors.index.json";
  std::vector<std::string> files;
  std::vector<std::string> listed;  // names the index promises
  if (fs::exists(single)) {
    files.push_back(single.string());
  } else if (fs::exists(index)) {
    std::ifstream in{index};
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
      return make_error(errc::invalid_argument, index.string() + " is not valid JSON: " + e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      return make_error(errc::invalid_argument, index.string() + " has no weight_map object");
    std::set<std::string> shards;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) return make_error(errc::invalid_argument, index.string() + ": weight_map['" + name + "'] is not a file name");
      shards.insert(file.get<std::string>());
    }
    for (auto& s : shards) {
      if (s.find('/') != std::string::npos || s == "..")
        return make_error(errc::invalid_argument, index.string() + " names a shard outside the directory: " + s);
      files.push_back((fs::path{dir} / s).string());
    }
    for (auto& [name, file] : j["weight_map"].items()) listed.push_back(name);
  } else {
    return make_error(errc::not_found, dir + " holds neither model.safetensors nor model.safetensors.index.json");
  }
  std::vector<std::string> duplicated;
  for (const auto& file : files) {
    auto tensors = load_safetensors(file);
    if (!tensors) return tensors.error();
    for (auto& [name, t] : *tensors)
      if (!out.emplace(name, std::move(t)).second) duplicated.push_back(name);
  }
  if (!duplicated.empty())
    return make_error(errc::invalid_argument, dir + ": tensors in more than one shard: " + join(duplicated));
  std::vector<std::string> missing;
  for (const auto& name : listed)
    if (!out.count(name)) missing.push_back(name);
  if (!missing.empty())
    return make_error(errc::invalid_argument,
                      index.string() + " lists tensors that no shard holds: " + join(missing));
  return out;
}

}  // namespace glint::components
