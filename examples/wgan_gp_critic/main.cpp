// A critic trained with a WGAN-GP gradient penalty, data-parallel on two CPU devices: each device
// runs its replica on its share of the batch, computes its own loss and penalty (a double backward),
// and only the loss and the gradients cross devices. The "real" samples come from a Gaussian around
// (2, 2), the "fake" ones from a Gaussian around 0 (no generator: the critic alone trains). Prints
// the critic loss and the Wasserstein estimate, which grows as the critic learns to tell them apart.
#include <evenflow/evenflow.h>

#include <cstdio>
#include <exception>
#include <memory>

namespace ef = evenflow;
namespace nn = evenflow::nn;
namespace par = evenflow::parallel;

int main() try {
  ef::manual_seed(ef::cpu(), 0);
  auto critic = std::make_shared<nn::Sequential>(nn::Linear(2, 64), nn::LeakyReLU(0.2), nn::Linear(64, 64),
                                                 nn::LeakyReLU(0.2), nn::Linear(64, 1));
  par::DataParallelModel model(critic, par::devices("cpu:2"));
  par::DataParallelCriterion criterion(model);
  par::ReplicatedOptimizer<ef::optim::Adam> opt(model, ef::optim::AdamOptions{.lr = 1e-3, .betas = {0.5, 0.9}});

  const int64_t batch = 256;
  for (int step = 1; step <= 200; ++step) {
    const ef::Tensor real = ef::randn({batch, 2}) * 0.5 + 2.0;
    const ef::Tensor fake = ef::randn({batch, 2}) * 0.5;
    const auto reals = model.scatter(real), fakes = model.scatter(fake);

    par::PerDevice<ef::Tensor> distance(reals.size());
    const ef::Tensor loss = criterion(
        [&](int r) {
          nn::Module& d = model.replica(r);
          const ef::Tensor d_real = d(reals[r]), d_fake = d(fakes[r]);
          distance[r] = (ef::mean(d_real) - ef::mean(d_fake)).detach();
          const ef::losses::Critic as_function = [&d](const ef::Tensor& x) { return d(x); };
          return ef::losses::wasserstein_critic_loss(d_real, d_fake) +
                 ef::losses::wgan_gp_penalty(as_function, reals[r], fakes[r], {.lambda = 10.0});
        },
        reals);
    opt.zero_grad();
    loss.backward();  // gradients are synchronized on both replicas when this returns
    opt.step();
    if (step % 40 == 0)
      std::printf("step %3d  critic loss %8.4f  Wasserstein estimate %.4f (device 0's half)\n", step, loss.item(),
                  distance[0].item());
  }
  model.check_replicas();  // the replicas stayed identical
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "wgan_gp_critic: %s\n", e.what());
  return 1;
}
