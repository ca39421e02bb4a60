#pragma once
/// The order in which a pipeline stage runs its micro-batches: 1F1B
/// (PipeDream-Flush, as Megatron-LM schedules it). A pure function of
/// (stages, stage, micro-batches), so the executor and its tests share it.
///
///   stage s of p, m micro-batches:
///     warm-up:   min(p - s - 1, m) forwards
///     steady:    one forward, then one backward, while forwards remain
///     cool-down: the backwards left
///
/// Forwards and backwards each run in micro-batch order. A stage holds the
/// activations of at most p - s micro-batches at once (all m with plain
/// GPipe), and the last stage runs each backward right after its forward.
/// Messages: forward(k) on a stage after the first receives micro-batch
/// k's activations from the stage before and, on one before the last,
/// sends its own on; backward(k) receives the gradient from the stage
/// after (but on the last) and sends one back (but on the first). An
/// executor posts each op's sends and the next op's receives together
/// (Megatron's batched isend/irecv): blocking sends in this order would
/// deadlock two neighbours that both send first.

#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace glint::components {

struct PipeOp {
  enum class Kind : uint8_t { forward, backward };
  Kind kind = Kind::forward;
  int micro = 0;  ///< the micro-batch, 0..m-1
  friend bool operator==(const PipeOp&, const PipeOp&) = default;
};

/// Stage `stage`'s ops, in order: 2 x micro_batches of them. Refuses a stage
/// outside 0..stages-1, or fewer than one stage or micro-batch.
Result<std::vector<PipeOp>> one_f_one_b(int stages, int stage, int micro_batches);

/// "F0 F1 B0 F2 B1 B2": a schedule as text, for messages and tests.
std::string describe_schedule(const std::vector<PipeOp>& ops);

}  // namespace glint::components
