// glint bench parallel: data parallelism against fully sharded data
// parallelism on two ranks (bench/parallel_bench.hpp).
#include "bench/parallel_bench.hpp"
#include "bench/bench_model.hpp"
#include "bench/measure.hpp"

#include "components/comm/process_group.hpp"
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"
#include "runtime/process.hpp"

#include <ATen/Parallel.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace glint::bench {

namespace {

using namespace glint::components;

constexpr const char* kName = "glint bench parallel";
constexpr uint64_t kSeed = 1;
constexpr int kRanks = 2;

int fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kName, what.c_str());
  return 1;
}

// A process group that adds up what its collectives move over a ring, as
// this rank sees it: an all-reduce of n bytes sends and receives 2 n (p-1)/p,
// an all-gather of n bytes out n (p-1)/p; Gloo's reduce-scatter is an
// all-reduce of its whole input (ProcessGroup::reduce_scatter_sum).
class CountingGroup : public ProcessGroup {
public:
  explicit CountingGroup(std::shared_ptr<ProcessGroup> inner) : inner_(std::move(inner)) {}
  double bytes = 0;
  double exchanged = 0;  ///< of bytes, what all_to_all moved (expert parallelism's tokens)

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool broken() const override { return inner_->broken(); }
  Result<void> all_reduce_sum(std::vector<Tensor>& ts) override {
    for (const auto& t : ts) bytes += 2 * share() * static_cast<double>(t.nbytes());
    return inner_->all_reduce_sum(ts);
  }
  Result<void> broadcast(std::vector<Tensor>& ts, int root) override {
    for (const auto& t : ts) bytes += share() * static_cast<double>(t.nbytes());
    return inner_->broadcast(ts, root);
  }
  Result<int64_t> broadcast_buckets(std::vector<Tensor>& ts, int root, int64_t bucket_bytes) override {
    for (const auto& t : ts) bytes += share() * static_cast<double>(t.nbytes());
    return inner_->broadcast_buckets(ts, root, bucket_bytes);
  }
  Result<void> barrier() override { return inner_->barrier(); }
  Result<void> all_gather(const Tensor& in, Tensor& out) override {
    bytes += share() * static_cast<double>(out.nbytes());
    return inner_->all_gather(in, out);
  }
  Result<void> reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    bytes += 2 * share() * static_cast<double>(in.nbytes());
    return inner_->reduce_scatter_sum(in, out);
  }
  // What leaves this rank for the others (its rows for itself stay).
  Result<void> all_to_all(const Tensor& in, const std::vector<int64_t>& in_rows, Tensor& out,
                          const std::vector<int64_t>& out_rows) override {
    const int64_t rows = in.shape().empty() ? 0 : in.shape()[0];
    if (rows > 0 && static_cast<size_t>(rank()) < in_rows.size()) {
      const double n = static_cast<double>(in.nbytes()) *
                       static_cast<double>(rows - in_rows[static_cast<size_t>(rank())]) / static_cast<double>(rows);
      bytes += n;
      exchanged += n;
    }
    return inner_->all_to_all(in, in_rows, out, out_rows);
  }
  Result<void> send(const Tensor& t, int to, int tag) override {
    bytes += static_cast<double>(t.nbytes());
    return inner_->send(t, to, tag);
  }
  Result<void> recv(Tensor& t, int from, int tag) override {
    bytes += static_cast<double>(t.nbytes());
    return inner_->recv(t, from, tag);
  }
  Result<std::unique_ptr<PendingSend>> send_async(const Tensor& t, int to, int tag) override {
    bytes += static_cast<double>(t.nbytes());
    return inner_->send_async(t, to, tag);
  }

private:
  double share() const { return static_cast<double>(size() - 1) / size(); }
  std::shared_ptr<ProcessGroup> inner_;
};

struct Measured {
  double seconds_per_step = 0;
  double state_bytes = 0;
  double bytes_per_step = 0;
  double expert_bytes = 0;     ///< of state_bytes, the routed experts' (parameters, gradients, optimizer state)
  double exchanged_per_step = 0;  ///< of bytes_per_step, all-to-all's
};

// The dense model's schemes, then expert parallelism (on an MoE model,
// against dp: "ep1").
enum Scheme : size_t { dp, fsdp, tp, pp, kSchemes, ep = kSchemes };
constexpr const char* kSchemeNames[] = {"dp2", "fsdp2", "tp2", "pp2", "ep2"};

// The bytes of the routed experts' tensors among `named`.
template <class Named>
double expert_bytes_of(const Named& named) {
  double n = 0;
  for (const auto& [name, t] : named)
    if (name.find(".mlp.experts.") != std::string::npos) n += static_cast<double>(t.nbytes());
  return n;
}

