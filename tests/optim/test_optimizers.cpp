// Optimizers against PyTorch 1.13 (tests/fixtures/optim.json): SGD with momentum, dampening,
// nesterov and weight decay, Adam and AdamW with amsgrad, a step where one parameter has no
// gradient; clip_grad_norm_; state export and import resuming a run exactly; argument errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "evenflow/layers/layers.h"
#include "evenflow/optim/optim.h"
#include "tests/layers/fixture.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::testing;
using namespace evenflow::optim;

namespace {

const Json& optim_fixture() {
  static const Json j = load_fixture("optim.json");
  return j;
}

// The fixture's optimizers, by case name, as scripts/make_layer_fixtures.py builds them.
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const std::vector<Tensor>& ps) {
  if (name == "sgd") return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1});
  if (name == "sgd_momentum") return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9});
  if (name == "sgd_momentum_dampening")
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.05, .momentum = 0.8, .dampening = 0.3});
  if (name == "sgd_nesterov")
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  if (name == "sgd_weight_decay")
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.5, .weight_decay = 0.01});
  if (name == "adam") return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01});
  if (name == "adam_betas_weight_decay")
    return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.02, .betas = {0.0, 0.9}, .eps = 1e-6, .weight_decay = 0.1});
  if (name == "adam_amsgrad") return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.05, .amsgrad = true});
  if (name == "adamw") return std::make_unique<AdamW>(ps, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
  if (name == "adamw_amsgrad")
    return std::make_unique<AdamW>(ps,
                                   AdamOptions{.lr = 0.03, .betas = {0.5, 0.99}, .weight_decay = 0.5, .amsgrad = true});
  return nullptr;
}

// sum(a·(p - t)²) + ½·sum((q² - 1)²), the q term only when use_q (optim_loss in the script).
Tensor loss_of(const Tensor& p, const Tensor& q, const Tensor& a, const Tensor& t, bool use_q) {
  Tensor loss = sum(a * square(p - t));
  if (use_q) loss = loss + 0.5 * sum(square(q * q - 1.0));
  return loss;
}

struct Problem {
  Tensor p, q, a, t;
  int64_t skip_q_step;
};

Problem problem_of(const Json& c) {
  return {tensor_from_json(c.at("p")).requires_grad_(), tensor_from_json(c.at("q")).requires_grad_(),
          tensor_from_json(c.at("a")), tensor_from_json(c.at("t")), c.at("skip_q_step").get<int64_t>()};
}

void train_step(Optimizer& opt, const Problem& pr, int64_t step) {
  opt.zero_grad();
  loss_of(pr.p, pr.q, pr.a, pr.t, step != pr.skip_q_step).backward();
  opt.step();
}

}  // namespace

TEST_CASE("SGD, Adam and AdamW match PyTorch step for step") {
  int cases = 0;
  for (const Json& c : optim_fixture().at("optimizers")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const Problem pr = problem_of(c);
    const std::unique_ptr<Optimizer> opt = make_optimizer(name, {pr.p, pr.q});
    REQUIRE_MESSAGE(opt != nullptr, "no optimizer for fixture case ", name);
    const Tensor p_handle = pr.p;
    for (size_t step = 0; step < c.at("steps").size(); ++step) {
      CAPTURE(step);
      train_step(*opt, pr, static_cast<int64_t>(step));
      CHECK(compare(pr.p, tensor_from_json(c.at("steps")[step].at("p")), 1e-10, 1e-10) == "");
      CHECK(compare(pr.q, tensor_from_json(c.at("steps")[step].at("q")), 1e-10, 1e-10) == "");
    }
    CHECK(pr.p.same(p_handle));  // updated in place
    CHECK(pr.p.is_leaf());
    ++cases;
  }
  CHECK(cases == 10);
}

