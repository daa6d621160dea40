// Module bookkeeping: names and order of parameters and buffers, state-dict loading and its
// errors, clone independence, to(device) and to(dtype), train/eval, zero_grad, functional calls
// with assign, default initialisation, and the argument errors of every layer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "evenflow/layers/layers.h"
#include "tests/layers/fixture.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::testing;
using namespace evenflow::nn;

namespace {

const ModuleOptions f64{.dtype = kFloat64};

// conv, bn, relu, pool, flatten, linear: the network of the "sequential_cnn" fixture case.
std::shared_ptr<Sequential> small_cnn(const ModuleOptions& o = {}) {
  return std::make_shared<Sequential>(Conv2d(1, 4, 3, {.padding = 1}, o), BatchNorm2d(4, {}, o), ReLU(), MaxPool2d(2),
                                      Flatten(), Linear(16, 3, true, o));
}

std::vector<std::string> keys(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [k, t] : named) out.push_back(k);
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A user-defined module with named children, as a model would be written.
class TwoLayer : public Cloneable<TwoLayer> {
 public:
  explicit TwoLayer(const ModuleOptions& o = {}) {
    register_module("features", std::make_shared<Sequential>(Linear(3, 4, true, o), Tanh()));
    register_module("head", std::make_shared<Linear>(4, 2, false, o));
    register_buffer("scale", full({}, 2.0, {.dtype = o.dtype, .device = o.device}));
  }
  Tensor forward(const Tensor& x) override { return (*child("head"))((*child("features"))(x)) * buffer("scale"); }
  std::string name() const override { return "TwoLayer"; }
};

}  // namespace