// `steps` timed steps (after one warm-up) of both ranks; rank 0's numbers.
// dp and fsdp: each rank its own `batch` rows; tp and pp: both ranks the
// same 2 x `batch` rows (the group is one data-parallel rank), so that
// every scheme trains as many tokens per step. pp runs its default 4
// micro-batches (2 per stage).
Result<Measured> run(const ModelConfig& cfg, Scheme scheme, const ParallelBenchArgs& a) {
  auto port = pick_free_port();
  if (!port) return port.error();
  std::array<Result<Measured>, kRanks> out{make_error(errc::internal, "not run"), make_error(errc::internal, "not run")};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      out[static_cast<size_t>(r)] = [&]() -> Result<Measured> {
        auto pg = ProcessGroup::create({.store_port = *port, .rank = r, .world_size = kRanks});
        if (!pg) return pg.error();
        auto counting = std::make_shared<CountingGroup>(*pg);
        TrainConfig tc{.optimizer = {.lr = 1e-4, .max_grad_norm = 1.0}};
        (scheme == fsdp ? tc.fsdp_group
         : scheme == tp ? tc.tp_group
         : scheme == pp ? tc.pp_group
         : scheme == ep ? tc.ep_group
                        : tc.dp_group) = counting;
        const bool shared_batch = scheme == tp || scheme == pp;
        auto lm = CausalLM::init_random(cfg, kSeed);
        if (!lm) return lm.error();
        auto tr = Trainer::create(std::move(*lm), tc);
        if (!tr) return tr.error();
        const TrainBatch batch{.tokens = {.input_ids = shared_batch
                                                           ? random_tokens(kRanks * a.batch, a.seq, cfg.vocab_size, kSeed)
                                                           : random_tokens(a.batch, a.seq, cfg.vocab_size, kSeed + r)}};
        auto step = [&]() -> Result<void> {
          if (auto m = tr->forward_backward(batch, {}); !m) return m.error();
          if (auto s = tr->clip_grad_and_step(); !s) return s.error();
          return {};
        };
        if (auto ok = step(); !ok) return ok.error();  // warm-up: the optimizer's moments exist from here
        counting->bytes = 0;
        counting->exchanged = 0;
        Result<void> ok{};
        const double seconds = seconds_of([&] {
          for (int s = 0; s < a.steps && ok; ++s) ok = step();
        });
        if (!ok) return ok.error();
        // The experts this rank holds: their values and gradients, and
        // their optimizer state (named after them).
        double experts = 0;
        for (const auto& [name, p] : tr->model().impl().params)
          if (name.find(".mlp.experts.") != std::string::npos)
            experts += static_cast<double>(p.nbytes() + (p.grad().defined() ? p.grad().nbytes() : 0));
        experts += expert_bytes_of(tr->optimizer_state());
        return Measured{seconds / a.steps, static_cast<double>(tr->state_bytes()), counting->bytes / a.steps, experts,
                        counting->exchanged / a.steps};
      }();
    });
  for (auto& t : threads) t.join();
  for (auto& o : out)
    if (!o) return o.error();
  return *out[0];
}

}  // namespace

// Expert parallelism on an MoE model: ep2 against dp2 on it (ep1: every
// rank holds every expert), each rank its own batch.
int parallel_moe(const ParallelBenchArgs& a, const ModelConfig& cfg) {
  const int threads_before = at::get_num_threads();
  at::set_num_threads(1);
  std::printf("# %s: %s, %lld experts of width %lld in every layer, %lld per token (%s parameters), %d ranks "
              "(threads, 1 libtorch thread each, Gloo over loopback), full-parameter AdamW, %lld x %lld tokens per "
              "rank; ep1 is dp over the ranks; medians of %d runs of %d steps after a warm-up step\n",
              kName, std::string{hf_class_name(cfg.architecture)}.c_str(),
              static_cast<long long>(cfg.moe.num_experts), static_cast<long long>(cfg.moe.moe_intermediate_size),
              static_cast<long long>(cfg.moe.num_experts_per_tok), millions(cfg.num_parameters()).c_str(), kRanks,
              static_cast<long long>(a.batch), static_cast<long long>(a.seq), a.repeats, a.steps);
  std::fflush(stdout);
  const Scheme schemes[] = {dp, ep};
  std::array<std::vector<double>, 2> seconds, state, experts, moved, exchanged;
  for (int rep = 0; rep < a.repeats; ++rep)
    for (size_t k = 0; k < 2; ++k) {
      const size_t i = (k + static_cast<size_t>(rep)) % 2;  // in turn first
      auto m = run(cfg, schemes[i], a);
      if (!m) {
        at::set_num_threads(threads_before);
        return fail(std::string{i ? "ep2" : "ep1"} + ": " + describe(m.error()));
      }
      seconds[i].push_back(m->seconds_per_step);
      state[i].push_back(m->state_bytes);
      experts[i].push_back(m->expert_bytes);
      moved[i].push_back(m->bytes_per_step);
      exchanged[i].push_back(m->exchanged_per_step);
    }
  at::set_num_threads(threads_before);
  const double tokens = static_cast<double>(kRanks * a.batch * a.seq);
  // The least all-to-all moves per step: each (token, slot) whose expert is
  // on the other rank, half of them when routing is even, there and back
  // forward, and its gradient back and there: 4 x tokens per rank x k x
  // (p-1)/p x hidden x 4 bytes per sparse layer.
  int64_t sparse = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) sparse += cfg.feed_forward(l) == FeedForward::sparse;
  const double theory = 4.0 * static_cast<double>(a.batch * a.seq * cfg.moe.num_experts_per_tok) *
                        (kRanks - 1.0) / kRanks * static_cast<double>(cfg.hidden_size) * 4.0 *
                        static_cast<double>(sparse);
  for (size_t i = 0; i < 2; ++i) {
    const std::string n = i ? "ep2" : "ep1";
    print_metric((n + "_state_bytes").c_str(), median(state[i]), 0);
    print_metric((n + "_expert_bytes").c_str(), median(experts[i]), 0);
    print_metric((n + "_tokens_per_s").c_str(), tokens / median(seconds[i]), 1);
    print_metric((n + "_bytes_per_step").c_str(), median(moved[i]), 0);
  }
  print_metric("ep2_all_to_all_bytes_per_step", median(exchanged[1]), 0);
  print_metric("ep2_all_to_all_bytes_even_routing", theory, 0);
  print_metric("ep2_state_bytes_vs_ep1", median(state[1]) / median(state[0]), 3);
  print_metric("ep2_expert_bytes_vs_ep1", median(experts[1]) / median(experts[0]), 3);
  print_metric("ep2_tokens_per_s_vs_ep1", median(seconds[0]) / median(seconds[1]), 3);
  return 0;
}

