#include "actors/dataloader.hpp"

#include "actors/detail/answer.hpp"
#include "actors/detail/pad.hpp"
#include "components/data/dataset.hpp"
#include "components/data/template.hpp"
#include "components/data/tokenizer.hpp"
#include "placement/service.hpp"

#include <deque>
#include <filesystem>
#include <memory>
#include <optional>

namespace glint::actors {

namespace {

using namespace components;

class Loader {
public:
  Loader(RankContext ctx, DataLoaderSpec spec) : ctx_(std::move(ctx)), spec_(std::move(spec)) {}

  caf::error fail(const caf::error& e) const {
    return with_context(e, "dataloader (rank " + std::to_string(ctx_.rank) + " of group '" + ctx_.group + "')");
  }

  void load() {
    auto ok = [&]() -> Result<void> {
      const auto& s = spec_;
      auto ds = Dataset::load({.path = s.dataset, .slice_begin = s.slice_begin, .slice_end = s.slice_end});
      if (!ds) return ds.error();
      if (s.preprocess == "gsm8k") ds->map(preprocess::gsm8k(s.system_prompt));
      else if (s.preprocess == "self_cognition") ds->map(preprocess::self_cognition(s.model_name, s.model_author));
      else if (!s.preprocess.empty())
        return make_error(errc::invalid_argument,
                          "unknown preprocessor '" + s.preprocess + "'; use gsm8k, self_cognition or none");
      auto path = s.tokenizer;
      if (std::filesystem::is_directory(path)) path += "/tokenizer.json";
      auto tok = Tokenizer::load(path);
      if (!tok) return tok.error();
      auto truncation = parse_truncation(s.truncation);
      if (!truncation) return truncation.error();
      auto chat = Template::make(std::make_shared<const Tokenizer>(std::move(*tok)),
                                 {.name = s.template_name, .max_length = s.max_length, .truncation = *truncation});
      if (!chat) return chat.error();
      ds->set_template(std::move(*chat));
      if (auto e = ds->encode({.add_generation_prompt = s.add_generation_prompt}); !e) return e;
      if (ds->size() == 0)
        return make_error(errc::invalid_argument, s.dataset + " has no usable row (" + ds->skipped().summary() + ")");
      auto sampler = BatchSampler::make(static_cast<int64_t>(ds->size()), {.batch_size = s.batch_size,
                                                                           .min_batch_size = s.min_batch_size,
                                                                           .shuffle = s.shuffle,
                                                                           .seed = s.seed,
                                                                           .epochs = s.epochs});
      if (!sampler) return sampler.error();
      if (sampler->batches_per_epoch() == 0)
        return make_error(errc::invalid_argument, "the dataset's " + std::to_string(ds->size()) +
                                                      " rows make no batch of min_batch_size " +
                                                      std::to_string(s.min_batch_size ? s.min_batch_size : s.batch_size));
      delivered_ = sampler->state();
      dataset_.emplace(std::move(*ds));
      sampler_.emplace(std::move(*sampler));
      return {};
    }();
    if (!ok) load_error_ = ok.error();
  }

  Result<void> ready() const {
    if (load_error_) return load_error_;
    return {};
  }

  /// Makes batches until `prefetch` are ready (at least one).
  void fill() {
    if (!ready()) return;
    const size_t want = static_cast<size_t>(std::max<int32_t>(spec_.prefetch, 1));
    while (ahead_.size() < want && !(!ahead_.empty() && ahead_.back().end)) {
      DataBatch b;
      for (auto i : sampler_->next()) {
        const auto u = static_cast<size_t>(i);
        const auto& enc = dataset_->encoded(u);
        const auto& row = dataset_->row(u);
        b.rows.push_back({i, enc.input_ids, enc.loss_mask, row.fields, row.origin});
      }
      b.end = b.rows.empty();
      b.state = sampler_->state();
      ahead_.push_back(std::move(b));
    }
  }

  Result<DataBatch> next() {
    if (auto ok = ready(); !ok) return ok.error();
    fill();
    auto b = std::move(ahead_.front());
    ahead_.pop_front();
    if (!b.end) delivered_ = b.state;
    else ahead_.push_back(b);  // stays at the end
    return b;
  }

  Result<LoaderState> state() const {
    if (auto ok = ready(); !ok) return ok.error();
    return delivered_;
  }

  Result<bool> restore(const LoaderState& s) {
    if (auto ok = ready(); !ok) return ok.error();
    if (auto ok = sampler_->restore(s); !ok) return ok.error();
    ahead_.clear();
    delivered_ = s;
    return true;
  }

  Result<LoaderInfo> info() const {
    if (auto ok = ready(); !ok) return ok.error();
    return LoaderInfo{static_cast<int64_t>(dataset_->size()), sampler_->batches_per_epoch(),
                      dataset_->skipped().summary(), delivered_};
  }

private:
  RankContext ctx_;
  DataLoaderSpec spec_;
  std::optional<Dataset> dataset_;
  std::optional<BatchSampler> sampler_;
  std::deque<DataBatch> ahead_;
  LoaderState delivered_;
  caf::error load_error_;
};

}  // namespace

dataloader_actor::behavior_type dataloader_rank(dataloader_actor::pointer self, RankContext ctx, DataLoaderSpec spec) {
  auto st = std::make_shared<Loader>(std::move(ctx), std::move(spec));
  st->load();
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
        return answer([&] { return st->restore(s); });
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
  return detail::pad_rows(rows, pad_id, {{"loss_mask", &DataRow::loss_mask}});
}

}  // namespace glint::actors
