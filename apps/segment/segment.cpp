// segment: semantic segmentation of FashionMNIST garments pasted onto canvases (Note
// [Segmentation canvases] in apps/segment/segmentation.h: 11 classes, the 10 garments and
// background, boundaries ignored) with a small encoder-decoder, trained with Adam on the loss
// --loss names (ce, focal, dice, lovasz, ohem, or a sum such as ce+dice). After each epoch it
// scores a held-out set (canvases of FashionMNIST's test images) by mIoU and pixel accuracy and
// writes, in --out: checkpoint.safetensors (Note [Training checkpoints] in io/checkpoint.h, so
// --resume continues exactly), model.safetensors, metrics.csv, metrics.png and predictions.png.
// With several --devices it trains data-parallel, each device computing its chunk's loss
// (segmentation_loss's parts, added over the devices), BatchNorm made SyncBatchNorm so N devices
// compute what one does. --compare trains every loss from --seeds seeds with the same budget, each in
// <out>/<loss>[/seed_<s>], then writes <out>/compare.md (mean ± standard deviation) and <out>/predictions.png.
#include <CLI/App.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "apps/common/image.h"
#include "apps/common/pipelines.h"
#include "apps/common/plot.h"
#include "apps/common/program.h"
#include "apps/common/run.h"
#include "apps/segment/segmentation.h"
#include "evenflow/data/fashion_mnist.h"
#include "evenflow/data/loader.h"
#include "evenflow/engine/autograd.h"
#include "evenflow/engine/ops.h"
#include "evenflow/io/checkpoint.h"
#include "evenflow/io/file.h"
#include "evenflow/optim/optim.h"
#include "evenflow/parallel/data_parallel.h"
#include "evenflow/parallel/process_group.h"
#include "evenflow/parallel/sync_batch_norm.h"
#include "evenflow/parallel/training_state.h"

namespace ef = evenflow;
namespace nn = evenflow::nn;
namespace seg = evenflow::segment;
namespace apps = evenflow::apps;
namespace fs = std::filesystem;

