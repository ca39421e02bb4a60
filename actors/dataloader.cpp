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

Result<Batch> padding_free_batch_of(
    const std::vector<DataRow>& rows, int64_t pad_id, int64_t min_rows,
    std::initializer_list<std::pair<const char*, const std::vector<std::vector<float>>*>> columns) {
  size_t longest = 1;
  for (const auto& r : rows) longest = std::max(longest, r.input_ids.size());
  for (const auto& [name, column] : columns)
    if (column->size() != rows.size())
      return make_error(errc::invalid_argument, std::string{"column "} + name + " has " +
                                                    std::to_string(column->size()) + " rows for " +
                                                    std::to_string(rows.size()));
  return detail::pack_rows(rows, pad_id, static_cast<int64_t>(longest), std::max<int64_t>(min_rows, 1), columns);
}

Result<Batch> packed_batch_of(const std::vector<DataRow>& rows, int64_t pad_id, int64_t row_tokens, int64_t min_rows) {
  return detail::pack_rows(rows, pad_id, row_tokens, min_rows);
}

GLINT_DEFINE_REGISTRATIONS(dataloader, types) {
  types.add_message_type<DataLoaderSpec>("glint.dataloader_spec");
  types.add_message_type<LoaderState>("glint.loader_state");
  types.add_message_type<DataBatch>("glint.data_batch");
  types.add_message_type<LoaderInfo>("glint.loader_info");
  types.add(dataloader_type, dataloader_rank);
}

}  // namespace glint::actors
