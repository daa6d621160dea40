// apps/segment: its pieces (canvases, mIoU, the losses on three CPU devices against one) in
// process, and the program end to end on a tiny synthetic FashionMNIST written here as raw IDX
// files: --steps writes valid outputs and --resume continues bitwise; bad arguments exit 2 with a
// one-line message; --compare writes its table and image; cpu:3 trains what cpu does (float64).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "apps/segment/segmentation.h"
#include "evenflow/engine/ops.h"
#include "evenflow/io/safetensors.h"
#include "evenflow/parallel/data_parallel.h"
#include "tests/io/test_files.h"
#include "tests/testing/helpers.h"
#include "tests/train/app_runner.h"

namespace ef = evenflow;
namespace seg = evenflow::segment;
using evenflow::testing::AppResult;
using evenflow::testing::check_tensorboard;
using evenflow::testing::cpu_devices;
using evenflow::testing::first_line;
using evenflow::testing::output_of;
using evenflow::testing::read_bytes;
using evenflow::testing::step_losses;
using evenflow::testing::TempDir;
using evenflow::testing::trained_on;

namespace {

// --- In process ---------------------------------------------------------------------------------------

// Two garments: a bright 10x10 square (class 3) and an image too faint to be drawn (class 7).
ef::data::Batch square_garments() {
  std::vector<double> pixels(2 * 28 * 28, 0.0);
  for (int y = 5; y < 15; ++y)
    for (int x = 5; x < 15; ++x) pixels[static_cast<size_t>(y * 28 + x)] = 1.0;
  std::fill(pixels.begin() + 28 * 28, pixels.end(), 0.05);
  return {.images = ef::from_vector(pixels, {2, 1, 28, 28}), .labels = ef::from_int_vector({3, 7}, {2})};
}

}  // namespace

TEST_CASE("segment: canvases are deterministic, labelled where drawn, boundaries ignored") {
  const seg::CanvasSet set(square_garments(), 10, 40, 7, 0);
  int64_t squares = 0;
  for (int64_t i = 0; i < set.size(); ++i) {
    CAPTURE(i);
    const ef::data::Example e = set.get(i);
    CHECK(e.image.shape() == ef::Shape{1, 40, 40});
    CHECK(e.label.shape() == ef::Shape{40, 40});
    const std::vector<double> image = e.image.to_vector();
    const std::vector<int64_t> label = e.label.to_int_vector();
    int64_t bad_labels = 0, drawn_mismatches = 0, class_next_to_background = 0, square = 0;
    for (int y = 0; y < 40; ++y) {
      for (int x = 0; x < 40; ++x) {
        const auto p = static_cast<size_t>(y * 40 + x);
        bad_labels += label[p] != 3 && label[p] != seg::kBackground && label[p] != seg::kIgnore;
        drawn_mismatches += (image[p] > seg::kDrawn) != (label[p] != seg::kBackground);  // faint garments never drawn
        if (label[p] != 3) continue;
        ++square;
        for (const auto& [dy, dx] : {std::pair{-1, 0}, std::pair{1, 0}, std::pair{0, -1}, std::pair{0, 1}}) {
          const int ny = y + dy, nx = x + dx;
          class_next_to_background +=
              ny >= 0 && ny < 40 && nx >= 0 && nx < 40 && label[static_cast<size_t>(ny * 40 + nx)] == seg::kBackground;
        }
      }
    }
    CHECK(bad_labels == 0);
    CHECK(drawn_mismatches == 0);
    CHECK(class_next_to_background == 0);  // a garment's edge is ignored
    CHECK(square <= 8 * 8 * 4);            // at most 4 squares, each with an ignored 1-pixel rim
    squares += square;
  }
  CHECK(squares > 0);
  const seg::CanvasSet again(square_garments(), 10, 40, 7, 0), other_stream(square_garments(), 10, 40, 7, 1);
  const ef::data::Batch b = again.get_batch({5, 2});
  CHECK(b.images.select(0, 0).to_vector() == set.get(5).image.to_vector());
  CHECK(b.labels.select(0, 1).to_int_vector() == set.get(2).label.to_int_vector());
  bool differs = false;
  for (int64_t i = 0; i < set.size(); ++i)
    differs = differs || other_stream.get(i).label.to_int_vector() != set.get(i).label.to_int_vector();
  CHECK(differs);
}

