// classify_steps: the classify network trained for --steps Adam steps without dropout on the first
// training images in order, from weights written to --init, printing each step's loss. With
// scripts/classify_steps_torch.py (the same from the same weights in PyTorch) it shows whether
// the two frameworks train the same way step by step: scripts/compare_classify_steps.sh.
#include <CLI/App.hpp>
#include <cinttypes>
#include <cstdio>
#include <memory>

#include "apps/common/fashion_cnn.h"
#include "apps/common/program.h"
#include "evenflow/data/fashion_mnist.h"
#include "evenflow/io/checkpoint.h"
#include "evenflow/losses/losses.h"
#include "evenflow/optim/optim.h"

namespace ef = evenflow;

int main(int argc, char** argv) {
  const std::unique_ptr<CLI::App> app_owner =
      ef::apps::make_app("classify's network, step by step, without dropout (for comparison with PyTorch)");
  CLI::App& app = *app_owner;
  std::string init = "classify_init.safetensors", data = ef::data::kFashionMnistRoot;
  int64_t steps = 200, batch = 100;
  uint64_t seed = 0;
  app.add_option("--init", init, "where to write the initial weights (PyTorch names)");
  ef::apps::add_integer(app, "--steps", steps, "Adam steps", 1);
  ef::apps::add_integer(app, "--batch-size", batch, "batch size", 1);
  ef::apps::add_integer(app, "--seed", seed, "seed of the initial weights", 0);
  app.add_option("--data", data, "FashionMNIST folder");
  return ef::apps::run_program(app, argc, argv, "classify_steps", [&] {
    ef::set_num_threads(1);  // one thread on both sides: the same summation order within a kernel
    ef::manual_seed(seed);
    auto net = ef::apps::make_fashion_cnn();
    net->replace_child("9", std::make_shared<ef::nn::Dropout>(0.0));
    ef::io::save_module(*net, init);
    const ef::data::FashionMNIST train(ef::data::Split::Train, data);
    EF_CHECK(steps * batch <= train.size(), "--steps x --batch-size exceeds the ", train.size(), " training images");
    ef::optim::Adam opt(net->parameters(), {.lr = 1e-3});
    for (int64_t step = 0; step < steps; ++step) {
      std::vector<int64_t> indices(static_cast<size_t>(batch));
      for (int64_t i = 0; i < batch; ++i) indices[static_cast<size_t>(i)] = step * batch + i;
      const ef::data::Batch b = train.get_batch(indices);
      const ef::Tensor loss = ef::losses::cross_entropy((*net)(b.images), b.labels);
      opt.zero_grad();
      loss.backward();
      opt.step();
      std::printf("%" PRId64 " %.9g\n", step, loss.item());
    }
    return 0;
  });
}
