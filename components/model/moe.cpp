// The sparse mixture-of-experts feed-forward block (Qwen2-MoE, Qwen3-MoE),
// as transformers defines it (reference/model-families.md sections 1.1, 2):
// its parameters, the fused on-disk expert layout, and its forward pass.
#include "components/model/moe.hpp"
#include "components/model/transformer.hpp"

#include "components/comm/process_group_impl.hpp"  // throw_error
#include "components/model/kernels.hpp"
#include "components/model/moe_config.hpp"
#include "components/parallel/expert_parallel.hpp"

#include "components/tensor/torch_bridge.hpp"
#include "runtime/text.hpp"

#include <c10/core/GradMode.h>

#include <atomic>
#include <optional>
#include <vector>

namespace glint::components {

namespace {
std::atomic<bool> dense_experts_on{false};
}  // namespace

void set_dense_experts(bool on) { dense_experts_on.store(on, std::memory_order_relaxed); }
bool dense_experts() { return dense_experts_on.load(std::memory_order_relaxed); }

namespace model_detail {

void sparse_block_shapes(const ModelConfig& c, const std::string& p, ParameterShapes& out) {
  // Every parameter of the block is a Linear module's weight [out, in].
  for (const auto& m : sparse_block_modules(c, p)) out.push_back({m.path + ".weight", {m.out, m.in}});
}

Result<void> unfuse_experts(const ModelConfig& c, std::map<std::string, Tensor>& weights, const std::string& origin) {
  const int64_t h = c.hidden_size, E = c.moe.num_experts, I = c.moe.moe_intermediate_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const auto p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    auto gu = weights.find(p + "gate_up_proj"), dn = weights.find(p + "down_proj");
    if (gu == weights.end() && dn == weights.end()) continue;
    auto refuse = [&](const std::string& what) { return make_error(errc::invalid_argument, origin + ": " + what); };
    if (c.feed_forward(l) != FeedForward::sparse)
      return refuse("layer " + std::to_string(l) + " holds fused experts (" + p + "gate_up_proj), but config.json " +
                    "makes it a dense layer (decoder_sparse_step " + std::to_string(c.moe.decoder_sparse_step) +
                    ", mlp_only_layers [" + join(c.moe.mlp_only_layers) + "])");
    if (gu == weights.end() || dn == weights.end())
      return refuse("layer " + std::to_string(l) + " has only one of the fused expert tensors " + p + "gate_up_proj and " +
                    p + "down_proj");
    const std::vector<int64_t> want_gu{E, 2 * I, h}, want_dn{E, h, I};
    if (gu->second.shape() != want_gu || dn->second.shape() != want_dn)
      return refuse(p + "gate_up_proj is " + gu->second.describe() + " and " + p + "down_proj " + dn->second.describe() +
                    ", expected [" + join(want_gu) + "] and [" + join(want_dn) + "] (num_experts " + std::to_string(E) +
                    ", moe_intermediate_size " + std::to_string(I) + ", hidden_size " + std::to_string(h) + ")");
    auto g = to_torch(gu->second), d = to_torch(dn->second);
    for (int64_t x = 0; x < E; ++x) {
      const auto q = p + std::to_string(x) + ".";
      // Each expert's gate rows, then its up rows (transformers 5's
      // conversion_mapping concatenates them so).
      const std::pair<std::string, at::Tensor> parts[] = {{q + "gate_proj.weight", g[x].narrow(0, 0, I)},
                                                          {q + "up_proj.weight", g[x].narrow(0, I, I)},
                                                          {q + "down_proj.weight", d[x]}};
      for (const auto& [name, t] : parts) {
        if (weights.count(name))
          return refuse("layer " + std::to_string(l) + " holds its experts twice: fused (" + p + "gate_up_proj) and " +
                        name);
        auto own = from_torch(t.contiguous().clone());
        if (!own) return own.error();
        weights.emplace(name, std::move(*own));
      }
    }
    weights.erase(p + "gate_up_proj");
    weights.erase(p + "down_proj");
  }
  return {};
}

RouterStatistics router_statistics(const RouterRecord& record, const at::Tensor& real, int64_t experts) {
  RouterStatistics st;
  if (record.layers.empty()) return st;
  const auto rows = real.reshape({-1}).nonzero().squeeze(1);  // the real tokens
  st.tokens = rows.numel();
  std::vector<at::Tensor> probs, counts;
  double entropy = 0;
  for (const auto& l : record.layers) {
    auto p = l.probs.index_select(0, rows);                        // [M, E]
    auto chosen = l.chosen.index_select(0, rows).reshape({-1});    // [M k]
    auto c = at::bincount(chosen, {}, experts).to(p.scalar_type());  // (token, slot) pairs per expert
    probs.push_back(p);
    counts.push_back(c);
    const double k = static_cast<double>(l.chosen.size(1));
    const double mean = static_cast<double>(st.tokens) * k / static_cast<double>(experts);
    st.load_max_over_mean.emplace_back(l.layer, mean > 0 ? c.max().item<double>() / mean : 0.0);
    c10::NoGradGuard no_grad;
    entropy += st.tokens > 0 ? -(p * at::log(p.clamp_min(1e-30))).sum(1).mean().item<double>() : 0.0;
  }
  st.entropy = entropy / static_cast<double>(record.layers.size());
  // Over every layer's tokens concatenated, as transformers computes it:
  // f_e = pairs that chose e / rows (summing to k), P_e = mean probability.
  auto p = at::cat(probs, 0);
  const double n = static_cast<double>(p.size(0));
  if (n == 0) {
    st.aux_loss = at::zeros({}, p.options());
    return st;
  }
  auto f = at::stack(counts).sum(0) / n;
  st.aux_loss = static_cast<double>(experts) * (f * p.mean(0)).sum();
  return st;
}

Result<at::Tensor> replay_routes(const ModelConfig& c, const Tensor& routes, int64_t B, int64_t T) {
  int64_t S = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) S += c.feed_forward(l) == FeedForward::sparse;
  const int64_t E = c.moe.num_experts, k = c.moe.num_experts_per_tok;
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "routes (routing replay): " + what); };
  if (S == 0) return bad("this model has no sparse layer to replay routes in; leave routes out");
  const std::vector<int64_t> want{B, T, S, k};
  if (routes.shape() != want)
    return bad("the batch's routes are " + routes.describe() + ", expected [" + join(want) +
               "] (rows, positions, sparse layers, num_experts_per_tok)");
  auto r = to_torch(routes);
  if (at::isFloatingType(r.scalar_type()) || r.scalar_type() == at::kBool)
    return bad("routes are expert indices, an integer tensor, not " + routes.describe());
  r = r.to(at::kLong).contiguous();
  // A position replays every slot of every layer, or none (-1 throughout).
  auto flat = r.view({B, T, S * k});
  auto free_pos = flat.eq(-1).all(2), given = flat.ge(0).logical_and(flat.lt(E)).all(2);
  auto wrong = free_pos.logical_or(given).logical_not().nonzero();
  if (wrong.size(0) > 0) {
    const int64_t b = wrong[0][0].item<int64_t>(), t = wrong[0][1].item<int64_t>();
    auto row = flat[b][t];
    std::vector<int64_t> vals(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + S * k);
    return bad("row " + std::to_string(b) + " position " + std::to_string(t) + " routes to [" + join(vals) +
               "]: each entry must be an expert in [0, " + std::to_string(E) +
               ") (num_experts), or every entry -1 for a position that routes itself");
  }
  // A token's k experts in one layer are distinct (the router's top k are).
  if (k > 1) {
    auto sorted = std::get<0>(r.sort(3));
    auto dup = sorted.narrow(3, 1, k - 1).eq(sorted.narrow(3, 0, k - 1)).logical_and(sorted.narrow(3, 1, k - 1).ge(0));
    auto where = dup.any(3).nonzero();
    if (where.size(0) > 0)
      return bad("row " + std::to_string(where[0][0].item<int64_t>()) + " position " +
                 std::to_string(where[0][1].item<int64_t>()) + " names an expert twice in sparse layer " +
                 std::to_string(where[0][2].item<int64_t>()) + " (a token's k experts are distinct)");
  }
  return r;
}

}  // namespace model_detail

