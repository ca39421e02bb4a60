#pragma once
/// `glint::Tensor`: the value that carries numbers between actors.
///
/// A tensor is a dtype, a shape and a contiguous host buffer that is shared,
/// not copied, when the tensor is copied or sliced along dim 0. Copies of a
/// Tensor are cheap and alias the same bytes: use `clone()` for a deep copy.
/// Thread-safety: like `std::shared_ptr`; concurrent reads are fine, a writer
/// must own the only reference (see `mutable_data`).
///
/// In local mode a tensor crosses actor boundaries by reference (no copy); in
/// cluster mode it is serialised with its header and bytes, and decoding
/// checks that the header and the bytes agree and stay under the limit
/// (`set_max_message_bytes`).

#include "runtime/error.hpp"

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/deserializer.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/serializer.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace glint {

/// Element types. The numbers are a wire format: append, never reorder.
enum class Dtype : uint8_t { f32 = 0, bf16, f16, i64, i32, u8, boolean, f64 };
/// How many Dtypes there are: a number read from the wire must be below it.
inline constexpr uint8_t dtype_count = 8;

/// Bytes per element.
size_t element_size(Dtype d);
std::string_view to_string(Dtype d);
Result<Dtype> parse_dtype(std::string_view name);

template <class T>
constexpr Dtype dtype_of();
template <> constexpr Dtype dtype_of<float>() { return Dtype::f32; }
template <> constexpr Dtype dtype_of<double>() { return Dtype::f64; }
template <> constexpr Dtype dtype_of<int64_t>() { return Dtype::i64; }
template <> constexpr Dtype dtype_of<int32_t>() { return Dtype::i32; }
template <> constexpr Dtype dtype_of<uint8_t>() { return Dtype::u8; }
template <> constexpr Dtype dtype_of<bool>() { return Dtype::boolean; }

/// The process-wide bound on one large payload (bytes, default 2 GiB): the
/// tensor decoder refuses a tensor above it, and the actors check a weight
/// bucket, a sampler's answer and a dataloader's batch against it before
/// sending (actors/detail/message_size.hpp). Every process of a job installs
/// it from `Options::max_message_bytes` when its runtime starts.
void set_max_message_bytes(uint64_t bytes);
uint64_t max_message_bytes();

/// Most dimensions a tensor may have.
inline constexpr size_t max_tensor_dims = 8;

class Tensor {
public:
  /// An undefined tensor (no dtype, no storage): `defined()` is false.
  Tensor() = default;

  /// A zero-filled tensor. Fails on a negative dimension or overflow.
  static Result<Tensor> zeros(Dtype dtype, std::vector<int64_t> shape);

  /// Copies `values` into a new tensor of `shape` (numel must match).
  template <class T>
  static Result<Tensor> from_values(std::span<const T> values, std::vector<int64_t> shape) {
    auto t = zeros(dtype_of<T>(), std::move(shape));
    if (!t) return t;
    if (static_cast<size_t>(t->numel()) != values.size())
      return make_error(errc::invalid_argument, "tensor shape holds " + std::to_string(t->numel()) +
                                                  " elements but " + std::to_string(values.size()) +
                                                  " values were given");
    std::memcpy(t->data_, values.data(), values.size_bytes());
    return t;
  }
  template <class T>
  static Result<Tensor> from_values(const std::vector<T>& values, std::vector<int64_t> shape) {
    return from_values(std::span<const T>(values), std::move(shape));
  }
  /// Wraps memory owned elsewhere without copying (e.g. an at::Tensor's
  /// storage); `owner` keeps it alive. The caller guarantees `data` holds
  /// numel * element_size bytes, contiguous.
  static Result<Tensor> wrap(Dtype dtype, std::vector<int64_t> shape, std::shared_ptr<void> owner,
                             void* data);

  bool defined() const { return owner_ != nullptr; }
  Dtype dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  size_t dims() const { return shape_.size(); }
  int64_t size(size_t dim) const { return shape_.at(dim); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(dtype_); }

  const std::byte* data() const { return data_; }
  /// Writable bytes. Writes are seen by every tensor sharing the storage.
  std::byte* mutable_data() { return data_; }

  /// Typed views; fail if T does not match the dtype.
  template <class T>
  Result<std::span<const T>> values() const {
    if (dtype_of<T>() != dtype_) return dtype_mismatch(dtype_of<T>());
    return std::span<const T>(reinterpret_cast<const T*>(data_), static_cast<size_t>(numel()));
  }
  template <class T>
  Result<std::span<T>> mutable_values() {
    if (dtype_of<T>() != dtype_) return dtype_mismatch(dtype_of<T>());
    return std::span<T>(reinterpret_cast<T*>(data_), static_cast<size_t>(numel()));
  }

  /// Rows [begin, end) along dim 0, sharing storage (no copy).
  Result<Tensor> slice(int64_t begin, int64_t end) const;

  /// A deep copy with its own storage.
  Tensor clone() const;

  /// Concatenates along dim 0 (copies). All parts must agree on dtype and trailing dims.
  static Result<Tensor> concat(std::span<const Tensor> parts);

  /// True if both point into the same storage.
  bool shares_storage_with(const Tensor& other) const { return owner_ && owner_ == other.owner_; }

  /// "f32[2, 3]".
  std::string describe() const;

  friend bool operator==(const Tensor& a, const Tensor& b);

  /// Validates a decoded header: dtype known, dims within limits and
  /// non-negative, byte count equal to numel * element size and under the limit.
  static Result<size_t> check_header(uint8_t dtype, const std::vector<int64_t>& shape,
                                     uint64_t nbytes);

  // CAF serialisation. Encoding writes dtype, shape, byte count and bytes;
  // decoding validates the header before it allocates or reads a byte.
  friend caf::error inspect(caf::serializer& f, Tensor& x);
  friend caf::error inspect(caf::deserializer& f, Tensor& x);
  template <class Inspector>
  friend std::enable_if_t<!std::is_base_of_v<caf::serializer, Inspector> &&
                              !std::is_base_of_v<caf::deserializer, Inspector>,
                          typename Inspector::result_type>
  inspect(Inspector& f, Tensor& x) {
    auto text = x.describe();
    return f(caf::meta::type_name("glint.tensor"), text);
  }

private:
  caf::error dtype_mismatch(Dtype wanted) const;

  Dtype dtype_ = Dtype::f32;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> owner_;
  std::byte* data_ = nullptr;
};

/// Named tensors in order: the one type for a set of weights, whether it
/// is synced to a sampler, saved to safetensors or exported from a model.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

}  // namespace glint
