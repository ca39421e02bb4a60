#include "actors/dataloader.hpp"

#include "actors/dataloader_state.hpp"
#include "actors/detail/answer.hpp"
#include "actors/detail/pad.hpp"
#include "placement/service.hpp"

#include <algorithm>
#include <memory>
#include <numeric>

namespace glint::actors {


dataloader_actor::behavior_type dataloader_rank(dataloader_actor::pointer self, RankContext ctx, DataLoaderSpec spec) {
  auto st = std::make_shared<DataLoaderState>(std::move(ctx), std::move(spec));
  auto answer = [st](auto&& run) { return detail::answer(*st, run); };
  return {
      [self, st, answer](next_batch_atom) -> caf::result<DataBatch> {
        auto r = answer([&] { return st->next(); });
        // Make the next batches after answering, while the driver works.
        self->send(self, prefetch_atom_v);
        return r;
      },
      [st](prefetch_atom) { st->fill(); },
      [st, answer](loader_state_atom) -> caf::result<LoaderState> { return answer([&] { return st->state(); }); },
      [st, answer](set_loader_state_atom, const LoaderState& s) -> caf::result<bool> {
        return answer([&]() -> Result<bool> {
          if (auto ok = st->restore(s); !ok) return ok.error();
          return true;
        });
      },
      [st, answer](loader_info_atom) -> caf::result<LoaderInfo> { return answer([&] { return st->info(); }); },
  };
}

Result<Group<dataloader_actor>> spawn_dataloader(Runtime& rt, const placement::DeviceGroup& group, DataLoaderSpec spec) {
  if (group.size() != 1)
    return make_error(errc::invalid_argument, "a dataloader group has one rank, not " + std::to_string(group.size()) +
                                                  "; slice its batches for data-parallel ranks");
  return placement::spawn_group<dataloader_actor>(rt, group, dataloader_type, spec);
}

Result<DataBatch> slice_for_rank(const DataBatch& batch, int32_t dp_rank, int32_t dp_size) {
  auto rows = glint::detail::part_of(batch.rows, dp_rank, dp_size);
  if (!rows) return with_context(rows.error(), "slicing a batch of " + std::to_string(batch.rows.size()) + " rows");
  return DataBatch{std::move(*rows), batch.state, batch.end};
}

Result<Batch> train_batch_of(const std::vector<DataRow>& rows, int64_t pad_id) {
  if (rows.empty()) return make_error(errc::invalid_argument, "no rows to make a training batch of");
  return detail::pad_rows(rows, pad_id);
}

Result<Batch> padding_free_batch_of(const std::vector<DataRow>& rows, int64_t pad_id, int64_t min_rows) {
  size_t longest = 1;
  for (const auto& r : rows) longest = std::max(longest, r.input_ids.size());
  return packed_batch_of(rows, pad_id, static_cast<int64_t>(longest), std::max<int64_t>(min_rows, 1));
}

Result<Batch> packed_batch_of(const std::vector<DataRow>& rows, int64_t pad_id, int64_t row_tokens, int64_t min_rows) {
  if (rows.empty()) return make_error(errc::invalid_argument, "no rows to make a training batch of");
  if (row_tokens < 1) return make_error(errc::invalid_argument, "packing needs row_tokens >= 1");
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Longest first; ties in row order, so the packing is deterministic.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rows[a].input_ids.size() > rows[b].input_ids.size(); });
  int64_t total = 0;
  for (const auto& r : rows) total += static_cast<int64_t>(r.input_ids.size());
  const auto bins_wanted = std::min<int64_t>(static_cast<int64_t>(rows.size()),
                                             std::max<int64_t>(min_rows, (total + row_tokens - 1) / row_tokens));
  std::vector<std::vector<size_t>> bins(static_cast<size_t>(bins_wanted));
  std::vector<int64_t> fill(bins.size(), 0);
  size_t placed = 0;
  for (size_t i : order) {
    const auto n = static_cast<int64_t>(rows[i].input_ids.size());
    // The longest rows start the rows wanted; each later one goes to the
    // emptiest row it fits in (so the rows, and the ranks they feed, get
    // even shares), or starts a new one.
    size_t at = bins.size();
    if (placed < bins.size()) {
      at = placed;
    } else {
      for (size_t b = 0; b < bins.size(); ++b)
        if (fill[b] + n <= row_tokens && (at == bins.size() || fill[b] < fill[at])) at = b;
      if (at == bins.size()) {
        bins.emplace_back();
        fill.push_back(0);
      }
    }
    ++placed;
    bins[at].push_back(i);
    fill[at] += n;
  }
  // Each bin, in the order its rows came, becomes one row of the batch.
  std::vector<components::EncodedRow> packed;
  std::vector<std::vector<float>> segments;
  for (auto& bin : bins) {
    std::sort(bin.begin(), bin.end());
    components::EncodedRow row;
    std::vector<float> seg;
    float id = 1;
    for (size_t i : bin) {
      row.input_ids.insert(row.input_ids.end(), rows[i].input_ids.begin(), rows[i].input_ids.end());
      row.loss_mask.insert(row.loss_mask.end(), rows[i].loss_mask.begin(), rows[i].loss_mask.end());
      seg.insert(seg.end(), rows[i].input_ids.size(), id);
      id += 1;
    }
    packed.push_back(std::move(row));
    segments.push_back(std::move(seg));
  }
  auto batch = detail::pad_rows(packed, pad_id, {{"segment_ids", &segments}});
  if (!batch) return batch.error();
  // segment_ids are indices, not floats.
  auto seg = batch->tensors.at("segment_ids").values<float>();
  if (!seg) return seg.error();
  std::vector<int64_t> ids(seg->begin(), seg->end());
  auto t = Tensor::from_values(ids, batch->tensors.at("segment_ids").shape());
  if (!t) return t.error();
  batch->tensors["segment_ids"] = std::move(*t);
  return batch;
}

}  // namespace glint::actors
