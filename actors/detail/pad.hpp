#pragma once
// Training rows of different lengths padded into one Batch (actors' own; no
// other layer includes it): input_ids padded with pad_id, attention_mask,
// and per-position float columns (loss_mask, old_logps) padded with 0.

#include "components/data/template.hpp"
#include "runtime/batch.hpp"
#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace glint::actors::detail {

/// `rows` padded to their longest; each column is one float vector per row,
/// as long as the row (loss_mask always). `rows` must not be empty. An
/// error when a tensor cannot be made (too large for the limits).
template <std::derived_from<components::EncodedRow> Row>
Result<Batch> pad_rows(const std::vector<Row>& rows, int64_t pad_id,
               std::initializer_list<std::pair<const char*, const std::vector<std::vector<float>>*>> columns = {}) {
  size_t t = 0;
  for (const auto& r : rows) t = std::max(t, r.input_ids.size());
  const auto b = rows.size();
  const std::vector<int64_t> shape{static_cast<int64_t>(b), static_cast<int64_t>(t)};
  std::vector<int64_t> ids(b * t, pad_id), attention(b * t, 0);
  for (size_t i = 0; i < b; ++i) {
    const auto at = static_cast<std::ptrdiff_t>(i * t);
    std::copy(rows[i].input_ids.begin(), rows[i].input_ids.end(), ids.begin() + at);
    std::fill_n(attention.begin() + at, rows[i].input_ids.size(), 1);
  }
  Batch out;
  caf::error failed;
  auto keep = [&](const char* name, Result<Tensor> t) {
    if (t) out.tensors[name] = std::move(*t);
    else if (!failed) failed = with_context(t.error(), std::string{"the batch's "} + name);
  };
  keep("input_ids", Tensor::from_values(ids, shape));
  keep("attention_mask", Tensor::from_values(attention, shape));
  auto put = [&](const char* name, auto&& column_of) {
    std::vector<float> v(b * t, 0.f);
    for (size_t i = 0; i < b; ++i) {
      const auto& c = column_of(i);
      std::copy(c.begin(), c.end(), v.begin() + static_cast<std::ptrdiff_t>(i * t));
    }
    keep(name, Tensor::from_values(v, shape));
  };
  put("loss_mask", [&](size_t i) -> const std::vector<float>& { return rows[i].loss_mask; });
  for (const auto& [name, column] : columns)
    put(name, [&](size_t i) -> const std::vector<float>& { return (*column)[i]; });
  if (failed) return failed;
  return out;
}

/// Which rows go together when rows of these lengths are packed into rows
/// of at most `row_tokens` (unless one alone is longer), at least
/// `min_rows` of them (fewer when there are fewer rows): the longest rows
/// start those; each later one goes to the emptiest row it fits in, or
/// starts a new one. Each bin lists its rows in their original order.
/// Deterministic (ties in row order).
inline std::vector<std::vector<size_t>> pack_layout(const std::vector<size_t>& lengths, int64_t row_tokens,
                                                    int64_t min_rows) {
  std::vector<size_t> order(lengths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  int64_t total = 0;
  for (auto n : lengths) total += static_cast<int64_t>(n);
  const auto bins_wanted = std::min<int64_t>(static_cast<int64_t>(lengths.size()),
                                             std::max<int64_t>(min_rows, (total + row_tokens - 1) / row_tokens));
  std::vector<std::vector<size_t>> bins(static_cast<size_t>(bins_wanted));
  std::vector<int64_t> fill(bins.size(), 0);
  size_t placed = 0;
  for (size_t i : order) {
    const auto n = static_cast<int64_t>(lengths[i]);
    // So the rows, and the ranks they feed, get even shares.
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
  for (auto& bin : bins) std::sort(bin.begin(), bin.end());
  return bins;
}

/// `rows` packed end to end without padding between them (pack_layout),
/// then padded as pad_rows pads: the same tensors, the columns joined as
/// the rows are, and segment_ids (i64: 1, 2, ... within a row, 0 on
/// padding). `rows` must not be empty; row_tokens >= 1. `layout`, when
/// given, gets the bins the rows went into (batch row by batch row).
template <std::derived_from<components::EncodedRow> Row>
Result<Batch> pack_rows(const std::vector<Row>& rows, int64_t pad_id, int64_t row_tokens, int64_t min_rows,
                        std::initializer_list<std::pair<const char*, const std::vector<std::vector<float>>*>> columns = {},
                        std::vector<std::vector<size_t>>* layout = nullptr) {
  if (rows.empty()) return make_error(errc::invalid_argument, "no rows to make a training batch of");
  if (row_tokens < 1) return make_error(errc::invalid_argument, "packing needs row_tokens >= 1");
  std::vector<size_t> lengths;
  for (const auto& r : rows) lengths.push_back(r.input_ids.size());
  const auto bins = pack_layout(lengths, row_tokens, min_rows);
  std::vector<components::EncodedRow> packed;
  std::vector<std::vector<float>> segments;
  std::vector<std::vector<std::vector<float>>> joined(columns.size());
  for (const auto& bin : bins) {
    components::EncodedRow row;
    std::vector<float> seg;
    std::vector<std::vector<float>> cols(columns.size());
    float id = 1;
    for (size_t i : bin) {
      row.input_ids.insert(row.input_ids.end(), rows[i].input_ids.begin(), rows[i].input_ids.end());
      row.loss_mask.insert(row.loss_mask.end(), rows[i].loss_mask.begin(), rows[i].loss_mask.end());
      seg.insert(seg.end(), rows[i].input_ids.size(), id);
      id += 1;
      size_t c = 0;
      for (const auto& [name, column] : columns) {
        const auto& v = (*column)[i];
        cols[c].insert(cols[c].end(), v.begin(), v.end());
        ++c;
      }
    }
    packed.push_back(std::move(row));
    segments.push_back(std::move(seg));
    for (size_t c = 0; c < cols.size(); ++c) joined[c].push_back(std::move(cols[c]));
  }
  auto batch = pad_rows(packed, pad_id, {{"segment_ids", &segments}});
  if (!batch) return batch.error();
  // segment_ids are indices, not floats.
  auto seg = batch->tensors.at("segment_ids").values<float>();
  if (!seg) return seg.error();
  std::vector<int64_t> ids(seg->begin(), seg->end());
  auto t = Tensor::from_values(ids, batch->tensors.at("segment_ids").shape());
  if (!t) return t.error();
  batch->tensors["segment_ids"] = std::move(*t);
  // The columns, padded the same way (pad_rows takes a fixed list).
  size_t c = 0;
  for (const auto& [name, column] : columns) {
    auto padded = pad_rows(packed, pad_id, {{name, &joined[c]}});
    if (!padded) return padded.error();
    batch->tensors[name] = std::move(padded->tensors.at(name));
    ++c;
  }
  if (layout) *layout = bins;
  return batch;
}

}  // namespace glint::actors::detail
