// classify: the FashionMNIST benchmark CNN (the TensorFlow/PyTorch tutorial model: two 5x5
// conv-relu-pool blocks, a 1024-unit hidden layer with dropout 0.4) trained with Adam. After each
// epoch it evaluates the test set and writes, in --out: checkpoint.safetensors (a training
// checkpoint, Note [Training checkpoints] in io/checkpoint.h, so --resume continues exactly),
// model.safetensors (weights under PyTorch's names), metrics.csv and loss_accuracy.png.
// With several --devices it trains data-parallel (Note [Data-parallel step] in
// parallel/data_parallel.h): each device runs its chunk of the batch and its own loss.
// scripts/bench_classify.sh compares its speed with PyTorch's (scripts/classify_torch.py).
#include <CLI/App.hpp>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>

#include "apps/common/fashion_cnn.h"
#include "apps/common/pipelines.h"
#include "apps/common/plot.h"
#include "apps/common/program.h"
#include "apps/common/run.h"
#include "evenflow/data/fashion_mnist.h"
#include "evenflow/data/loader.h"
#include "evenflow/engine/ops.h"
#include "evenflow/io/checkpoint.h"
#include "evenflow/layers/layers.h"
#include "evenflow/losses/losses.h"
#include "evenflow/optim/optim.h"
#include "evenflow/parallel/data_parallel.h"
#include "evenflow/parallel/training_state.h"

namespace ef = evenflow;
namespace nn = evenflow::nn;

