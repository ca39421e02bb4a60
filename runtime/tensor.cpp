#include "runtime/tensor.hpp"

#include <atomic>
#include <limits>

namespace glint {

namespace {
std::atomic<uint64_t> g_max_message_bytes{uint64_t{2} << 30};

}  // namespace

void set_max_message_bytes(uint64_t bytes) { g_max_message_bytes.store(bytes); }
uint64_t max_message_bytes() { return g_max_message_bytes.load(); }

size_t element_size(Dtype d) {
  switch (d) {
    case Dtype::f32: return 4;
    case Dtype::bf16: return 2;
    case Dtype::f16: return 2;
    case Dtype::i64: return 8;
    case Dtype::i32: return 4;
    case Dtype::u8: return 1;
    case Dtype::boolean: return 1;
    case Dtype::f64: return 8;
  }
  return 1;
}

std::string_view to_string(Dtype d) {
  switch (d) {
    case Dtype::f32: return "f32";
    case Dtype::bf16: return "bf16";
    case Dtype::f16: return "f16";
    case Dtype::i64: return "i64";
    case Dtype::i32: return "i32";
    case Dtype::u8: return "u8";
    case Dtype::boolean: return "bool";
    case Dtype::f64: return "f64";
  }
  return "?";
}

Result<Dtype> parse_dtype(std::string_view name) {
  for (uint8_t i = 0; i < dtype_count; ++i)
    if (to_string(static_cast<Dtype>(i)) == name) return static_cast<Dtype>(i);
  return make_error(errc::invalid_argument,
                    "unknown dtype '" + std::string{name} + "'; expected one of f32, bf16, f16, i64, i32, u8, bool");
}

namespace {

// numel of `shape`, or an error naming the problem.
Result<int64_t> checked_numel(const std::vector<int64_t>& shape, size_t elem) {
  if (shape.size() > max_tensor_dims)
    return make_error(errc::invalid_argument, "tensor has " + std::to_string(shape.size()) +
                                                " dims; at most " + std::to_string(max_tensor_dims) + " are allowed");
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    auto d = shape[i];
    if (d < 0)
      return make_error(errc::invalid_argument,
                        "tensor dim " + std::to_string(i) + " is negative (" + std::to_string(d) + ")");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d / static_cast<int64_t>(elem))
      return make_error(errc::resource_exhausted, "tensor shape overflows 64-bit byte count");
    n *= d;
  }
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace

Result<Tensor> Tensor::zeros(Dtype dtype, std::vector<int64_t> shape) {
  auto n = checked_numel(shape, element_size(dtype));
  if (!n) return n.error();
  size_t bytes = static_cast<size_t>(*n) * element_size(dtype);
  // Never allocate zero bytes, so that a defined empty tensor has an owner.
  std::shared_ptr<std::byte[]> buf(new (std::nothrow) std::byte[bytes == 0 ? 1 : bytes]());
  if (!buf)
    return make_error(errc::resource_exhausted, "cannot allocate " + std::to_string(bytes) + " bytes for tensor");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = buf.get();
  t.owner_ = std::move(buf);
  return t;
}

Result<Tensor> Tensor::wrap(Dtype dtype, std::vector<int64_t> shape, std::shared_ptr<void> owner,
                            void* data) {
  auto n = checked_numel(shape, element_size(dtype));
  if (!n) return n.error();
  if (!owner) return make_error(errc::invalid_argument, "Tensor::wrap needs an owner for the memory");
  if (*n > 0 && data == nullptr) return make_error(errc::invalid_argument, "Tensor::wrap given a null pointer");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.owner_ = std::move(owner);
  t.data_ = static_cast<std::byte*>(data);
  return t;
}

int64_t Tensor::numel() const {
  if (!owner_) return 0;
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

caf::error Tensor::dtype_mismatch(Dtype wanted) const {
  return make_error(errc::invalid_argument, "tensor " + describe() + " read as " + std::string{to_string(wanted)});
}

Result<Tensor> Tensor::slice(int64_t begin, int64_t end) const {
  if (!defined() || shape_.empty())
    return make_error(errc::invalid_argument, "cannot slice " + describe() + " along dim 0");
  if (begin < 0 || end < begin || end > shape_[0])
    return make_error(errc::invalid_argument, "slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                                                ") is outside dim 0 of " + describe());
  Tensor t = *this;
  size_t row = shape_[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape_[0]);
  t.data_ = data_ + static_cast<size_t>(begin) * row;
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::clone() const {
  if (!defined()) return {};
  auto t = zeros(dtype_, shape_);
  if (nbytes() > 0) std::memcpy(t->data_, data_, nbytes());
  return std::move(*t);
}

Result<Tensor> Tensor::concat(std::span<const Tensor> parts) {
  if (parts.empty()) return make_error(errc::invalid_argument, "concat of no tensors");
  const auto& first = parts[0];
  if (!first.defined() || first.dims() == 0)
    return make_error(errc::invalid_argument, "cannot concatenate " + first.describe() + " along dim 0");
  int64_t rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& p = parts[i];
    bool same_tail = p.defined() && p.dims() == first.dims() && p.dtype() == first.dtype() &&
                     std::equal(p.shape_.begin() + 1, p.shape_.end(), first.shape_.begin() + 1);
    if (!same_tail)
      return make_error(errc::invalid_argument, "cannot concatenate part " + std::to_string(i) + " " +
                                                  p.describe() + " onto " + first.describe());
    rows += p.shape_[0];
  }
  auto shape = first.shape_;
  shape[0] = rows;
  auto out = zeros(first.dtype_, std::move(shape));
  if (!out) return out;
  auto* dst = out->data_;
  for (const auto& p : parts) {
    if (p.nbytes() > 0) std::memcpy(dst, p.data_, p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string{to_string(dtype_)} + shape_string(shape_);
}

bool operator==(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.dtype_ == b.dtype_ && a.shape_ == b.shape_ &&
         (a.nbytes() == 0 || std::memcmp(a.data_, b.data_, a.nbytes()) == 0);
}

Result<size_t> Tensor::check_header(uint8_t dtype, const std::vector<int64_t>& shape, uint64_t nbytes) {
  if (dtype >= dtype_count)
    return make_error(errc::invalid_argument, "tensor header names unknown dtype code " + std::to_string(dtype));
  auto d = static_cast<Dtype>(dtype);
  auto n = checked_numel(shape, element_size(d));
  if (!n) return n.error();
  uint64_t expected = static_cast<uint64_t>(*n) * element_size(d);
  if (expected != nbytes)
    return make_error(errc::invalid_argument, "tensor header says " + std::string{to_string(d)} + shape_string(shape) +
                                                " (" + std::to_string(expected) + " bytes) but carries " +
                                                std::to_string(nbytes) + " bytes");
  if (nbytes > max_message_bytes())
    return make_error(errc::resource_exhausted, "tensor of " + std::to_string(nbytes) +
                                                  " bytes exceeds the limit of " + std::to_string(max_message_bytes()) +
                                                  " bytes (Options::max_message_bytes)");
  return static_cast<size_t>(nbytes);
}

caf::error inspect(caf::serializer& f, Tensor& x) {
  uint8_t defined = x.defined() ? 1 : 0;
  if (auto err = f(defined)) return err;
  if (!defined) return caf::none;
  auto dtype = static_cast<uint8_t>(x.dtype_);
  uint64_t nbytes = x.nbytes();
  if (auto err = f(dtype, x.shape_, nbytes)) return err;
  return nbytes > 0 ? f.apply_raw(nbytes, x.data_) : caf::none;
}

caf::error inspect(caf::deserializer& f, Tensor& x) {
  uint8_t defined = 0;
  if (auto err = f(defined)) return err;
  if (!defined) {
    x = Tensor{};
    return caf::none;
  }
  uint8_t dtype = 0;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  // A shape longer than the limit is rejected before the vector is filled.
  size_t ndims = 0;
  if (auto err = f(dtype)) return err;
  if (auto err = f.begin_sequence(ndims)) return err;
  if (ndims > max_tensor_dims)
    return make_error(errc::invalid_argument, "tensor header declares " + std::to_string(ndims) + " dims; at most " +
                                                std::to_string(max_tensor_dims) + " are allowed");
  shape.resize(ndims);
  for (auto& d : shape)
    if (auto err = f(d)) return err;
  if (auto err = f.end_sequence()) return err;
  if (auto err = f(nbytes)) return err;
  auto ok = Tensor::check_header(dtype, shape, nbytes);
  if (!ok) return ok.error();
  auto t = Tensor::zeros(static_cast<Dtype>(dtype), std::move(shape));
  if (!t) return t.error();
  if (nbytes > 0)
    if (auto err = f.apply_raw(nbytes, t->data_))
      return make_error(errc::invalid_argument, "tensor payload truncated: header promised " +
                                                  std::to_string(nbytes) + " bytes (" + caf::to_string(err) + ")");
  x = std::move(*t);
  return caf::none;
}

}  // namespace glint
