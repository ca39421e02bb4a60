#include "components/data/synthetic.hpp"

#include "components/data/detail/splitmix.hpp"

namespace glint::components {

std::vector<Row> arithmetic_rows(int64_t n, const ArithmeticOptions& o) {
  detail::SplitMix64 gen{o.seed};
  auto next = [&](int64_t bound) { return static_cast<int64_t>(gen.next() % static_cast<uint64_t>(bound + 1)); };
  std::vector<Row> rows;
  rows.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t terms = o.max_terms >= 3 ? 2 + next(1) : 2;
    int64_t value = next(o.max_operand);
    std::string expr = std::to_string(value);
    for (int64_t t = 1; t < terms; ++t) {
      int64_t x = next(o.max_operand);
      if (o.subtraction && next(1) == 1 && x <= value) {
        expr += " - " + std::to_string(x);
        value -= x;
      } else {
        expr += " + " + std::to_string(x);
        value += x;
      }
    }
    Row r;
    r.fields["question"] = "What is " + expr + "?";
    r.fields["answer"] = expr + " = " + std::to_string(value) + "\n#### " + std::to_string(value);
    r.origin = "arithmetic[" + std::to_string(i) + "]";
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace glint::components
