#include "components/parallel/tensor_parallel.hpp"

#include "components/comm/process_group_impl.hpp"
#include "components/tensor/torch_bridge.hpp"

#include "components/parallel/autograd_group.hpp"

namespace glint::components::tp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using detail::group_of;
using detail::keep_group;

// The sum over the group of a copy of `x` (contiguous), or a thrown error.
at::Tensor summed(const at::Tensor& x, ProcessGroup& pg, const char* what) {
  std::vector<at::Tensor> t{x.detach().contiguous().clone()};
  if (auto ok = all_reduce_sum(pg, t); !ok) throw_error(with_context(ok.error(), what));
  return t[0];
}

struct CopyToFn : torch::autograd::Function<CopyToFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, ProcessGroup* pg) {
    keep_group(ctx, *pg);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {summed(grads[0], group_of(ctx), "tensor parallelism: the input's gradient"), at::Tensor{}};
  }
};

struct ReduceFromFn : torch::autograd::Function<ReduceFromFn> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, ProcessGroup* pg) {
    return summed(x, *pg, "tensor parallelism: a row-parallel output");
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor{}}; }
};

// log p(target) from this rank's logits [N, Vl] of the rows [v0, v0 + Vl).
struct VocabLogprobFn : torch::autograd::Function<VocabLogprobFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& w, int64_t v0,
                            const at::Tensor& targets, ProcessGroup* pg) {
    at::NoGradGuard no_grad;
    auto local = at::matmul(hidden, w.t());  // [N, Vl]
    const int64_t N = local.size(0), Vl = local.size(1);
    // log-sum-exp over the whole vocabulary from each rank's max and sum:
    // M = max_r m_r, S = sum_r s_r exp(m_r - M), lse = M + log S.
    auto m = std::get<0>(local.max(1));                                // [N]
    auto s = at::exp(local - m.unsqueeze(1)).sum(1);                   // [N]
    auto mine = at::stack({m, s}, 0).contiguous();                     // [2, N]
    auto all = at::empty({pg->size() * 2, N}, mine.options());
    auto in = from_torch(mine);
    auto out = from_torch(all);
    if (!in || !out) throw_error(make_error(errc::internal, "vocab_logprob's statistics as glint tensors"));
    if (auto ok = pg->all_gather(*in, *out); !ok) throw_error(with_context(ok.error(), "vocab_logprob's max and sum"));
    auto per_rank = all.view({pg->size(), 2, N});
    auto ms = per_rank.select(1, 0), ss = per_rank.select(1, 1);       // [p, N]
    auto M = std::get<0>(ms.max(0));
    auto lse = M + at::log((ss * at::exp(ms - M.unsqueeze(0))).sum(0));
    // The target's logit, from the rank that holds its row.
    auto local_t = targets - v0;
    auto held = (local_t >= 0).logical_and(local_t < Vl);
    auto idx = at::where(held, local_t, at::zeros_like(local_t));
    auto t = at::where(held, local.gather(1, idx.unsqueeze(1)).squeeze(1), at::zeros({}, local.options()));
    t = summed(t, *pg, "vocab_logprob's target logits");
    ctx->save_for_backward({hidden, w, lse, idx, held});
    ctx->saved_data["v0"] = v0;
    return t - lse;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &w = saved[1], &lse = saved[2], &idx = saved[3], &held = saved[4];
    auto g = grads[0];  // [N]
    // d logp / d logit_j = [j = target] - softmax_j, over this rank's rows.
    auto d = -at::exp(at::matmul(hidden, w.t()) - lse.unsqueeze(1));
    d.scatter_add_(1, idx.unsqueeze(1), held.to(d.scalar_type()).unsqueeze(1));
    d = d * g.unsqueeze(1);
    at::Tensor dh, dw;
    if (ctx->needs_input_grad(0)) dh = at::matmul(d, w);         // summed over ranks by copy_to
    if (ctx->needs_input_grad(1)) dw = at::matmul(d.t(), hidden);
    return {dh, dw, at::Tensor{}, at::Tensor{}, at::Tensor{}};
  }
};

}  // namespace

