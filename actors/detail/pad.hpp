#pragma once
// Training rows of different lengths padded into one Batch (actors' own; no
// other layer includes it): input_ids padded with pad_id, attention_mask,
// and per-position float columns (loss_mask, old_logps) padded with 0.

#include "components/data/template.hpp"
#include "runtime/batch.hpp"
#include "runtime/tensor.hpp"

#include <algorithm>
#include <concepts>
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

}  // namespace glint::actors::detail