namespace {

// The reference composition (set_dense_experts): every expert on every
// token, weighted by the router (0 where the token did not choose it).
at::Tensor dense_routed(const CausalLM::Impl& m, const std::string& pre, const at::Tensor& x, const at::Tensor& weights,
                        const at::Tensor& chosen, const PassOptions& pass) {
  const int64_t E = m.cfg.moe.num_experts;
  auto full = at::zeros({x.size(0), E}, weights.options()).scatter(1, chosen, weights);
  auto routed = at::zeros_like(x);
  for (int64_t e = 0; e < E; ++e)
    routed = routed + full.narrow(1, e, 1) * m.swiglu_mlp(pre + "experts." + std::to_string(e), x, false, pass);
  return routed;
}

// The experts [first, first + n) on xs, whose rows are sorted by expert
// (count[e] rows for expert first + e): one GEMM per projection per
// expert, in training with the large-product library choice (kernels.hpp:
// faster there from ~64 rows; decoding keeps the rows' own). `owner`: per
// row, the index of its adapter in pass.row_adapters (-1: none), or
// undefined. Rows in xs's order; xs itself when it has none (so that the
// result is always xs's descendant: expert parallelism's exchanges must be
// in every rank's graph, whatever its share of the tokens).
at::Tensor run_experts(const CausalLM::Impl& m, const std::string& pre, const at::Tensor& xs, const int64_t* count,
                       int64_t first, int64_t n, const PassOptions& pass, const at::Tensor& owner) {
  std::optional<LargeProductScope> large;
  if (at::GradMode::is_enabled()) large.emplace();
  std::vector<at::Tensor> outs;
  int64_t begin = 0;
  for (int64_t e = 0; e < n; ++e) {
    const int64_t rows = count[e];
    if (rows == 0) continue;
    auto slice = xs.narrow(0, begin, rows);
    // Without per-row adapters the pass applies as it is; with them, a copy
    // whose rows are this slice's.
    std::optional<PassOptions> sub;
    if (owner.defined()) {
      sub.emplace(pass);
      sub->row_adapters.clear();
      auto mine = owner.narrow(0, begin, rows);
      for (size_t a = 0; a < pass.row_adapters.size(); ++a) {
        auto sel = (mine == static_cast<int64_t>(a)).nonzero().squeeze(1);
        if (sel.numel() > 0) sub->row_adapters.push_back({pass.row_adapters[a].lora, sel});
      }
    }
    outs.push_back(m.swiglu_mlp(pre + "experts." + std::to_string(first + e), slice, false, sub ? *sub : pass));
    begin += rows;
  }
  return outs.empty() ? xs : at::cat(outs, 0);
}

// The (token, slot) pairs sorted by their expert (stable), so that each
// expert's are one slice: the order, each sorted pair's token, and the
// pairs per expert.
struct Sorted {
  at::Tensor order, token, counts;
};
Sorted sort_by_expert(const at::Tensor& chosen, int64_t E) {
  const int64_t k = chosen.size(1);
  auto flat = chosen.reshape({-1});                                // [N k]
  auto order = std::get<1>(flat.sort(/*stable=*/true, 0, false));  // slots by expert
  return {order, at::floor_divide(order, k), at::bincount(flat, {}, E).to(at::kLong).contiguous()};
}

// Grouped by expert: each expert's tokens are one contiguous slice and one
// GEMM per projection, forward and backward; no expert sees a token not
// routed to it, and none is dropped.
at::Tensor grouped_routed(const CausalLM::Impl& m, const std::string& pre, const at::Tensor& x,
                          const at::Tensor& weights, const at::Tensor& chosen, const PassOptions& pass) {
  const int64_t N = x.size(0), E = m.cfg.moe.num_experts;
  const auto s = sort_by_expert(chosen, E);
  auto xs = x.index_select(0, s.token);  // [N k, H]
  auto ws = weights.reshape({-1}).index_select(0, s.order).unsqueeze(1);
  // Per-row adapters (the sampler's multi-tenant batches) name token rows:
  // each expert's slice gets the rows of its own tokens.
  at::Tensor owner;
  if (!pass.row_adapters.empty()) {
    owner = at::full({N}, -1, at::kLong);
    for (size_t a = 0; a < pass.row_adapters.size(); ++a)
      owner.index_fill_(0, pass.row_adapters[a].rows, static_cast<int64_t>(a));
    owner = owner.index_select(0, s.token);
  }
  auto ys = run_experts(m, pre, xs, s.counts.data_ptr<int64_t>(), 0, E, pass, owner);
  return at::zeros_like(x).index_add(0, s.token, ys * ws);
}

// Expert parallelism (components/parallel/expert_parallel.hpp): the sorted
// pairs go to the ranks holding their experts (one exchange), each rank
// runs its experts over what it got, grouped by expert, and the outputs go
// back (another), where the router's weights combine them as above.
at::Tensor expert_parallel_routed(const CausalLM::Impl& m, const std::string& pre, const at::Tensor& x,
                                  const at::Tensor& weights, const at::Tensor& chosen, const PassOptions& pass) {
  if (!pass.row_adapters.empty())
    throw_error(make_error(errc::unimplemented, "per-row adapters on an expert-parallel model are not built yet"));
  auto& pg = *m.ep->pg;
  const int64_t p = pg.size(), n = m.ep->experts;
  const auto s = sort_by_expert(chosen, m.cfg.moe.num_experts);
  auto xs = x.index_select(0, s.token);
  auto ws = weights.reshape({-1}).index_select(0, s.order).unsqueeze(1);
  // What each rank sends each other one: its pairs for that rank's experts
  // (contiguous, as they are sorted by expert), counted per expert.
  auto got_counts = ep::exchange_counts(s.counts, pg).contiguous();  // [p * n]: from each rank, per local expert
  std::vector<int64_t> send(static_cast<size_t>(p), 0), recv(static_cast<size_t>(p), 0);
  const auto* sc = s.counts.data_ptr<int64_t>();
  const auto* rc = got_counts.data_ptr<int64_t>();
  for (int64_t r = 0; r < p; ++r)
    for (int64_t e = 0; e < n; ++e) {
      send[static_cast<size_t>(r)] += sc[r * n + e];
      recv[static_cast<size_t>(r)] += rc[r * n + e];
    }
  auto got = ep::exchange(xs, send, recv, pg);  // [R, H]: by source rank, then by expert
  // Grouped by this rank's expert, across the sources.
  auto local = at::arange(n, at::kLong).repeat({p}).repeat_interleave(got_counts);
  auto order = std::get<1>(local.sort(/*stable=*/true, 0, false));
  auto per_expert = got_counts.view({p, n}).sum(0).contiguous();
  auto ys = run_experts(m, pre, got.index_select(0, order), per_expert.data_ptr<int64_t>(), m.ep->first_expert, n,
                        pass, {});
  auto back = ep::exchange(ys.index_select(0, at::argsort(order)), recv, send, pg);  // in xs's order
  return at::zeros_like(x).index_add(0, s.token, back * ws);
}

}  // namespace

