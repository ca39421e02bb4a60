#pragma once
/// `BatchSampler`: which rows make each batch, epoch after epoch, with a
/// state small enough to checkpoint and restore exactly:
///
///   auto s = BatchSampler::make(rows, {.batch_size = 8, .seed = 1, .epochs = 3});
///   while (auto idx = s->next(); !idx.empty()) { ... }
///   auto st = s->state();     // {seed, epoch, position}
///   s->restore(st);           // the batches that follow are the same again
///
/// Each epoch is a permutation of [0, rows) drawn from (seed, epoch) with
/// splitmix64, the same on every platform (or the identity without
/// shuffle). A batch takes the next batch_size rows of the epoch; a last
/// batch of the epoch smaller than min_batch_size is dropped, so every
/// batch has at least min_batch_size rows (a data-parallel step needs one
/// row per rank at least). Not thread-safe: one owner.

#include "runtime/error.hpp"

#include <cstdint>
#include <vector>

namespace glint::components {

/// Where a loader stands: the next batch starts at row `position` of epoch `epoch`.
struct LoaderState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t position = 0;
  friend bool operator==(const LoaderState&, const LoaderState&) = default;
};

struct BatchSamplerOptions {
  int64_t batch_size = 8;
  int64_t min_batch_size = 0;  ///< 0: as batch_size (drop any short last batch)
  bool shuffle = true;
  uint64_t seed = 0;
  int64_t epochs = 1;          ///< 0: endless
};

class BatchSampler {
public:
  /// Errors: batch_size < 1, min_batch_size outside [0, batch_size], epochs < 0.
  static Result<BatchSampler> make(int64_t rows, const BatchSamplerOptions& options);

  /// The next batch's row indices; empty once every epoch is done (or when
  /// a whole epoch is shorter than min_batch_size).
  std::vector<int64_t> next();
  LoaderState state() const { return state_; }
  /// Continues from `state`. Error: a state of another seed, or a position
  /// outside this dataset's epoch.
  Result<void> restore(const LoaderState& state);
  int64_t batches_per_epoch() const;
  int64_t rows() const { return rows_; }

private:
  void load_epoch();

  int64_t rows_ = 0;
  BatchSamplerOptions options_;
  LoaderState state_;
  std::vector<int64_t> order_;  // of state_.epoch
  int64_t order_epoch_ = -1;
};

}  // namespace glint::components
