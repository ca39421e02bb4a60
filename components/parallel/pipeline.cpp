#include "components/parallel/pipeline.hpp"

#include "components/comm/process_group_impl.hpp"
#include "components/parallel/pipeline_schedule.hpp"
#include "components/tensor/torch_bridge.hpp"

#include <memory>

namespace glint::components {

Result<void> run_pipeline(ProcessGroup& pp, int micro_batches, const PipelineStage& stage) try {
  const int p = pp.size(), s = pp.rank();
  auto ops = one_f_one_b(p, s, micro_batches);
  if (!ops) return ops.error();
  const auto M = static_cast<size_t>(micro_batches);
  std::vector<at::Tensor> inputs(M), outputs(M);
  std::vector<at::Tensor> sent;  // kept alive until their sends are waited for
  std::vector<std::unique_ptr<ProcessGroup::PendingSend>> sends;
  // Tags: micro-batch m's activations 2m, their gradient 2m + 1.
  auto post = [&](const at::Tensor& t, int to, int tag) -> Result<void> {
    sent.push_back(t.detach().contiguous());
    auto g = from_torch(sent.back());
    if (!g) return g.error();
    auto h = pp.send_async(*g, to, tag);
    if (!h) return h.error();
    sends.push_back(std::move(*h));
    return {};
  };
  auto receive = [&](std::vector<int64_t> shape, int from, int tag) -> Result<at::Tensor> {
    auto t = at::empty(shape, at::TensorOptions().dtype(stage.dtype));
    auto g = from_torch(t);
    if (!g) return g.error();
    if (auto ok = pp.recv(*g, from, tag); !ok) return ok.error();
    return t;
  };
  for (const auto& op : *ops) {
    const auto m = static_cast<size_t>(op.micro);
    if (op.kind == PipeOp::Kind::forward) {
      at::Tensor in;
      if (s > 0) {
        auto got = receive(stage.activation_shape(op.micro), s - 1, 2 * op.micro);
        if (!got) return with_context(got.error(), "stage " + std::to_string(s) + " receiving micro-batch " +
                                                       std::to_string(op.micro) + "'s activations");
        in = got->set_requires_grad(true);
      }
      auto out = stage.forward(op.micro, in);
      if (s < p - 1)
        if (auto ok = post(out, s + 1, 2 * op.micro); !ok) return ok.error();
      inputs[m] = in;
      outputs[m] = out;
      continue;
    }
    if (s == p - 1) {
      outputs[m].backward();
    } else {
      auto grad = receive(outputs[m].sizes().vec(), s + 1, 2 * op.micro + 1);
      if (!grad) return with_context(grad.error(), "stage " + std::to_string(s) + " receiving micro-batch " +
                                                       std::to_string(op.micro) + "'s gradient");
      outputs[m].backward(*grad);
    }
    if (s > 0) {
      const auto& g = inputs[m].grad();
      if (auto ok = post(g.defined() ? g : at::zeros_like(inputs[m]), s - 1, 2 * op.micro + 1); !ok) return ok.error();
    }
    inputs[m] = outputs[m] = at::Tensor{};  // the micro-batch's activations go
  }
  for (auto& h : sends)
    if (auto ok = h->wait(); !ok) return ok;
  return {};
} catch (const std::exception& e) {
  return carried_error(e).value_or(error_of_exception(e, "a pipeline stage"));
}

}  // namespace glint::components
