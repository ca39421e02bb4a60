#pragma once
/// The dataloader actor: owns a dataset (loaded, preprocessed and encoded
/// where it runs, so a cluster job reads its data on the node that holds
/// it), a BatchSampler, and a few batches made ahead of the driver:
///
///   auto data = actors::spawn_dataloader(rt, DeviceGroup::of("data", 1), {
///       .dataset = "data/arith.jsonl", .preprocess = "gsm8k", .tokenizer = "models/arith",
///       .add_generation_prompt = true, .batch_size = 8, .seed = 1, .epochs = 0});
///   auto batch = data->call<Collect::first>(Dispatch::first, actors::next_batch_atom_v).get();
///   auto mine = actors::slice_for_rank(*batch, dp_rank, dp_size);     // or Dispatch::slice_dp
///   auto state = data->call<Collect::first>(Dispatch::first, actors::loader_state_atom_v).get();
///
/// A batch carries the loader state after it. loader_state answers the
/// state after the last batch *delivered*, not after those made ahead, so a
/// checkpoint taken between steps resumes exactly: restore it with
/// set_loader_state and the same batches follow. Once every epoch is done,
/// next_batch answers a batch with `end` set and no rows.
///
/// Errors: a dataset that cannot be read, an unknown preprocessor or
/// template, a tokenizer that does not load, or no row left after skipping
/// bad ones fail every call with what went wrong (the actor stays up).
/// Bad rows themselves are skipped and counted (loader_info).

#include "components/data/batch_sampler.hpp"
#include "components/data/template.hpp"
#include "placement/device_mesh.hpp"
#include "runtime/batch.hpp"
#include "runtime/group.hpp"
#include "runtime/registry.hpp"
#include "runtime/types.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <cstdint>
#include <map>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoaderState& x) {
  return f(caf::meta::type_name("glint.loader_state"), x.seed, x.epoch, x.position);
}
}  // namespace glint::components