TEST_CASE("segment: mIoU skips absent classes and ignored pixels") {
  seg::Confusion c;
  CHECK(c.miou() == 0.0);
  c.add(ef::from_int_vector({0, 1, 1, 10}, {1, 2, 2}), ef::from_int_vector({0, 1, seg::kIgnore, 1}, {1, 2, 2}));
  // class 0: 1/1; class 1: 1 of 2 (one missed as background); background: 0 of 1 (a false positive).
  CHECK(c.miou() == doctest::Approx(0.5).epsilon(1e-15));
  CHECK(c.pixel_accuracy() == doctest::Approx(2.0 / 3.0).epsilon(1e-15));
  CHECK_THROWS_WITH_AS(seg::loss_terms("ce+bogus"), doctest::Contains("\"bogus\""), ef::Error);
  CHECK(seg::loss_terms("ce+dice") == std::vector<std::string>{"ce", "dice"});
}

TEST_CASE("segment: segmentation_loss on three CPU devices equals one device, loss and gradients (float64)") {
  ef::manual_seed(3);
  const ef::Tensor images = ef::rand({5, 1, 8, 8}, {.dtype = ef::kFloat64});
  std::vector<int64_t> labels(5 * 8 * 8);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = i % 7 == 0 ? seg::kIgnore : static_cast<int64_t>(i * 5 % 11);
  const ef::Tensor target = ef::from_int_vector(labels, {5, 8, 8});
  const auto conv = std::make_shared<ef::nn::Conv2d>(1, seg::kClasses, 3, ef::nn::Conv2dConfig{.padding = 1},
                                                     ef::nn::ModuleOptions{.dtype = ef::kFloat64});
  // One step of each spec: its loss and the weight's gradient, on `devices`.
  const auto step = [&](const std::string& spec, const std::string& devices) {
    ef::parallel::DataParallelModel model(conv->clone(), ef::parallel::devices(devices));
    ef::parallel::DataParallelCriterion criterion(
        model, [&](const ef::Tensor& logits, const ef::Tensor& t) { return seg::segmentation_loss(spec, logits, t); });
    const ef::Tensor loss = criterion(model(model.scatter(images)), model.scatter(target));
    loss.backward();
    std::vector<double> out{loss.item()};
    for (const double g : model.module().parameters().front().grad().to_vector()) out.push_back(g);
    return out;
  };
  for (const std::string spec : {"ce", "focal", "dice", "lovasz", "ohem", "ce+dice", "focal+lovasz+ohem"}) {
    CAPTURE(spec);
    const std::vector<double> one = step(spec, "cpu"), three = step(spec, "cpu:3");
    REQUIRE(one.size() == three.size());
    CHECK(std::isfinite(one[0]));
    CHECK(one[0] > 0);
    for (size_t i = 0; i < one.size(); ++i) {
      CAPTURE(i);
      CHECK(std::abs(one[i] - three[i]) <= 1e-12 + 1e-10 * std::abs(one[i]));
    }
  }
}

// --- End to end --------------------------------------------------------------------------------------

namespace {

AppResult run_segment(const std::string& args) {
  return ef::testing::run_app(EF_SEGMENT_BIN, args);
}

void write_dataset(const TempDir& data) {
  ef::testing::write_fashion_split(data, "train", 40, 0);
  ef::testing::write_fashion_split(data, "t10k", 20, 3);
}

bool is_png(const std::string& path) {
  return read_bytes(path).substr(0, 8) == "\x89PNG\r\n\x1a\n";
}

// 32x32 canvases, 24 for training (6 steps an epoch) and 8 held out.
std::string tiny_args(const TempDir& data) {
  return "--data " + data.path().string() +
         " --canvas 32 --train-size 24 --test-size 8 --batch-size 4 --workers 1 --threads 1 ";
}

}  // namespace

TEST_CASE("segment: --steps writes valid outputs and --resume continues exactly") {
  TempDir data, full, split;
  write_dataset(data);
  const std::string common = tiny_args(data) + "--devices cpu:1 --loss focal+dice --epochs 2 --print-loss";

  const AppResult whole = run_segment(common + " --steps 8 --out " + full.path().string());
  REQUIRE_MESSAGE(whole.rc == 0, whole.output);
  const auto reference = step_losses(whole.output);
  REQUIRE(reference.size() == 8);

  const AppResult first = run_segment(common + " --steps 4 --out " + split.path().string());
  REQUIRE_MESSAGE(first.rc == 0, first.output);
  CHECK(step_losses(first.output).size() == 4);
  CHECK_MESSAGE(first.output.find("mIoU") != std::string::npos, first.output);
  CHECK(is_png(split.file("metrics.png")));
  CHECK(is_png(split.file("predictions.png")));
  CHECK(first_line(split.file("metrics.csv")) ==
        "epoch,step,train_loss,test_loss,test_miou,test_pixel_accuracy,seconds,images_per_s");
  const auto ckpt = evenflow::io::load_safetensors(split.file("checkpoint.safetensors"));
  CHECK(ckpt.at("train.step").to_int_vector() == std::vector<int64_t>{4});
  CHECK(ckpt.contains("model.0.weight"));
  CHECK(ckpt.contains("model.1.running_mean"));
  CHECK(ckpt.contains("optim.state.0.exp_avg"));
  const auto model = evenflow::io::load_safetensors(split.file("model.safetensors"));
  CHECK(model.contains("22.bias"));  // the 1x1 classifier

  const AppResult resumed = run_segment(common + " --resume --steps 8 --out " + split.path().string());
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
  CHECK_MESSAGE(resumed.output.find("at step 4") != std::string::npos, resumed.output);
  const auto rest = step_losses(resumed.output);
  REQUIRE(rest.size() == 4);
  CHECK(rest.front().first == 5);
  CHECK(rest == std::vector<std::pair<int, std::string>>(reference.begin() + 4, reference.end()));  // bitwise
  const std::string csv = read_bytes(split.file("metrics.csv"));
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 4);  // the header, steps 4, 6 (epoch 1) and 8
  check_tensorboard(split.path().string(), "learning_rate", "predictions");

  const AppResult other_loss = run_segment(tiny_args(data) +
                                           "--devices cpu:1 --loss ce --epochs 2 --resume --steps 8 "
                                           "--out " +
                                           split.path().string());
  CHECK(other_loss.rc == 2);
  CHECK_MESSAGE(other_loss.output.find("was written with loss focal+dice") != std::string::npos, other_loss.output);
}

