// apps/common/wgan_resnet.h, the WGAN-GP paper's CIFAR-10 ResNet generator and critic: output shapes,
// the parameter count against the architecture's closed form and the documented names, the WGAN-GP
// penalty through a tiny critic checked to second order in float64 (and the generator to first),
// channels-last against contiguous (values, gradients, the layout kept through the blocks), the
// resampling helpers against the engine's pooling and upsampling ops, and set_precision's float32
// layers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/run.h"
#include "apps/common/wgan_critic.h"
#include "apps/common/wgan_generator.h"
#include "apps/common/wgan_resnet.h"
#include "evenflow/engine/ops.h"
#include "evenflow/losses/losses.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

namespace ef = evenflow;
using ef::Tensor;
using ef::apps::WganCritic;
using ef::apps::WganGenerator;
using ef::apps::WganResnetCritic;
using ef::apps::WganResnetGenerator;
using ef::testing::compare;
using ef::testing::error_of;

namespace {

const ef::nn::ModuleOptions kDouble{.dtype = ef::kFloat64};

// The parameter count of the architecture (Note [WGAN ResNet parameter names]), width d, z_dim z,
// image channels c: a k x k convolution from i to o channels has k·k·i·o weights and o biases.
int64_t conv_params(int64_t k, int64_t i, int64_t o) {
  return k * k * i * o + o;
}
int64_t critic_params(int64_t d, int64_t c) {
  const int64_t first = conv_params(3, c, d) + conv_params(3, d, d) + conv_params(1, c, d);
  const int64_t down = 2 * conv_params(3, d, d) + conv_params(1, d, d);
  const int64_t plain = 2 * conv_params(3, d, d);
  return first + down + 2 * plain + (d + 1);
}
int64_t generator_params(int64_t d, int64_t z, int64_t c) {
  const int64_t up = 2 * d + conv_params(3, d, d) + 2 * d + conv_params(3, d, d) + conv_params(1, d, d);
  return (z * 16 * d + 16 * d) + 3 * up + 2 * d + conv_params(3, d, c);
}

std::vector<std::string> names_of(const ef::nn::NamedTensors& named) {
  std::vector<std::string> names;
  for (const auto& [name, t] : named) names.push_back(name);
  return names;
}

// Note [Checks along random directions]
// A gradient check per element costs two evaluations per parameter. Along k random directions it
// costs 2k: a tensor x moved to x + Σ tᵢ·Vᵢ is a function of t [k], whose derivatives are ⟨∇x f, Vᵢ⟩
// (and ⟨Vⱼ, ∇²x f·Vᵢ⟩), so a wrong derivative of any element shows unless it is orthogonal to every
// direction.
constexpr int64_t kDirections = 3;
Tensor directions_for(const Tensor& x) {
  return ef::randn({kDirections, x.numel()}, {.dtype = ef::kFloat64}) * 0.5;
}
Tensor along(const Tensor& x, const Tensor& directions, const Tensor& t) {
  return x + ef::reshape(ef::matmul(ef::reshape(t, {1, kDirections}), directions), x.shape());
}

// A module's parameters as functions of t (Note [Checks along random directions]).
class ParametersAlong {
 public:
  explicit ParametersAlong(ef::nn::Module& m) : module_(m), named_(m.named_parameters()) {
    for (const auto& [name, p] : named_) {
      start_.push_back(p.detach().clone());
      directions_.push_back(directions_for(p));
    }
  }
  // Rebinds every parameter to θ + Σ tᵢ·Vᵢ.
  void move(const Tensor& t) {
    for (size_t i = 0; i < named_.size(); ++i) module_.assign(named_[i].first, along(start_[i], directions_[i], t));
  }

 private:
  ef::nn::Module& module_;
  ef::nn::NamedTensors named_;
  std::vector<Tensor> start_, directions_;
};

// The same network in the other layout, with the same values.
template <typename Net, typename... Args>
std::shared_ptr<Net> twin(const Net& net, Args&&... args) {
  auto other = std::make_shared<Net>(std::forward<Args>(args)...);
  other->load_state_dict(net.state_dict());
  return other;
}

}  // namespace