at::Tensor CausalLM::Impl::sparse_moe(int64_t layer, const at::Tensor& h, const PassOptions& pass) const {
  const auto& m = cfg.moe;
  const auto pre = "model.layers." + std::to_string(layer) + ".mlp.";
  const auto sizes = h.sizes().vec();
  const int64_t H = sizes.back(), k = m.num_experts_per_tok;
  if (!pass.row_adapters.empty() && h.dim() != 2)
    throw_error(make_error(errc::internal, "per-row adapters on an expert block need [tokens, hidden] input"));
  auto x = h.reshape({-1, H});
  // Under expert parallelism a rank without tokens still takes its part in
  // the exchanges.
  if (x.size(0) == 0 && !ep) return at::zeros_like(h);

  // Routing: softmax over every expert, the k most probable, optionally
  // renormalised to sum 1 (in the computation's dtype: f32, as
  // transformers' router, or f64 in tests).
  auto probs = at::softmax(linear(pre + "gate", x, false, pass), -1);  // [N, E]
  auto [weights, chosen] = probs.topk(k, -1);                          // [N, k]
  if (pass.replay.defined()) {
    // The replayed experts where given (checked by the caller: in range,
    // distinct), the router's own elsewhere; weighted by the router.
    int64_t ordinal = 0;
    for (int64_t l = 0; l < layer; ++l) ordinal += cfg.feed_forward(l) == FeedForward::sparse;
    if (pass.replay.size(0) != x.size(0))
      throw_error(make_error(errc::internal, "a routing replay of " + std::to_string(pass.replay.size(0)) +
                                                 " tokens for a pass of " + std::to_string(x.size(0))));
    auto given = pass.replay.select(1, ordinal).to(at::kLong);  // [N, k]
    chosen = at::where(given.narrow(1, 0, 1).lt(0), chosen, given);
    weights = probs.gather(1, chosen);
  }
  if (m.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);

  if (pass.routes) pass.routes->layers.push_back({layer, probs, chosen});
  if (ep && dense_experts())
    throw_error(make_error(errc::unimplemented, "set_dense_experts on an expert-parallel model: each rank holds " +
                                                    std::to_string(ep->experts) + " experts only"));
  auto routed = ep               ? expert_parallel_routed(*this, pre, x, weights, chosen, pass)
                : dense_experts() ? dense_routed(*this, pre, x, weights, chosen, pass)
                                  : grouped_routed(*this, pre, x, weights, chosen, pass);
  if (m.shared_expert_intermediate_size > 0) {
    // Qwen2-MoE: a shared expert on every token, gated per token.
    auto gate = at::sigmoid(linear(pre + "shared_expert_gate", x, false, pass));  // [N, 1]
    routed = routed + gate * swiglu_mlp(pre + "shared_expert", x, false, pass);
  }
  return routed.view(sizes);
}

}  // namespace glint::components
