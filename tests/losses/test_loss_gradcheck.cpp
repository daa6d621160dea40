// gradcheck and gradgradcheck in float64 of every loss, on every case of the PyTorch fixture:
// with respect to each float input (logits, both inputs where both are float, class weights,
// pos_weight); for the gradient penalties, with respect to the critic's parameters, so
// gradgradcheck there checks third derivatives of the critic.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "tests/losses/loss_fixture.h"
#include "tests/testing/gradcheck.h"

using namespace evenflow;
using namespace evenflow::testing;

namespace {

struct Differentiable {
  Fn fn;
  std::vector<Tensor> inputs;
};

// The case as a function of its float inputs (of the critic's parameters for a penalty).
Differentiable as_function(const Json& c) {
  const Inputs fixed = inputs_from_json(c);
  if (is_penalty(c)) {
    return {[c, fixed](const std::vector<Tensor>& params) { return run_case(c, fixed, params); },
            critic_params_from_json(c)};
  }
  std::vector<std::string> names;
  std::vector<Tensor> inputs;
  for (const auto& [name, t] : fixed) {
    if (!is_floating(t.dtype())) continue;
    names.push_back(name);
    inputs.push_back(t);
  }
  return {[c, fixed, names](const std::vector<Tensor>& args) {
            Inputs in = fixed;
            for (size_t i = 0; i < names.size(); ++i) in[names[i]] = args[i];
            return run_case(c, in);
          },
          inputs};
}

// Runs check on every fixture case of the given losses; returns how many ran.
int check_all(const std::set<std::string>& losses,
              std::string (*check)(const Fn&, const std::vector<Tensor>&, const GradcheckOptions&)) {
  int n = 0;
  for (const Json& c : loss_fixture().at("cases")) {
    if (losses.count(c.at("loss").get<std::string>()) == 0) continue;
    const std::string name = c.at("name");
    CAPTURE(name);
    const Differentiable d = as_function(c);
    const std::string failure = check(d.fn, d.inputs, {});
    CHECK_MESSAGE(failure.empty(), name, ": ", failure);
    ++n;
  }
  return n;
}

const std::set<std::string> kClassification{"cross_entropy", "nll_loss", "focal_loss"};
const std::set<std::string> kSegmentation{"dice_loss", "lovasz_softmax", "ohem_cross_entropy"};
const std::set<std::string> kRegression{"mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits"};
const std::set<std::string> kGan{"wasserstein_critic_loss", "wasserstein_generator_loss", "wgan_gp_penalty",
                                 "dragan_penalty", "r1_penalty"};

}  // namespace

TEST_CASE("gradcheck: cross_entropy, nll_loss, focal_loss (logits and class weights)") {
  CHECK(check_all(kClassification, gradcheck) == 20);
}

TEST_CASE("gradgradcheck: cross_entropy, nll_loss, focal_loss") {
  CHECK(check_all(kClassification, gradgradcheck) == 20);
}

TEST_CASE("gradcheck: dice_loss, lovasz_softmax, ohem_cross_entropy") {
  CHECK(check_all(kSegmentation, gradcheck) == 12);
}

TEST_CASE("gradgradcheck: dice_loss, lovasz_softmax, ohem_cross_entropy") {
  CHECK(check_all(kSegmentation, gradgradcheck) == 12);
}

TEST_CASE("gradcheck: mse, l1, smooth_l1, binary_cross_entropy_with_logits (both inputs, weights)") {
  CHECK(check_all(kRegression, gradcheck) == 16);
}

TEST_CASE("gradgradcheck: mse, l1, smooth_l1, binary_cross_entropy_with_logits") {
  CHECK(check_all(kRegression, gradgradcheck) == 16);
}

TEST_CASE("gradcheck: Wasserstein losses; penalties w.r.t. the critic's parameters") {
  CHECK(check_all(kGan, gradcheck) == 5);
}

TEST_CASE("gradgradcheck: Wasserstein losses; penalties w.r.t. the critic's parameters") {
  CHECK(check_all(kGan, gradgradcheck) == 5);
}

// Note [Focal loss at saturated pixels]: pixels whose target probability rounds to 1 (logit gaps
// of 40 in float64, 20 in float32) beside ordinary ones, for γ on both sides of 1 and 2.
TEST_CASE("focal_loss at saturated pixels: finite to second order, gradcheck and gradgradcheck, every gamma") {
  const Tensor target = from_int_vector({0, 2, 1, 2}, {4});
  for (const double gamma : {0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0}) {
    CAPTURE(gamma);
    for (const DType dtype : {kFloat64, kFloat32}) {
      const double gap = dtype == kFloat64 ? 40.0 : 20.0;
      std::vector<double> v = {gap, 0.0, 0.0, 0.3, -0.2, 0.1, 0.0, gap, -1.0, 0.0, 0.5, 0.2};
      const Tensor logits = from_vector(v, {4, 3}, {.dtype = dtype}).requires_grad_(true);
      const Tensor loss = losses::focal_loss(logits, target, {.gamma = gamma});
      const Tensor g = grad({loss}, {logits}, {}, {.create_graph = true})[0];
      const Tensor gg = grad({sum(square(g))}, {logits})[0];
      for (const Tensor& t : {loss, g, gg}) {
        for (const double x : t.to_vector()) CHECK(std::isfinite(x));
      }
    }
    const Fn focal = [&](const std::vector<Tensor>& x) { return losses::focal_loss(x[0], target, {.gamma = gamma}); };
    const Tensor at =
        from_vector({40.0, 0.0, 0.0, 0.3, -0.2, 0.1, 0.0, 40.0, -1.0, 0.0, 0.5, 0.2}, {4, 3}, {.dtype = kFloat64});
    CHECK(gradcheck(focal, {at}) == "");
    CHECK(gradgradcheck(focal, {at}) == "");
  }
}