TEST_CASE("state export and import resume a run exactly") {
  for (const std::string name : {"sgd_nesterov", "adam_amsgrad", "adamw"}) {
    CAPTURE(name);
    const Json& c = *std::find_if(optim_fixture().at("optimizers").begin(), optim_fixture().at("optimizers").end(),
                                  [&](const Json& j) { return j.at("name") == name; });
    const Problem a = problem_of(c);
    const std::unique_ptr<Optimizer> opt_a = make_optimizer(name, {a.p, a.q});
    for (int64_t s = 0; s < 3; ++s) train_step(*opt_a, a, s);  // q skipped at step 2
    opt_a->set_lr(opt_a->lr() * 0.5);

    // A second run from copies of the parameters and the exported state.
    Problem b = a;
    b.p = a.p.detach().clone().requires_grad_();
    b.q = a.q.detach().clone().requires_grad_();
    const std::unique_ptr<Optimizer> opt_b = make_optimizer(name, {b.p, b.q});
    const NamedTensors state = opt_a->state();
    std::vector<std::string> keys;
    for (const auto& [k, t] : state) keys.push_back(k);
    CHECK(keys.front() == "lr");
    CHECK(std::find(keys.begin(), keys.end(), "state.1.step") != keys.end());
    opt_b->load_state(state);
    CHECK(opt_b->lr() == opt_a->lr());
    const NamedTensors reloaded = opt_b->state();
    REQUIRE(reloaded.size() == state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      CHECK(reloaded[i].first == state[i].first);
      CHECK(vals(reloaded[i].second) == vals(state[i].second));
      if (state[i].first != "lr" && state[i].second.dtype() != kInt64)
        CHECK(reloaded[i].second.data_ptr() != state[i].second.data_ptr());  // a copy, not shared
    }
    for (int64_t s = 3; s < 6; ++s) {
      train_step(*opt_a, a, s);
      train_step(*opt_b, b, s);
      CHECK(vals(a.p) == vals(b.p));  // bitwise
      CHECK(vals(a.q) == vals(b.q));
    }
  }
  // Per-parameter step counts: q had no gradient at step 2, so it was updated once less.
  Tensor p = ones({2}, {.requires_grad = true}), q = ones({2}, {.requires_grad = true});
  Adam adam({p, q});
  sum(p * q).backward();
  adam.step();
  q.set_grad(Tensor());
  adam.step();
  const NamedTensors st = adam.state();
  CHECK(st[1].first == "state.0.step");
  CHECK(st[1].second.item() == 2);
  CHECK(st[4].first == "state.1.step");
  CHECK(st[4].second.item() == 1);
}

TEST_CASE("load_state errors") {
  Tensor p = zeros({2, 3}, {.dtype = kFloat64, .requires_grad = true});
  Adam adam({p});
  const Tensor m = zeros({2, 3}, {.dtype = kFloat64});
  const Tensor one = from_int_vector({1}, {});
  CHECK(error_of([&] {
          adam.load_state({{"state.0.exp_avg", m}});
        }) == "Adam.load_state: parameter 0 has state tensors but no \"state.0.step\"");
  CHECK(error_of([&] {
          adam.load_state({{"state.1.step", one}});
        }) == "Adam.load_state: \"state.1.step\" names parameter 1 but there are 1");
  CHECK(error_of([&] {
          adam.load_state({{"state.0.momentum_buffer", m}});
        }) == "Adam.load_state: unexpected key \"state.0.momentum_buffer\" (Adam keeps no \"momentum_buffer\")");
  CHECK(error_of([&] { adam.load_state({{"epoch", one}}); }) == "Adam.load_state: unexpected key \"epoch\"");
  CHECK(error_of([&] {
          adam.load_state({{"state.0.step", one}, {"state.0.exp_avg", zeros({3, 2})}});
        }) == "Adam.load_state: \"state.0.exp_avg\" is [3, 2] float32 but parameter 0 is [2, 3] float64");
  CHECK(error_of([&] {
          adam.load_state({{"state.0.step", scalar_tensor(1.0)}});
        }).find("must be a positive int64") != std::string::npos);
  // A step count without every moment: the missing one would silently restart from zero.
  CHECK(error_of([&] {
          adam.load_state({{"state.0.step", one}, {"state.0.exp_avg_sq", m}});
        }) == "Adam.load_state: parameter 0 has \"state.0.step\" but no \"state.0.exp_avg\": the state is incomplete");
  SGD momentum({p}, {.lr = 0.1, .momentum = 0.9});
  CHECK(error_of([&] {
          momentum.load_state({{"state.0.step", one}});
        }) ==
        "SGD.load_state: parameter 0 has \"state.0.step\" but no \"state.0.momentum_buffer\": the state is incomplete");
  SGD plain({p}, {.lr = 0.1});
  CHECK(error_of([&] { plain.load_state({{"state.0.step", one}}); }) == "(no error)");
}