int parallel(const ParallelBenchArgs& a) {
  if (auto bad = bad_sizes(a.repeats, a.steps, a.batch, a.seq); !bad.empty()) return fail(bad);
  auto arch = parse_architecture(a.arch);
  if (!arch) return fail(describe(arch.error()));
  if (is_moe(*arch)) return parallel_moe(a, bench_model(a.small, a.seq, *arch));
  const auto cfg = bench_model(a.small, a.seq);
  // One libtorch thread per rank: the two ranks are the machine's two cores.
  const int threads_before = at::get_num_threads();
  at::set_num_threads(1);
  std::printf("# %s: Qwen3 %s parameters, %d ranks (threads of this process, 1 libtorch thread each, Gloo over "
              "loopback), full-parameter AdamW, %lld x %lld tokens per rank; medians of %d runs of %d steps after a "
              "warm-up step\n",
              kName, millions(cfg.num_parameters()).c_str(), kRanks, static_cast<long long>(a.batch),
              static_cast<long long>(a.seq), a.repeats, a.steps);
  std::fflush(stdout);
  std::array<std::vector<double>, kSchemes> seconds, state, moved;
  for (int rep = 0; rep < a.repeats; ++rep)
    for (size_t k = 0; k < kSchemes; ++k) {
      // In turn first, so that all share whatever else loads the machine.
      const auto scheme = static_cast<Scheme>((k + static_cast<size_t>(rep)) % kSchemes);
      auto m = run(cfg, scheme, a);
      if (!m) {
        at::set_num_threads(threads_before);
        return fail(std::string{kSchemeNames[scheme]} + ": " + describe(m.error()));
      }
      seconds[scheme].push_back(m->seconds_per_step);
      state[scheme].push_back(m->state_bytes);
      moved[scheme].push_back(m->bytes_per_step);
    }
  at::set_num_threads(threads_before);
  const double tokens = static_cast<double>(kRanks * a.batch * a.seq);
  // The least each needs per step, over a ring of p ranks, P the model's
  // f32 bytes and A a layer's activations (tokens x hidden x 4): DP one
  // all-reduce of the gradients, 2 P (p-1)/p; FSDP two all-gathers of the
  // parameters and one reduce-scatter of the gradients, 3 P (p-1)/p; TP
  // Megatron's four all-reduces of A per layer (o and down forward, their
  // inputs' gradients backward) and two more (the embedding forward, the
  // head's input gradient), (4 L + 2) 2 A (p-1)/p; PP the activations
  // forward and their gradients back across the one cut, 2 A (a rank sends
  // one and receives the other).
  const double p_bytes = 4.0 * static_cast<double>(cfg.num_parameters());
  const double a_bytes = 4.0 * tokens * static_cast<double>(cfg.hidden_size);
  const double share = static_cast<double>(kRanks - 1) / kRanks;
  const double theory[] = {2 * share * p_bytes, 3 * share * p_bytes,
                           static_cast<double>(4 * cfg.num_hidden_layers + 2) * 2 * share * a_bytes, 2 * a_bytes};
  const double dp_state = median(state[dp]), dp_tps = tokens / median(seconds[dp]);
  for (size_t k = 0; k < kSchemes; ++k) {
    const std::string n = kSchemeNames[k];
    print_metric((n + "_state_bytes").c_str(), median(state[k]), 0);
    if (k != dp) print_metric((n + "_state_bytes_vs_dp").c_str(), median(state[k]) / dp_state, 3);
    print_metric((n + "_tokens_per_s").c_str(), tokens / median(seconds[k]), 1);
    if (k != dp) print_metric((n + "_tokens_per_s_vs_dp").c_str(), tokens / median(seconds[k]) / dp_tps, 3);
    print_metric((n + "_bytes_per_step").c_str(), median(moved[k]), 0);
    print_metric((n + "_bytes_theory").c_str(), theory[k], 0);
  }
  return 0;
}

}  // namespace glint::bench
