#include "components/parallel/pipeline.hpp"

#include "components/comm/process_group_impl.hpp"
#include "components/model/transformer.hpp"
#include "components/parallel/pipeline_schedule.hpp"
#include "components/tensor/torch_bridge.hpp"

#include <memory>
#include <optional>
#include <string>

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
  // A forward or backward that throws (memory running out on this stage)
  // must not leave the neighbours waiting on messages that never come: the
  // schedule goes on with zeros of the planned shapes, and the first such
  // failure is this stage's answer once every message has been sent.
  std::optional<caf::error> failed;
  auto note = [&](const std::exception& e, const std::string& what) {
    if (!failed) failed = carried_error(e).value_or(error_of_exception(e, what));
  };
  for (const auto& op : *ops) {
    const auto m = static_cast<size_t>(op.micro);
    const std::string which = "micro-batch " + std::to_string(op.micro) + " on stage " + std::to_string(s);
    if (op.kind == PipeOp::Kind::forward) {
      at::Tensor in;
      if (s > 0) {
        auto got = receive(stage.activation_shape(op.micro), s - 1, 2 * op.micro);
        if (!got) return with_context(got.error(), "stage " + std::to_string(s) + " receiving micro-batch " +
                                                       std::to_string(op.micro) + "'s activations");
        in = got->set_requires_grad(true);
      }
      at::Tensor out;
      if (!failed) {
        try {
          out = stage.forward(op.micro, in);
        } catch (const std::exception& e) {
          note(e, "the forward of " + which);
        }
      }
      if (s < p - 1) {
        auto sent_on = out.defined() ? out : at::zeros(stage.activation_shape(op.micro), at::TensorOptions().dtype(stage.dtype));
        if (auto ok = post(sent_on, s + 1, 2 * op.micro); !ok) return ok.error();
      }
      inputs[m] = in;
      outputs[m] = out;
      continue;
    }
    if (s < p - 1) {
      auto grad = receive(stage.activation_shape(op.micro), s + 1, 2 * op.micro + 1);
      if (!grad) return with_context(grad.error(), "stage " + std::to_string(s) + " receiving micro-batch " +
                                                       std::to_string(op.micro) + "'s gradient");
      if (!failed && outputs[m].defined()) {
        try {
          outputs[m].backward(*grad);
        } catch (const std::exception& e) {
          note(e, "the backward of " + which);
        }
      }
    } else if (!failed && outputs[m].defined()) {
      try {
        outputs[m].backward();
      } catch (const std::exception& e) {
        note(e, "the backward of " + which);
      }
    }
    if (s > 0) {
      const auto& g = inputs[m].grad();
      if (auto ok = post(g.defined() && !failed ? g : at::zeros_like(inputs[m]), s - 1, 2 * op.micro + 1); !ok)
        return ok.error();
    }
    inputs[m] = outputs[m] = at::Tensor{};  // the micro-batch's activations go
  }
  for (auto& h : sends)
    if (auto ok = h->wait(); !ok) return ok;
  if (failed) return *failed;
  return {};
} catch (const std::exception& e) {
  return carried_error(e).value_or(error_of_exception(e, "a pipeline stage"));
}

namespace pp {

std::pair<int64_t, int64_t> stage_layers(int64_t layers, int stages, int stage) {
  const int64_t base = layers / stages, extra = layers % stages;
  const int64_t first = stage * base + std::min<int64_t>(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

int stage_of(const ModelConfig& c, int stages, const std::string& name) {
  if (name == "model.norm.weight" || name == "lm_head.weight") return stages - 1;
  const std::string pre = "model.layers.";
  if (name.rfind(pre, 0) != 0) return 0;
  const int64_t l = std::stoll(name.substr(pre.size()));
  for (int s = 0; s < stages; ++s)
    if (l < stage_layers(c.num_hidden_layers, stages, s).second) return s;
  return stages - 1;
}

Result<void> shard_model(CausalLM::Impl& m, std::shared_ptr<ProcessGroup> pg) {
  if (!pg) return make_error(errc::invalid_argument, "pipeline parallelism needs a process group");
  if (m.pp || m.tp || !m.sharded_by.empty()) return make_error(errc::failed_precondition, "the model is sharded already");
  if (!m.adapters.empty())
    return make_error(errc::unimplemented, "LoRA on a pipeline-parallel model is not built yet; remove the adapters or "
                                           "use data parallelism");
  if (m.cfg.has_linear_attention())
    return make_error(errc::unimplemented, std::string{hf_class_name(m.cfg.architecture)} +
                                               " has Gated DeltaNet layers, which pipeline parallelism does not run "
                                               "yet; use data parallelism or fsdp");
  const int64_t L = m.cfg.num_hidden_layers;
  if (L < pg->size())
    return make_error(errc::invalid_argument, "the model has " + std::to_string(L) + " decoder layers, fewer than the " +
                                                  std::to_string(pg->size()) +
                                                  " pipeline stages: each stage needs one at least; use fewer stages");
  auto [first, end] = stage_layers(L, pg->size(), pg->rank());
  const bool is_last = pg->rank() == pg->size() - 1;
  // Its own parameters, and the last stage the embeddings too when they are tied to its head.
  auto keep = [&](const std::string& n) {
    return stage_of(m.cfg, pg->size(), n) == pg->rank() ||
           (is_last && m.cfg.tie_word_embeddings && n == "model.embed_tokens.weight");
  };
  std::vector<std::string> names;
  std::map<std::string, at::Tensor> params;
  for (const auto& n : m.names)
    if (keep(n)) {
      names.push_back(n);
      params[n] = m.params.at(n);
    }
  m.names = std::move(names);
  m.params = std::move(params);
  m.pp = std::make_shared<PipelinePlan>(PipelinePlan{std::move(pg), first, end});
  return {};
}

}  // namespace pp

}  // namespace glint::components
