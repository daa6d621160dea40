// The table of differentiable ops that drives gradcheck, gradgradcheck and the CPU-vs-CUDA parity
// test. Every name in EF_DIFFERENTIABLE_OPS needs at least one entry (test_gradcheck.cpp checks).
#pragma once

#include <string>
#include <vector>

#include "tests/testing/gradcheck.h"

namespace evenflow::testing {

enum class Values { Normal, Positive, AwayFromZero };

struct InputSpec {
  Shape shape;
  Values values = Values::Normal;
  std::vector<int64_t> ints = {};  // non-empty: an int64 index tensor with these values
};

struct OpCase {
  std::string name;  // a name from EF_DIFFERENTIABLE_OPS
  std::vector<InputSpec> inputs;
  Fn fn;
  GradcheckOptions tolerance = {};
  bool cpu_only = false;  // uses several CPU devices
};

const std::vector<OpCase>& op_table();
// Deterministic inputs for a case (drawn on the CPU, then moved), float inputs in `dtype`.
std::vector<Tensor> make_inputs(const OpCase& c, DType dtype, const Device& device, uint64_t seed = 1);

}  // namespace evenflow::testing
