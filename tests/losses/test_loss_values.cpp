// Every loss against PyTorch 1.13 (tests/fixtures/losses.json): the value and the gradients of the
// float inputs for a random upstream gradient, in float64 to 1e-10; for the gradient penalties, the
// gradients of the critic's weights. The same cases in float32, on another CPU device, and on a
// CUDA device where one is visible.
#include <doctest/doctest.h>

#include <iostream>
#include <set>

#include "tests/losses/loss_fixture.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::testing;

namespace {

void expect_close(const Tensor& got, const Json& want, double tol, const std::string& what) {
  REQUIRE_MESSAGE(got.defined(), what, " is undefined");
  const Tensor ref = tensor_from_json(want);
  const std::string mismatch = compare(got.to(cpu()).to(kFloat64), ref, tol, tol);
  CHECK_MESSAGE(mismatch.empty(), what, ": ", mismatch);
}

// Runs the case on `device` in `dtype` and compares with PyTorch's float64 values.
void check_case(const Json& c, const Device& device, DType dtype, double tol) {
  const std::string name = c.at("name");
  CAPTURE(name);
  Inputs in = inputs_from_json(c, device, dtype);
  if (is_penalty(c)) {
    std::vector<Tensor> params = critic_params_from_json(c, device, dtype);
    for (Tensor& p : params) p.requires_grad_();
    const Tensor out = run_case(c, in, params);
    CHECK(out.dtype() == dtype);
    CHECK(out.device() == device);
    expect_close(out, c.at("output"), tol, "penalty");
    const std::vector<Tensor> g = grad({out}, params, {}, {.allow_unused = true});
    for (size_t i = 0; i < params.size(); ++i) {
      const Json& want = c.at("critic_grads")[i];
      expect_close(g[i].defined() ? g[i] : zeros_like(params[i]), want.at(1), tol,
                   "gradient of " + want.at(0).get<std::string>());
    }
    return;
  }
  std::vector<Tensor> wrt;
  for (const std::string& k : differentiated(c)) {
    in[k].requires_grad_();
    wrt.push_back(in[k]);
  }
  const Tensor out = run_case(c, in);
  CHECK(out.dtype() == dtype);
  CHECK(out.device() == device);
  expect_close(out, c.at("output"), tol, "output");
  const Tensor gy = tensor_from_json(c.at("grad_output"), device, dtype);
  const std::vector<Tensor> g = grad({sum(out * gy)}, wrt);
  size_t i = 0;
  for (const std::string& k : differentiated(c)) expect_close(g[i++], c.at("grads").at(k), tol, "gradient of " + k);
}

// Runs every float64 fixture case of the given losses; returns how many ran.
std::set<std::string> all_losses() {
  std::set<std::string> all;
  for (const Json& c : loss_fixture().at("cases")) all.insert(c.at("loss").get<std::string>());
  return all;
}

int check_losses(const std::set<std::string>& losses, const Device& device = cpu(), DType dtype = kFloat64,
                 double tol = 1e-10) {
  int n = 0;
  for (const Json& c : loss_fixture().at("cases")) {
    if (losses.count(c.at("loss").get<std::string>()) == 0) continue;
    check_case(c, device, dtype, tol);
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("PyTorch fixture: every loss of losses.h has cases") {
  CHECK(all_losses() == std::set<std::string>{"cross_entropy", "nll_loss", "focal_loss", "dice_loss", "lovasz_softmax",
                                              "ohem_cross_entropy", "mse_loss", "l1_loss", "smooth_l1_loss",
                                              "binary_cross_entropy_with_logits", "wasserstein_critic_loss",
                                              "wasserstein_generator_loss", "wgan_gp_penalty", "dragan_penalty",
                                              "r1_penalty"});
  CHECK(loss_fixture().at("cases").size() == 53);
}

TEST_CASE("cross_entropy matches PyTorch: weights, label smoothing, ignore_index, NCHW, every reduction") {
  CHECK(check_losses({"cross_entropy"}) == 12);
}

TEST_CASE("nll_loss matches PyTorch") {
  CHECK(check_losses({"nll_loss"}) == 4);
}

TEST_CASE("focal_loss matches its PyTorch reference") {
  CHECK(check_losses({"focal_loss"}) == 4);
}

TEST_CASE("dice_loss matches its PyTorch reference") {
  CHECK(check_losses({"dice_loss"}) == 3);
}

TEST_CASE("lovasz_softmax matches Berman et al.'s algorithm in PyTorch") {
  CHECK(check_losses({"lovasz_softmax"}) == 4);
}

TEST_CASE("ohem_cross_entropy matches its PyTorch reference") {
  CHECK(check_losses({"ohem_cross_entropy"}) == 5);
}

TEST_CASE("mse, l1 and smooth_l1 match PyTorch, gradients of input and target") {
  CHECK(check_losses({"mse_loss", "l1_loss", "smooth_l1_loss"}) == 11);
}

TEST_CASE("binary_cross_entropy_with_logits matches PyTorch: weight, pos_weight, large logits") {
  CHECK(check_losses({"binary_cross_entropy_with_logits"}) == 5);
}

TEST_CASE("Wasserstein losses and the gradient penalties match PyTorch, critic gradients included") {
  CHECK(check_losses({"wasserstein_critic_loss", "wasserstein_generator_loss", "wgan_gp_penalty", "dragan_penalty",
                      "r1_penalty"}) == 5);
}

TEST_CASE("every loss in float32 and on another device agrees with PyTorch's float64 values") {
  CHECK(check_losses(all_losses(), cpu(), kFloat32, 1e-4) == 53);
  CHECK(check_losses(all_losses(), cpu(1), kFloat64, 1e-10) == 53);
}

TEST_CASE("every loss on a CUDA device agrees with PyTorch, float64 and float32") {
  if (!cuda_devices_available()) return;
  CHECK(check_losses(all_losses(), cuda(), kFloat64, 1e-10) == 53);
  CHECK(check_losses(all_losses(), cuda(), kFloat32, 1e-4) == 53);
}
