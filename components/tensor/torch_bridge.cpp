#include "components/tensor/torch_bridge.hpp"

#include <memory>

namespace glint::components {

at::ScalarType to_torch(Dtype d) {
  switch (d) {
    case Dtype::f32: return at::kFloat;
    case Dtype::bf16: return at::kBFloat16;
    case Dtype::f16: return at::kHalf;
    case Dtype::i64: return at::kLong;
    case Dtype::i32: return at::kInt;
    case Dtype::u8: return at::kByte;
    case Dtype::boolean: return at::kBool;
    case Dtype::f64: return at::kDouble;
  }
  return at::kFloat;
}

Result<Dtype> from_torch(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return Dtype::f32;
    case at::kBFloat16: return Dtype::bf16;
    case at::kHalf: return Dtype::f16;
    case at::kLong: return Dtype::i64;
    case at::kInt: return Dtype::i32;
    case at::kByte: return Dtype::u8;
    case at::kBool: return Dtype::boolean;
    case at::kDouble: return Dtype::f64;
    default:
      return make_error(errc::invalid_argument,
                        std::string{"torch dtype "} + c10::toString(s) + " has no glint equivalent");
  }
}

at::Tensor to_torch(const Tensor& t) {
  if (!t.defined()) return {};
  // The deleter holds a copy of the glint tensor, keeping its storage alive.
  auto* keep = new Tensor(t);
  return at::from_blob(const_cast<std::byte*>(t.data()), t.shape(), [keep](void*) { delete keep; },
                       at::TensorOptions().dtype(to_torch(t.dtype())).device(at::kCPU));
}

Result<Tensor> from_torch(const at::Tensor& t) {
  if (!t.defined()) return Tensor{};
  if (!t.device().is_cpu())
    return make_error(errc::invalid_argument, "from_torch needs a CPU tensor, got one on " + t.device().str());
  if (!t.is_contiguous())
    return make_error(errc::invalid_argument, "from_torch needs a contiguous tensor; call .contiguous() first");
  auto dtype = from_torch(t.scalar_type());
  if (!dtype) return dtype.error();
  auto owner = std::make_shared<at::Tensor>(t);
  return Tensor::wrap(*dtype, t.sizes().vec(), owner, t.data_ptr());
}

std::string shape_of(const at::Tensor& t) {
  if (!t.defined()) return "none";
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

}  // namespace glint::components