namespace {

struct Args : ef::apps::EpochOptions {
  Args() {
    out = "runs/segment";
    epochs = 5;
    batch_size = 32;
  }
  std::string loss = "ce";
  bool compare = false;
  int64_t seeds = 3;  // --compare: runs per loss
  int64_t canvas = 64;
  int64_t train_size = 4000;
  int64_t test_size = 500;
};

constexpr int64_t kShown = 4;        // held-out canvases in predictions.png
constexpr int64_t kEvalBatch = 100;  // held-out canvases per evaluation batch

// The columns of metrics.csv: one row per evaluation (test_loss: the held-out batches' losses,
// weighted by their images; mIoU and pixel accuracy in [0, 1]).
const std::vector<std::string> kColumns = {
    "epoch", "step", "train_loss", "test_loss", "test_miou", "test_pixel_accuracy", "seconds", "images_per_s"};

void write_plot(const std::string& path, const std::string& spec, const apps::MetricsLog& log) {
  apps::Series loss{.label = "train loss", .color = {200, 40, 40}};
  apps::Series miou{.label = "test mIoU", .color = {30, 80, 200}};
  apps::Series accuracy{.label = "test pixel accuracy", .color = {40, 150, 60}};
  for (size_t i = 0; i < log.size(); ++i) {
    for (apps::Series* series : {&loss, &miou, &accuracy}) series->x.push_back(log.at(i, "epoch"));
    loss.y.push_back(log.at(i, "train_loss"));
    miou.y.push_back(log.at(i, "test_miou"));
    accuracy.y.push_back(log.at(i, "test_pixel_accuracy"));
  }
  apps::write_line_plot_png(path, {.title = "FashionMNIST segmentation, loss " + spec,
                                   .x_label = "epoch",
                                   .y_label = "loss / score",
                                   .series = {loss, miou, accuracy}});
}

// --- Prediction images ----------------------------------------------------------------------------

// One row per canvas: the input, the ground truth, then each prediction (labels [k, H, W]) under
// its loss's name.
apps::RgbImage predictions_grid(const ef::data::Batch& shown, const std::vector<ef::Tensor>& predictions,
                                const std::vector<std::string>& losses) {
  const int64_t k = shown.images.size(0), h = shown.images.size(2), w = shown.images.size(3);
  const ef::Tensor truth = seg::colorize(shown.labels);
  std::vector<ef::Tensor> predicted;
  for (const ef::Tensor& p : predictions) predicted.push_back(seg::colorize(p));
  std::vector<ef::Tensor> cells;
  for (int64_t i = 0; i < k; ++i) {
    cells.push_back(shown.images.select(0, i).expand({3, h, w}));
    cells.push_back(truth.select(0, i));
    for (const ef::Tensor& p : predicted) cells.push_back(p.select(0, i));
  }
  const int columns = 2 + static_cast<int>(predictions.size());
  const int scale = static_cast<int>(std::max<int64_t>(1, 128 / std::max(h, w)));
  std::vector<std::string> titles{"input", "truth"};
  titles.insert(titles.end(), losses.begin(), losses.end());
  return apps::image_grid(ef::stack(cells, 0), columns, 0.0, 1.0, scale, titles);
}

// --- One training run -----------------------------------------------------------------------------

struct Setup {
  std::vector<ef::Device> devices;
  ef::DType dtype = ef::kFloat32;
  ef::data::Pipeline train;                         // segment_pipeline's
  std::shared_ptr<const ef::data::RayBatches> ray;  // --ray: where the training batches are made
  std::shared_ptr<seg::CanvasSet> test;
  ef::data::Batch shown;  // the first kShown held-out canvases
};

struct Outcome {
  double miou = 0, pixel_accuracy = 0;  // the final evaluation's
  double seconds = 0;                   // training time over the whole run, resumed parts included
  ef::Tensor predicted;                 // labels [kShown, H, W] of setup.shown
};

// The settings a checkpoint must share with the run that resumes it: not the devices, nor the number of
// processes, which do not change the answer (Note [Random numbers per sample] in engine/tensor.h).
// `seed`: the run's (its initialization and data order; --compare's k-th run of a loss has --seed + k).
std::map<std::string, std::string> run_metadata(const Args& a, const std::string& spec, uint64_t seed) {
  return {{"app", "segment"},
          {"batch_size", std::to_string(a.batch_size)},
          {"canvas", std::to_string(a.canvas)},
          {"dtype", a.dtype},
          {"precision", a.precision},
          {"augment", a.augment ? "on" : "off"},
          {"loss", spec},
          {"lr", apps::metadata_number(a.lr)},
          {"seed", std::to_string(seed)},
          {"train_size", std::to_string(a.train_size)}};
}

struct Evaluation {
  double loss = 0, miou = 0, pixel_accuracy = 0;
};

Evaluation evaluate(nn::Module& model, ef::data::DataLoader& loader, const std::string& spec, ef::DType dtype) {
  ef::NoGradGuard no_grad;
  model.eval();
  const ef::Device device = model.parameters().front().device();
  seg::Confusion confusion;
  double loss_sum = 0, images = 0;
  for (ef::data::Batch& b : loader.epoch(0)) {
    const ef::Tensor labels = b.labels.to(device);
    const ef::Tensor logits = model(b.images.to(dtype).to(device));
    const auto n = static_cast<double>(b.labels.size(0));
    loss_sum += seg::segmentation_loss(spec, logits, labels).value().item() * n;
    images += n;
    confusion.add(ef::argmax(logits, 1), labels);
  }
  model.train();
  return {loss_sum / images, confusion.miou(), confusion.pixel_accuracy()};
}

ef::Tensor predict(nn::Module& model, const ef::data::Batch& shown, ef::DType dtype) {
  ef::NoGradGuard no_grad;
  model.eval();
  const ef::Device device = model.parameters().front().device();
  ef::Tensor labels = ef::argmax(model(shown.images.to(dtype).to(device)), 1).to(ef::cpu());
  model.train();
  return labels;
}

// Trains `spec` from `seed` (initialization and data order) in `run`'s folder and returns its
// scores. With --resume it continues from the checkpoint there; where there is none,
// `start_if_missing` starts afresh (--compare resuming a run it had not reached) instead of failing.
Outcome train(const Args& a, const Setup& s, const std::string& spec, uint64_t seed, apps::Run& run,
              bool start_if_missing) {
  ef::manual_seed(seed);
  std::shared_ptr<nn::Module> net = seg::make_model({.dtype = s.dtype});
  apps::set_precision(*net, apps::compute_dtype(a), std::array<const char*, 1>{"0"});  // the image layer
  if (s.devices.size() > 1 || ef::parallel::processes()->size() > 1) net = ef::parallel::convert_sync_batchnorm(net);
  ef::parallel::DataParallelModel model(net, s.devices);
  // The loss of the whole batch, whatever the split (segmentation_loss's parts).
  ef::parallel::DataParallelCriterion criterion(model, [&](const ef::Tensor& logits, const ef::Tensor& target) {
    return seg::segmentation_loss(spec, logits, target);
  });
  ef::parallel::ReplicatedOptimizer<ef::optim::Adam> opt(model, ef::optim::AdamOptions{.lr = a.lr});
  ef::parallel::TrainingState state({{"", model, opt}});
  // Batches stay on the host; the epoch loop copies each chunk straight to its device.
  ef::data::DataLoader train_loader(s.train.dataset,
                                    {.batch_size = a.batch_size,
                                     .shuffle = true,
                                     .seed = seed,
                                     .num_workers = a.workers,
                                     // With --ray they run on the cluster, in its copy of the pipeline.
                                     .transforms = s.ray ? decltype(s.train.transforms){} : s.train.transforms,
                                     .batch_part = model.batch_part(),
                                     .ray = s.ray});
  ef::data::DataLoader test_loader(s.test, {.batch_size = kEvalBatch, .num_workers = a.workers});
  run.resume(state, "step", start_if_missing);
  std::printf("training loss %s on %s, %s, %" PRId64 " canvases %" PRId64 "x%" PRId64 ", batch %" PRId64 ", %" PRId64
              " steps per epoch\n",
              spec.c_str(), apps::describe_devices(s.devices).c_str(), apps::describe_precision(a).c_str(),
              s.train.dataset->size(), a.canvas, a.canvas, a.batch_size, train_loader.num_batches());
  std::fflush(stdout);

  apps::setup_done();
  run.train_epochs(
      train_loader, a, s.devices, s.dtype,
      [&](const ef::parallel::PerDevice<ef::Tensor>& images, const ef::parallel::PerDevice<ef::Tensor>& labels,
          const ef::BatchRows& rows) {
        const ef::Tensor loss = criterion(model(model.scatter(images, rows)), model.scatter(labels, rows));
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
      },
      [&](const apps::Run::EpochStats& e) {
        const Evaluation ev = evaluate(model.module(), test_loader, spec, s.dtype);
        run.log({{"epoch", e.epochs_done},
                 {"step", static_cast<double>(run.progress().step)},
                 {"train_loss", e.mean_loss},
                 {"test_loss", ev.loss},
                 {"test_miou", ev.miou},
                 {"test_pixel_accuracy", ev.pixel_accuracy},
                 {"seconds", e.seconds},
                 {"images_per_s", e.images_per_s}});
        run.scalar("learning_rate", a.lr, run.progress().step);
        std::printf("epoch %.6g  step %" PRId64
                    "  train loss %.4f  test loss %.4f  mIoU %.2f%%  pixel accuracy %.2f%%  %.1f s  %.0f img/s\n",
                    e.epochs_done, run.progress().step, e.mean_loss, ev.loss, 100 * ev.miou, 100 * ev.pixel_accuracy,
                    e.seconds, e.images_per_s);
        std::fflush(stdout);
        run.save(state, [&] {
          write_plot(run.file("metrics.png"), spec, run.metrics());
          ef::io::save_module(model.module(), run.file("model.safetensors"));
        });
      });
  const apps::MetricsLog& log = run.metrics();
  EF_CHECK(log.size() > 0, "--resume: ", run.file("metrics.csv"),
           " has no evaluation although the checkpoint is at step ", run.progress().step);
  Outcome o{.miou = log.at(log.size() - 1, "test_miou"),
            .pixel_accuracy = log.at(log.size() - 1, "test_pixel_accuracy"),
            .predicted = predict(model.module(), s.shown, s.dtype)};
  for (size_t i = 0; i < log.size(); ++i) o.seconds += log.at(i, "seconds");
  run.image("predictions", predictions_grid(s.shown, {o.predicted}, {spec}), run.progress().step);
  return o;
}

// --- --compare --------------------------------------------------------------------------------------

// Mean and sample standard deviation (NaN for one value).
std::pair<double, double> mean_sd(const std::vector<double>& v) {
  double mean = 0;
  for (double x : v) mean += x / static_cast<double>(v.size());
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return {mean, v.size() > 1 ? std::sqrt(ss / static_cast<double>(v.size() - 1)) : NAN};
}

// "mean ± sd" of percentages ("mean" for one run).
std::string percent_mean_sd(const std::vector<double>& v) {
  const auto [mean, sd] = mean_sd(v);
  char out[64];
  if (std::isnan(sd))
    std::snprintf(out, sizeof(out), "%.2f%%", 100 * mean);
  else
    std::snprintf(out, sizeof(out), "%.2f%% ± %.2f", 100 * mean, 100 * sd);
  return out;
}

// outcomes[i]: loss specs[i]'s runs, one per seed.
void write_compare(const std::string& path, const std::string& command, const std::vector<std::string>& specs,
                   const std::vector<std::vector<Outcome>>& outcomes) {
  const size_t seeds = outcomes[0].size();
  std::string text = "# Segmentation losses compared\n\n`" + command + "`\n\nEvery loss trained from " +
                     std::to_string(seeds) +
                     (seeds > 1 ? " seeds (initialization and data order; run k of every loss "
                                  "starts from the same seed), "
                                : " seed, ") +
                     "on the same canvases with the same budget; scores on the held-out canvases after the last "
                     "step, as the mean ± the standard deviation over the seeds.\n\n"
                     "| loss | mIoU | pixel accuracy | runs | train seconds per run |\n|---|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<double> miou, accuracy, seconds;
    for (const Outcome& o : outcomes[i]) {
      miou.push_back(o.miou);
      accuracy.push_back(o.pixel_accuracy);
      seconds.push_back(o.seconds);
    }
    char line[300];
    std::snprintf(line, sizeof(line), "| %s | %s | %s | %zu | %.1f |\n", specs[i].c_str(),
                  percent_mean_sd(miou).c_str(), percent_mean_sd(accuracy).c_str(), outcomes[i].size(),
                  mean_sd(seconds).first);
    text += line;
  }
  text += "\npredictions.png (the first seed's): one row per held-out canvas; columns: input, ground truth";
  for (const std::string& s : specs) text += ", " + s;
  text += ".\nColours:";
  for (int64_t c = 0; c <= seg::kBackground; ++c) {
    const apps::Rgb rgb = seg::label_color(c);
    char hex[16];
    std::snprintf(hex, sizeof(hex), "#%02x%02x%02x", rgb.r, rgb.g, rgb.b);
    text += std::string(c == 0 ? " " : ", ") +
            (c < seg::kBackground ? ef::data::FashionMNIST::class_names()[static_cast<size_t>(c)] : "background") +
            " " + hex;
  }
  text += ", ignored boundary #ffffff.\n";
  ef::io::write_file_atomically(path, [&](ef::io::OutputFile& f) { f.write(text.data(), text.size()); });
}

