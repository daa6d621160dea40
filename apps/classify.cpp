// classify: the FashionMNIST benchmark CNN (the TensorFlow/PyTorch tutorial model: two 5x5
// conv-relu-pool blocks, a 1024-unit hidden layer with dropout 0.4) trained with Adam. After each
// epoch it evaluates the test set and writes, in --out: checkpoint.safetensors (a training
// checkpoint, Note [Training checkpoints] in io/checkpoint.h, so --resume continues exactly),
// model.safetensors (weights under PyTorch's names), metrics.csv and loss_accuracy.png.
// With several --devices it trains data-parallel (Note [Data-parallel step] in
// parallel/data_parallel.h): each device runs its chunk of the batch and its own loss.
// scripts/bench_classify.sh compares its speed with PyTorch's (scripts/classify_torch.py).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "apps/common/fashion_cnn.h"
#include "apps/common/metrics.h"
#include "apps/common/plot.h"
#include "apps/common/program.h"
#include "apps/common/progress.h"
#include "apps/common/run_options.h"
#include "evenflow/data/fashion_mnist.h"
#include "evenflow/data/loader.h"
#include "evenflow/engine/ops.h"
#include "evenflow/io/checkpoint.h"
#include "evenflow/layers/layers.h"
#include "evenflow/losses/losses.h"
#include "evenflow/optim/optim.h"
#include "evenflow/parallel/data_parallel.h"

namespace ef = evenflow;
namespace nn = evenflow::nn;
namespace fs = std::filesystem;

