#pragma once
// Rows of different lengths padded into one training Batch (actors' own; no
// other layer includes it): input_ids padded with pad_id, attention_mask,
// and per-position float columns (loss_mask, old_logps) padded with 0.

#include "runtime/batch.hpp"
#include "runtime/tensor.hpp"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace glint::actors::detail {

/// `Row` has `std::vector<int64_t> input_ids`; each column names a
/// `std::vector<float>` member as long as it. `rows` must not be empty.
template <class Row>
Batch pad_rows(const std::vector<Row>& rows, int64_t pad_id,
               std::initializer_list<std::pair<const char*, std::vector<float> Row::*>> columns) {
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
  out.tensors["input_ids"] = *Tensor::from_values(ids, shape);
  out.tensors["attention_mask"] = *Tensor::from_values(attention, shape);
  for (const auto& [name, member] : columns) {
    std::vector<float> v(b * t, 0.f);
    for (size_t i = 0; i < b; ++i)
      std::copy((rows[i].*member).begin(), (rows[i].*member).end(), v.begin() + static_cast<std::ptrdiff_t>(i * t));
    out.tensors[name] = *Tensor::from_values(v, shape);
  }
  return out;
}

}  // namespace glint::actors::detail