TEST_CASE("segment: bad arguments exit 2 with a one-line message") {
  TempDir data, out;
  write_dataset(data);
  const std::string data_arg = " --data " + data.path().string();
  const std::string out_arg = " --out " + out.path().string();
  for (const auto& [args, expected] :
       std::vector<std::pair<std::string, std::string>>{{"--loss ce+bogus" + data_arg, "unknown loss \"bogus\""},
                                                        {"--loss dice+" + data_arg, "unknown loss \"\""},
                                                        {"--data /nonexistent/fashion", "/nonexistent/fashion"},
                                                        {"--devices tpu:0" + data_arg, "tpu:0"},
                                                        {"--devices cpu:0" + data_arg, "cpu:0"},
                                                        {"--canvas 30" + data_arg, "--canvas"},
                                                        {"--resume" + data_arg, "checkpoint.safetensors"}}) {
    const AppResult r = run_segment(args + out_arg);
    CAPTURE(args);
    CHECK(r.rc == 2);
    CHECK_MESSAGE(r.output.find("segment: error:") != std::string::npos, r.output);
    CHECK_MESSAGE(r.output.find(expected) != std::string::npos, r.output);
    CHECK_MESSAGE(std::count(r.output.begin(), r.output.end(), '\n') == 1, r.output);
  }
}

TEST_CASE("segment: --compare trains every loss from each seed and writes compare.md and predictions.png") {
  TempDir data, out;
  write_dataset(data);
  const AppResult r = run_segment(tiny_args(data) + "--compare --seeds 2 --steps 2 --out " + out.path().string());
  REQUIRE_MESSAGE(r.rc == 0, r.output);
  const std::string md = read_bytes(out.file("compare.md"));
  std::vector<std::string> rows;
  std::istringstream in(md);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("| ", 0) == 0 && line.rfind("| loss ", 0) != 0) rows.push_back(line);
  REQUIRE_MESSAGE(rows.size() == 6, md);
  for (const std::string spec : {"ce", "focal", "dice", "lovasz", "ohem", "ce+dice"}) {
    CAPTURE(spec);
    const auto row = std::find_if(rows.begin(), rows.end(),
                                  [&](const std::string& line) { return line.rfind("| " + spec + " |", 0) == 0; });
    REQUIRE(row != rows.end());
    CHECK_MESSAGE(row->find(" ± ") != std::string::npos, *row);  // mean ± standard deviation
    CHECK(row->find("| 2 |") != std::string::npos);              // runs
    for (const char* seed : {"seed_0", "seed_1"}) {
      CHECK(first_line(out.file(spec + "/" + seed + "/metrics.csv")).rfind("epoch,step,", 0) == 0);
      const auto ckpt = evenflow::io::load_safetensors(out.file(spec + "/" + seed + "/checkpoint.safetensors"));
      CHECK(ckpt.metadata.at("seed") == std::string(seed).substr(5));
    }
  }
  CHECK(is_png(out.file("predictions.png")));
  // The first seed's run is the run of that loss alone, from the same seed: bitwise the same model.
  TempDir alone;
  REQUIRE(run_segment(tiny_args(data) + "--loss dice --steps 2 --out " + alone.path().string()).rc == 0);
  CHECK(read_bytes(alone.file("model.safetensors")) == read_bytes(out.file("dice/seed_0/model.safetensors")));
  // Each run's config.toml holds the comparison's settings, without --loss (which excludes
  // --compare: its default written there did not read back), and repeats it (one seed: in <loss>/).
  const std::string config = read_bytes(out.file("dice/seed_0/config.toml"));
  CHECK_MESSAGE(config.find("\ncompare=true\n") != std::string::npos, config);
  CHECK_MESSAGE(config.find("\nloss=") == std::string::npos, config);
  TempDir again;
  const AppResult repeated =
      run_segment("--config " + out.file("dice/seed_0/config.toml") + " --seeds 1 --out " + again.path().string());
  REQUIRE_MESSAGE(repeated.rc == 0, repeated.output);
  CHECK(read_bytes(again.file("dice/model.safetensors")) == read_bytes(out.file("dice/seed_0/model.safetensors")));
}