namespace glint::actors {

using components::LoaderState;

struct DataLoaderSpec {
  std::string dataset{};        ///< a .jsonl or .json file
  int64_t slice_begin = 0;      ///< rows [slice_begin, slice_end) of it; -1: to the end
  int64_t slice_end = -1;
  std::string preprocess{};     ///< "", "gsm8k" or "self_cognition"
  std::string model_name{};     ///< {{NAME}} and {{AUTHOR}} for self_cognition
  std::string model_author{};
  std::string system_prompt{};  ///< gsm8k's system message; empty: its default
  std::string tokenizer{};      ///< a model directory (tokenizer.json, tokenizer_config.json), or a tokenizer.json
  std::string template_name = "auto";  ///< the model's chat template; or chatml, qwen2.5, qwen3, llama3
  /// Tokens per row; 0: the model's context (max_position_embeddings of
  /// the config.json beside the tokenizer, else tokenizer_config.json's
  /// model_max_length), no limit when neither gives one.
  int64_t max_length = 0;
  std::string truncation = "refuse";  ///< refuse (skip the row), left or right
  bool add_generation_prompt = false; ///< prompts to sample from (RL) rather than rows to train on (SFT)
  int64_t batch_size = 8;       ///< the global batch
  int64_t min_batch_size = 0;   ///< 0: batch_size (a short last batch of an epoch is dropped)
  bool shuffle = true;
  uint64_t seed = 0;
  int64_t epochs = 1;           ///< 0: endless
  int32_t prefetch = 2;         ///< batches made ahead
  friend bool operator==(const DataLoaderSpec&, const DataLoaderSpec&) = default;
};

/// One row to train on or sample from: its tokens and loss mask (the one
/// training-row type, components::EncodedRow; all 0 for prompts), and where
/// it came from and what rewards need of it.
struct DataRow : components::EncodedRow {
  int64_t index = 0;                          ///< in the dataset after preprocessing and skipping
  std::map<std::string, std::string> fields;  ///< e.g. "solution" for GSM8K rewards
  std::string origin;                         ///< file:line
  friend bool operator==(const DataRow&, const DataRow&) = default;
};

struct DataBatch {
  std::vector<DataRow> rows;
  LoaderState state;  ///< after this batch
  bool end = false;   ///< every epoch is done; no rows
  friend bool operator==(const DataBatch&, const DataBatch&) = default;
};

struct LoaderInfo {
  int64_t rows = 0;               ///< usable rows
  int64_t batches_per_epoch = 0;
  std::string skipped{};          ///< "N rows skipped: ..." by reason
  LoaderState state{};
  friend bool operator==(const LoaderInfo&, const LoaderInfo&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DataLoaderSpec& x) {
  return f(caf::meta::type_name("glint.dataloader_spec"), x.dataset, x.slice_begin, x.slice_end, x.preprocess,
           x.model_name, x.model_author, x.system_prompt, x.tokenizer, x.template_name, x.max_length, x.truncation,
           x.add_generation_prompt, x.batch_size, x.min_batch_size, x.shuffle, x.seed, x.epochs, x.prefetch);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DataRow& x) {
  return f(caf::meta::type_name("glint.data_row"), x.index, x.input_ids, x.loss_mask, x.truncated_tokens, x.fields,
           x.origin);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DataBatch& x) {
  return f(caf::meta::type_name("glint.data_batch"), x.rows, x.state, x.end);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoaderInfo& x) {
  return f(caf::meta::type_name("glint.loader_info"), x.rows, x.batches_per_epoch, x.skipped, x.state);
}

using next_batch_atom = caf::atom_constant<caf::atom("next_batch")>;
using loader_state_atom = caf::atom_constant<caf::atom("ld_state")>;
using set_loader_state_atom = caf::atom_constant<caf::atom("ld_set")>;
using loader_info_atom = caf::atom_constant<caf::atom("ld_info")>;
using prefetch_atom = caf::atom_constant<caf::atom("ld_fill")>;
inline constexpr next_batch_atom next_batch_atom_v{};
inline constexpr loader_state_atom loader_state_atom_v{};
inline constexpr set_loader_state_atom set_loader_state_atom_v{};
inline constexpr loader_info_atom loader_info_atom_v{};
inline constexpr prefetch_atom prefetch_atom_v{};

using dataloader_actor = caf::typed_actor<
    caf::replies_to<next_batch_atom>::with<DataBatch>,
    caf::replies_to<loader_state_atom>::with<LoaderState>,
    /// Continues from `state` (batches made ahead are dropped).
    caf::replies_to<set_loader_state_atom, LoaderState>::with<bool>,
    caf::replies_to<loader_info_atom>::with<LoaderInfo>,
    /// The actor's own: makes batches ahead after it answers next_batch.
    caf::reacts_to<prefetch_atom>>;

inline constexpr const char* dataloader_type = "glint.dataloader";

dataloader_actor::behavior_type dataloader_rank(dataloader_actor::pointer self, RankContext ctx, DataLoaderSpec spec);

/// A one-rank group (the loader is not replicated; slice its batches).
Result<Group<dataloader_actor>> spawn_dataloader(Runtime& rt, const placement::DeviceGroup& group, DataLoaderSpec spec);

/// Part dp_rank of dp_size of `batch`, split as Dispatch::slice_dp splits
/// (contiguous, sizes differ by at most one). Error: fewer rows than parts.
Result<DataBatch> slice_for_rank(const DataBatch& batch, int32_t dp_rank, int32_t dp_size);

/// An SFT batch of `rows`: input_ids (padded with pad_id), attention_mask
/// and loss_mask, for the model's forward_backward.
Result<Batch> train_batch_of(const std::vector<DataRow>& rows, int64_t pad_id);

/// The same rows packed without padding between them (padding-free
/// batches): each row of the batch holds whole rows end to end, told apart
/// by segment_ids (1, 2, ... within a row), at most `row_tokens` tokens
/// unless one row alone is longer, and there are at least `min_rows` rows
/// (a data-parallel group's size; fewer when there are fewer rows). The
/// longest rows start those; each later one goes to the emptiest row it
/// fits in. With row_tokens the longest row's length, the packed batch
/// never costs more than the padded one (attention is quadratic in a row's
/// length). For token-mean losses (cross-entropy) the loss, summed over
/// tokens, equals the padded batch's up to float rounding: no token attends
/// across rows it was not in. Per-sequence losses (GRPO's) count a packed
/// row as one sequence: do not pack for them.
Result<Batch> packed_batch_of(const std::vector<DataRow>& rows, int64_t pad_id, int64_t row_tokens, int64_t min_rows = 1);

/// packed_batch_of with rows as long as the longest of `rows`: what the
/// SFT examples and `glint sft` train on by default (padding-free batches
/// that never cost more than padded ones).
/// `columns`: more per-token float columns (one vector per row, as long as
/// the row), joined and padded (with 0) as the rows are.
Result<Batch> padding_free_batch_of(
    const std::vector<DataRow>& rows, int64_t pad_id, int64_t min_rows = 1,
    std::initializer_list<std::pair<const char*, const std::vector<std::vector<float>>*>> columns = {});

GLINT_REGISTRATIONS(dataloader);

}  // namespace glint::actors
