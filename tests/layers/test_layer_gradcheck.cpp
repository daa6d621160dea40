// gradcheck of every layer's forward in float64, with respect to its input and its parameters
// (the module's parameters are rebound to gradcheck's tensors with Module::assign), and
// gradgradcheck: GroupNorm (a composite in layers/) and the other layers, which must stay twice
// differentiable for gradient penalties. And every layer's parameter gradients follow the gradient
// layout rule (Note [Gradient layout] in engine/autograd.cpp).
#include <doctest/doctest.h>

#include "tests/layers/fixture.h"
#include "tests/layers/layer_cases.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::testing;

namespace {

// fn(x, p0, p1, ...) = m(x) with the module's parameters set to p0, p1, ...
Fn module_fn(const std::shared_ptr<nn::Module>& m, const std::function<void()>& before = {}) {
  std::vector<std::string> names;
  for (const auto& [name, p] : m->named_parameters()) names.push_back(name);
  return [m, names, before](const std::vector<Tensor>& args) {
    for (size_t i = 0; i < names.size(); ++i) m->assign(names[i], args[i + 1]);
    if (before) before();
    return m->forward(args[0]);
  };
}

std::vector<Tensor> module_inputs(const Tensor& x, const nn::Module& m) {
  std::vector<Tensor> inputs{x};
  for (const Tensor& p : m.parameters()) inputs.push_back(p.detach());
  return inputs;
}

// The float64 fixture cases (PyTorch's weights and inputs) as (name, module, input).
struct LoadedCase {
  std::string name;
  std::shared_ptr<nn::Module> module;
  Tensor input;
};

std::vector<LoadedCase> float64_cases() {
  std::vector<LoadedCase> out;
  const Json fixture = load_fixture("layers.json");
  for (const Json& c : fixture.at("cases")) {
    if (c.at("dtype") != "float64") continue;
    const std::string name = c.at("name");
    auto m = layer_factories().at(name)({.dtype = kFloat64});
    m->load_state_dict(named_from_json(c.at("state")));
    out.push_back({name, m, tensor_from_json(c.at("input"))});
  }
  return out;
}

}  // namespace

TEST_CASE("gradcheck: every layer, float64, input and parameters") {
  const std::vector<LoadedCase> cases = float64_cases();
  CHECK(cases.size() == 35);
  for (const LoadedCase& c : cases) {
    CAPTURE(c.name);
    const std::string failure = gradcheck(module_fn(c.module), module_inputs(c.input, *c.module));
    CHECK_MESSAGE(failure.empty(), c.name, ": ", failure);
  }
}

TEST_CASE("every layer's parameter gradients are contiguous and own their storage, with and without create_graph") {
  int with_params = 0;
  for (const LoadedCase& c : float64_cases()) {
    if (c.module->parameters().empty()) continue;
    ++with_params;
    CAPTURE(c.name);
    for (bool create_graph : {false, true}) {
      CAPTURE(create_graph);
      c.module->zero_grad();
      sum(square(c.module->forward(c.input))).backward(Tensor(), false, create_graph);
      const nn::NamedTensors params = c.module->named_parameters();
      for (const auto& [name, p] : params) CHECK_MESSAGE(p.grad().defined(), name);
      CHECK(gradient_layout_problem(params).empty());
      c.module->zero_grad();  // under create_graph a gradient's graph refers to its parameter
    }
  }
  CHECK(with_params >= 12);
}

TEST_CASE("gradgradcheck: GroupNorm") {
  int n = 0;
  for (const LoadedCase& c : float64_cases()) {
    if (c.name.rfind("groupnorm", 0) != 0) continue;
    CAPTURE(c.name);
    const std::string failure = gradgradcheck(module_fn(c.module), module_inputs(c.input, *c.module));
    CHECK_MESSAGE(failure.empty(), c.name, ": ", failure);
    ++n;
  }
  CHECK(n == 2);
}

TEST_CASE("gradgradcheck: the other layers") {
  for (const LoadedCase& c : float64_cases()) {
    if (c.name.rfind("groupnorm", 0) == 0) continue;
    CAPTURE(c.name);
    const std::string failure = gradgradcheck(module_fn(c.module), module_inputs(c.input, *c.module));
    CHECK_MESSAGE(failure.empty(), c.name, ": ", failure);
  }
}

TEST_CASE("gradcheck and gradgradcheck: Dropout with a fixed mask, and group_norm with weights") {
  auto drop = std::make_shared<nn::Dropout>(0.3);
  const Tensor x = randn({3, 5}, {.dtype = kFloat64});
  const Fn fn = module_fn(drop, [] { manual_seed(cpu(), 11); });  // the same mask every call
  CHECK(gradcheck(fn, {x}).empty());
  CHECK(gradgradcheck(fn, {x}).empty());

  const Fn gn = [](const std::vector<Tensor>& a) { return nn::group_norm(a[0], 3, a[1], a[2], 1e-4); };
  const std::vector<Tensor> inputs{randn({2, 6, 2, 3}, {.dtype = kFloat64}), randn({6}, {.dtype = kFloat64}),
                                   randn({6}, {.dtype = kFloat64})};
  CHECK(gradcheck(gn, inputs).empty());
  CHECK(gradgradcheck(gn, inputs).empty());
}
