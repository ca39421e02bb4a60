#pragma once
/// `TrainerState`: where a training loop stands, as a checkpoint's
/// trainer_state.json holds it. The Checkpointer (checkpointer.hpp) writes
/// it with each checkpoint and reads it back to resume, and reads the
/// step, summary and time of a directory the run index lacks:
///
///   auto text = trainer_state_json(state, "loss 0.31", clock.unix_ms());
///   auto back = parse_trainer_state(text, dir + "/trainer_state.json");
///
/// The file is untrusted input: a field of the wrong type or out of range
/// is an error naming the file and the field, never an exception. A metric
/// that is not finite (a diverged loss) is written as null, as JSON has no
/// NaN, and read back as NaN.

#include "components/data/batch_sampler.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace glint::actors {

using components::LoaderState;

struct TrainerState {
  int64_t step = 0;                    ///< optimizer steps the loop has taken
  int64_t consumed_samples = 0;
  int64_t gradient_accumulation = 1;
  uint64_t seed = 0;                   ///< the driver's seed; with step, it seeds each step's draws
  std::string phase{};                 ///< the loop's own label ("sft", "grpo")
  LoaderState loader{};                ///< filled in by save from the dataloader given
  std::map<std::string, double> metrics{};
  std::string train_configs{};         ///< filled in by save: the model's configs for the adapter (JSON)
};

/// What a checkpoint directory says of itself, for its run-index entry.
struct CheckpointSummary {
  int64_t step = 0;
  int64_t saved_ms = 0;  ///< unix time of the save; 0 when the file has none
  std::string summary{};
};

/// The text of trainer_state.json: `state`, and the checkpoint's summary
/// and time of saving.
std::string trainer_state_json(const TrainerState& state, const std::string& summary, int64_t saved_ms);

/// Parses a trainer_state.json (`origin` names it in errors). Errors
/// (invalid_argument): not a JSON object, no step or loader, a field of the
/// wrong type.
Result<TrainerState> parse_trainer_state(std::string_view text, const std::string& origin);

/// Only what the run index needs (step, saved_ms, summary): a file without
/// the rest still describes its directory. Errors as parse_trainer_state.
Result<CheckpointSummary> parse_checkpoint_summary(std::string_view text, const std::string& origin);

}  // namespace glint::actors
