// segment: semantic segmentation of FashionMNIST garments pasted onto canvases (Note
// [Segmentation canvases] in apps/segment/segmentation.h: 11 classes, the 10 garments and
// background, boundaries ignored) with a small encoder-decoder, trained with Adam on the loss
// --loss names (ce, focal, dice, lovasz, ohem, or a sum such as ce+dice). After each epoch it
// scores a held-out set (canvases of FashionMNIST's test images) by mIoU and pixel accuracy and
// writes, in --out: checkpoint.safetensors (Note [Training checkpoints] in io/checkpoint.h, so
// --resume continues exactly), model.safetensors, metrics.csv, metrics.png and predictions.png.
// With several --devices it trains data-parallel, each device computing its chunk's loss (Note
// [Segmentation losses on devices]), BatchNorm made SyncBatchNorm so N devices compute what one
// does. --compare trains every loss with the same seed and budget, each in <out>/<loss>, then
// writes <out>/compare.md and <out>/predictions.png.
#include <CLI/CLI.hpp>
#include <algorithm>
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
#include "apps/common/plot.h"
#include "apps/common/program.h"
#include "apps/common/progress.h"
#include "apps/common/run_options.h"
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

namespace ef = evenflow;
namespace nn = evenflow::nn;
namespace seg = evenflow::segment;
namespace apps = evenflow::apps;
namespace fs = std::filesystem;

namespace {

struct Args : ef::apps::RunOptions {
  Args() { out = "runs/segment"; }
  int64_t epochs = 5;
  int64_t batch_size = 32;
  double lr = 1e-3;
  int64_t steps = 0;  // 0: no limit
  std::string loss = "ce";
  bool compare = false;
  int64_t canvas = 64;
  int64_t train_size = 4000;
  int64_t test_size = 500;
};

constexpr int64_t kShown = 4;        // held-out canvases in predictions.png
constexpr int64_t kEvalBatch = 100;  // held-out canvases per evaluation batch

// --- metrics.csv ----------------------------------------------------------------------------------
// One row per evaluation, like apps/common/metrics.h, with the segmentation scores as columns.

struct Row {
  double epoch = 0;  // epochs done, fractional when the run stopped mid-epoch
  int64_t step = 0;
  double train_loss = 0;                          // mean over the steps since the previous row
  double test_loss = 0;                           // held-out batches' losses, weighted by their images
  double test_miou = 0, test_pixel_accuracy = 0;  // in [0, 1]
  double seconds = 0;                             // training time since the previous row
  double images_per_s = 0;
};

constexpr const char* kCsvHeader = "epoch,step,train_loss,test_loss,test_miou,test_pixel_accuracy,seconds,images_per_s";

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::string text = std::string(kCsvHeader) + "\n";
  for (const Row& r : rows) {
    char line[320];
    std::snprintf(line, sizeof(line), "%.6g,%" PRId64 ",%.9g,%.9g,%.6f,%.6f,%.3f,%.1f\n", r.epoch, r.step, r.train_loss,
                  r.test_loss, r.test_miou, r.test_pixel_accuracy, r.seconds, r.images_per_s);
    text += line;
  }
  ef::io::write_file_atomically(path, [&](ef::io::OutputFile& f) { f.write(text.data(), text.size()); });
}

std::vector<Row> read_csv(const std::string& path) {
  std::vector<Row> rows;
  std::ifstream in(path);
  EF_CHECK(in.good(), "cannot read ", path, ": it holds the run's history up to its checkpoint");
  std::string line;
  EF_CHECK(std::getline(in, line) && line == kCsvHeader, path, ": line 1 is not the header \"", kCsvHeader, "\"");
  for (int n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    Row r;
    char end = 0;
    const int got =
        std::sscanf(line.c_str(), "%lf,%" SCNd64 ",%lf,%lf,%lf,%lf,%lf,%lf%c", &r.epoch, &r.step, &r.train_loss,
                    &r.test_loss, &r.test_miou, &r.test_pixel_accuracy, &r.seconds, &r.images_per_s, &end);
    EF_CHECK(got == 8, path, ": line ", n, " is not a row of 8 numbers: \"", line, "\"");
    for (double v : {r.epoch, r.train_loss, r.test_loss, r.test_miou, r.test_pixel_accuracy, r.seconds, r.images_per_s})
      EF_CHECK(std::isfinite(v), path, ": line ", n, " holds a number that is not finite: \"", line, "\"");
    rows.push_back(r);
  }
  return rows;
}