TEST_CASE("wgan_resnet: a batch of 3 gives generator images [3, 3, 32, 32] in [-1, 1] and critic scores [3]") {
  ef::manual_seed(1);
  WganResnetGenerator generator(128, 16, {});
  WganResnetCritic critic(16, {});
  const Tensor images = generator(ef::randn({3, 128}));
  CHECK(images.shape() == ef::Shape{3, 3, 32, 32});
  const std::vector<double> v = images.to_vector();
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  CHECK(*lo >= -1.0);
  CHECK(*hi <= 1.0);
  CHECK(*hi - *lo > 0.1);  // not a constant image
  const Tensor scores = critic(images);
  CHECK(scores.shape() == ef::Shape{3});
  CHECK(scores.requires_grad());
  // One image channel (wgan_gp's FashionMNIST), and another resolution for the critic.
  CHECK(WganResnetGenerator(8, 4, {}, false, 1)(ef::randn({2, 8})).shape() == ef::Shape{2, 1, 32, 32});
  CHECK(WganResnetCritic(4, {}, false, 1)(ef::randn({2, 1, 8, 12})).shape() == ef::Shape{2});
  CHECK(error_of([&] { critic(ef::randn({2, 3, 30, 30})); }).find("multiples of 4") != std::string::npos);
  CHECK(error_of([&] { critic(ef::randn({2, 1, 32, 32})); }).find("channels") != std::string::npos);
  CHECK(error_of([] { WganResnetCritic(0, {}); }).find("width") != std::string::npos);
}

TEST_CASE(
    "wgan_resnet: parameter counts equal the architecture's closed form (D = 16) and the names are as documented") {
  const WganResnetCritic critic(16, {});
  const WganResnetGenerator generator(128, 16, {});
  CHECK(critic.num_parameters() == critic_params(16, 3));
  CHECK(generator.num_parameters() == generator_params(16, 128, 3));
  CHECK(WganResnetCritic(5, {}, false, 1).num_parameters() == critic_params(5, 1));
  CHECK(WganResnetGenerator(7, 5, {}, false, 1).num_parameters() == generator_params(5, 7, 1));

  // Each module's weight then bias, in the documented order.
  auto weights_and_biases = [](const std::vector<std::string>& modules) {
    std::vector<std::string> names;
    for (const std::string& m : modules) {
      names.push_back(m + ".weight");
      names.push_back(m + ".bias");
    }
    return names;
  };
  const std::vector<std::string> critic_names = weights_and_biases(
      {"blocks.0.conv1", "blocks.0.conv2", "blocks.0.shortcut", "blocks.1.conv1", "blocks.1.conv2", "blocks.1.shortcut",
       "blocks.2.conv1", "blocks.2.conv2", "blocks.3.conv1", "blocks.3.conv2", "fc"});
  CHECK(names_of(critic.named_parameters()) == critic_names);
  CHECK(critic.named_buffers().empty());  // no normalization in the critic

  std::vector<std::string> generator_modules = {"fc"};
  for (const std::string b : {"blocks.0.", "blocks.1.", "blocks.2."}) {
    for (const char* m : {"bn1", "conv1", "bn2", "conv2", "shortcut"}) generator_modules.push_back(b + m);
  }
  generator_modules.push_back("bn");
  generator_modules.push_back("conv");
  const std::vector<std::string> generator_names = weights_and_biases(generator_modules);
  CHECK(names_of(generator.named_parameters()) == generator_names);
  const ef::nn::NamedTensors buffers = generator.named_buffers();
  REQUIRE(buffers.size() == 7 * 3);  // bn1, bn2 of three blocks and bn: running_mean, running_var, count
  CHECK(buffers.front().first == "blocks.0.bn1.running_mean");
  CHECK(buffers.back().first == "bn.num_batches_tracked");
  CHECK(generator.tensor("blocks.1.conv1.weight").shape() == ef::Shape{16, 16, 3, 3});
  CHECK(generator.tensor("fc.weight").shape() == ef::Shape{16 * 16, 128});
  CHECK(critic.tensor("blocks.0.shortcut.weight").shape() == ef::Shape{16, 3, 1, 1});
}

