// gradcheck and gradgradcheck of every differentiable op, in float64 on the CPU, driven by the op
// table; third-order gradients of a small conv net; the comparison they rest on.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <set>

#include "tests/engine/op_table.h"

using namespace evenflow;
using namespace evenflow::testing;

TEST_CASE("op table: every differentiable op has an entry") {
  std::set<std::string> covered;
  for (const OpCase& c : op_table()) covered.insert(c.name);
#define EF_EXPECT_COVERED(name) CHECK_MESSAGE(covered.count(#name) == 1, "no op-table entry for " #name);
  EF_DIFFERENTIABLE_OPS(EF_EXPECT_COVERED)
#undef EF_EXPECT_COVERED
  std::set<std::string> known;
#define EF_KNOWN(name) known.insert(#name);
  EF_DIFFERENTIABLE_OPS(EF_KNOWN)
#undef EF_KNOWN
  for (const std::string& name : covered)
    CHECK_MESSAGE(known.count(name) == 1, "op-table entry for unknown op " << name);
}

TEST_CASE("gradcheck: every op, float64, CPU") {
  size_t index = 0;
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    CAPTURE(index++);
    const std::string failure = gradcheck(c.fn, make_inputs(c, kFloat64, cpu()), c.tolerance);
    CHECK_MESSAGE(failure.empty(), c.name << ": " << failure);
  }
}

TEST_CASE("gradgradcheck: every op, float64, CPU") {
  size_t index = 0;
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    CAPTURE(index++);
    const std::string failure = gradgradcheck(c.fn, make_inputs(c, kFloat64, cpu()), c.tolerance);
    CHECK_MESSAGE(failure.empty(), c.name << ": " << failure);
  }
}

TEST_CASE("third-order gradients of a small conv net") {
  // conv -> tanh -> conv -> softplus -> mean: smooth, so every order exists.
  const Fn net = [](const std::vector<Tensor>& p) {
    Tensor h = tanh(conv2d(p[0], p[1], p[2], {.padding = {1, 1}}));
    h = softplus(conv2d(h, p[3], Tensor(), {.stride = {2, 2}}));
    return mean(h * h);
  };
  manual_seed(cpu(), 3);
  const TensorOptions f64{.dtype = kFloat64};
  const std::vector<Tensor> params{randn({1, 2, 4, 4}, f64), mul_scalar(randn({3, 2, 3, 3}, f64), 0.5), randn({3}, f64),
                                   mul_scalar(randn({2, 3, 2, 2}, f64), 0.5)};
  // d³ checked as gradgradcheck of the first derivative.
  const Fn first = first_derivative(net, params.size());
  std::vector<Tensor> args = params;
  args.push_back(ones({}, f64));
  const std::string failure = gradgradcheck(first, args, {.eps = 1e-5, .atol = 1e-5, .rtol = 1e-3});
  CHECK_MESSAGE(failure.empty(), failure);
}

TEST_CASE("compare: infinities and NaNs must match; an infinite reference is no infinite tolerance") {
  const TensorOptions f64{.dtype = kFloat64};
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor ref = from_vector({1.0, inf, -inf}, {3}, f64);
  CHECK(compare(from_vector({1.0, inf, -inf}, {3}, f64), ref, 1e-5, 1e-3).empty());
  CHECK(compare(from_vector({1.0, 12.0, -inf}, {3}, f64), ref, 1e-5, 1e-3) == "element 1: 12 vs reference inf");
  CHECK(compare(from_vector({1.0, inf, inf}, {3}, f64), ref, 1e-5, 1e-3) == "element 2: inf vs reference -inf");
  CHECK(compare(from_vector({1.0, inf, -inf}, {3}, f64), from_vector({1.0, inf, 7.0}, {3}, f64), 1e-5, 1e-3) ==
        "element 2: -inf vs reference 7");
  CHECK_FALSE(compare(from_vector({std::nan("")}, {1}, f64), from_vector({0.0}, {1}, f64), 1e-5, 1e-3).empty());
}