namespace {

struct Args : ef::apps::EpochOptions {
  Args() { out = "runs/classify"; }  // 10 epochs of batches of 100, Adam 1e-3
};

struct Evaluation {
  double loss = 0, accuracy = 0;
};

Evaluation evaluate(nn::Module& model, ef::data::DataLoader& loader, ef::DType dtype) {
  ef::NoGradGuard no_grad;
  model.eval();
  double loss_sum = 0, correct = 0, n = 0;
  for (ef::data::Batch& b : loader.epoch(0)) {
    const ef::Tensor logits = model(b.images.to(dtype));
    const auto count = static_cast<double>(b.labels.numel());
    loss_sum += ef::losses::cross_entropy(logits, b.labels).item() * count;
    correct += ef::sum(ef::eq(ef::argmax(logits, 1).to(ef::kFloat64), b.labels.to(ef::kFloat64))).item();
    n += count;
  }
  model.train();
  return {loss_sum / n, correct / n};
}

void write_plot(const std::string& path, const ef::apps::MetricsLog& log) {
  ef::apps::Series loss{.label = "train loss", .color = {200, 40, 40}};
  ef::apps::Series accuracy{.label = "test accuracy", .color = {30, 80, 200}};
  for (size_t i = 0; i < log.size(); ++i) {
    loss.x.push_back(log.at(i, "epoch"));
    loss.y.push_back(log.at(i, "train_loss"));
    accuracy.x.push_back(log.at(i, "epoch"));
    accuracy.y.push_back(log.at(i, "test_accuracy"));
  }
  ef::apps::write_line_plot_png(path, {.title = "FashionMNIST classifier",
                                       .x_label = "epoch",
                                       .y_label = "loss / accuracy",
                                       .series = {loss, accuracy}});
}

int run(const Args& a) {
  // --- Setup: every failure here is a bad argument or a missing dataset (exit 2) ---------------
  const std::vector<ef::Device> devices = ef::apps::run_devices(a);
  EF_CHECK(a.dtype == "float32" || a.dtype == "float64", "--dtype must be float32 or float64, got \"", a.dtype, "\"");
  const ef::DType dtype = a.dtype == "float64" ? ef::kFloat64 : ef::kFloat32;
  const ef::DType compute = ef::apps::compute_dtype(a);
  ef::set_num_threads(a.threads > 0 ? a.threads : ef::parallel::cpu_threads_per_device(devices));
  // What a resume must share with the run it continues: not the devices, nor the number of
  // processes, which do not change the answer (Note [Random numbers per sample] in engine/tensor.h).
  ef::apps::Run run(a, a.out, {"epoch", "step", "train_loss", "test_loss", "test_accuracy", "seconds", "images_per_s"},
                    {{"app", "classify"},
                     {"batch_size", std::to_string(a.batch_size)},
                     {"dtype", a.dtype},
                     {"precision", a.precision},
                     {"augment", a.augment ? "on" : "off"},
                     {"lr", ef::apps::metadata_number(a.lr)},
                     {"seed", std::to_string(a.seed)}});
  const std::string description = ef::apps::classify_pipeline(a.data, a.augment);
  const ef::data::Pipeline pipeline = ef::apps::make_pipeline(description);
  const std::shared_ptr<const ef::data::Dataset> train_set = pipeline.dataset;
  auto test_set = std::make_shared<ef::data::FashionMNIST>(ef::data::Split::Test, a.data);
  EF_CHECK(train_set->size() > 0 && test_set->size() > 0, "--data ", a.data, ": the training set has ",
           train_set->size(), " images and the test set ", test_set->size(), "; both need some");

  ef::manual_seed(a.seed);
  const auto net = ef::apps::make_fashion_cnn({.dtype = dtype});
  ef::apps::set_precision(*net, compute, std::array<const char*, 1>{"0"});  // the image layer
  ef::parallel::DataParallelModel model(net, devices);
  ef::parallel::DataParallelCriterion criterion(model, ef::losses::CrossEntropyLoss{});
  ef::parallel::ReplicatedOptimizer<ef::optim::Adam> opt(model, ef::optim::AdamOptions{.lr = a.lr});
  ef::parallel::TrainingState state({{"", model, opt}});
  // Batches arrive on the first device (replica 0's), each process reading its part of them.
  ef::data::DataLoader train_loader(
      train_set, {.batch_size = a.batch_size,
                  .shuffle = true,
                  .seed = a.seed,
                  .num_workers = a.workers,
                  .device = devices[0],
                  // With --ray they run on the cluster, in its copy of the pipeline.
                  .transforms = a.ray.empty() ? pipeline.transforms : decltype(pipeline.transforms){},
                  .batch_part = model.batch_part(),
                  .ray = ef::apps::connect_ray(a.ray, description)});
  ef::data::DataLoader test_loader(test_set, {.batch_size = 1000, .num_workers = a.workers, .device = devices[0]});
  run.resume(state, "step");
  std::printf("training on %s, %s, %" PRId64 " images, batch %" PRId64 ", %" PRId64 " steps per epoch\n",
              ef::apps::describe_devices(devices).c_str(), ef::apps::describe_precision(a).c_str(), train_set->size(),
              a.batch_size, train_loader.num_batches());
  std::fflush(stdout);

  // --- Training -----------------------------------------------------------------------------------------
  ef::apps::setup_done();
  run.train_epochs(
      train_loader, a, devices, dtype,
      [&](const ef::parallel::PerDevice<ef::Tensor>& images, const ef::parallel::PerDevice<ef::Tensor>& labels,
          const ef::BatchRows& rows) {
        const ef::Tensor loss = criterion(model(model.scatter(images, rows)), model.scatter(labels, rows));
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
      },
      [&](const ef::apps::Run::EpochStats& e) {
        const Evaluation ev = evaluate(model.module(), test_loader, dtype);
        run.log({{"epoch", e.epochs_done},
                 {"step", static_cast<double>(run.progress().step)},
                 {"train_loss", e.mean_loss},
                 {"test_loss", ev.loss},
                 {"test_accuracy", ev.accuracy},
                 {"seconds", e.seconds},
                 {"images_per_s", e.images_per_s}});
        run.scalar("learning_rate", a.lr, run.progress().step);
        std::printf(
            "epoch %.6g  step %" PRId64 "  train loss %.4f  test loss %.4f  test accuracy %.2f%%  %.1f s  %.0f img/s\n",
            e.epochs_done, run.progress().step, e.mean_loss, ev.loss, 100 * ev.accuracy, e.seconds, e.images_per_s);
        std::fflush(stdout);
        run.save(state, [&] {
          write_plot(run.file("loss_accuracy.png"), run.metrics());
          ef::io::save_module(model.module(), run.file("model.safetensors"));
        });
      });
  std::printf("done: %" PRId64 " steps; outputs in %s\n", run.progress().step, a.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<CLI::App> app_owner =
      ef::apps::make_app("Train the FashionMNIST benchmark CNN with Adam (evenflow)");
  CLI::App& app = *app_owner;
  Args a;
  ef::apps::add_epoch_options(app, a, "seed of the initialization, dropout and data order");
  return ef::apps::run_program(app, argc, argv, "classify", [&] { return run(a); });
}
