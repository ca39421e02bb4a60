#include "components/data/synthetic.hpp"

namespace glint::components {

std::vector<Row> arithmetic_rows(int64_t n, const ArithmeticOptions& o) {
  // splitmix64: fixed, so rows do not depend on the standard library.
  uint64_t state = o.seed;
  auto next = [&](int64_t bound) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<int64_t>(z % static_cast<uint64_t>(bound + 1));
  };
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
