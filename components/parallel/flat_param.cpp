#include "components/parallel/flat_param.hpp"

#include "components/model/optim_impl.hpp"
#include "components/tensor/torch_bridge.hpp"

#include <c10/core/GradMode.h>

#include <cmath>

namespace glint::components {

Result<FlatParam> FlatParam::shard(std::vector<at::Tensor> params, int shards, int rank) {
  if (shards < 1 || rank < 0 || rank >= shards)
    return make_error(errc::invalid_argument, "shard " + std::to_string(rank) + " of " + std::to_string(shards) +
                                                  " is not a shard");
  if (params.empty()) return make_error(errc::invalid_argument, "a flat parameter needs at least one parameter");
  for (const auto& p : params)
    if (!p.defined() || p.scalar_type() != params.front().scalar_type() || p.device() != params.front().device())
      return make_error(errc::invalid_argument, "the parameters of one flat parameter must share a dtype and device");
  c10::NoGradGuard no_grad;
  FlatParam f;
  f.shards_ = shards;
  f.rank_ = rank;
  for (const auto& p : params) {
    f.offsets_.push_back(f.numel_);
    f.shapes_.push_back(p.sizes().vec());
    f.numel_ += p.numel();
  }
  f.shard_numel_ = (f.numel_ + shards - 1) / shards;  // padded to a multiple of the shard count
  std::vector<at::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.detach().reshape({-1}));
  auto whole = at::cat(flat);
  if (auto pad = f.shard_numel_ * shards - f.numel_; pad > 0) whole = at::cat({whole, at::zeros({pad}, whole.options())});
  f.local_ = whole.narrow(0, rank * f.shard_numel_, f.shard_numel_).clone().set_requires_grad(true);
  // From now on each parameter is a view of the flat buffer, whose storage
  // free_full() releases and gather() fills again.
  f.full_ = whole.contiguous();
  f.params_ = std::move(params);
  f.point_params();
  return f;
}

Result<void> FlatParam::check_group(const ProcessGroup& pg, const char* what) const {
  if (pg.size() != shards_ || pg.rank() != rank_)
    return make_error(errc::invalid_argument, "a flat parameter cut for rank " + std::to_string(rank_) + " of " +
                                                  std::to_string(shards_) + " " + what + " over rank " +
                                                  std::to_string(pg.rank()) + " of " + std::to_string(pg.size()));
  return {};
}

Result<void> FlatParam::gather(ProcessGroup& pg) {
  if (auto ok = check_group(pg, "gathered"); !ok) return ok;
  c10::NoGradGuard no_grad;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  const auto bytes = static_cast<size_t>(padded_numel()) * full_.element_size();
  if (storage->nbytes() < bytes) {  // freed: the same storage again, so every view of it sees the values
    storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
    storage->set_nbytes(bytes);
  }
  auto in = from_torch(local_.detach());
  auto out = from_torch(full_);
  if (!in || !out) return make_error(errc::internal, "a flat parameter's buffers as glint tensors");
  if (auto ok = pg.all_gather(*in, *out); !ok) return ok;
  gathered_ = true;
  return {};
}

void FlatParam::point_params() {
  for (size_t i = 0; i < params_.size(); ++i) {
    int64_t n = 1;
    for (auto d : shapes_[i]) n *= d;
    params_[i].set_data(full_.narrow(0, offsets_[i], n).view(shapes_[i]));
  }
}

void FlatParam::free_full() {
  // The bytes go; the parameters, their shapes and what autograd saved of
  // them stay, to be filled by the next gather.
  full_.storage().unsafeGetStorageImpl()->reset();
  gathered_ = false;
}

Result<void> FlatParam::reduce_grads(ProcessGroup& pg, bool average) {
  if (auto ok = check_group(pg, "reduced"); !ok) return ok;
  c10::NoGradGuard no_grad;
  auto flat = at::zeros({padded_numel()}, local_.options().requires_grad(false));
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].grad();
    if (!g.defined()) continue;
    flat.narrow(0, offsets_[i], g.numel()).copy_(g.reshape({-1}));
  }
  auto mine = at::empty({shard_numel_}, flat.options());
  auto in = from_torch(flat);
  auto out = from_torch(mine);
  if (!in || !out) return make_error(errc::internal, "a flat parameter's gradients as glint tensors");
  if (auto ok = pg.reduce_scatter_sum(*in, *out); !ok) return ok;
  if (average) mine.div_(shards_);  // the mean over ranks: Gloo has no AVG
  if (local_.grad().defined()) local_.mutable_grad().add_(mine);
  else local_.mutable_grad() = mine;
  for (auto& p : params_) p.mutable_grad() = at::Tensor{};
  return {};
}

Result<double> clip_grad_norm(const std::vector<FlatParam*>& params, ProcessGroup& pg, double max_norm) {
  c10::NoGradGuard no_grad;
  // In double: the squares of many shards' gradients summed over ranks.
  auto sum = at::zeros({1}, at::kDouble);
  for (auto* f : params)
    if (const auto& g = f->local().grad(); g.defined()) sum += grad_squares(g);
  auto t = from_torch(sum);
  if (!t) return t.error();
  std::vector<Tensor> ts{*t};
  if (auto ok = pg.all_reduce_sum(ts); !ok) return ok.error();
  const double norm = std::sqrt(sum.item<double>());
  std::vector<at::Tensor> grads;
  for (auto* f : params) grads.push_back(f->local().grad());
  clip_to_norm(grads, norm, max_norm);  // as the trainer clips
  return norm;
}

}  // namespace glint::components