// The penalty's gradient with respect to the critic's parameters is the double backward wgan_gp
// trains with: gradcheck checks it against differences of the penalty, gradgradcheck its own
// derivatives (the critic's third), both along random directions in the parameters (Note [Checks
// along random directions]). The penalty's value is made of the critic's first derivatives, checked
// first, along directions in the parameters and the images. 8x8 images keep it cheap: every block and
// op runs as at 32x32.
TEST_CASE("wgan_resnet: WGAN-GP penalty through a width-2 critic passes gradcheck and gradgradcheck (float64)") {
  ef::manual_seed(2);
  WganResnetCritic critic(2, kDouble);
  const Tensor real = ef::randn({2, 3, 8, 8}, {.dtype = ef::kFloat64});
  const Tensor fake = ef::randn({2, 3, 8, 8}, {.dtype = ef::kFloat64});
  const Tensor eps = ef::from_vector({0.3, 0.8}, {2, 1, 1, 1}, {.dtype = ef::kFloat64});
  ParametersAlong params(critic);
  const Tensor image_directions = directions_for(real);
  const ef::testing::Fn scores = [&](const std::vector<Tensor>& a) {  // (s, t) -> D(real + Σ sⱼ·Uⱼ)
    params.move(a[1]);
    return critic(along(real, image_directions, a[0]));
  };
  const ef::testing::Fn penalty_along = [&](const std::vector<Tensor>& a) {  // t -> penalty
    params.move(a[0]);
    return ef::losses::wgan_gp_penalty([&](const Tensor& x) { return critic(x); }, real, fake, {.eps = eps});
  };
  const Tensor origin = ef::zeros({kDirections}, {.dtype = ef::kFloat64});
  CHECK(ef::testing::gradcheck(scores, {origin, origin}) == "");

  const Tensor t = origin.clone().requires_grad_(true);
  const Tensor penalty = penalty_along({t});
  CHECK(penalty.item() > 0.0);
  // Every direction changes the penalty, through second derivatives of the critic.
  for (const double d : ef::grad({penalty}, {t})[0].to_vector()) CHECK(std::fabs(d) > 1e-6);
  CHECK(ef::testing::gradcheck(penalty_along, {origin}) == "");
  CHECK(ef::testing::gradgradcheck(penalty_along, {origin}) == "");
}

// The generator trains by first derivatives (through the critic): its images along random directions
// in z and the parameters, weighted by a fixed random tensor, against differences (batch
// normalization in training mode, so the samples are coupled).
TEST_CASE("wgan_resnet: a width-2 generator passes gradcheck (float64)") {
  ef::manual_seed(6);
  WganResnetGenerator generator(4, 2, kDouble);
  const Tensor z = ef::randn({2, 4}, {.dtype = ef::kFloat64});
  const Tensor weights = ef::randn({2, 3, 32, 32}, {.dtype = ef::kFloat64});
  ParametersAlong params(generator);
  const Tensor z_directions = directions_for(z);
  const ef::testing::Fn weighted = [&](const std::vector<Tensor>& a) {  // (s, t) -> Σ w·G(z + Σ sⱼ·Uⱼ)
    params.move(a[1]);
    return ef::sum(generator(along(z, z_directions, a[0])) * weights);
  };
  const Tensor origin = ef::zeros({kDirections}, {.dtype = ef::kFloat64});
  const Tensor s = origin.clone().requires_grad_(true), t = origin.clone().requires_grad_(true);
  for (const Tensor& g : ef::grad({weighted({s, t})}, {s, t})) {
    for (const double d : g.to_vector()) CHECK(std::fabs(d) > 1e-6);
  }
  CHECK(ef::testing::gradcheck(weighted, {origin, origin}) == "");
}

