#pragma once
/// `DataLoaderGroup`: a driver's typed client of a dataloader, Twinkle's
/// DataLoader in C++:
///
///   auto data = actors::open_dataloader(rt, DeviceGroup::of("data", 1), {
///       .dataset = "data/arith.jsonl", .preprocess = "gsm8k", .tokenizer = "models/arith",
///       .add_generation_prompt = true, .batch_size = 8, .seed = 1, .epochs = 0});
///   auto batch = data->next_batch().take();   // rows, the loader state after them, `end`
///
/// The loader is one rank (a dataset is read and encoded once, where it
/// runs); give a model group the whole batch and its forward_backward
/// slices it by data-parallel rank. Transport boundary as ModelGroup's: a
/// copyable handle on a DataLoaderBackend; `open_dataloader` is the one way
/// to get one.

#include "actors/dataloader.hpp"
#include "runtime/future.hpp"
#include "runtime/group.hpp"

#include <memory>

namespace glint::actors {

/// The contract of a dataloader, whatever carries its calls.
class DataLoaderBackend {
public:
  virtual ~DataLoaderBackend() = default;
  virtual const GroupInfo& info() const = 0;
  virtual Future<DataBatch> next_batch() = 0;
  virtual Future<LoaderState> state() = 0;
  virtual Future<void> set_state(const LoaderState& state) = 0;
  virtual Future<LoaderInfo> loader_info() = 0;
};

class DataLoaderGroup {
public:
  explicit DataLoaderGroup(std::shared_ptr<DataLoaderBackend> backend) : backend_(std::move(backend)) {}

  /// The next global batch (made ahead while the driver works). Once every
  /// epoch is done: a batch with `end` set and no rows.
  Future<DataBatch> next_batch() const { return backend_->next_batch(); }
  /// The position after the last batch delivered (not those made ahead): a
  /// checkpoint taken between steps resumes exactly.
  Future<LoaderState> state() const { return backend_->state(); }
  /// Continues from `state`; batches made ahead are dropped. Error: a state
  /// of another dataset or seed.
  Future<void> set_state(const LoaderState& state) const { return backend_->set_state(state); }
  /// Usable rows, batches per epoch, what was skipped and why, the position.
  Future<LoaderInfo> loader_info() const { return backend_->loader_info(); }

  const GroupInfo& info() const { return backend_->info(); }
  DataLoaderBackend& backend() const { return *backend_; }

private:
  std::shared_ptr<DataLoaderBackend> backend_;
};

/// The one way to get a DataLoaderGroup: places and spawns the loader
/// (local, cluster; in remote mode too, in the driver's own process: the
/// data is the tenant's).
Result<DataLoaderGroup> open_dataloader(Runtime& rt, const placement::DeviceGroup& group, DataLoaderSpec spec);

/// A client over an existing CAF dataloader group.
DataLoaderGroup dataloader_group_of(Group<dataloader_actor> group);

}  // namespace glint::actors
