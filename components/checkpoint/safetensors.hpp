#pragma once
/// The safetensors format (Hugging Face): an 8-byte little-endian header
/// length, a JSON header naming each tensor's dtype, shape and byte range,
/// then the bytes.
///
///   auto f = SafetensorsFile::open("model/model.safetensors");
///   Result<Tensor> w = f->get("model.embed_tokens.weight");   // a view of the mapped file
///
/// Reading maps the file and hands out tensors that view the mapping (no
/// copy; the mapping lives as long as any tensor from it). Every header
/// field is checked against the file before a byte is read: a truncated file,
/// overlapping or out-of-range offsets, a shape that disagrees with its byte
/// range, or an unsupported dtype is an error naming the file and tensor.
/// Writing goes to a temporary file that is synced and renamed into place, so
/// a reader never sees half a file.

#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {

using glint::NamedTensors;

class SafetensorsFile {
public:
  static Result<SafetensorsFile> open(const std::string& path);
  /// A safetensors file held in memory, checked as open() checks a file:
  /// `bytes` is the whole file, kept alive by `owner`; tensors from get()
  /// view it (and may be written in place). `origin` names it in errors.
  /// open() maps the file and calls this.
  static Result<SafetensorsFile> parse(std::span<std::byte> bytes, std::shared_ptr<void> owner,
                                       const std::string& origin);

  const std::string& path() const { return path_; }
  /// Tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  /// A tensor viewing the mapped file (copied only if the file misaligns it).
  Result<Tensor> get(const std::string& name) const;
  /// The free-form "__metadata__" strings.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

private:
  struct Entry {
    Dtype dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  ///< offsets into the data section
  };
  std::string path_;
  std::shared_ptr<void> mapping_;
  const std::byte* data_ = nullptr;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// A name next to `path` for writing it atomically (write, fsync, rename):
/// unique per process, thread and call, so concurrent writers never share one.
std::string temp_path_for(const std::string& path);

/// A file written whole or not at all: bytes go to a temporary beside
/// `path` (temp_path_for); commit() fsyncs it and renames it into place.
/// Dropped without commit, the temporary is removed and `path` is untouched.
///
///   auto f = AtomicFile::create("out.gguf");
///   f->write(header.data(), header.size());   // as many writes as needed
///   f->commit();
class AtomicFile {
public:
  static Result<AtomicFile> create(const std::string& path);
  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  ~AtomicFile();
  /// Appends `n` bytes; an error names the temporary and errno's reason.
  Result<void> write(const void* data, size_t n);
  /// Zero bytes up to the next multiple of `alignment` of the bytes written.
  Result<void> pad_to(uint64_t alignment);
  uint64_t bytes_written() const { return written_; }
  Result<void> commit();

private:
  AtomicFile(std::string path, std::string tmp, int fd) : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

/// The safetensors dtype name of `d` ("F32", "BF16", ...).
std::string_view safetensors_dtype(Dtype d);

/// Writes `tensors` to `path` (atomically: a temporary file, fsync, rename).
/// Names must be unique and tensors defined.
Result<void> write_safetensors(const std::string& path, const NamedTensors& tensors,
                               const std::map<std::string, std::string>& metadata = {});

/// transformers' default max_shard_size ("5GB": decimal, as it counts).
inline constexpr int64_t default_max_shard_bytes = 5'000'000'000;

/// Writes `tensors` as the weights of a Hugging Face model directory, as
/// transformers' save_pretrained does: `model.safetensors` when they take
/// at most max_shard_bytes, else shards `model-00001-of-0000N.safetensors`
/// and `model.safetensors.index.json` ({"metadata": {"total_size": bytes},
/// "weight_map": {name: shard}}). Tensors go to shards in order, a new
/// shard starting when the next would pass the limit; a tensor bigger than
/// the limit gets a shard of its own (huggingface_hub's split). Weights of
/// an earlier save in `dir` that this one does not use are removed, in an
/// order that never leaves a readable directory with stale weights.
Result<void> write_safetensors_dir(const std::string& dir, const NamedTensors& tensors,
                                   int64_t max_shard_bytes = default_max_shard_bytes,
                                   const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

/// A tensor to be written, known before its values: its name and bytes.
struct TensorSpec {
  std::string name;
  uint64_t bytes = 0;
};

/// write_safetensors_dir for tensors that are not all in memory at once
/// (a sharded model gathered piece by piece): the shards are planned from
/// `tensors`' sizes, then `fetch(i)` is called once for each tensor, in
/// order, and each shard is written as soon as its tensors are in, so that
/// at most about one shard (max_shard_bytes) is held at a time. A tensor of
/// another size than planned, or a fetch that fails, stops the write with
/// no index written (a directory that fails to load, never a mixed one).
Result<void> write_safetensors_dir_streamed(const std::string& dir, const std::vector<TensorSpec>& tensors,
                                            const std::function<Result<Tensor>(size_t)>& fetch,
                                            int64_t max_shard_bytes = default_max_shard_bytes,
                                            const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

/// Every tensor of one safetensors file, by name (views of the mapped file).
Result<std::map<std::string, Tensor>> load_safetensors(const std::string& path);

/// Every tensor of a Hugging Face model directory: `model.safetensors`, or
/// the shards listed by `model.safetensors.index.json`. Names are unique
/// across shards; the error lists what is missing or duplicated.
Result<std::map<std::string, Tensor>> load_safetensors_dir(const std::string& dir);

}  // namespace glint::components