int run(const Args& a, const std::string& command) {
  // --- Setup: every failure here is a bad argument or a missing dataset (exit 2) ---------------
  const std::vector<std::string> specs = a.compare ? seg::compare_specs() : std::vector<std::string>{a.loss};
  for (const std::string& spec : specs) seg::loss_terms(spec);
  EF_CHECK(a.canvas >= 28 && a.canvas <= 1024 && a.canvas % 4 == 0,
           "--canvas must be a multiple of 4 (the model halves it twice) from 28 (a garment) to 1024, got ", a.canvas);
  Setup s;
  s.devices = apps::run_devices(a);
  EF_CHECK(a.dtype == "float32" || a.dtype == "float64", "--dtype must be float32 or float64, got \"", a.dtype, "\"");
  s.dtype = a.dtype == "float64" ? ef::kFloat64 : ef::kFloat32;
  apps::compute_dtype(a);  // --precision checked before any work
  // Every output folder before any work: <out>, or with --compare one per loss in it, and with
  // several seeds one per seed in that: <out>/<loss>/seed_<s>.
  const int64_t seeds = a.compare ? a.seeds : 1;
  const auto seed_of = [&](int64_t k) { return a.seed + static_cast<uint64_t>(k); };
  std::vector<std::unique_ptr<apps::Run>> runs;  // spec-major: runs[i * seeds + k]
  for (const std::string& spec : specs) {
    for (int64_t k = 0; k < seeds; ++k) {
      fs::path folder = a.compare ? fs::path(a.out) / spec : fs::path(a.out);
      if (seeds > 1) folder /= "seed_" + std::to_string(seed_of(k));
      runs.push_back(std::make_unique<apps::Run>(a, folder, kColumns, run_metadata(a, spec, seed_of(k))));
    }
  }
  const bool primary = runs[0]->primary();
  ef::set_num_threads(a.threads > 0 ? a.threads : ef::parallel::cpu_threads_per_device(s.devices));
  const std::string description = apps::segment_pipeline(a.data, a.train_size, a.canvas, a.seed, a.augment);
  s.train = apps::make_pipeline(description);
  s.ray = apps::connect_ray(a.ray, description);
  s.test = std::make_shared<seg::CanvasSet>(ef::data::load_fashion_mnist(ef::data::Split::Test, a.data), a.test_size,
                                            a.canvas, a.seed, 1);
  std::vector<int64_t> shown(static_cast<size_t>(std::min(kShown, a.test_size)));
  for (size_t i = 0; i < shown.size(); ++i) shown[i] = static_cast<int64_t>(i);
  s.shown = s.test->get_batch(shown);

  if (!a.compare) {
    const Outcome o = train(a, s, a.loss, a.seed, *runs[0], false);
    if (primary) apps::write_png(runs[0]->file("predictions.png"), predictions_grid(s.shown, {o.predicted}, {a.loss}));
    std::printf("done: mIoU %.2f%%, pixel accuracy %.2f%%; outputs in %s\n", 100 * o.miou, 100 * o.pixel_accuracy,
                a.out.c_str());
    return 0;
  }
  std::vector<std::vector<Outcome>> outcomes(specs.size());
  std::vector<ef::Tensor> predictions;  // each loss's first seed's
  for (size_t i = 0; i < specs.size(); ++i) {
    for (int64_t k = 0; k < seeds; ++k)
      outcomes[i].push_back(train(a, s, specs[i], seed_of(k), *runs[i * static_cast<size_t>(seeds) + k], true));
    predictions.push_back(outcomes[i][0].predicted);
  }
  const std::string md_path = (fs::path(a.out) / "compare.md").string();
  if (primary) {
    write_compare(md_path, command, specs, outcomes);
    apps::write_png((fs::path(a.out) / "predictions.png").string(), predictions_grid(s.shown, predictions, specs));
  }
  std::printf("\n");
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<double> miou, accuracy;
    for (const Outcome& o : outcomes[i]) {
      miou.push_back(o.miou);
      accuracy.push_back(o.pixel_accuracy);
    }
    std::printf("%-8s mIoU %s  pixel accuracy %s  (%" PRId64 " seeds)\n", specs[i].c_str(),
                percent_mean_sd(miou).c_str(), percent_mean_sd(accuracy).c_str(), seeds);
  }
  std::printf("done: %s and predictions.png in %s\n", md_path.c_str(), a.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<CLI::App> app_owner =
      ef::apps::make_app("Segment FashionMNIST garments on canvases with a small encoder-decoder (evenflow)");
  CLI::App& app = *app_owner;
  Args a;
  ef::apps::add_epoch_options(app, a, "seed of the canvases, the initialization and the data order");
  auto* loss = app.add_option("--loss", a.loss, "ce, focal, dice, lovasz, ohem, or a sum of them such as ce+dice");
  app.add_flag("--compare", a.compare,
               "train ce, focal, dice, lovasz, ohem and ce+dice with the same seeds and budget, each in <out>/<loss> "
               "(--resume continues each); write <out>/compare.md (mean and standard deviation over the seeds) and "
               "<out>/predictions.png")
      ->excludes(loss);
  ef::apps::add_integer(
      app, "--seeds", a.seeds,
      "with --compare, runs per loss: seeds --seed, --seed + 1, ... (the initialization and data order; "
      "the canvases stay --seed's), each in <out>/<loss>/seed_<s> when more than one",
      1, 100);
  ef::apps::add_integer(app, "--canvas", a.canvas, "canvas height and width (a multiple of 4)", 28, 1024);
  // Canvases are drawn when read, but an epoch's order holds an index per canvas: bounded.
  ef::apps::add_integer(app, "--train-size", a.train_size, "training canvases", 1, 10'000'000);
  ef::apps::add_integer(app, "--test-size", a.test_size, "held-out canvases", 1, 10'000'000);
  return ef::apps::run_program(app, argc, argv, "segment", [&] {
    std::string command = "segment";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    return run(a, command);
  });
}
