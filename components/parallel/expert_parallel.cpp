#include "components/parallel/expert_parallel.hpp"

#include "components/comm/process_group_impl.hpp"
#include "components/tensor/torch_bridge.hpp"

#include "components/parallel/autograd_group.hpp"

#include <cstdlib>

namespace glint::components::ep {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rows of x (contiguous) exchanged: send[r] rows to rank r, recv[r] rows
// from it, or a thrown error.
at::Tensor exchanged(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                     ProcessGroup& pg, const char* what) {
  int64_t rows = 0;
  for (auto r : recv) rows += r;
  auto shape = x.sizes().vec();
  shape[0] = rows;
  auto in = x.detach().contiguous();
  auto out = at::empty(shape, in.options());
  auto a = from_torch(in), b = from_torch(out);
  if (!a) throw_error(a.error());
  if (!b) throw_error(b.error());
  if (auto ok = pg.all_to_all(*a, send, *b, recv); !ok) throw_error(with_context(ok.error(), what));
  return out;
}

struct ExchangeFn : torch::autograd::Function<ExchangeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> send,
                            std::vector<int64_t> recv, ProcessGroup* pg) {
    detail::keep_group(ctx, *pg);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchanged(x, send, recv, *pg, "expert parallelism: tokens to their experts' ranks");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& pg = detail::group_of(ctx);
    const auto send = ctx->saved_data["send"].toIntVector(), recv = ctx->saved_data["recv"].toIntVector();
    return {exchanged(grads[0], recv, send, pg, "expert parallelism: gradients back to their tokens' ranks"),
            at::Tensor{}, at::Tensor{}, at::Tensor{}};
  }
};

}  // namespace

Result<Range> expert_range(int64_t experts, const ProcessGroup& pg) {
  const int64_t p = pg.size();
  if (experts < p || experts % p != 0)
    return make_error(errc::invalid_argument,
                      "num_experts (" + std::to_string(experts) + ") does not divide by the expert-parallel size " +
                          std::to_string(p) + ": each rank holds the same number of each sparse layer's experts; " +
                          "use an ep that divides " + std::to_string(experts));
  const int64_t n = experts / p;
  return Range{pg.rank() * n, n};
}

at::Tensor exchange(const at::Tensor& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                    ProcessGroup& pg) {
  return ExchangeFn::apply(x, send_rows, recv_rows, &pg);
}

at::Tensor exchange_counts(const at::Tensor& counts, ProcessGroup& pg) {
  c10::NoGradGuard no_grad;
  const int64_t p = pg.size(), n = counts.numel() / p;
  std::vector<int64_t> each(static_cast<size_t>(p), n);
  return exchanged(counts.to(at::kLong).reshape({-1}), each, each, pg, "expert parallelism: the tokens per expert");
}

int64_t expert_of(const std::string& name) {
  static const std::string key = ".mlp.experts.";
  const auto at = name.find(key);
  if (at == std::string::npos) return -1;
  const char* digits = name.c_str() + at + key.size();
  char* end = nullptr;
  const long e = std::strtol(digits, &end, 10);
  if (end == digits || *end != '.') return -1;
  return e;
}

int owner_of(const ModelConfig& c, int size, const std::string& name) {
  const int64_t e = expert_of(name);
  if (e < 0 || size <= 1 || c.moe.num_experts % size != 0) return -1;
  return static_cast<int>(e / (c.moe.num_experts / size));
}

Result<void> shard_model(CausalLM::Impl& m, std::shared_ptr<ProcessGroup> pg) {
  if (!pg) return make_error(errc::invalid_argument, "expert parallelism needs a process group");
  if (m.ep || m.pp || m.tp || !m.sharded_by.empty())
    return make_error(errc::failed_precondition, "the model is sharded already");
  int64_t sparse = 0;
  for (int64_t l = 0; l < m.cfg.num_hidden_layers; ++l) sparse += m.cfg.feed_forward(l) == FeedForward::sparse;
  if (sparse == 0)
    return make_error(errc::invalid_argument,
                      std::string{"expert parallelism splits a model's experts, and this "} +
                          std::string{hf_class_name(m.cfg.architecture)} +
                          " has none (no sparse layer); use dp or fsdp to spread it over ranks");
  if (!m.adapters.empty())
    return make_error(errc::unimplemented, "LoRA on an expert-parallel model is not built yet; remove the adapters or "
                                           "use data parallelism");
  auto range = expert_range(m.cfg.moe.num_experts, *pg);
  if (!range) return range.error();
  std::vector<std::string> names;
  std::map<std::string, at::Tensor> params;
  for (const auto& n : m.names) {
    const int64_t e = expert_of(n);
    if (e >= 0 && (e < range->first || e >= range->first + range->count)) continue;
    names.push_back(n);
    params[n] = m.params.at(n);
  }
  m.names = std::move(names);
  m.params = std::move(params);
  m.ep = std::make_shared<ExpertParallelPlan>(ExpertParallelPlan{std::move(pg), range->first, range->count});
  return {};
}

}  // namespace glint::components::ep