namespace {

struct Args : evenflow::apps::RunOptions {
  Args() { out = "runs/classify"; }
  int64_t epochs = 10;
  int64_t batch_size = 100;
  double lr = 1e-3;
  int64_t steps = 0;  // 0: no limit
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

void write_plot(const std::string& path, const std::vector<evenflow::apps::MetricsRow>& rows) {
  evenflow::apps::Series loss{.label = "train loss", .color = {200, 40, 40}};
  evenflow::apps::Series accuracy{.label = "test accuracy", .color = {30, 80, 200}};
  for (const auto& r : rows) {
    loss.x.push_back(r.epoch);
    loss.y.push_back(r.train_loss);
    accuracy.x.push_back(r.epoch);
    accuracy.y.push_back(r.test_accuracy);
  }
  evenflow::apps::write_line_plot_png(path, {.title = "FashionMNIST classifier",
                                             .x_label = "epoch",
                                             .y_label = "loss / accuracy",
                                             .series = {loss, accuracy}});
}

// The settings a checkpoint must share with the run that resumes it: not the devices, nor the number of
// processes, which do not change the answer (Note [Random numbers per sample] in engine/tensor.h).
std::map<std::string, std::string> run_metadata(const Args& a) {
  return {{"app", "classify"},
          {"batch_size", std::to_string(a.batch_size)},
          {"dtype", a.dtype},
          {"lr", ef::apps::metadata_number(a.lr)},
          {"seed", std::to_string(a.seed)}};
}

int run(const Args& a) {
  // --- Setup: every failure here is a bad argument or a missing dataset (exit 2) ---------------
  const std::vector<ef::Device> devices = ef::parallel::devices(a.devices);
  const ef::Device device = devices[0];  // batches arrive here, are split from here; replica 0 lives here
  EF_CHECK(a.dtype == "float32" || a.dtype == "float64", "--dtype must be float32 or float64, got \"", a.dtype, "\"");
  const ef::DType dtype = a.dtype == "float64" ? ef::kFloat64 : ef::kFloat32;
  ef::set_num_threads(a.threads > 0 ? a.threads : ef::parallel::cpu_threads_per_device(devices));
  const std::string ckpt_path = (fs::path(a.out) / "checkpoint.safetensors").string();
  const bool primary = ef::apps::primary_process();  // writes the outputs (program.h)
  if (primary) ef::apps::prepare_output_folder(a.out, ckpt_path, a.resume, a.overwrite);
  auto train_set = std::make_shared<ef::data::FashionMNIST>(ef::data::Split::Train, a.data);
  auto test_set = std::make_shared<ef::data::FashionMNIST>(ef::data::Split::Test, a.data);
  EF_CHECK(train_set->size() > 0 && test_set->size() > 0, "--data ", a.data, ": the training set has ",
           train_set->size(), " images and the test set ", test_set->size(), "; both need some");
  const std::string model_path = (fs::path(a.out) / "model.safetensors").string();
  const std::string csv_path = (fs::path(a.out) / "metrics.csv").string();
  const std::string png_path = (fs::path(a.out) / "loss_accuracy.png").string();

  ef::data::DataLoader train_loader(train_set,
                                    {.batch_size = a.batch_size,
                                     .shuffle = true,
                                     .seed = a.seed,
                                     .num_workers = a.workers,
                                     .device = device,
                                     .batch_part = ef::apps::process_batch_part(static_cast<int>(devices.size()))});
  ef::data::DataLoader test_loader(test_set, {.batch_size = 1000, .num_workers = a.workers, .device = device});
  const int64_t steps_per_epoch = train_loader.num_batches();

  ef::manual_seed(a.seed);
  ef::parallel::DataParallelModel model(evenflow::apps::make_fashion_cnn({.dtype = dtype}), devices);
  ef::parallel::DataParallelCriterion criterion(model, ef::losses::CrossEntropyLoss{});
  ef::parallel::ReplicatedOptimizer<ef::optim::Adam> opt(model, ef::optim::AdamOptions{.lr = a.lr});
  ef::io::TrainingProgress progress;
  std::vector<evenflow::apps::MetricsRow> rows;
  if (a.resume) {
    const auto ck = ef::io::load_training_checkpoint(ckpt_path, model.module(), opt.primary(), {device});
    ef::apps::check_resume_metadata(ckpt_path, ck.metadata, run_metadata(a));
    model.copy_primary_to_replicas();
    opt.load_state(opt.primary().state());
    progress = ck.progress;
    rows = ef::apps::rows_up_to_checkpoint(evenflow::apps::read_metrics_csv(csv_path), progress.step, csv_path);
    std::printf("resuming from %s at step %" PRId64 " (epoch %" PRId64 ")\n", ckpt_path.c_str(), progress.step,
                progress.epoch + 1);
  }
  std::printf("training on %s, %s, %" PRId64 " images, batch %" PRId64 ", %" PRId64 " steps per epoch\n",
              ef::apps::describe_devices(devices).c_str(), a.dtype.c_str(), train_set->size(), a.batch_size,
              steps_per_epoch);
  std::fflush(stdout);

  // --- Training ---------------------------------------------------------------------------------------
  // The checkpoint last (the rule in run_options.h).
  const auto save = [&] {
    if (!primary) return;
    evenflow::apps::write_metrics_csv(csv_path, rows);
    write_plot(png_path, rows);
    ef::io::save_module(model.module(), model_path);
    ef::io::save_training_checkpoint(ckpt_path, model.module(), opt.primary(), progress, {device}, run_metadata(a));
  };
  ef::apps::setup_done();
  using Clock = std::chrono::steady_clock;
  evenflow::apps::ProgressBar bar;
  bool stop = a.steps > 0 && progress.step >= a.steps;
  while (!stop && progress.epoch < a.epochs) {
    const int64_t skip = progress.step - progress.epoch * steps_per_epoch;  // steps of this epoch already done
    bar.start_epoch(progress.epoch + 1, a.epochs, steps_per_epoch, skip + 1);
    double loss_sum = 0, seconds = 0;
    int64_t steps = 0, images = 0, i = 0;
    auto t0 = Clock::now();
    for (ef::data::Batch& b : train_loader.epoch(progress.epoch)) {
      if (i++ < skip) {
        t0 = Clock::now();
        continue;
      }
      const ef::Tensor loss = criterion(model(model.scatter(b.images.to(dtype))), model.scatter(b.labels));
      opt.zero_grad();
      loss.backward();
      opt.step();
      const double l = loss.item();
      ++progress.step;
      ef::apps::check_finite_loss(l, progress.step, "training loss");
      ++steps;
      loss_sum += l;
      images += std::min(a.batch_size, train_set->size() - (i - 1) * a.batch_size);  // the global batch's
      const auto t1 = Clock::now();
      seconds += std::chrono::duration<double>(t1 - t0).count();
      t0 = t1;
      if (a.print_loss) std::printf("step %" PRId64 " loss %.17g\n", progress.step, l);
      bar.update(i, l, static_cast<double>(images) / seconds);
      if (a.steps > 0 && progress.step >= a.steps) {
        stop = true;
        break;
      }
    }
    bar.finish();
    if (progress.step == (progress.epoch + 1) * steps_per_epoch) ++progress.epoch;  // the epoch is complete
    const Evaluation ev = evaluate(model.module(), test_loader, dtype);
    rows.push_back({.epoch = static_cast<double>(progress.step) / static_cast<double>(steps_per_epoch),
                    .step = progress.step,
                    .train_loss = steps > 0 ? loss_sum / static_cast<double>(steps) : 0.0,
                    .test_loss = ev.loss,
                    .test_accuracy = ev.accuracy,
                    .seconds = seconds,
                    .images_per_s = seconds > 0 ? static_cast<double>(images) / seconds : 0.0});
    std::printf("epoch %.6g  step %" PRId64
                "  train loss %.4f  test loss %.4f  test accuracy %.2f%%  %.1f s  %.0f img/s\n",
                rows.back().epoch, progress.step, rows.back().train_loss, ev.loss, 100 * ev.accuracy, seconds,
                rows.back().images_per_s);
    std::fflush(stdout);
    save();
  }
  std::printf("done: %" PRId64 " steps; outputs in %s\n", progress.step, a.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train the FashionMNIST benchmark CNN with Adam (evenflow)"};
  Args a;
  evenflow::apps::add_run_options(app, a, "seed of the initialization, dropout and data order");
  app.add_option("--epochs", a.epochs, "epochs")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", a.batch_size, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--lr", a.lr, "Adam learning rate")->check(CLI::PositiveNumber & ef::apps::finite());
  app.add_option("--steps", a.steps, "stop after this many steps in all (0: no limit)")->check(CLI::NonNegativeNumber);
  return evenflow::apps::run_program(app, argc, argv, "classify", [&] { return run(a); });
}