TEST_CASE("state_dict names and order match PyTorch for a Sequential CNN") {
  auto net = small_cnn();
  // PyTorch's names, from the fixture.
  std::vector<std::string> torch_keys;
  const Json fixture = load_fixture("layers.json");
  for (const Json& c : fixture.at("cases"))
    if (c.at("name") == "sequential_cnn")
      for (const Json& pair : c.at("state")) torch_keys.push_back(pair.at(0));
  CHECK(keys(net->state_dict()) == torch_keys);
  CHECK(keys(net->state_dict()) == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                                            "1.running_mean", "1.running_var", "1.num_batches_tracked",
                                                            "5.weight", "5.bias"});
  CHECK(keys(net->named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"});
  CHECK(keys(net->named_buffers()) ==
        std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"});
  const Tensor count = net->tensor("1.num_batches_tracked");
  CHECK(count.dtype() == kInt64);
  CHECK(count.dim() == 0);
  CHECK(net->num_parameters() == 4 * 9 + 4 + 4 + 4 + 16 * 3 + 3);
  for (const Tensor& p : net->parameters()) {
    CHECK(p.is_leaf());
    CHECK(p.requires_grad());
  }
  for (const Tensor& b : net->buffers()) CHECK_FALSE(b.requires_grad());

  TwoLayer model;
  CHECK(keys(model.state_dict()) ==
        std::vector<std::string>{"scale", "features.0.weight", "features.0.bias", "head.weight"});
  std::vector<std::string> modules;
  for (const auto& [name, m] : model.named_modules()) modules.push_back(name + ":" + m->name());
  CHECK(modules == std::vector<std::string>{":TwoLayer", "features:Sequential", "features.0:Linear", "features.1:Tanh",
                                            "head:Linear"});
}

TEST_CASE("repr prints the module tree as PyTorch does") {
  TwoLayer model;
  CHECK(model.repr() ==
        "TwoLayer(\n"
        "  (features): Sequential(\n"
        "    (0): Linear(in_features=3, out_features=4, bias=True)\n"
        "    (1): Tanh()\n"
        "  )\n"
        "  (head): Linear(in_features=4, out_features=2, bias=False)\n"
        ")");
  CHECK(Dropout(0.25).repr() == "Dropout(p=0.25, inplace=False)");
  CHECK(BatchNorm2d(3, {.eps = 1e-20, .momentum = 0.5}).repr() ==
        "BatchNorm2d(3, eps=1e-20, momentum=0.5, affine=True, track_running_stats=True)");
  CHECK(util::py_float(1e16) == "1e+16");
  CHECK(util::py_float(123456.75) == "123456.75");
  CHECK(util::py_float(0.0001) == "0.0001");
  CHECK(util::py_float(-2.5e-7) == "-2.5e-07");
  CHECK(util::py_float(100.0) == "100.0");
}

TEST_CASE("Identity returns its input and passes gradients through; it has no state") {
  Identity id;
  CHECK(id.repr() == "Identity()");
  CHECK(id.state_dict().empty());
  Tensor x = randn({2, 3}, {.dtype = kFloat64}).requires_grad_();
  const Tensor y = id(x);
  CHECK(y.data_ptr() == x.data_ptr());
  sum(y * 3.0).backward();
  CHECK(x.grad().to_vector() == std::vector<double>(6, 3.0));
  auto net = std::make_shared<Sequential>(Linear(3, 2), Identity(), Tanh());
  CHECK(keys(net->state_dict()) == std::vector<std::string>{"0.weight", "0.bias"});
}

TEST_CASE("load_state_dict copies into the existing storage and keeps parameters' identity") {
  manual_seed(cpu(), 1);
  auto a = small_cnn(f64);
  auto b = small_cnn(f64);
  const Tensor w = b->tensor("0.weight");
  const void* storage = w.data_ptr();
  a->tensor("1.num_batches_tracked").fill_(7);
  b->load_state_dict(a->state_dict());
  CHECK(b->tensor("0.weight").same(w));  // the same tensor: an optimizer holding it sees the values
  CHECK(w.data_ptr() == storage);
  for (const auto& [k, t] : a->state_dict()) CHECK_MESSAGE(vals(b->tensor(k)) == vals(t), k);
  CHECK(w.is_leaf());
  CHECK(w.requires_grad());
  CHECK(b->tensor("1.num_batches_tracked").item() == 7);
}

TEST_CASE("load_state_dict errors: missing, unexpected, shape, dtype, and a failed load changes nothing") {
  auto net = small_cnn(f64);
  const std::vector<double> before = vals(net->tensor("0.weight"));
  NamedTensors sd;
  for (const auto& [k, t] : net->state_dict()) sd.emplace_back(k, t.dtype() == kInt64 ? t.clone() : t + 1.0);

  NamedTensors missing(sd.begin() + 1, sd.end());
  CHECK(error_of([&] { net->load_state_dict(missing); }) ==
        "load_state_dict: missing key(s) in the state dict: \"0.weight\"");
  NamedTensors unexpected = sd;
  unexpected.emplace_back("7.weight", zeros({2}, {.dtype = kFloat64}));
  CHECK(error_of([&] { net->load_state_dict(unexpected); }) ==
        "load_state_dict: unexpected key(s) in the state dict: \"7.weight\"");
  NamedTensors shape = sd;
  shape.back().second = zeros({4}, {.dtype = kFloat64});
  CHECK(error_of([&] { net->load_state_dict(shape); }) ==
        "load_state_dict: \"5.bias\" has shape [4] in the state dict but [3] in the module");
  NamedTensors dtype = sd;
  dtype[1].second = zeros({4}, {.dtype = kFloat32});
  CHECK(error_of([&] { net->load_state_dict(dtype); }) ==
        "load_state_dict: \"0.bias\" is float32 in the state dict but float64 in the module");
  NamedTensors twice = sd;
  twice.push_back(sd.front());
  CHECK(contains(error_of([&] { net->load_state_dict(twice); }), "\"0.weight\" appears twice"));
  CHECK(vals(net->tensor("0.weight")) == before);

  // Not strict: missing and unexpected keys are ignored, the rest is loaded; shapes still checked.
  net->load_state_dict(unexpected, /*strict=*/false);
  net->load_state_dict(missing, /*strict=*/false);
  CHECK(vals(net->tensor("5.bias")) == vals(sd.back().second));
  CHECK(contains(error_of([&] { net->load_state_dict(shape, false); }), "\"5.bias\" has shape [4]"));
}

TEST_CASE("clone is a deep copy: same values and configuration, independent storage") {
  manual_seed(cpu(), 2);
  auto net = small_cnn(f64);
  net->eval();
  std::shared_ptr<Sequential> copy = clone(*net);
  CHECK(copy->repr() == net->repr());
  CHECK_FALSE(copy->is_training());
  CHECK_FALSE((*copy)[1]->is_training());
  for (const auto& [k, t] : net->state_dict()) {
    const Tensor c = copy->tensor(k);
    CHECK_MESSAGE(vals(c) == vals(t), k);
    CHECK(c.data_ptr() != t.data_ptr());
  }
  for (const Tensor& p : copy->parameters()) {
    CHECK(p.is_leaf());
    CHECK(p.requires_grad());
  }
  const Tensor x = randn({2, 1, 4, 4}, {.dtype = kFloat64});
  CHECK(vals((*copy)(x)) == vals((*net)(x)));
  {
    NoGradGuard no_grad;
    net->tensor("0.weight").fill_(0.5);
    net->tensor("1.running_mean").fill_(3);
  }
  CHECK(vals(copy->tensor("0.weight")) != vals(net->tensor("0.weight")));
  CHECK(vals(copy->tensor("1.running_mean")) != vals(net->tensor("1.running_mean")));
  CHECK((*copy)[0] != (*net)[0]);  // children are copied too

  TwoLayer model;
  auto model_copy = clone(model);
  CHECK(model_copy->child("features.0") != model.child("features.0"));
  const Tensor in = randn({5, 3});
  CHECK(vals((*model_copy)(in)) == vals(model(in)));
}

TEST_CASE("to(cpu:1) moves every tensor and keeps values, to(float64) converts float tensors") {
  manual_seed(cpu(), 3);
  auto net = small_cnn();
  const NamedTensors before = net->state_dict();
  const Tensor x = randn({2, 1, 4, 4});
  net->eval();
  const std::vector<double> y0 = vals((*net)(x));
  sum((*net)(x)).backward();
  net->to(cpu(1));
  for (const auto& [k, t] : net->state_dict()) {
    CHECK(t.device() == cpu(1));
    CHECK(vals(t) == vals(std::find_if(before.begin(), before.end(), [&](auto& p) { return p.first == k; })->second));
  }
  for (const Tensor& p : net->parameters()) {
    CHECK(p.is_leaf());
    CHECK(p.requires_grad());
    CHECK(p.grad().device() == cpu(1));
  }
  CHECK(vals((*net)(x.to(cpu(1)))) == y0);
  CHECK(contains(error_of([&] { (*net)(x); }),
                 "Conv2d: input is float32 on cpu:0 but the parameters are float32 on "
                 "cpu:1"));

  net->to(kFloat64);
  CHECK(net->tensor("0.weight").dtype() == kFloat64);
  CHECK(net->tensor("1.running_var").dtype() == kFloat64);
  CHECK(net->tensor("1.num_batches_tracked").dtype() == kInt64);
  CHECK(net->tensor("0.weight").requires_grad());
  CHECK(compare((*net)(x.to(cpu(1)).to(kFloat64)), from_vector(y0, {2, 3}, {.dtype = kFloat64}), 1e-5, 1e-5).empty());
  CHECK(contains(error_of([&] { net->to(kInt64); }), "to: dtype must be float32 or float64"));
}

TEST_CASE("train and eval: Dropout and BatchNorm") {
  Sequential net(Linear(4, 4), BatchNorm1d(4), Dropout(0.5));
  CHECK(net.is_training());
  net.eval();
  for (const auto& [name, m] : net.named_modules()) CHECK_FALSE(m->is_training());
  net.train();
  for (const auto& [name, m] : net.named_modules()) CHECK(m->is_training());

  // Dropout: identity in eval; in training about half the elements zeroed, the rest doubled, the
  // mask drawn from the device's generator.
  Dropout drop(0.5);
  const Tensor x = ones({4000});
  drop.eval();
  CHECK(vals(drop(x)) == vals(x));
  drop.train();
  manual_seed(cpu(), 9);
  const std::vector<double> y = vals(drop(x));
  int zeros_seen = 0;
  for (double v : y) {
    CHECK((v == 0 || v == 2));
    zeros_seen += v == 0;
  }
  CHECK(zeros_seen > 1800);
  CHECK(zeros_seen < 2200);
  manual_seed(cpu(), 9);
  CHECK(vals(drop(x)) == y);

  // BatchNorm: training normalizes with the batch and updates running stats; eval uses them.
  BatchNorm1d bn(2, {.momentum = 0.5}, f64);
  const Tensor b = from_vector({1, 10, 3, 20}, {2, 2}, {.dtype = kFloat64});
  bn(b);
  CHECK(vals(bn.tensor("running_mean")) == std::vector<double>{1.0, 7.5});  // 0.5·0 + 0.5·mean
  CHECK(vals(bn.tensor("running_var")) == std::vector<double>{1.5, 25.5});  // 0.5·1 + 0.5·unbiased var
  CHECK(bn.tensor("num_batches_tracked").item() == 1);
  bn.eval();
  const Tensor e = bn(b);
  CHECK(std::fabs(e.to_vector()[0] - (1 - 1.0) / std::sqrt(1.5 + 1e-5)) < 1e-12);
  CHECK(std::fabs(e.to_vector()[3] - (20 - 7.5) / std::sqrt(25.5 + 1e-5)) < 1e-12);
  CHECK(bn.tensor("num_batches_tracked").item() == 1);  // eval does not count
}

TEST_CASE("zero_grad, assign (functional calls) and child access") {
  Linear lin(3, 2, true, f64);
  const Tensor x = randn({4, 3}, {.dtype = kFloat64});
  sum(lin(x)).backward();
  CHECK(lin.weight().grad().defined());
  lin.zero_grad(/*set_to_none=*/false);
  CHECK(vals(lin.weight().grad()) == std::vector<double>(6, 0.0));
  lin.zero_grad();
  CHECK_FALSE(lin.weight().grad().defined());

  // A parameter rebound to a computed tensor: gradients flow to what it was computed from.
  const Tensor base = randn({2, 3}, {.dtype = kFloat64}).requires_grad_();
  lin.assign("weight", base * 2.0);
  const Tensor g = grad({sum(lin(x))}, {base})[0];
  CHECK(compare(g, sum(x, {0}).unsqueeze(0).expand({2, 3}) * 2.0, 1e-12, 1e-12).empty());
  CHECK(error_of([&] {
          lin.assign("weight", zeros({3, 2}, {.dtype = kFloat64}));
        }) == "Linear.assign(\"weight\"): got shape [3, 2] float64, the module has [2, 3] float64");
  CHECK(error_of([&] { lin.assign("scale", zeros({2})); }) == "Linear.assign: no parameter or buffer \"scale\"");
  CHECK(error_of([&] { lin.tensor("head.weight"); }) ==
        "Linear: no child module \"head\" on the way to \"head.weight\"");

  TwoLayer model;
  model.replace_child("features.1", std::make_shared<ReLU>());
  CHECK(model.child("features.1")->name() == "ReLU");
  CHECK(contains(error_of([&] { model.child("body"); }), "no child module \"body\""));
  CHECK(contains(error_of([&] { model.replace_child("features.7", std::make_shared<ReLU>()); }),
                 "no child module \"features.7\""));
  Sequential seq;
  seq.push_back(Linear(2, 2));
  seq.push_back(std::make_shared<Tanh>());
  CHECK(seq.size() == 2);
  CHECK(seq[1]->name() == "Tanh");
  CHECK(contains(error_of([&] { seq[2]; }), "index 2 is out of range for 2 modules"));
  auto shared = std::make_shared<Linear>(2, 2);
  Sequential mixed(shared, ReLU(), seq);  // a shared module, a value, a nested Sequential (copied handles)
  CHECK(mixed[0] == shared);
  CHECK(keys(mixed.state_dict()) == std::vector<std::string>{"0.weight", "0.bias", "2.0.weight", "2.0.bias"});
  CHECK(mixed.tensor("2.0.weight").same(seq.tensor("0.weight")));
  Sequential listed{std::make_shared<ReLU>(), std::make_shared<Flatten>()};
  CHECK(keys(listed.state_dict()).empty());
  CHECK(listed.named_children()[1].first == "1");
}

TEST_CASE("default initialisation: PyTorch's bounds, from the device's generator") {
  manual_seed(cpu(), 4);
  Linear lin(50, 40);
  const double bound = 1 / std::sqrt(50.0);
  double lo = 1, hi = -1;
  for (double v : vals(lin.weight())) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo >= -bound);
  CHECK(hi < bound);
  CHECK(lo < -0.95 * bound);
  CHECK(hi > 0.95 * bound);
  for (double v : vals(lin.bias())) CHECK(std::fabs(v) <= bound);

  // ConvTranspose2d: fan_in = weight.size(1)·kh·kw = (out / groups)·kh·kw, as PyTorch.
  ConvTranspose2d up(4, 6, 3, {.groups = 2});
  CHECK(up.weight().shape() == Shape{4, 3, 3, 3});
  const double up_bound = 1 / std::sqrt(27.0);
  double up_max = 0;
  for (double v : vals(up.weight())) up_max = std::max(up_max, std::fabs(v));
  CHECK(up_max <= up_bound);
  CHECK(up_max > 0.8 * up_bound);
  Conv2d conv(6, 9, {3, 2}, {.groups = 3});
  double conv_max = 0;
  for (double v : vals(conv.bias())) conv_max = std::max(conv_max, std::fabs(v));
  CHECK(conv_max <= 1 / std::sqrt(12.0));

  // The same seed gives the same model on any device.
  manual_seed(cpu(), 5);
  Conv2d c0(2, 3, 3);
  manual_seed(cpu(2), 5);
  Conv2d c2(2, 3, 3, {}, {.device = cpu(2)});
  CHECK(c2.weight().device() == cpu(2));
  CHECK(vals(c0.weight()) == vals(c2.weight()));
  CHECK(vals(c0.bias()) == vals(c2.bias()));

  BatchNorm2d bn(3);
  CHECK(vals(bn.tensor("weight")) == std::vector<double>{1, 1, 1});
  CHECK(vals(bn.tensor("bias")) == std::vector<double>{0, 0, 0});
  GroupNorm gn(2, 4, {}, f64);
  CHECK(vals(gn.tensor("weight")) == std::vector<double>{1, 1, 1, 1});
  CHECK(gn.tensor("weight").dtype() == kFloat64);
}

TEST_CASE("update_batchnorm_statistics: the plain average over the batches given, then settings restored") {
  // A BatchNorm2d inside a Sequential, momentum 0.1, in eval mode with statistics of its own.
  const TensorOptions doubles{.dtype = kFloat64};
  auto net = std::make_shared<Sequential>(Conv2d(2, 3, 1, {}, {.dtype = kFloat64}),
                                          BatchNorm2d(3, {.momentum = 0.1}, {.dtype = kFloat64}));
  manual_seed(cpu(), 5);
  (*net)(randn({4, 2, 3, 3}, doubles));
  net->eval();
  const std::vector<Tensor> batches = {randn({4, 2, 3, 3}, doubles) * 2.0 + 1.0, randn({6, 2, 3, 3}, doubles)};
  update_batchnorm_statistics(*net, [&] {
    for (const Tensor& b : batches) (*net)(b);
  });
  // Each batch's channel mean and unbiased variance of the BatchNorm's input, averaged over the two.
  std::vector<double> want_mean(3, 0.0), want_var(3, 0.0);
  {
    NoGradGuard no_grad;
    for (const Tensor& b : batches) {
      const Tensor h = net->child("0")->forward(b);
      const std::vector<double> m = mean(h, {0, 2, 3}).to_vector(), v = var(h, {0, 2, 3}).to_vector();
      for (size_t c = 0; c < 3; ++c) {
        want_mean[c] += m[c] / 2;
        want_var[c] += v[c] / 2;
      }
    }
  }
  auto& bn = dynamic_cast<BatchNorm&>(*net->child("1"));
  const std::vector<double> got_mean = bn.tensor("running_mean").to_vector(),
                            got_var = bn.tensor("running_var").to_vector();
  for (size_t c = 0; c < 3; ++c) {
    CHECK(got_mean[c] == doctest::Approx(want_mean[c]).epsilon(1e-12));
    CHECK(got_var[c] == doctest::Approx(want_var[c]).epsilon(1e-12));
  }
  CHECK(bn.tensor("num_batches_tracked").item() == 2);
  CHECK(bn.config().momentum == 0.1);
  CHECK_FALSE(net->is_training());
  CHECK_FALSE(bn.is_training());
  // An error in the batches restores the settings too.
  CHECK(error_of([&] {
          update_batchnorm_statistics(*net, [&] { (*net)(zeros({2, 5, 3, 3}, doubles)); });
        }).find("Conv2d: input has 5 channels") == 0);
  CHECK(bn.config().momentum == 0.1);
  CHECK_FALSE(net->is_training());
  CHECK(error_of([&] { bn.set_momentum(1.5); }) == "BatchNorm2d: momentum must be in [0, 1], got 1.5");
}

TEST_CASE("layer argument errors name the layer and the values") {
  CHECK(error_of([] {
          Conv2d(1, 4, 3)(zeros({2, 3, 5, 5}));
        }) == "Conv2d: input has 3 channels, expected 1 (input shape [2, 3, 5, 5])");
  CHECK(error_of([] { Conv2d(1, 4, 3)(zeros({3, 5, 5})); }) == "Conv2d: expected a 4-d input, got shape [3, 5, 5]");
  CHECK(error_of([] { Conv2d(3, 4, 3, {.groups = 2}); }) == "Conv2d: in_channels 3 is not divisible by groups 2");
  CHECK(error_of([] { Conv2d(2, 4, 3, {.stride = 0}); }) == "Conv2d: stride must be positive, got 0");
  CHECK(error_of([] { Conv2d(2, 4, {3, 0}); }) == "Conv2d: kernel_size must be positive, got (3, 0)");
  CHECK(error_of([] { ConvTranspose2d(2, 4, 3, {.stride = 2, .output_padding = 2}); }) ==
        "ConvTranspose2d: output_padding 2 must be smaller than stride 2 or dilation 1");
  CHECK(error_of([] {
          ConvTranspose2d(2, 4, 3)(zeros({1, 3, 4, 4}));
        }) == "ConvTranspose2d: input has 3 channels, expected 2 (input shape [1, 3, 4, 4])");
  CHECK(error_of([] {
          Linear(4, 3)(zeros({2, 5}));
        }) ==
        "Linear: input has 5 features (last dim of [2, 5]), "
        "expected 4");
  CHECK(error_of([] {
          Linear(4, 3)(zeros({2, 4}, {.dtype = kFloat64}));
        }) ==
        "Linear: input is float64 on cpu:0 but the parameters are float32 on cpu:0 (convert the input or call .to on "
        "the module)");
  CHECK(error_of([] {
          BatchNorm2d(3)(zeros({2, 4, 2, 2}));
        }) == "BatchNorm2d: input has 4 channels, expected 3 (input shape [2, 4, 2, 2])");
  CHECK(error_of([] {
          BatchNorm1d(3)(zeros({2, 3, 2, 2}));
        }) == "BatchNorm1d: expected a 2-d to 3-d input, got shape [2, 3, 2, 2]");
  CHECK(error_of([] { BatchNorm1d(3, {.momentum = 2.0}); }) == "BatchNorm1d: momentum must be in [0, 1], got 2");
  CHECK(error_of([] { GroupNorm(3, 4); }) == "GroupNorm: num_channels 4 is not divisible by num_groups 3");
  CHECK(error_of([] {
          GroupNorm(2, 4)(zeros({2, 6, 3}));
        }) == "GroupNorm: input has 6 channels, expected 4 (input shape [2, 6, 3])");
  CHECK(error_of([] {
          LayerNorm({3, 4})(zeros({2, 4, 3}));
        }) == "LayerNorm: input shape [2, 4, 3] does not end with normalized_shape [3, 4]");
  CHECK(error_of([] { MaxPool2d(2, {.padding = 2}); }) == "MaxPool2d: padding 2 must be at most half of kernel_size 2");
  CHECK(error_of([] { AvgPool2d(2)(zeros({2, 2})); }) == "AvgPool2d: expected a 4-d input, got shape [2, 2]");
  CHECK(error_of([] { AdaptiveAvgPool2d(0); }) == "AdaptiveAvgPool2d: output_size must be positive, got 0");
  CHECK(error_of([] { Upsample({}); }) == "Upsample: give exactly one of size and scale_factor");
  CHECK(error_of([] { Upsample({.scale_factor = 2.0, .align_corners = true}); }) ==
        "Upsample: align_corners applies to bilinear mode only");
  CHECK(error_of([] {
          Upsample({.scale_factor = 0.1})(zeros({1, 1, 4, 4}));
        }) == "Upsample: scale_factor (0.1, 0.1) turns input shape [1, 1, 4, 4] into an empty output");
  CHECK(error_of([] { Dropout(1.5); }) == "Dropout: p must be in [0, 1], got 1.5");
  CHECK(error_of([] { Flatten(2)(zeros({2, 3})); }) == "Flatten: dims 2..-1 do not fit an input of shape [2, 3]");
  CHECK(error_of([] { Softplus(0.0); }) == "Softplus: beta must be positive, got 0");
  CHECK(error_of([] { Softplus(-1.0); }) == "Softplus: beta must be positive, got -1");
  CHECK(error_of([] { ReLU()(Tensor()); }) == "ReLU: the input is undefined");
  CHECK(error_of([] {
          Sequential(Linear(2, 3), Linear(2, 3))(zeros({1, 2}));
        }) == "Linear: input has 3 features (last dim of [1, 3]), expected 2");
}

// A user's own module registering a bad tensor gets an ef::Error naming it (not an internal error).
struct Registers : nn::Cloneable<Registers> {
  explicit Registers(int mistake) {
    const Tensor w = ones({2}, {.requires_grad = true});
    if (mistake == 0) register_parameter("w", Tensor());
    if (mistake == 1) register_parameter("w", w * 2.0);
    if (mistake == 2) {
      register_parameter("w", ones({2}));
      register_buffer("w", zeros({2}));
    }
    if (mistake == 3) register_buffer("b", Tensor());
  }
  std::string name() const override { return "Registers"; }
  Tensor forward(const Tensor& x) override { return x; }
};

TEST_CASE("module: registering an undefined, non-leaf or taken tensor is a clear error") {
  const std::string leaf = "must be a defined tensor that no op produced (a leaf; detach() makes one)";
  CHECK(error_of([] { Registers(0); }) == "Registers: parameter \"w\" " + leaf);
  CHECK(error_of([] { Registers(1); }) == "Registers: parameter \"w\" " + leaf);
  CHECK(error_of([] { Registers(2); }) == "Registers: \"w\" registered twice");
  CHECK(error_of([] { Registers(3); }) == "Registers: buffer \"b\" must be defined");
}

// Note [bfloat16 compute] in engine/ops.h, set on a module tree.
TEST_CASE("bfloat16 compute: a module's layers take their setting, and a clone keeps it") {
  auto net = std::make_shared<nn::Sequential>(nn::Conv2d(1, 4, 3), nn::ReLU(), nn::Flatten(), nn::Linear(4 * 6 * 6, 3));
  CHECK(net->compute_dtype() == kFloat32);
  net->set_compute_dtype(kBFloat16);
  const auto copy = net->clone();
  manual_seed(cpu(), 4);
  const Tensor x = randn({2, 1, 8, 8});
  const auto& w0 = net->tensor("0.weight");
  const auto rounded = [](const Tensor& t) { return t.detach().to(kBFloat16).to(kFloat32); };
  const Tensor first = relu(conv2d(rounded(x), rounded(w0), net->tensor("0.bias")));
  const Tensor want = linear(rounded(flatten(first, 1)), rounded(net->tensor("3.weight")), net->tensor("3.bias"));
  // The same products; the rounded weight is a new (contiguous) matrix, so the GEMM may sum in
  // another order than on the transposed view: equal to float32 rounding.
  CHECK(compare(net->forward(x), want, 1e-6, 1e-6) == "");
  CHECK(compare(copy->forward(x), want, 1e-6, 1e-6) == "");
  CHECK(compare(net->forward(x),
                linear(flatten(relu(conv2d(x, w0, net->tensor("0.bias"))), 1), net->tensor("3.weight"),
                       net->tensor("3.bias")),
                1e-4, 1e-4) != "");  // and not the float32 result
  CHECK(error_of([&] { net->set_compute_dtype(kFloat64); }).find("float32 or bfloat16, got float64") !=
        std::string::npos);
}

// Upsample and AdaptiveAvgPool2d make their operands once per input size (ResamplingOperands, so
// that a recorded step copies nothing from the host): one layer resizing two sizes in turn gives
// what the functional ops give, and operands made for another size are refused.
TEST_CASE("resampling layers keep their operands per input size; operands of another size are refused") {
  Upsample up({.scale_factor = 2.0, .mode = UpsampleMode::Bilinear});
  AdaptiveAvgPool2d pool(3);
  manual_seed(4);
  for (int round = 0; round < 2; ++round) {
    for (const int64_t h : {4, 6}) {
      CAPTURE(h);
      const Tensor x = randn({1, 2, h, h + 1});
      CHECK(up(x).to_vector() == upsample_bilinear2d(x, {2 * h, 2 * (h + 1)}, false).to_vector());
      CHECK(pool(x).to_vector() == adaptive_avg_pool2d(x, {3, 3}).to_vector());
    }
  }
  const Resampling nearest = resampling(ResampleMode::Nearest, {4, 4}, {8, 8}, {});
  CHECK(error_of([&] {
          (void)resample2d(zeros({1, 1, 3, 3}), nearest);
        }) == "resample2d: operands made for 4x4, input [1, 1, 3, 3]");
}
