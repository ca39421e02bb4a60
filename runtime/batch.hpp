#pragma once
/// `glint::Batch`: named tensors plus per-sample fields, the unit of data that
/// dataloaders, samplers and model shards pass around. Every tensor's dim 0 and
/// every field's length is the number of samples. Slicing shares the tensors'
/// storage; fields are copied (they are small).

#include "runtime/tensor.hpp"

#include <map>
#include <string>
#include <vector>

namespace glint {

struct Batch {
  std::map<std::string, Tensor> tensors;
  /// Per-sample text fields (prompts, answers, ids): one entry per sample.
  std::map<std::string, std::vector<std::string>> fields;

  /// The number of samples; an error if tensors and fields disagree.
  Result<int64_t> size() const;

  /// Samples [begin, end), sharing tensor storage.
  Result<Batch> slice(int64_t begin, int64_t end) const;

  /// Concatenates batches with the same keys along the sample dim.
  static Result<Batch> concat(std::span<const Batch> parts);

  /// The tensor called `name`, or not_found naming the keys that exist.
  Result<Tensor> tensor(const std::string& name) const;

  friend bool operator==(const Batch&, const Batch&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Batch& x) {
  return f(caf::meta::type_name("glint.batch"), x.tensors, x.fields);
}

}  // namespace glint
