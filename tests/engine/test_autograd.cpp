// The autograd engine: backward and grad, accumulation, retain_graph, allow_unused, higher-order
// gradients, in-place detection, passes spanning several devices, and errors raised on a worker.
#include <doctest/doctest.h>

#include <functional>
#include <future>

#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/ops.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using evenflow::testing::error_of;
using evenflow::testing::vals;

namespace {
const TensorOptions f64{.dtype = kFloat64};
}  // namespace

TEST_CASE("backward accumulates into leaves; grad() leaves .grad alone") {
  Tensor x = from_vector({1, 2, 3}, {3}, f64).requires_grad_();
  Tensor y = sum(x * x);
  y.backward();
  CHECK(vals(x.grad()) == std::vector<double>{2, 4, 6});
  sum(x * 3.0).backward();
  CHECK(vals(x.grad()) == std::vector<double>{5, 7, 9});
  const auto g = grad({sum(x * x * x)}, {x});
  CHECK(vals(g[0]) == std::vector<double>{3, 12, 27});
  CHECK(vals(x.grad()) == std::vector<double>{5, 7, 9});
  CHECK(x.is_leaf());
  CHECK_FALSE(y.is_leaf());
  CHECK(std::string(y.grad_fn()->name()) == "sum");
}

TEST_CASE("a shared subexpression sums its gradients") {
  Tensor x = from_vector({2}, {1}, f64).requires_grad_();
  Tensor h = x * x;           // used twice
  Tensor y = sum(h * h + h);  // dy/dx = (2h + 1)·2x = (8 + 1)·4 = 36
  y.backward();
  CHECK(x.grad().item() == doctest::Approx(36));
}

TEST_CASE("retain_graph: a second backward needs it") {
  Tensor x = from_vector({1, 2}, {2}, f64).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward();
  const std::string msg = error_of([&] { y.backward(); });
  CHECK(msg.find("backward through the graph a second time") != std::string::npos);
  CHECK(msg.find("retain_graph=true") != std::string::npos);
  Tensor z = sum(exp(x));
  x.set_grad(Tensor());
  z.backward(Tensor(), /*retain_graph=*/true);
  z.backward();
  CHECK(vals(x.grad()) == std::vector<double>{2 * std::exp(1.0), 2 * std::exp(2.0)});
}

TEST_CASE("allow_unused and other argument errors") {
  Tensor x = from_vector({1}, {1}, f64).requires_grad_();
  Tensor unused = from_vector({1}, {1}, f64).requires_grad_();
  Tensor y = sum(x * 2.0);
  CHECK(error_of([&] { grad({y}, {x, unused}, {}, {.retain_graph = true}); }).find("grad: inputs[1]") == 0);
  const auto g = grad({y}, {x, unused}, {}, {.retain_graph = true, .allow_unused = true});
  CHECK(g[0].item() == 2);
  CHECK_FALSE(g[1].defined());
  Tensor v = x * 2.0;
  v = expand(v, {3});
  CHECK(error_of([&] { v.backward(); }).find("backward: grad can be created implicitly only for one-element outputs") ==
        0);
  CHECK(error_of([&] {
          grad({v}, {x}, {ones({2}, f64)});
        }).find("grad: grad_outputs[0] has shape [2] but outputs[0] has shape [3]") == 0);
  Tensor c = ones({1}, f64);
  CHECK(error_of([&] { grad({c}, {x}); }).find("does not require grad") != std::string::npos);
  CHECK(error_of([&] { grad({y}, {c}); }).find("grad: inputs[0]") == 0);
}

TEST_CASE("in-place changes to a saved tensor are detected") {
  Tensor x = from_vector({1, 2}, {2}, f64).requires_grad_();
  Tensor w = from_vector({3, 4}, {2}, f64);
  Tensor y = sum(x * w);
  w.mul_(2.0);  // w was saved by mul
  const std::string msg = error_of([&] { y.backward(); });
  CHECK(msg.find("in backward of mul on cpu:0") == 0);
  CHECK(msg.find("modified in place: it is at version 1, the graph expects version 0") != std::string::npos);
  CHECK(error_of([&] { x.mul_(2.0); }).find("mul_: ") == 0);
  {
    NoGradGuard no_grad;
    x.mul_(2.0);  // allowed: the optimizer's way
  }
  CHECK(vals(x) == std::vector<double>{2, 4});
}