void write_plot(const std::string& path, const std::string& spec, const std::vector<Row>& rows) {
  apps::Series loss{.label = "train loss", .color = {200, 40, 40}};
  apps::Series miou{.label = "test mIoU", .color = {30, 80, 200}};
  apps::Series accuracy{.label = "test pixel accuracy", .color = {40, 150, 60}};
  for (const Row& r : rows) {
    for (apps::Series* s : {&loss, &miou, &accuracy}) s->x.push_back(r.epoch);
    loss.y.push_back(r.train_loss);
    miou.y.push_back(r.test_miou);
    accuracy.y.push_back(r.test_pixel_accuracy);
  }
  apps::write_line_plot_png(path, {.title = "FashionMNIST segmentation, loss " + spec,
                                   .x_label = "epoch",
                                   .y_label = "loss / score",
                                   .series = {loss, miou, accuracy}});
}

// --- Prediction images ----------------------------------------------------------------------------

// One row per canvas: the input, the ground truth, then each prediction (labels [k, H, W]).
void write_predictions(const std::string& path, const ef::data::Batch& shown,
                       const std::vector<ef::Tensor>& predictions) {
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
  apps::write_png(path, apps::image_grid(ef::stack(cells, 0), columns, 0.0, 1.0, scale));
}

// --- One training run -----------------------------------------------------------------------------

struct Setup {
  std::vector<ef::Device> devices;
  ef::DType dtype = ef::kFloat32;
  std::shared_ptr<seg::CanvasSet> train, test;
  ef::data::Batch shown;  // the first kShown held-out canvases
};

struct Outcome {
  Row last;              // the final evaluation
  double seconds = 0;    // training time over the whole run, resumed parts included
  ef::Tensor predicted;  // labels [kShown, H, W] of setup.shown
};

