#include "components/parallel/pipeline_schedule.hpp"

#include <algorithm>

namespace glint::components {

Result<std::vector<PipeOp>> one_f_one_b(int stages, int stage, int micro_batches) {
  if (stages < 1) return make_error(errc::invalid_argument, "a pipeline needs at least one stage");
  if (stage < 0 || stage >= stages)
    return make_error(errc::invalid_argument, "stage " + std::to_string(stage) + " is not one of the pipeline's " +
                                                  std::to_string(stages));
  if (micro_batches < 1)
    return make_error(errc::invalid_argument, "a pipeline step needs at least one micro-batch (got " +
                                                  std::to_string(micro_batches) + ")");
  using K = PipeOp::Kind;
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipeOp> ops;
  ops.reserve(2 * static_cast<size_t>(micro_batches));
  int forward = 0, backward = 0;
  for (; forward < warmup; ++forward) ops.push_back({K::forward, forward});
  for (; forward < micro_batches; ++forward, ++backward) {
    ops.push_back({K::forward, forward});
    ops.push_back({K::backward, backward});
  }
  for (; backward < micro_batches; ++backward) ops.push_back({K::backward, backward});
  return ops;
}

std::string describe_schedule(const std::vector<PipeOp>& ops) {
  std::string out;
  for (const auto& op : ops) {
    if (!out.empty()) out += ' ';
    out += (op.kind == PipeOp::Kind::forward ? 'F' : 'B') + std::to_string(op.micro);
  }
  return out;
}

}  // namespace glint::components
