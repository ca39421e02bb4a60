#include "components/data/batch_sampler.hpp"

#include "components/data/detail/splitmix.hpp"

#include <numeric>

namespace glint::components {

Result<BatchSampler> BatchSampler::make(int64_t rows, const BatchSamplerOptions& o) {
  if (rows < 0) return make_error(errc::invalid_argument, "a dataset cannot have " + std::to_string(rows) + " rows");
  if (o.batch_size < 1)
    return make_error(errc::invalid_argument, "batch_size must be at least 1, not " + std::to_string(o.batch_size));
  if (o.min_batch_size < 0 || o.min_batch_size > o.batch_size)
    return make_error(errc::invalid_argument, "min_batch_size " + std::to_string(o.min_batch_size) +
                                                  " must be between 0 and batch_size " + std::to_string(o.batch_size));
  if (o.epochs < 0) return make_error(errc::invalid_argument, "epochs must be 0 (endless) or more");
  BatchSampler s;
  s.rows_ = rows;
  s.options_ = o;
  if (s.options_.min_batch_size == 0) s.options_.min_batch_size = o.batch_size;
  s.state_.seed = o.seed;
  return s;
}

void BatchSampler::load_epoch() {
  if (order_epoch_ == state_.epoch) return;
  order_.resize(static_cast<size_t>(rows_));
  std::iota(order_.begin(), order_.end(), 0);
  if (options_.shuffle) {
    detail::SplitMix64 gen{state_.seed ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(state_.epoch + 1))};
    gen.shuffle(order_);
  }
  order_epoch_ = state_.epoch;
}

std::vector<int64_t> BatchSampler::next() {
  if (rows_ < options_.min_batch_size) return {};
  for (;;) {
    if (options_.epochs > 0 && state_.epoch >= options_.epochs) return {};
    const int64_t left = rows_ - state_.position;
    if (left < options_.min_batch_size || left <= 0) {  // drop the short tail, start the next epoch
      ++state_.epoch;
      state_.position = 0;
      continue;
    }
    load_epoch();
    const int64_t take = std::min(left, options_.batch_size);
    std::vector<int64_t> out(order_.begin() + state_.position, order_.begin() + state_.position + take);
    state_.position += take;
    return out;
  }
}

Result<void> BatchSampler::restore(const LoaderState& s) {
  if (s.seed != options_.seed)
    return make_error(errc::invalid_argument, "the state was saved with seed " + std::to_string(s.seed) +
                                                  ", this loader shuffles with seed " + std::to_string(options_.seed));
  if (s.epoch < 0 || s.position < 0 || s.position > rows_)
    return make_error(errc::invalid_argument, "the state (epoch " + std::to_string(s.epoch) + ", position " +
                                                  std::to_string(s.position) + ") does not fit a dataset of " +
                                                  std::to_string(rows_) + " rows; was it saved for another dataset?");
  state_ = s;
  return {};
}

int64_t BatchSampler::batches_per_epoch() const {
  const int64_t full = rows_ / options_.batch_size, tail = rows_ % options_.batch_size;
  return full + (tail >= options_.min_batch_size && tail > 0 ? 1 : 0);
}

}  // namespace glint::components