Result<Range> shard_range(int64_t n, const ProcessGroup& pg, const std::string& what) {
  const int p = pg.size();
  if (n % p != 0)
    return make_error(errc::invalid_argument, what + " (" + std::to_string(n) +
                                                  ") does not divide by the tensor-parallel size " + std::to_string(p) +
                                                  "; pick a tp size that divides it");
  return Range{pg.rank() * (n / p), n / p};
}

Result<Range> vocab_range(int64_t V, const ProcessGroup& pg) {
  const int64_t p = pg.size(), r = pg.rank();
  if (V < p)
    return make_error(errc::invalid_argument, "vocab_size (" + std::to_string(V) + ") is smaller than the "
                                              "tensor-parallel size " + std::to_string(p));
  const int64_t base = V / p, extra = V % p;
  return Range{r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

at::Tensor copy_to(const at::Tensor& x, ProcessGroup& pg) {
  if (pg.size() == 1) return x;
  return CopyToFn::apply(x, &pg);
}

at::Tensor reduce_from(const at::Tensor& x, ProcessGroup& pg) {
  if (pg.size() == 1) return x;
  return ReduceFromFn::apply(x, &pg);
}

at::Tensor column_linear(const at::Tensor& x, const at::Tensor& w_shard, const at::Tensor& b_shard, ProcessGroup& pg) {
  return at::linear(copy_to(x, pg), w_shard, b_shard);
}

at::Tensor row_linear(const at::Tensor& x_shard, const at::Tensor& w_shard, const at::Tensor& b, ProcessGroup& pg) {
  auto y = reduce_from(at::linear(x_shard, w_shard), pg);
  return b.defined() ? y + b : y;
}

at::Tensor vocab_embedding(const at::Tensor& ids, const at::Tensor& w_shard, int64_t vocab_begin, ProcessGroup& pg) {
  auto local = ids - vocab_begin;
  auto held = (local >= 0).logical_and(local < w_shard.size(0));
  auto rows = at::embedding(w_shard, at::where(held, local, at::zeros_like(local)));
  return reduce_from(rows * held.unsqueeze(-1).to(rows.scalar_type()), pg);
}

at::Tensor vocab_logprob(const at::Tensor& hidden, const at::Tensor& w_shard, int64_t vocab_begin, int64_t V,
                         const at::Tensor& targets, ProcessGroup& pg) {
  if (targets.numel() > 0 && (targets.min().item<int64_t>() < 0 || targets.max().item<int64_t>() >= V))
    throw_error(make_error(errc::invalid_argument, "vocab_logprob: a target is outside the vocabulary [0, " +
                                                       std::to_string(V) + ")"));
  return VocabLogprobFn::apply(copy_to(hidden, pg), w_shard, vocab_begin, targets, &pg);
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How a parameter splits: 0 its rows, 1 its columns, -1 not at all.
int split_dim(const std::string& n) {
  for (const char* rows : {"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
                           "v_proj.bias", "gate_proj.weight", "up_proj.weight", "embed_tokens.weight", "lm_head.weight"})
    if (ends_with(n, rows)) return 0;
  for (const char* cols : {"o_proj.weight", "down_proj.weight"})
    if (ends_with(n, cols)) return 1;
  return -1;
}

}  // namespace

bool is_shard(const std::string& name) { return split_dim(name) >= 0; }

Result<at::Tensor> gather_whole(const std::string& name, const at::Tensor& shard, ProcessGroup& pg) {
  const int dim = split_dim(name);
  if (dim < 0) return shard;
  // Columns travel as rows of the transpose: all_gather stacks along dim 0.
  auto mine = (dim == 0 ? shard : shard.t()).detach().contiguous();
  // The vocabulary's rows may split unevenly (vocab_range): each rank's
  // count first, then the shards padded to the largest.
  std::vector<int64_t> counts(static_cast<size_t>(pg.size()), mine.size(0));
  if (ends_with(name, "embed_tokens.weight") || ends_with(name, "lm_head.weight")) {
    auto mine_n = at::tensor({mine.size(0)}, at::kLong), all_n = at::empty({pg.size()}, at::kLong);
    auto in = from_torch(mine_n);
    auto out = from_torch(all_n);
    if (!in || !out) return make_error(errc::internal, "a shard's row count as glint tensors");
    if (auto ok = pg.all_gather(*in, *out); !ok) return with_context(ok.error(), "gathering the rows of " + name);
    for (int r = 0; r < pg.size(); ++r) counts[static_cast<size_t>(r)] = all_n[r].item<int64_t>();
  }
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  if (mine.size(0) < most)
    mine = at::cat({mine, at::zeros({most - mine.size(0), mine.size(1)}, mine.options())});
  auto sizes = mine.sizes().vec();
  sizes[0] *= pg.size();
  auto all = at::empty(sizes, mine.options());
  auto in = from_torch(mine);
  auto out = from_torch(all);
  if (!in || !out) return make_error(errc::internal, "a tensor-parallel shard as glint tensors");
  if (auto ok = pg.all_gather(*in, *out); !ok) return with_context(ok.error(), "gathering " + name);
  if (std::any_of(counts.begin(), counts.end(), [&](int64_t n) { return n != most; })) {
    std::vector<at::Tensor> parts;
    for (int r = 0; r < pg.size(); ++r) parts.push_back(all.narrow(0, r * most, counts[static_cast<size_t>(r)]));
    all = at::cat(parts);
  }
  return dim == 0 ? all : all.t().contiguous();
}

bool gradient_is_partial(const std::string& name) {
  return ends_with(name, "q_norm.weight") || ends_with(name, "k_norm.weight");
}

Result<void> shard_model(CausalLM::Impl& m, std::shared_ptr<ProcessGroup> pg) {
  if (!pg) return make_error(errc::invalid_argument, "tensor parallelism needs a process group");
  if (m.tp || !m.sharded_by.empty()) return make_error(errc::failed_precondition, "the model is sharded already");
  if (!m.adapters.empty())
    return make_error(errc::unimplemented, "LoRA on a tensor-parallel model is not built yet; remove the adapters or "
                                           "use data parallelism");
  const auto& c = m.cfg;
  if (c.has_experts())
    return make_error(errc::unimplemented, std::string{hf_class_name(c.architecture)} +
                                               " has experts, which tensor parallelism does not split yet; use "
                                               "data parallelism or fsdp");
  if (c.has_linear_attention() || c.attention_gate)
    return make_error(errc::unimplemented, std::string{hf_class_name(c.architecture)} +
                                               " has Gated DeltaNet layers and gated attention, which tensor "
                                               "parallelism does not split yet; use data parallelism or fsdp");
  if (c.o_bias || c.mlp_bias)
    return make_error(errc::unimplemented, "a model whose o_proj or down_proj has a bias cannot be tensor-parallel "
                                           "yet (the bias would be added on every rank)");
  auto heads = shard_range(c.num_attention_heads, *pg, "the number of attention heads");
  if (!heads) return heads.error();
  auto kv = shard_range(c.num_key_value_heads, *pg, "the number of key/value heads (GQA)");
  if (!kv) return kv.error();
  auto mlp = shard_range(c.intermediate_size, *pg, "intermediate_size");
  if (!mlp) return mlp.error();
  auto vocab = vocab_range(c.vocab_size, *pg);
  if (!vocab) return vocab.error();
  c10::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> out;
  for (const auto& n : m.names) {
    const auto& p = m.params.at(n);
    const int dim = split_dim(n);
    if (dim < 0) {
      out[n] = p;
      continue;
    }
    Range r = *mlp;
    if (n.find("q_proj") != std::string::npos || n.find("o_proj") != std::string::npos)
      r = {heads->begin * c.head_dim, heads->size * c.head_dim};
    else if (n.find("k_proj") != std::string::npos || n.find("v_proj") != std::string::npos)
      r = {kv->begin * c.head_dim, kv->size * c.head_dim};
    else if (n.find("embed_tokens") != std::string::npos || n.find("lm_head") != std::string::npos)
      r = *vocab;
    out[n] = p.narrow(dim, r.begin, r.size).contiguous().clone().set_requires_grad(p.requires_grad());
  }
  m.params = std::move(out);
  m.tp = std::make_shared<TensorParallelPlan>(
      TensorParallelPlan{std::move(pg), heads->size, kv->size, vocab->begin});
  return {};
}

}  // namespace glint::components::tp