TEST_CASE("no_grad records nothing; detach cuts the graph") {
  Tensor x = ones({2}, f64).requires_grad_();
  {
    NoGradGuard no_grad;
    CHECK_FALSE((x * 2.0).requires_grad());
  }
  CHECK((x * 2.0).requires_grad());
  CHECK_FALSE((x * 2.0).detach().requires_grad());
}

TEST_CASE("create_graph: a gradient penalty differentiates through the gradient") {
  // f = Σx³, ∇f = 3x², penalty = Σ(∇f)² = Σ9x⁴, d penalty/dx = 36x³.
  Tensor x = from_vector({1, -2, 0.5}, {3}, f64).requires_grad_();
  Tensor f = sum(x * x * x);
  const Tensor g = grad({f}, {x}, {}, {.create_graph = true})[0];
  CHECK(g.requires_grad());
  sum(square(g)).backward();
  CHECK(vals(x.grad()) == std::vector<double>{36, -288, 4.5});
}

// Note [Gradients nobody asked for] in engine/autograd.cpp.
TEST_CASE("a closure learns which of its inputs' gradients the pass needs") {
  Tensor a = from_vector({1, 2}, {2}, f64).requires_grad_();
  Tensor b = from_vector({3, 4}, {2}, f64).requires_grad_();
  const Tensor c = from_vector({5, 6}, {2}, f64);  // requires no grad: no edge
  std::vector<bool> asked;
  Tensor hidden;  // a non-leaf input, made anew for each pass (a pass frees its graph)
  const auto probe = [&] {
    hidden = b * 2.0;
    Tensor y;
    {
      NoGradGuard no_grad;
      y = a + hidden + c;
    }
    record("probe", {y}, {a, hidden, c}, {}, [&asked](const std::vector<Tensor>& g) {
      asked = {input_grad_needed(0), input_grad_needed(1), input_grad_needed(2)};
      return std::vector<Tensor>{g[0], g[0], Tensor()};
    });
    return sum(y);
  };
  CHECK(input_grad_needed(0));  // outside a closure
  grad({probe()}, {a});
  CHECK(asked == std::vector<bool>{true, false, false});
  grad({probe()}, {b});  // through the non-leaf
  CHECK(asked == std::vector<bool>{false, true, false});
  const Tensor loss = probe();
  grad({loss}, {hidden});  // a capture at the non-leaf itself
  CHECK(asked == std::vector<bool>{false, true, false});
  probe().backward();
  CHECK(asked == std::vector<bool>{true, true, false});
  CHECK(vals(b.grad()) == std::vector<double>{2, 2});

  // A penalty through a convolution: its first pass, with respect to the images alone, computes
  // no weight gradient; the second still reaches the weight, and gets what it gets when the first
  // pass is asked for the weight's gradient too.
  Tensor x = from_vector({0.5, -1, 2, 0.25, 1.5, -0.75, 1, 2, -2}, {1, 1, 3, 3}, f64).requires_grad_();
  Tensor w = from_vector({1, -2, 0.5, 3}, {1, 1, 2, 2}, f64).requires_grad_();
  const auto penalty_grad = [&](const std::vector<Tensor>& first_pass_inputs) {
    const Tensor gx = grad({sum(square(conv2d(x, w)))}, first_pass_inputs, {}, {.create_graph = true})[0];
    return vals(grad({sum(square(gx))}, {w})[0]);
  };
  const std::vector<double> pruned = penalty_grad({x});
  CHECK(pruned == penalty_grad({x, w}));
  CHECK(pruned != std::vector<double>(4, 0.0));
}

