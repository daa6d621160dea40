// Every layer against PyTorch 1.13 (tests/fixtures/layers.json): forward output, gradients of the
// input and of every parameter, buffers after a training step, the eval-mode output of BatchNorm,
// state-dict names and order, and the printed module.
#include <doctest/doctest.h>

#include <set>

#include "tests/layers/fixture.h"
#include "tests/layers/layer_cases.h"
#include "tests/testing/gradcheck.h"

using namespace evenflow;
using namespace evenflow::testing;

namespace {

const Json& layer_fixture() {
  static const Json j = load_fixture("layers.json");
  return j;
}

void expect_close(const Tensor& got, const Json& want, double tol, const std::string& what) {
  const Tensor ref = tensor_from_json(want);
  REQUIRE_MESSAGE(got.defined(), what, " is undefined");
  CHECK_MESSAGE(got.dtype() == ref.dtype(), what, ": dtype ", dtype_name(got.dtype()));
  const std::string mismatch = compare(got.to(kFloat64), ref.to(kFloat64), tol, tol);
  CHECK_MESSAGE(mismatch.empty(), what, ": ", mismatch);
}

// Builds the case's module, loads PyTorch's weights, runs a training step and compares everything.
void check_case(const Json& c) {
  const std::string name = c.at("name");
  CAPTURE(name);
  const DType dtype = c.at("dtype") == "float32" ? kFloat32 : kFloat64;
  const double tol = dtype == kFloat32 ? 1e-5 : 1e-10;
  const auto it = layer_factories().find(name);
  REQUIRE_MESSAGE(it != layer_factories().end(), "no factory for fixture case ", name);
  std::shared_ptr<nn::Module> m = it->second({.dtype = dtype});
  CHECK(m->repr() == c.at("repr").get<std::string>());

  // Same names, same order as PyTorch's state dict.
  const nn::NamedTensors state = named_from_json(c.at("state"));
  std::vector<std::string> want_keys, got_keys;
  for (const auto& [k, t] : state) want_keys.push_back(k);
  for (const auto& [k, t] : m->state_dict()) got_keys.push_back(k);
  CHECK(got_keys == want_keys);
  m->load_state_dict(state);

  const Tensor x = tensor_from_json(c.at("input")).requires_grad_();
  m->train();
  const Tensor y = (*m)(x);
  expect_close(y, c.at("output"), tol, "output");
  sum(y * tensor_from_json(c.at("grad_output"))).backward();
  expect_close(x.grad(), c.at("grad_input"), tol, "input gradient");
  const nn::NamedTensors params = m->named_parameters();
  REQUIRE(params.size() == c.at("grads").size());
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].first == c.at("grads")[i][0].get<std::string>());
    expect_close(params[i].second.grad(), c.at("grads")[i][1], tol, "gradient of " + params[i].first);
  }
  const nn::NamedTensors buffers = m->named_buffers();
  REQUIRE(buffers.size() == c.at("buffers_after").size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const std::string key = c.at("buffers_after")[i][0];
    CHECK(buffers[i].first == key);
    if (buffers[i].second.dtype() == kInt64) {
      CHECK(buffers[i].second.to_int_vector() == tensor_from_json(c.at("buffers_after")[i][1]).to_int_vector());
    } else {
      expect_close(buffers[i].second, c.at("buffers_after")[i][1], tol, key + " after the training step");
    }
  }
  if (c.contains("eval_output")) {
    m->eval();
    expect_close((*m)(x.detach()), c.at("eval_output"), tol, "eval output");
  }
}

// Runs every fixture case whose name starts with one of the prefixes; returns how many ran.
int check_cases(const std::vector<std::string>& prefixes) {
  int n = 0;
  for (const Json& c : layer_fixture().at("cases")) {
    const std::string name = c.at("name");
    for (const std::string& p : prefixes) {
      if (name.rfind(p, 0) == 0) {
        check_case(c);
        ++n;
        break;
      }
    }
  }
  return n;
}

}  // namespace

TEST_CASE("PyTorch fixture: every case has a module here and every module a case") {
  std::set<std::string> cases;
  for (const Json& c : layer_fixture().at("cases")) cases.insert(c.at("name").get<std::string>());
  std::set<std::string> factories;
  for (const auto& [name, f] : layer_factories()) factories.insert(name);
  CHECK(cases == factories);
}

TEST_CASE("Linear matches PyTorch") {
  CHECK(check_cases({"linear"}) == 3);
}

TEST_CASE("Conv2d and ConvTranspose2d match PyTorch") {
  CHECK(check_cases({"conv"}) == 5);
}

TEST_CASE("BatchNorm1d and BatchNorm2d match PyTorch, running statistics included") {
  CHECK(check_cases({"batchnorm"}) == 5);
}

TEST_CASE("LayerNorm and GroupNorm match PyTorch") {
  CHECK(check_cases({"layernorm", "groupnorm"}) == 4);
}

TEST_CASE("activations match PyTorch") {
  CHECK(check_cases({"relu", "leaky_relu", "elu", "sigmoid", "tanh", "softplus"}) == 6);
}

TEST_CASE("pooling and upsampling match PyTorch") {
  CHECK(check_cases({"maxpool2d", "avgpool2d", "adaptive_avg_pool2d", "upsample"}) == 12);
}

TEST_CASE("Flatten and a Sequential CNN match PyTorch") {
  CHECK(check_cases({"flatten", "sequential"}) == 3);
}
