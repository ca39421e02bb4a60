#pragma once
/// Datasets the project makes itself, so examples and tests need no
/// download. `arithmetic_rows` writes GSM8K-style rows (question, and an
/// answer that ends in "#### n") of small sums and differences:
///
///   auto rows = arithmetic_rows(1000, {.seed = 1});
///   // {"question": "What is 7 + 5?", "answer": "7 + 5 = 12\n#### 12"}
///
/// The same options give the same rows on every platform.

#include "components/data/dataset.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace glint::components {

struct ArithmeticOptions {
  uint64_t seed = 0;
  int64_t max_operand = 20;    ///< operands are drawn from [0, max_operand]
  bool subtraction = true;     ///< also a - b (with a >= b, so answers stay non-negative)
  int64_t max_terms = 2;       ///< 2 or 3 operands
};

/// `n` rows in the GSM8K format; origins "arithmetic[i]".
std::vector<Row> arithmetic_rows(int64_t n, const ArithmeticOptions& options = {});

}  // namespace glint::components