// Note [Gradient layout]: a later gradient is added into .grad() in place only when nothing but the
// leaf sees it; a .grad() the caller holds keeps its values, and the leaf gets a new tensor.
TEST_CASE("a later backward adds into .grad() in place only when nobody else holds it") {
  Tensor x = from_vector({1, 2, 3}, {3}, f64).requires_grad_();
  sum(x * x).backward();
  const void* first = x.grad().data_ptr();
  sum(x * 3.0).backward();
  CHECK(x.grad().data_ptr() == first);  // in place
  CHECK(vals(x.grad()) == std::vector<double>{5, 7, 9});
  const Tensor held = x.grad();
  sum(x).backward();
  CHECK(vals(held) == std::vector<double>{5, 7, 9});
  CHECK(held.data_ptr() != x.grad().data_ptr());
  CHECK(vals(x.grad()) == std::vector<double>{6, 8, 10});
  const Tensor view = x.grad().narrow(0, 0, 2);  // a view shares the storage: out of place too
  sum(x).backward();
  CHECK(vals(view) == std::vector<double>{6, 8});
  CHECK(vals(x.grad()) == std::vector<double>{7, 9, 11});
}

TEST_CASE("accumulated gradients are differentiable under create_graph") {
  Tensor x = from_vector({3}, {1}, f64).requires_grad_();
  sum(x * x * x).backward(Tensor(), false, /*create_graph=*/true);
  const Tensor gx = x.grad();  // 3x² with a graph
  REQUIRE(gx.requires_grad());
  const Tensor ggx = grad({sum(gx)}, {x})[0];
  CHECK(ggx.item() == doctest::Approx(18));
  x.set_grad(Tensor());  // x.grad's graph refers to x: clearing it breaks the cycle (see backward())
}

// Note [Gradient layout] in engine/autograd.cpp: ops whose backward hands its incoming gradient on
// unchanged (add, clone, sum_to of an equal shape), a transposed gradient (linear's weight), and
// the seed of backward() itself must not end up shared between .grad()s or left strided.
TEST_CASE("every accumulated gradient is its own contiguous tensor") {
  using evenflow::testing::gradient_layout_problem;
  const Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, f64);
  auto leaf = [](std::vector<double> v, Shape s) { return from_vector(v, s, f64).requires_grad_(); };
  struct Pattern {
    std::string name;
    std::function<Tensor(const std::vector<Tensor>&)> loss;
    std::vector<Tensor> params;
  };
  const std::vector<Pattern> patterns{
      {"x + (a + b)", [&](const auto& p) { return sum(x + (p[0] + p[1])); }, {leaf({1, 2}, {2}), leaf({3, 4}, {2})}},
      {"clone(a) + b", [&](const auto& p) { return sum(clone(p[0]) + p[1]); }, {leaf({1, 2}, {2}), leaf({3, 4}, {2})}},
      {"sum(a) + sum(b)", [&](const auto& p) { return sum(p[0]) + sum(p[1]); }, {leaf({1, 2}, {2}), leaf({3}, {1})}},
      {"linear(x, W0 + dW, b1 + b2)",
       [&](const auto& p) { return sum(linear(x, p[0] + p[1], p[2] + p[3])); },
       {leaf({1, 2, 3, 4}, {2, 2}), leaf({0, 1, 0, 1}, {2, 2}), leaf({1, 1}, {2}), leaf({2, 2}, {2})}},
      {"linear weight (a transposed gradient)",
       [&](const auto& p) { return sum(linear(x, p[0], Tensor())); },
       {leaf({1, 2, 3, 4}, {2, 2})}},
      {"a used twice", [&](const auto& p) { return sum(p[0] + p[0]); }, {leaf({1, 2}, {2})}},
  };
  for (bool create_graph : {false, true}) {
    for (const Pattern& pattern : patterns) {
      CAPTURE(pattern.name);
      CAPTURE(create_graph);
      std::vector<std::pair<std::string, Tensor>> named;
      for (size_t i = 0; i < pattern.params.size(); ++i) {
        pattern.params[i].set_grad(Tensor());
        named.emplace_back(std::to_string(i), pattern.params[i]);
      }
      const Tensor loss = pattern.loss(pattern.params);
      const std::vector<Tensor> want = grad({loss}, pattern.params, {}, {.retain_graph = true});
      loss.backward(Tensor(), false, create_graph);
      CHECK(gradient_layout_problem(named).empty());
      for (size_t i = 0; i < want.size(); ++i) CHECK(vals(pattern.params[i].grad()) == vals(want[i]));
      for (const Tensor& p : pattern.params) p.set_grad(Tensor());  // create_graph: break the cycle
    }
  }
}