TEST_CASE("wgan_resnet: channels-last and contiguous networks agree (float64 to 1e-12, float32 to rounding)") {
  ef::manual_seed(3);
  for (const ef::DType dtype : {ef::kFloat64, ef::kFloat32}) {
    const std::string dtype_name = ef::dtype_name(dtype);
    CAPTURE(dtype_name);
    const ef::nn::ModuleOptions o{.dtype = dtype};
    const double tol = dtype == ef::kFloat64 ? 1e-12 : 1e-4;
    auto generator = std::make_shared<WganResnetGenerator>(16, 4, o, false);
    auto critic = std::make_shared<WganResnetCritic>(4, o, false);
    auto generator_cl = twin(*generator, 16, 4, o, true);
    auto critic_cl = twin(*critic, 4, o, true);

    const Tensor z = ef::randn({2, 16}, {.dtype = dtype});
    const Tensor images = generator->forward(z), images_cl = generator_cl->forward(z);
    CHECK(compare(images_cl, images, tol, tol) == "");
    const Tensor x = images.detach();
    const Tensor x_cl = x.contiguous(ef::MemoryFormat::ChannelsLast);
    CHECK(compare(critic_cl->forward(x_cl), critic->forward(x), tol, tol) == "");

    // Where the backend runs a convolution channels-last (oneDNN's float32 path), every block's
    // output stays channels-last: the resampling, ReLU and the residual sum keep the layout.
    const bool conv_keeps =
        ef::nn::Conv2d(3, 4, 3, {.padding = 1, .channels_last = true}, o)(x_cl.detach()).is_channels_last();
    Tensor h = x_cl;
    for (const auto& [name, block] : critic_cl->child("blocks")->named_children()) {
      CAPTURE(name);
      h = block->forward(h);
      CHECK(h.is_channels_last() == conv_keeps);
      CHECK(h.is_contiguous() == !conv_keeps);
    }
    Tensor a = ef::reshape(generator_cl->child("fc")->forward(z), {2, 4, 4, 4});
    for (const auto& [name, block] : generator_cl->child("blocks")->named_children()) {
      CAPTURE(name);
      a = block->forward(a);
      CHECK(a.is_channels_last() == conv_keeps);
    }
    CHECK(images_cl.is_channels_last() == conv_keeps);

    // The penalty's parameter gradients (a double backward) in both layouts.
    const Tensor eps = ef::from_vector({0.25, 0.75}, {2, 1, 1, 1}, {.dtype = dtype});
    auto grads_of = [&](WganResnetCritic& net, const Tensor& real) {
      const Tensor p = ef::losses::wgan_gp_penalty([&](const Tensor& in) { return net.forward(in); }, real,
                                                   ef::zeros_like(real), {.eps = eps});
      return ef::grad({p}, net.parameters(), {}, {.allow_unused = true});
    };
    const std::vector<Tensor> g = grads_of(*critic, x), g_cl = grads_of(*critic_cl, x_cl);
    REQUIRE(g.size() == g_cl.size());
    int compared = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      CAPTURE(i);
      // A bias reaches the input gradient only through ReLU masks: no gradient (allow_unused).
      REQUIRE(g[i].defined() == g_cl[i].defined());
      if (!g[i].defined()) continue;
      ++compared;
      if (dtype == ef::kFloat64) {
        CHECK(compare(g_cl[i], g[i], tol, tol) == "");
      } else {
        CHECK(ef::testing::compare_normwise(g_cl[i], g[i], tol) == "");
      }
    }
    CHECK(compared == 11);  // the ten convolutions' weights and fc's
  }
}

