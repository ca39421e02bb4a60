#include "actors/dataloader_state.hpp"

#include "actors/detail/message_size.hpp"
#include "components/data/template.hpp"
#include "components/data/tokenizer.hpp"
#include "runtime/file.hpp"
#include "runtime/log.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>

namespace glint::actors {

using namespace components;

namespace {

// The longest row when the spec gives no max_length: the model's context,
// max_position_embeddings of the config.json beside the tokenizer, else the
// tokenizer_config.json's model_max_length; 0 (no limit) when neither says.
Result<int64_t> default_max_length(const std::string& tokenizer_path, const Tokenizer& tok) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::is_directory(tokenizer_path, ec) ? fs::path{tokenizer_path}
                                                            : fs::path{tokenizer_path}.parent_path();
  const auto config = (dir / "config.json").string();
  if (fs::exists(config, ec)) {
    auto text = read_text_file(config);
    if (!text) return text.error();
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return make_error(errc::invalid_argument, config + " is not a JSON object (read for the model's context length)");
    if (auto v = j.find("max_position_embeddings"); v != j.end()) {
      if (!v->is_number_integer() || v->get<int64_t>() <= 0)
        return make_error(errc::invalid_argument, config + ": max_position_embeddings " + v->dump() +
                                                      " is not a positive integer");
      log::info("dataloader: max_length " + std::to_string(v->get<int64_t>()) +
                " tokens, the model's max_position_embeddings (" + config + "); set max_length to change it");
      return v->get<int64_t>();
    }
  }
  if (auto n = tok.config().model_max_length) {
    log::info("dataloader: max_length " + std::to_string(*n) + " tokens, the tokenizer's model_max_length (" +
              tok.config().origin + "); set max_length to change it");
    return *n;
  }
  log::warn("dataloader: no max_length, and neither config.json nor tokenizer_config.json beside " + tokenizer_path +
            " gives the model's context: rows of any length are kept (set max_length to bound them)");
  return 0;
}

}  // namespace

DataLoaderState::DataLoaderState(RankContext ctx, DataLoaderSpec spec) : ctx_(std::move(ctx)), spec_(std::move(spec)) {
  if (auto ok = load(); !ok) load_error_ = ok.error();
}

std::string DataLoaderState::where() const {
  return "dataloader (rank " + std::to_string(ctx_.rank) + " of group '" + ctx_.group + "')";
}

Result<void> DataLoaderState::load() {
  const auto& s = spec_;
  auto ds = Dataset::load({.path = s.dataset, .slice_begin = s.slice_begin, .slice_end = s.slice_end});
  if (!ds) return ds.error();
  if (s.preprocess == "gsm8k") ds->map(preprocess::gsm8k(s.system_prompt));
  else if (s.preprocess == "self_cognition") ds->map(preprocess::self_cognition(s.model_name, s.model_author));
  else if (!s.preprocess.empty())
    return make_error(errc::invalid_argument,
                      "unknown preprocessor '" + s.preprocess + "'; use gsm8k, self_cognition or none");
  auto tok = Tokenizer::load(s.tokenizer);
  if (!tok) return tok.error();
  auto truncation = parse_truncation(s.truncation);
  if (!truncation) return truncation.error();
  if (s.max_length < 0)
    return make_error(errc::invalid_argument, "max_length is " + std::to_string(s.max_length) +
                                                  "; use 0 (the model's context) or a number of tokens");
  int64_t max_length = s.max_length;
  if (max_length == 0) {
    auto d = default_max_length(s.tokenizer, *tok);
    if (!d) return d.error();
    max_length = *d;
  }
  auto chat = Template::make(std::make_shared<const Tokenizer>(std::move(*tok)),
                             {.name = s.template_name, .max_length = max_length, .truncation = *truncation});
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
}

Result<void> DataLoaderState::ready() const {
  if (load_error_) return load_error_;
  return {};
}

void DataLoaderState::fill() {
  if (!ready()) return;
  const size_t want = static_cast<size_t>(std::max<int32_t>(spec_.prefetch, 1));
  while (ahead_.size() < want && !(!ahead_.empty() && ahead_.back().end)) {
    DataBatch b;
    for (auto i : sampler_->next()) {
      const auto u = static_cast<size_t>(i);
      const auto& row = dataset_->row(u);
      DataRow r;
      static_cast<EncodedRow&>(r) = dataset_->encoded(u);
      r.index = i;
      r.fields = row.fields;
      r.origin = row.origin;
      b.rows.push_back(std::move(r));
    }
    b.end = b.rows.empty();
    b.state = sampler_->state();
    ahead_.push_back(std::move(b));
  }
}

Result<DataBatch> DataLoaderState::next() {
  if (auto ok = ready(); !ok) return ok.error();
  fill();
  // The batch is one message: it must fit what the driver's process accepts.
  uint64_t bytes = 0;
  for (const auto& r : ahead_.front().rows) {
    bytes += 64 + r.input_ids.size() * sizeof(int64_t) + r.loss_mask.size() * sizeof(float) + r.origin.size();
    for (const auto& [k, v] : r.fields) bytes += k.size() + v.size() + 16;
  }
  if (auto ok = detail::fits_in_a_message(bytes, "a batch of " + std::to_string(ahead_.front().rows.size()) + " rows",
                                          "lower batch_size or max_length");
      !ok)
    return ok.error();
  auto b = std::move(ahead_.front());
  ahead_.pop_front();
  if (!b.end) delivered_ = b.state;
  else ahead_.push_back(b);  // stays at the end
  return b;
}

Result<LoaderState> DataLoaderState::state() const {
  if (auto ok = ready(); !ok) return ok.error();
  return delivered_;
}

Result<void> DataLoaderState::restore(const LoaderState& s) {
  if (auto ok = ready(); !ok) return ok.error();
  if (auto ok = sampler_->restore(s); !ok) return ok.error();
  ahead_.clear();
  delivered_ = s;
  return {};
}

Result<LoaderInfo> DataLoaderState::info() const {
  if (auto ok = ready(); !ok) return ok.error();
  return LoaderInfo{static_cast<int64_t>(dataset_->size()), sampler_->batches_per_epoch(),
                    dataset_->skipped().summary(), delivered_};
}

}  // namespace glint::actors