TEST_CASE("changing a gradient in place when it arrives leaves the rest of backward unchanged") {
  // The data-parallel gradient sync all-reduces a parameter's gradient in place as soon as it is
  // accumulated, while backward goes on. add's backward hands the same gradient to `a` and to mul,
  // so unless a.grad() is its own tensor, mul's backward would read the changed values.
  Tensor a = from_vector({0, 0}, {2}, f64).requires_grad_();
  Tensor w = from_vector({1, 1}, {2}, f64).requires_grad_();
  const Tensor x = from_vector({3, 5}, {2}, f64);
  set_post_accumulate_hook(a, [](const Tensor& leaf) {
    NoGradGuard no_grad;
    leaf.grad().mul_(100.0);
  });
  (a + x * w).backward(ones({2}, f64));
  set_post_accumulate_hook(a, nullptr);
  CHECK(vals(a.grad()) == std::vector<double>{100, 100});
  CHECK(vals(w.grad()) == std::vector<double>{3, 5});
}

TEST_CASE("retain_grad keeps a non-leaf's gradient") {
  Tensor x = from_vector({1, 2}, {2}, f64).requires_grad_();
  Tensor h = x * 3.0;
  h.retain_grad();
  sum(h * h).backward();
  CHECK(vals(h.grad()) == std::vector<double>{6, 12});
}

TEST_CASE("a backward pass spanning several CPU devices equals the one-device pass") {
  manual_seed(cpu(), 11);
  const Tensor x0 = randn({4, 3}, f64), w0 = randn({3, 2}, f64);
  auto run = [&](const Device& a, const Device& b, const Device& c) {
    Tensor x = x0.to(a).detach().requires_grad_();
    Tensor w = w0.to(b).detach().requires_grad_();
    Tensor h = tanh(matmul(x.to(b), w));  // on b
    Tensor loss = sum(square(h.to(c)));   // on c
    loss.backward();
    return std::pair{vals(x.grad()), vals(w.grad())};
  };
  const auto one = run(cpu(0), cpu(0), cpu(0));
  const auto three = run(cpu(1), cpu(2), cpu(3));
  CHECK(one.first == three.first);
  CHECK(one.second == three.second);
}

TEST_CASE("a failure in a node on another device's worker reaches the caller, and the engine goes on") {
  Tensor x = from_vector({1, 2}, {2}, f64).requires_grad_();
  Tensor w = from_vector({3, 4}, {2}, f64).to(cpu(2));
  Tensor y = sum((x.to(cpu(2)) * w).to(cpu(0)));
  w.fill_(0.0);
  const std::string msg = error_of([&] { y.backward(); });
  CHECK(msg.find("in backward of mul on cpu:2") == 0);
  Tensor z = sum(x * 2.0);
  z.backward();
  CHECK(vals(x.grad()) == std::vector<double>{2, 2});
}

TEST_CASE("grad() called from inside a device worker (as a per-device gradient penalty does)") {
  std::promise<std::vector<double>> result;
  context(cpu(2)).worker().post([&] {
    try {
      Tensor x = from_vector({1, 2}, {2}, {.dtype = kFloat64, .device = cpu(2)}).requires_grad_();
      const Tensor g = grad({sum(x * x * x)}, {x}, {}, {.create_graph = true})[0];
      const Tensor gg = grad({sum(g)}, {x})[0];
      result.set_value(vals(gg));
    } catch (...) {
      result.set_exception(std::current_exception());
    }
  });
  CHECK(result.get_future().get() == std::vector<double>{6, 12});
}