TEST_CASE("wgan_resnet: mean_pool2x2 and upsample_nearest2x equal avg_pool2d and upsample_nearest2d, keep the layout") {
  ef::manual_seed(4);
  const Tensor x = ef::randn({2, 3, 4, 6}, {.dtype = ef::kFloat64});
  const Tensor x_cl = x.contiguous(ef::MemoryFormat::ChannelsLast);
  REQUIRE(x_cl.is_channels_last());
  const Tensor pooled = ef::avg_pool2d(x, {.kernel = {2, 2}});
  const Tensor upsampled = ef::upsample_nearest2d(x, {8, 12});
  for (const Tensor& in : {x, x_cl}) {
    const bool cl = in.is_channels_last();
    CAPTURE(cl);
    const Tensor p = ef::apps::mean_pool2x2(in), u = ef::apps::upsample_nearest2x(in);
    CHECK(compare(p, pooled, 1e-15, 0) == "");
    CHECK(compare(u, upsampled, 0, 0) == "");
    CHECK(p.is_channels_last() == cl);
    CHECK(u.is_channels_last() == cl);
    CHECK(p.is_contiguous() == !cl);
    CHECK(u.is_contiguous() == !cl);
  }
  // Gradients along a random direction equal the engine ops', in both layouts, and the helpers are
  // twice differentiable.
  const Tensor rp = ef::randn({2, 3, 2, 3}, {.dtype = ef::kFloat64}),
               ru = ef::randn({2, 3, 8, 12}, {.dtype = ef::kFloat64});
  for (const Tensor& in : {x, x_cl}) {
    const Tensor leaf = in.detach().requires_grad_(true);
    const Tensor gp = ef::grad({ef::sum(ef::apps::mean_pool2x2(leaf) * rp)}, {leaf})[0];
    const Tensor gu = ef::grad({ef::sum(ef::apps::upsample_nearest2x(leaf) * ru)}, {leaf})[0];
    const Tensor ref = x.detach().requires_grad_(true);
    CHECK(compare(gp, ef::grad({ef::sum(ef::avg_pool2d(ref, {.kernel = {2, 2}}) * rp)}, {ref})[0], 1e-15, 0) == "");
    CHECK(compare(gu, ef::grad({ef::sum(ef::upsample_nearest2d(ref, {8, 12}) * ru)}, {ref})[0], 1e-14, 0) == "");
  }
  const ef::testing::Fn pool_cubed = [](const std::vector<Tensor>& a) {
    return ef::apps::mean_pool2x2(ef::pow(a[0].contiguous(ef::MemoryFormat::ChannelsLast), 3.0));
  };
  const ef::testing::Fn up_cubed = [](const std::vector<Tensor>& a) {
    return ef::apps::upsample_nearest2x(ef::pow(a[0].contiguous(ef::MemoryFormat::ChannelsLast), 3.0));
  };
  const Tensor small = ef::randn({1, 2, 2, 2}, {.dtype = ef::kFloat64});
  CHECK(ef::testing::gradgradcheck(pool_cubed, {small}) == "");
  CHECK(ef::testing::gradgradcheck(up_cubed, {small}) == "");
  CHECK(error_of([] { ef::apps::mean_pool2x2(ef::randn({1, 1, 3, 4})); }).find("even") != std::string::npos);
}

TEST_CASE("wgan_resnet: set_precision keeps the image and score layers float32, the rest bfloat16") {
  WganResnetCritic critic(4, {});
  WganResnetGenerator generator(8, 4, {});
  ef::apps::set_precision(critic, ef::kBFloat16, WganResnetCritic::kFloat32Layers);
  ef::apps::set_precision(generator, ef::kBFloat16, WganResnetGenerator::kFloat32Layers);
  CHECK(critic.child("blocks.0.conv1")->compute_dtype() == ef::kFloat32);
  CHECK(critic.child("blocks.0.shortcut")->compute_dtype() == ef::kFloat32);
  CHECK(critic.child("blocks.0.conv2")->compute_dtype() == ef::kBFloat16);
  CHECK(critic.child("blocks.3.conv1")->compute_dtype() == ef::kBFloat16);
  CHECK(critic.child("fc")->compute_dtype() == ef::kFloat32);
  CHECK(generator.child(WganResnetGenerator::kImageLayer)->compute_dtype() == ef::kFloat32);
  CHECK(generator.child("blocks.2.conv2")->compute_dtype() == ef::kBFloat16);
  CHECK(generator.child("fc")->compute_dtype() == ef::kBFloat16);
  // The DCGAN-style critic and generator the same way.
  WganCritic small_critic(4, "layernorm", {});
  WganGenerator small_generator(8, 4, {});
  ef::apps::set_precision(small_critic, ef::kBFloat16, WganCritic::kFloat32Layers);
  ef::apps::set_precision(small_generator, ef::kBFloat16, WganGenerator::kFloat32Layers);
  CHECK(small_critic.child(WganCritic::kImageLayer)->compute_dtype() == ef::kFloat32);
  CHECK(small_critic.child("conv2")->compute_dtype() == ef::kBFloat16);
  CHECK(small_critic.child("fc")->compute_dtype() == ef::kFloat32);
  CHECK(small_generator.child(WganGenerator::kImageLayer)->compute_dtype() == ef::kFloat32);
  CHECK(small_generator.child("fc")->compute_dtype() == ef::kBFloat16);
  // A bfloat16 critic still scores, and its scores differ from float32's only by rounding.
  ef::manual_seed(5);
  const Tensor x = ef::rand({2, 3, 8, 8});
  WganResnetCritic reference(4, {});
  reference.load_state_dict(critic.state_dict());
  const Tensor s = critic(x), s32 = reference(x);
  CHECK(compare(s, s32, 2e-2, 5e-2) == "");
}
