#pragma once
// A ProcessGroup without peers, for tests of its callers' error paths: it
// acts as if every other rank passed the same tensors (a sum is the tensor
// times the group's size, a broadcast leaves it as it is), and fails the
// collectives it is told to, as a dead or timed-out peer would make c10d
// fail them.

#include "components/comm/process_group.hpp"
#include "components/tensor/torch_bridge.hpp"

#include <c10/core/GradMode.h>

#include <deque>
#include <string>

namespace glint::testing {

class FakeProcessGroup : public components::ProcessGroup {
public:
  FakeProcessGroup(int rank, int size) : rank_(rank), size_(size) {}

  /// The next collectives answer these, in order (an empty error: it works).
  void script(std::deque<caf::error> outcomes) { outcomes_ = std::move(outcomes); }
  int collectives() const { return collectives_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Result<void> all_reduce_sum(std::vector<Tensor>& tensors) override {
    if (auto e = next(); e) return e;
    c10::NoGradGuard no_grad;
    for (auto& t : tensors) components::to_torch(t).mul_(size_);
    return {};
  }
  Result<void> broadcast(std::vector<Tensor>&, int) override {
    if (auto e = next(); e) return e;
    return {};
  }
  Result<int64_t> broadcast_buckets(std::vector<Tensor>& tensors, int, int64_t) override {
    if (auto e = next(); e) return e;
    return static_cast<int64_t>(tensors.size());
  }
  Result<void> barrier() override {
    if (auto e = next(); e) return e;
    return {};
  }
  Result<void> all_gather(const Tensor& input, Tensor& output) override {
    if (auto e = next(); e) return e;
    c10::NoGradGuard no_grad;
    auto out = components::to_torch(output);
    for (int r = 0; r < size_; ++r) out.narrow(0, r * input.size(0), input.size(0)).copy_(components::to_torch(input));
    return {};
  }
  Result<void> reduce_scatter_sum(const Tensor& input, Tensor& output) override {
    if (auto e = next(); e) return e;
    c10::NoGradGuard no_grad;
    auto out = components::to_torch(output);
    out.copy_(components::to_torch(input).reshape({-1}).narrow(0, rank_ * out.numel(), out.numel()).view(out.sizes()) * size_);
    return {};
  }
  // As if each rank sent this one what this one sends it: the rows for
  // this rank come back as they are, the others' slots are zeros.
  Result<void> all_to_all(const Tensor& input, const std::vector<int64_t>& in_rows, Tensor& output,
                          const std::vector<int64_t>& out_rows) override {
    if (auto e = next(); e) return e;
    c10::NoGradGuard no_grad;
    auto in = components::to_torch(input), out = components::to_torch(output);
    out.zero_();
    int64_t from = 0, to = 0;
    for (int r = 0; r < size_ && r < static_cast<int>(in_rows.size()) && r < static_cast<int>(out_rows.size()); ++r) {
      if (r == rank_ && in_rows[r] == out_rows[r]) out.narrow(0, to, out_rows[r]).copy_(in.narrow(0, from, in_rows[r]));
      from += in_rows[r];
      to += out_rows[r];
    }
    return {};
  }
  Result<void> send(const Tensor&, int, int) override { return next_result(); }
  Result<void> recv(Tensor&, int, int) override { return next_result(); }
  Result<std::unique_ptr<PendingSend>> send_async(const Tensor&, int, int) override {
    struct Sent : PendingSend {
      Result<void> wait() override { return {}; }
    };
    if (auto e = next(); e) return e;
    return std::unique_ptr<PendingSend>{new Sent};
  }

private:
  Result<void> next_result() {
    if (auto e = next(); e) return e;
    return {};
  }
  caf::error next() {
    ++collectives_;
    if (outcomes_.empty()) return {};
    auto e = std::move(outcomes_.front());
    outcomes_.pop_front();
    return e;
  }

  int rank_, size_;
  int collectives_ = 0;
  std::deque<caf::error> outcomes_;
};

}  // namespace glint::testing