TEST_CASE("optimizers update parameters in place on several devices, and modules see the updates") {
  nn::Linear lin(3, 2);
  lin.to(cpu(1));
  Tensor extra = ones({2}, {.device = cpu(2), .requires_grad = true});
  std::vector<Tensor> params = lin.parameters();
  params.push_back(extra);
  SGD sgd(params, {.lr = 0.5});
  const std::vector<double> w0 = vals(lin.weight());
  sum(lin(ones({1, 3}, {.device = cpu(1)}))).backward();
  sum(extra * 2.0).backward();
  sgd.step();
  std::vector<double> w1 = vals(lin.weight());
  for (size_t i = 0; i < w0.size(); ++i) CHECK(w1[i] == doctest::Approx(w0[i] - 0.5));
  CHECK(vals(extra) == std::vector<double>{0, 0});
  CHECK(lin.weight().same(params[0]));
  sgd.zero_grad();
  CHECK_FALSE(extra.grad().defined());
}

TEST_CASE("optimizer argument errors") {
  Tensor p = zeros({2}, {.requires_grad = true});
  CHECK(error_of([&] { SGD({p}, {.lr = -1}); }) == "SGD: lr must be non-negative, got -1");
  CHECK(error_of([&] { SGD({p}, {.lr = 0.1, .nesterov = true}); }) ==
        "SGD: nesterov needs momentum > 0 and dampening 0, got momentum 0 and dampening 0");
  CHECK(error_of([&] { SGD({p, p}); }) == "SGD: parameter 1 appears more than once");
  CHECK(error_of([&] { Adam({p * 2.0}); }) ==
        "Adam: parameter 0 is not a leaf tensor (it was computed by mul_scalar): optimize the tensors it was computed "
        "from");
  CHECK(error_of([&] { Adam({p}, {.betas = {0.9, 1.0}}); }) == "Adam: betas.second must be in [0, 1), got 1");
  CHECK(error_of([&] { AdamW({p}, {.eps = -1}); }) == "AdamW: eps must be non-negative, got -1");
  CHECK(error_of([&] { Adam({from_int_vector({1}, {1})}); }) ==
        "Adam: parameter 0 is int64, only float32 and float64 tensors can be optimized");
  SGD sgd({p});
  CHECK(error_of([&] { sgd.set_lr(-0.5); }) == "SGD: lr must be non-negative, got -0.5");
}

TEST_CASE("clip_grad_norm_ matches PyTorch") {
  int n = 0;
  for (const Json& c : optim_fixture().at("clip_grad_norm")) {
    const double norm_type =
        c.at("norm_type").is_string() ? std::numeric_limits<double>::infinity() : c.at("norm_type").get<double>();
    const double max_norm = c.at("max_norm");
    CAPTURE(max_norm);
    CAPTURE(norm_type);
    std::vector<Tensor> params;
    for (const Json& g : c.at("grads")) {
      Tensor p = zeros_like(tensor_from_json(g)).requires_grad_();
      p.set_grad(tensor_from_json(g));
      params.push_back(p);
    }
    Tensor no_grad_param = zeros({3}, {.dtype = kFloat64, .requires_grad = true});
    params.push_back(no_grad_param);
    const double total = clip_grad_norm_(params, max_norm, norm_type);
    CHECK(total == doctest::Approx(c.at("total_norm").get<double>()).epsilon(1e-12));
    for (size_t i = 0; i < 2; ++i)
      CHECK(compare(params[i].grad(), tensor_from_json(c.at("clipped")[i]), 1e-12, 1e-12) == "");
    CHECK_FALSE(no_grad_param.grad().defined());
    ++n;
  }
  CHECK(n == 4);
  CHECK(clip_grad_norm_({zeros({2}, {.requires_grad = true})}, 1.0) == 0.0);
  CHECK(error_of([] { clip_grad_norm_({}, -1.0); }) == "clip_grad_norm_: max_norm must be non-negative, got -1");
}

TEST_CASE("the fused Adam step updates strided parameters and state like contiguous ones") {
  for (const DType dt : {kFloat32, kFloat64}) {
    manual_seed(3);
    const Tensor base = randn({5, 7}, {.dtype = dt});
    const Tensor grad = randn({7, 5}, {.dtype = dt});
    // The same values twice: once as a transposed (strided) view, once contiguous.
    const Tensor strided = transpose(base.clone(), 0, 1).requires_grad_();
    const Tensor dense = transpose(base, 0, 1).contiguous().requires_grad_();
    REQUIRE_FALSE(strided.is_contiguous());
    Adam a({strided}, {.lr = 0.1, .weight_decay = 0.01, .amsgrad = true});
    Adam b({dense}, {.lr = 0.1, .weight_decay = 0.01, .amsgrad = true});
    for (int step = 0; step < 3; ++step) {
      strided.set_grad(grad * static_cast<double>(step + 1));
      dense.set_grad(grad * static_cast<double>(step + 1));
      a.step();
      b.step();
    }
    CHECK(compare(strided, dense, 0, 0).empty());
    CHECK_FALSE(compare(dense, transpose(base, 0, 1), 0, 0).empty());  // it moved
  }
}

