// train_demo: the engine end to end. A small MLP learns to classify three interleaved spirals,
// with an optional input-gradient penalty (a double backward, as in WGAN-GP) and an optional
// second device that holds the second half of the network, so one backward pass spans two devices.
#include <CLI/App.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "apps/common/program.h"
#include "evenflow/engine/ops.h"
#include "evenflow/losses/losses.h"

namespace ef = evenflow;

namespace {

// Three spirals in the plane, `n` points each, with labels 0..2.
std::pair<ef::Tensor, ef::Tensor> spirals(int64_t n, double noise, uint64_t seed) {
  ef::manual_seed(ef::cpu(), seed);
  const std::vector<double> jitter = ef::randn({3 * n, 2}, {.dtype = ef::kFloat64}).to_vector();
  std::vector<double> xy;
  std::vector<int64_t> labels;
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < n; ++i) {
      const double r = static_cast<double>(i) / static_cast<double>(n);
      const double angle = 4.0 * r + 2.0 * M_PI * static_cast<double>(c) / 3.0;
      const size_t k = static_cast<size_t>(c * n + i);
      xy.push_back(r * std::cos(angle) + noise * jitter[2 * k]);
      xy.push_back(r * std::sin(angle) + noise * jitter[2 * k + 1]);
      labels.push_back(c);
    }
  }
  return {ef::from_vector(xy, {3 * n, 2}), ef::from_int_vector(labels, {3 * n})};
}

struct Linear {
  ef::Tensor w, b;
  Linear(int64_t in, int64_t out, const ef::TensorOptions& o) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));  // PyTorch's default range
    w = ef::uniform({out, in}, -bound, bound, o).requires_grad_();
    b = ef::uniform({out}, -bound, bound, o).requires_grad_();
  }
  ef::Tensor operator()(const ef::Tensor& x) const { return ef::linear(x, w, b); }
};

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<CLI::App> app_owner =
      ef::apps::make_app("evenflow engine demo: an MLP on three spirals, trained end to end");
  CLI::App& app = *app_owner;
  std::string device = "cpu:0", second_device;
  int steps = 1500, hidden = 64;
  double lr = 0.3, penalty = 0.0;
  uint64_t seed = 0;
  std::string dtype = "float32";
  app.add_option("--device", device, "device for the first layers (cpu:N or cuda:N)");
  app.add_option("--second-device", second_device, "device for the last layer (default: the same)");
  ef::apps::add_integer(app, "--steps", steps, "training steps", 1);
  ef::apps::add_integer(app, "--hidden", hidden, "hidden units", 1);
  ef::apps::add_number(app, "--lr", lr, "SGD learning rate (momentum 0.9)", {.min = 0, .min_excluded = true});
  ef::apps::add_number(app, "--penalty", penalty, "weight of the input-gradient penalty (double backward)", {.min = 0});
  app.add_option("--dtype", dtype, "float32 or float64")->check(CLI::IsMember({"float32", "float64"}));
  ef::apps::add_integer(app, "--seed", seed, "random seed", 0);
  return ef::apps::run_program(app, argc, argv, "train_demo", [&] {
    const ef::Device d0(device), d1(second_device.empty() ? device : second_device);
    const ef::DType dt = dtype == "float64" ? ef::kFloat64 : ef::kFloat32;
    auto [x_all, y_all] = spirals(300, 0.02, seed);
    const ef::Tensor x = x_all.to(dt).to(d0), labels = y_all.to(d1);

    ef::manual_seed(d0, seed + 1);
    ef::manual_seed(d1, seed + 2);
    const Linear l1(2, hidden, {.dtype = dt, .device = d0}), l2(hidden, hidden, {.dtype = dt, .device = d0});
    const Linear l3(hidden, 3, {.dtype = dt, .device = d1});
    std::vector<ef::Tensor> params{l1.w, l1.b, l2.w, l2.b, l3.w, l3.b};
    std::vector<ef::Tensor> velocity;
    for (const auto& p : params) velocity.push_back(ef::zeros_like(p));

    std::printf("training a %d-unit MLP on 900 spiral points, %s%s, %s, penalty %g\n", hidden, d0.str().c_str(),
                d1 == d0 ? "" : (" + " + d1.str()).c_str(), dtype.c_str(), penalty);
    const auto start = std::chrono::steady_clock::now();
    double accuracy = 0;
    for (int step = 1; step <= steps; ++step) {
      ef::Tensor xin = x.detach().requires_grad_(penalty > 0);
      const ef::Tensor logits = l3(ef::tanh(l2(ef::tanh(l1(xin)))).to(d1));
      const ef::Tensor nll = ef::losses::cross_entropy(logits, labels);
      ef::Tensor loss = nll;
      if (penalty > 0) {
        // ‖∂nll/∂x‖², differentiated again by backward: the WGAN-GP pattern.
        const ef::Tensor gx = ef::grad({nll}, {xin}, {}, {.create_graph = true})[0];
        loss = nll + (ef::sum(ef::square(gx)) * (penalty * 900.0)).to(d1);
      }
      for (auto& p : params) p.set_grad(ef::Tensor());
      loss.backward();
      {
        ef::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i) {
          velocity[i].mul_(0.9);
          velocity[i].add_(params[i].grad());
          params[i].add_(velocity[i], -lr);
        }
      }
      if (step % 100 == 0 || step == steps) {
        ef::NoGradGuard no_grad;
        const ef::Tensor predicted = ef::argmax(logits, 1);
        const ef::Tensor correct = ef::eq(predicted.to(ef::kFloat64), labels.to(ef::kFloat64));
        accuracy = ef::mean(correct).item();
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("step %5d  loss %.5f  accuracy %5.1f%%  %.1f steps/s\n", step, nll.item(), 100 * accuracy,
                    step / secs);
      }
    }
    std::printf("final training accuracy %.1f%%\n", 100 * accuracy);
    return accuracy > 0.9 ? 0 : 1;
  });
}