// The settings a checkpoint must share with the run that resumes it: not the devices, nor the number of
// processes, which do not change the answer (Note [Random numbers per sample] in engine/tensor.h).
std::map<std::string, std::string> run_metadata(const Args& a, const std::string& spec) {
  return {{"app", "segment"},
          {"batch_size", std::to_string(a.batch_size)},
          {"canvas", std::to_string(a.canvas)},
          {"dtype", a.dtype},
          {"loss", spec},
          {"lr", apps::metadata_number(a.lr)},
          {"seed", std::to_string(a.seed)},
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

// Trains `spec` in `out` and returns its scores. With --resume it continues from the checkpoint
// in `out`; where there is none, `start_if_missing` starts afresh (--compare resuming a loss it
// had not reached) instead of failing.
Outcome train(const Args& a, const Setup& s, const std::string& spec, const fs::path& out, bool start_if_missing) {
  const std::string ckpt_path = (out / "checkpoint.safetensors").string();  // `out` prepared by run()
  const std::string model_path = (out / "model.safetensors").string();
  const std::string csv_path = (out / "metrics.csv").string();
  const std::string png_path = (out / "metrics.png").string();

  // Batches stay on the host: the valid-pixel count is taken there, then scatter copies each chunk
  // straight to its device.
  const auto job = ef::parallel::processes();
  const bool primary = apps::primary_process();  // writes the outputs
  ef::data::DataLoader train_loader(s.train,
                                    {.batch_size = a.batch_size,
                                     .shuffle = true,
                                     .seed = a.seed,
                                     .num_workers = a.workers,
                                     .batch_part = apps::process_batch_part(static_cast<int>(s.devices.size()))});
  ef::data::DataLoader test_loader(s.test, {.batch_size = kEvalBatch, .num_workers = a.workers});
  const int64_t steps_per_epoch = train_loader.num_batches();

  ef::manual_seed(a.seed);
  std::shared_ptr<nn::Module> net = seg::make_model({.dtype = s.dtype});
  if (s.devices.size() > 1 || job->size() > 1) net = ef::parallel::convert_sync_batchnorm(net);
  ef::parallel::DataParallelModel model(net, s.devices);
  // The loss of the whole batch, whatever the split (segmentation_loss's parts).
  ef::parallel::DataParallelCriterion criterion(model, [&](const ef::Tensor& logits, const ef::Tensor& target) {
    return seg::segmentation_loss(spec, logits, target);
  });
  ef::parallel::ReplicatedOptimizer<ef::optim::Adam> opt(model, ef::optim::AdamOptions{.lr = a.lr});
  ef::io::TrainingProgress progress;
  std::vector<Row> rows;
  if (a.resume && (fs::exists(ckpt_path) || !start_if_missing)) {
    const auto ck = ef::io::load_training_checkpoint(ckpt_path, model.module(), opt.primary(), {s.devices[0]});
    ef::apps::check_resume_metadata(ckpt_path, ck.metadata, run_metadata(a, spec));
    model.copy_primary_to_replicas();
    opt.load_state(opt.primary().state());
    progress = ck.progress;
    rows = apps::rows_up_to_checkpoint(read_csv(csv_path), progress.step, csv_path);
    std::printf("resuming %s from %s at step %" PRId64 " (epoch %" PRId64 ")\n", spec.c_str(), ckpt_path.c_str(),
                progress.step, progress.epoch + 1);
  }
  std::printf("training loss %s on %s, %s, %" PRId64 " canvases %" PRId64 "x%" PRId64 ", batch %" PRId64 ", %" PRId64
              " steps per epoch\n",
              spec.c_str(), apps::describe_devices(s.devices).c_str(), a.dtype.c_str(), s.train->size(), a.canvas,
              a.canvas, a.batch_size, steps_per_epoch);
  std::fflush(stdout);

  // The checkpoint last (the rule in run_options.h).
  const auto save = [&] {
    if (!primary) return;
    write_csv(csv_path, rows);
    write_plot(png_path, spec, rows);
    ef::io::save_module(model.module(), model_path);
    ef::io::save_training_checkpoint(ckpt_path, model.module(), opt.primary(), progress, {s.devices[0]},
                                     run_metadata(a, spec));
  };
  apps::setup_done();
  using Clock = std::chrono::steady_clock;
  apps::ProgressBar bar;
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
      const ef::Tensor loss = criterion(model(model.scatter(b.images.to(s.dtype))), model.scatter(b.labels));
      opt.zero_grad();
      loss.backward();
      opt.step();
      const double l = loss.item();
      ++progress.step;
      apps::check_finite_loss(l, progress.step, "training loss");
      ++steps;
      loss_sum += l;
      images += b.labels.size(0);
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
    const Evaluation ev = evaluate(model.module(), test_loader, spec, s.dtype);
    rows.push_back({.epoch = static_cast<double>(progress.step) / static_cast<double>(steps_per_epoch),
                    .step = progress.step,
                    .train_loss = steps > 0 ? loss_sum / static_cast<double>(steps) : 0.0,
                    .test_loss = ev.loss,
                    .test_miou = ev.miou,
                    .test_pixel_accuracy = ev.pixel_accuracy,
                    .seconds = seconds,
                    .images_per_s = seconds > 0 ? static_cast<double>(images) / seconds : 0.0});
    std::printf("epoch %.6g  step %" PRId64
                "  train loss %.4f  test loss %.4f  mIoU %.2f%%  pixel accuracy %.2f%%  %.1f s  %.0f img/s\n",
                rows.back().epoch, progress.step, rows.back().train_loss, ev.loss, 100 * ev.miou,
                100 * ev.pixel_accuracy, seconds, rows.back().images_per_s);
    std::fflush(stdout);
    save();
  }
  EF_CHECK(!rows.empty(), "--resume: ", csv_path, " has no evaluation although ", ckpt_path, " is at step ",
           progress.step);
  Outcome o{.last = rows.back(), .predicted = predict(model.module(), s.shown, s.dtype)};
  for (const Row& r : rows) o.seconds += r.seconds;
  return o;
}

// --- --compare --------------------------------------------------------------------------------------

void write_compare(const std::string& path, const std::string& command, const std::vector<std::string>& specs,
                   const std::vector<Outcome>& outcomes) {
  std::string text = "# Segmentation losses compared\n\n`" + command +
                     "`\n\nEvery loss trained from the same initialisation on the same batches (same seed and "
                     "budget); scores on the held-out canvases after the last step.\n\n"
                     "| loss | mIoU | pixel accuracy | train seconds |\n|---|---:|---:|---:|\n";
  for (size_t i = 0; i < specs.size(); ++i) {
    char line[200];
    std::snprintf(line, sizeof(line), "| %s | %.2f%% | %.2f%% | %.1f |\n", specs[i].c_str(),
                  100 * outcomes[i].last.test_miou, 100 * outcomes[i].last.test_pixel_accuracy, outcomes[i].seconds);
    text += line;
  }
  text += "\npredictions.png: one row per held-out canvas; columns: input, ground truth";
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
  s.devices = ef::parallel::devices(a.devices);
  EF_CHECK(a.dtype == "float32" || a.dtype == "float64", "--dtype must be float32 or float64, got \"", a.dtype, "\"");
  s.dtype = a.dtype == "float64" ? ef::kFloat64 : ef::kFloat32;
  // Every output folder before any work: <out>, and with --compare one per loss in it.
  const bool primary = apps::primary_process();  // writes the outputs
  if (primary) apps::prepare_output_folder(a.out, fs::path(a.out) / "checkpoint.safetensors", a.resume, a.overwrite);
  if (a.compare && primary)
    for (const std::string& spec : specs)
      apps::prepare_output_folder(fs::path(a.out) / spec, fs::path(a.out) / spec / "checkpoint.safetensors", a.resume,
                                  a.overwrite);
  ef::set_num_threads(a.threads > 0 ? a.threads : ef::parallel::cpu_threads_per_device(s.devices));
  s.train = std::make_shared<seg::CanvasSet>(ef::data::load_fashion_mnist(ef::data::Split::Train, a.data), a.train_size,
                                             a.canvas, a.seed, 0);
  s.test = std::make_shared<seg::CanvasSet>(ef::data::load_fashion_mnist(ef::data::Split::Test, a.data), a.test_size,
                                            a.canvas, a.seed, 1);
  std::vector<int64_t> shown(static_cast<size_t>(std::min(kShown, a.test_size)));
  for (size_t i = 0; i < shown.size(); ++i) shown[i] = static_cast<int64_t>(i);
  s.shown = s.test->get_batch(shown);

  if (!a.compare) {
    const Outcome o = train(a, s, a.loss, a.out, false);
    if (primary) write_predictions((fs::path(a.out) / "predictions.png").string(), s.shown, {o.predicted});
    std::printf("done: mIoU %.2f%%, pixel accuracy %.2f%%; outputs in %s\n", 100 * o.last.test_miou,
                100 * o.last.test_pixel_accuracy, a.out.c_str());
    return 0;
  }
  std::vector<Outcome> outcomes;
  std::vector<ef::Tensor> predictions;
  for (const std::string& spec : specs) {
    outcomes.push_back(train(a, s, spec, fs::path(a.out) / spec, true));
    predictions.push_back(outcomes.back().predicted);
  }
  const std::string md_path = (fs::path(a.out) / "compare.md").string();
  if (primary) {
    write_compare(md_path, command, specs, outcomes);
    write_predictions((fs::path(a.out) / "predictions.png").string(), s.shown, predictions);
  }
  std::printf("\n");
  for (size_t i = 0; i < specs.size(); ++i)
    std::printf("%-8s mIoU %6.2f%%  pixel accuracy %6.2f%%  %.1f s\n", specs[i].c_str(),
                100 * outcomes[i].last.test_miou, 100 * outcomes[i].last.test_pixel_accuracy, outcomes[i].seconds);
  std::printf("done: %s and predictions.png in %s\n", md_path.c_str(), a.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Segment FashionMNIST garments on canvases with a small encoder-decoder (evenflow)"};
  Args a;
  ef::apps::add_run_options(app, a, "seed of the canvases, the initialization and the data order");
  app.add_option("--epochs", a.epochs, "epochs")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", a.batch_size, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--lr", a.lr, "Adam learning rate")->check(CLI::PositiveNumber & apps::finite());
  app.add_option("--steps", a.steps, "stop after this many steps in all (0: no limit)")->check(CLI::NonNegativeNumber);
  auto* loss = app.add_option("--loss", a.loss, "ce, focal, dice, lovasz, ohem, or a sum of them such as ce+dice");
  app.add_flag("--compare", a.compare,
               "train ce, focal, dice, lovasz, ohem and ce+dice with the same seed and budget, each in <out>/<loss> "
               "(--resume continues each); write <out>/compare.md and <out>/predictions.png")
      ->excludes(loss);
  app.add_option("--canvas", a.canvas, "canvas height and width (a multiple of 4, 28 to 1024)");
  // Canvases are drawn when read, but an epoch's order holds an index per canvas: bounded.
  app.add_option("--train-size", a.train_size, "training canvases (at most 10000000)")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  app.add_option("--test-size", a.test_size, "held-out canvases (at most 10000000)")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  return ef::apps::run_program(app, argc, argv, "segment", [&] {
    std::string command = "segment";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    return run(a, command);
  });
}