// The multi-tensor step groups parameters by step count, device and dtype: each must move exactly
// as it would alone.
TEST_CASE("Adam: one step over parameters of different step counts and dtypes equals each alone") {
  manual_seed(5);
  const std::vector<Tensor> init{randn({3, 4}), randn({5}, {.dtype = kFloat64}), randn({2, 2}), randn({70000})};
  std::vector<Tensor> together, alone;
  for (const Tensor& t : init) {
    together.push_back(t.clone().requires_grad_());
    alone.push_back(t.clone().requires_grad_());
  }
  AdamW joint(together, {.lr = 0.05, .amsgrad = true});
  std::vector<std::unique_ptr<AdamW>> single;
  for (const Tensor& t : alone)
    single.push_back(std::make_unique<AdamW>(std::vector<Tensor>{t}, AdamOptions{.lr = 0.05, .amsgrad = true}));
  for (int step = 0; step < 4; ++step) {
    for (size_t k = 0; k < init.size(); ++k) {
      // Parameter 2 gets a gradient every other step only, so its step count falls behind.
      const bool has_grad = k != 2 || step % 2 == 0;
      const Tensor g = has_grad ? randn(init[k].shape(), {.dtype = init[k].dtype()}) : Tensor();
      together[k].set_grad(g);
      alone[k].set_grad(g.defined() ? g.clone() : Tensor());
      if (has_grad) single[k]->step();
    }
    joint.step();
  }
  for (size_t k = 0; k < init.size(); ++k) {
    CAPTURE(k);
    CHECK_MESSAGE(compare(together[k], alone[k], 0, 0).empty(), compare(together[k], alone[k], 0, 0));
  }
}

TEST_CASE("adam_ names a mismatched operand") {
  const Tensor p = zeros({3}), g = zeros({4}), m = zeros({3}), v = zeros({3});
  CHECK(error_of([&] {
          adam_(AdamArgs{}, {{p, g, m, v, {}}});
        }).find("adam_: grad has shape [4] but param has [3]") == 0);
  CHECK(error_of([&] {
          adam_(AdamArgs{}, {{p, zeros({3}, {.dtype = kFloat64}), m, v, {}}});
        }).find("adam_: param is float32") == 0);
  // Several parameters: the entry is named, and they share a device and dtype.
  CHECK(error_of([&] {
          adam_(AdamArgs{}, {{p, zeros({3}), m, v, {}}, {p, g, m, v, {}}});
        }).find("adam_: grad 1 has shape [4] but param 1 has [3]") == 0);
  CHECK(error_of([&] {
          adam_(AdamArgs{}, {{p, zeros({3}), m, v, {}}, {zeros({3}, {.dtype = kFloat64}), g, m, v, {}}});
        }).find("adam_: param 0 is float32") == 0);
}

// Note [Adam moments flush to zero]: a parameter whose gradient stays 0 keeps exact zeros, never
// subnormal moments (which x86 computes on ~100x slower).
TEST_CASE("Adam's moments flush to zero below the smallest normal number") {
  for (const DType dt : {kFloat32, kFloat64}) {
    const Tensor p = zeros({4}, {.dtype = dt}).requires_grad_();
    Adam adam({p}, {.lr = 1e-3});
    p.set_grad(full({4}, 1e-3, {.dtype = dt}));
    adam.step();
    const int steps = dt == kFloat32 ? 850 : 6800;  // unflushed, m = 1e-4·0.9^k would be subnormal
    for (int k = 0; k < steps; ++k) {
      p.set_grad(zeros({4}, {.dtype = dt}));
      adam.step();
    }
    int moments = 0;
    for (const auto& [name, t] : adam.state()) {
      if (name.find("exp_avg") == std::string::npos) continue;
      ++moments;
      for (const double v : t.to_vector()) CHECK_MESSAGE(std::fpclassify(v) != FP_SUBNORMAL, name);
      if (name == "state.0.exp_avg") CHECK(t.to_vector() == std::vector<double>(4, 0.0));
    }
    CHECK(moments == 2);
  }
}
