#include "runtime/batch.hpp"
#include "runtime/text.hpp"

namespace glint {

Result<int64_t> Batch::size() const {
  int64_t n = -1;
  std::string first;
  auto check = [&](const std::string& key, int64_t rows) -> caf::error {
    if (n < 0) {
      n = rows;
      first = key;
      return caf::none;
    }
    if (rows != n)
      return make_error(errc::invalid_argument, "batch entry '" + key + "' has " + std::to_string(rows) +
                                                  " samples but '" + first + "' has " + std::to_string(n));
    return caf::none;
  };
  for (const auto& [k, t] : tensors) {
    if (!t.defined() || t.dims() == 0)
      return make_error(errc::invalid_argument, "batch tensor '" + k + "' is " + t.describe() +
                                                  "; batch tensors need a sample dim");
    if (auto err = check(k, t.size(0))) return err;
  }
  for (const auto& [k, v] : fields)
    if (auto err = check(k, static_cast<int64_t>(v.size()))) return err;
  return n < 0 ? 0 : n;
}

Result<Batch> Batch::slice(int64_t begin, int64_t end) const {
  auto n = size();
  if (!n) return n.error();
  if (begin < 0 || end < begin || end > *n)
    return make_error(errc::invalid_argument, "slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                                                ") is outside a batch of " + std::to_string(*n) + " samples");
  Batch out;
  for (const auto& [k, t] : tensors) {
    auto part = t.slice(begin, end);
    if (!part) return with_context(part.error(), "tensor '" + k + "'");
    out.tensors[k] = std::move(*part);
  }
  for (const auto& [k, v] : fields) out.fields[k] = {v.begin() + begin, v.begin() + end};
  return out;
}

Result<Batch> Batch::concat(std::span<const Batch> parts) {
  if (parts.empty()) return Batch{};
  Batch out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (auto n = parts[i].size(); !n) return with_context(n.error(), "batch part " + std::to_string(i));
    bool same_keys = parts[i].tensors.size() == parts[0].tensors.size() &&
                     parts[i].fields.size() == parts[0].fields.size();
    for (const auto& [k, t] : parts[0].tensors) same_keys = same_keys && parts[i].tensors.count(k);
    for (const auto& [k, v] : parts[0].fields) same_keys = same_keys && parts[i].fields.count(k);
    if (!same_keys)
      return make_error(errc::invalid_argument,
                        "batch part " + std::to_string(i) + " has other keys than part 0; cannot concatenate");
  }
  for (const auto& [k, t] : parts[0].tensors) {
    std::vector<Tensor> ts;
    for (const auto& p : parts) ts.push_back(p.tensors.at(k));
    auto joined = Tensor::concat(ts);
    if (!joined) return with_context(joined.error(), "batch tensor '" + k + "'");
    out.tensors[k] = std::move(*joined);
  }
  for (const auto& [k, v] : parts[0].fields) {
    auto& dst = out.fields[k];
    for (const auto& p : parts) dst.insert(dst.end(), p.fields.at(k).begin(), p.fields.at(k).end());
  }
  return out;
}

Result<Tensor> Batch::tensor(const std::string& name) const {
  if (auto i = tensors.find(name); i != tensors.end()) return i->second;
  std::vector<std::string> names;
  for (const auto& [k, t] : tensors) names.push_back(k);
  auto keys = join(names);
  return make_error(errc::not_found, "batch has no tensor '" + name + "' (it has: " +
                                       (keys.empty() ? std::string{"none"} : keys) + ")");
}

}  // namespace glint
