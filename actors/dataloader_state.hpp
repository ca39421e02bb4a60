#pragma once
/// What one dataloader rank is, without the actor: the dataset (loaded,
/// preprocessed, encoded), its BatchSampler, the batches made ahead and the
/// position after the last batch delivered. The actor (actors/dataloader.cpp)
/// answers these methods, so tests call them directly
/// (tests/actors/dataloader_state_test.cpp).

#include "actors/dataloader.hpp"
#include "components/data/dataset.hpp"

#include <deque>
#include <optional>

namespace glint::actors {

class DataLoaderState {
public:
  /// Loads, preprocesses and encodes the dataset `spec` names; an error is
  /// kept and answered by every call.
  DataLoaderState(RankContext ctx, DataLoaderSpec spec);

  std::string where() const;
  caf::error fail(const caf::error& e) const { return with_context(e, where()); }

  /// Makes batches until `prefetch` are ready (at least one).
  void fill();
  /// The next batch; once every epoch is done, one with `end` set, again and again.
  Result<DataBatch> next();
  /// The position after the last batch delivered (not those made ahead).
  Result<LoaderState> state() const;
  /// Continues from `s`; batches made ahead are dropped.
  Result<void> restore(const LoaderState& s);
  Result<LoaderInfo> info() const;

private:
  Result<void> load();
  Result<void> ready() const;

  RankContext ctx_;
  DataLoaderSpec spec_;
  std::optional<components::Dataset> dataset_;
  std::optional<components::BatchSampler> sampler_;
  std::deque<DataBatch> ahead_;
  LoaderState delivered_;
  caf::error load_error_;
};

}  // namespace glint::actors
