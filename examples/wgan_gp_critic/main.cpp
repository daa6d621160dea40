// A critic trained with a WGAN-GP gradient penalty, data-parallel on CPU devices: each device runs
// its replica on its share of the batch, computes its own loss and penalty (a double backward), and
// only the loss and the gradients cross devices. The "real" samples come from a Gaussian around
// (2, 2), the "fake" ones from a Gaussian around 0 (no generator: the critic alone trains). Every
// random number is drawn for the whole batch and then split, so the losses do not depend on how
// many devices share the batch.
//   wgan_gp_critic [devices, default cpu:2] [float32|float64, default float32]
// prints the critic loss every 40 steps and the Wasserstein estimate.
#include <evenflow/evenflow.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

namespace ef = evenflow;
namespace nn = evenflow::nn;
namespace par = evenflow::parallel;

int main(int argc, char** argv) try {
  const std::string devices = argc > 1 ? argv[1] : "cpu:2";
  const std::string dtype_name = argc > 2 ? argv[2] : "float32";
  if (dtype_name != "float32" && dtype_name != "float64") throw ef::Error("the dtype must be float32 or float64");
  const ef::DType dtype = dtype_name == "float64" ? ef::kFloat64 : ef::kFloat32;
  const nn::ModuleOptions o{.dtype = dtype};

  ef::manual_seed(ef::cpu(), 0);
  auto critic =
      std::make_shared<nn::Sequential>(nn::Linear(2, 64, true, o), nn::LeakyReLU(0.2), nn::Linear(64, 64, true, o),
                                       nn::LeakyReLU(0.2), nn::Linear(64, 1, true, o));
  par::DataParallelModel model(critic, par::devices(devices));
  par::DataParallelCriterion criterion(model);
  par::ReplicatedOptimizer<ef::optim::Adam> opt(model, ef::optim::AdamOptions{.lr = 1e-3, .betas = {0.5, 0.9}});

  const int64_t batch = 256;
  for (int step = 1; step <= 200; ++step) {
    const ef::Tensor real = ef::randn({batch, 2}, {.dtype = dtype}) * 0.5 + 2.0;
    const ef::Tensor fake = ef::randn({batch, 2}, {.dtype = dtype}) * 0.5;
    const ef::Tensor eps = ef::rand({batch, 1}, {.dtype = dtype});  // the penalty's interpolation weights
    const auto reals = model.scatter(real), fakes = model.scatter(fake), epss = model.scatter(eps);

    par::PerDevice<ef::Tensor> distance(reals.size());
    const ef::Tensor loss = criterion([&](int r) {
      nn::Module& d = model.replica(r);
      const ef::Tensor d_real = d(reals[r]), d_fake = d(fakes[r]);
      distance[r] = (ef::mean(d_real) - ef::mean(d_fake)).detach();
      const ef::losses::Critic as_function = [&d](const ef::Tensor& x) { return d(x); };
      return ef::losses::wasserstein_critic_loss(d_real, d_fake) +
             ef::losses::wgan_gp_penalty(as_function, reals[r], fakes[r], {.lambda = 10.0, .eps = epss[r]});
    });
    opt.zero_grad();
    loss.backward();  // gradients are synchronized on every replica when this returns
    opt.step();
    if (step % 40 == 0)
      std::printf("step %3d  critic loss %.17g  Wasserstein estimate on %s %.6f\n", step, loss.item(),
                  model.devices()[0].str().c_str(), distance[0].item());
  }
  model.check_replicas();  // the replicas stayed identical
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "wgan_gp_critic: %s\n", e.what());
  return 1;
}