// With --augment too: the image and its label map are turned, cut and mirrored per image, the
// same on one device or three (Note [Label maps] in data/transforms.h), and not as without it.
TEST_CASE("segment: three CPU devices train what one does (ce+dice, float64), with and without --augment") {
  TempDir data;
  write_dataset(data);
  std::vector<std::vector<std::pair<int, std::string>>> runs;
  for (const char* augment : {"", " --augment"}) {
    CAPTURE(augment);
    TempDir one, three;
    const std::string common = tiny_args(data) + "--loss ce+dice --dtype float64 --steps 3 --print-loss" + augment;
    const AppResult a = run_segment(common + " --devices cpu --out " + one.path().string());
    const AppResult b = run_segment(common + " --devices cpu:3 --out " + three.path().string());
    REQUIRE_MESSAGE(a.rc == 0, a.output);
    REQUIRE_MESSAGE(b.rc == 0, b.output);
    CHECK(trained_on(a.output) == cpu_devices(1));
    CHECK(trained_on(b.output) == cpu_devices(3));
    const auto la = step_losses(a.output), lb = step_losses(b.output);
    REQUIRE(la.size() == 3);
    REQUIRE(lb.size() == 3);
    for (size_t i = 0; i < la.size(); ++i) {
      CAPTURE(i);
      CHECK(la[i].first == lb[i].first);
      const double x = std::stod(la[i].second), y = std::stod(lb[i].second);
      CHECK(std::abs(x - y) <= 1e-10 * std::abs(x));
    }
    runs.push_back(la);
  }
  CHECK(runs[0] != runs[1]);
}

// --cuda-graph (Note [Recorded epoch steps] in apps/common/run.cpp) on two CPU devices, SyncBatchNorm
// and the Upsample layers' operands made once (ResamplingOperands) included: ce+dice is recorded and
// its replays give the eager losses bitwise; Lovász-softmax sorts on the host, so its step runs
// eagerly, saying why, with the same losses.
TEST_CASE("segment: --cuda-graph records ce+dice on two CPU devices, bitwise; lovasz runs eagerly, saying why") {
  TempDir data;
  write_dataset(data);
  for (const char* loss : {"ce+dice", "lovasz"}) {
    CAPTURE(loss);
    TempDir eager, recorded;
    const std::string common = tiny_args(data) + "--devices cpu:2 --steps 5 --print-loss --loss " + loss;
    const auto reference = step_losses(output_of(run_segment(common + " --out " + eager.path().string())));
    const std::string replayed = output_of(run_segment(common + " --cuda-graph --out " + recorded.path().string()));
    REQUIRE(reference.size() == 5);
    CHECK(step_losses(replayed) == reference);  // bitwise
    const bool recordable = std::string(loss) == "ce+dice";
    CHECK_MESSAGE(
        (replayed.find("step graph: recorded the step on cpu:0 and 1 more") != std::string::npos) == recordable,
        replayed);
    CHECK((replayed.find("step graph: running the step eagerly") != std::string::npos) == !recordable);
  }
}

// On a GPU (scripts/gpu_check.sh): the recorded step is one CUDA graph -- bilinear upsampling,
// BatchNorm, the class targets' check -- and with cuDNN's deterministic algorithms its replays give
// the eager losses bitwise.
TEST_CASE("segment: --cuda-graph on a GPU replays the eager run's losses bitwise") {
  if (!evenflow::testing::cuda_devices_available(1)) return;
  TempDir data, eager, recorded;
  write_dataset(data);
  const std::string common =
      tiny_args(data) + "--devices cuda:0 --cudnn-deterministic --steps 5 --print-loss --loss ce+dice";
  const auto reference = step_losses(output_of(run_segment(common + " --out " + eager.path().string())));
  const std::string replayed = output_of(run_segment(common + " --cuda-graph --out " + recorded.path().string()));
  REQUIRE(reference.size() == 5);
  CHECK(step_losses(replayed) == reference);
  CHECK_MESSAGE(replayed.find("step graph: recorded the step on cuda:0") != std::string::npos, replayed);
}
