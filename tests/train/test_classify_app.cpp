// apps/classify end to end, on a tiny synthetic FashionMNIST written here as raw IDX files (so CI
// needs no dataset): --steps 5 writes a valid checkpoint, model, metrics.csv and PNG; --resume
// --steps 10 continues from step 5 with losses identical (to the last bit) to an uninterrupted run
// of 10 steps; bad arguments exit 2 with a one-line message.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "evenflow/io/safetensors.h"
#include "tests/testing/helpers.h"
#include "tests/train/app_runner.h"

using evenflow::testing::check_tensorboard;
using evenflow::testing::cpu_devices;
using evenflow::testing::first_line;
using evenflow::testing::output_of;
using evenflow::testing::read_bytes;
using evenflow::testing::run_app;
using evenflow::testing::step_losses;
using evenflow::testing::TempDir;
using evenflow::testing::trained_on;
using evenflow::testing::write_bytes;
using evenflow::testing::write_fashion_split;
using Result = evenflow::testing::AppResult;

namespace {

// A run of 10 steps against 5 steps, then --resume for 5 more: the same losses, bitwise.
void check_resume(const std::string& extra_args) {
  CAPTURE(extra_args);
  TempDir data, full, split;
  write_fashion_split(data, "train", 40, 0);
  write_fashion_split(data, "t10k", 20, 3);
  const std::string common = "--data " + data.path().string() +
                             " --batch-size 4 --epochs 2 --workers 1 --threads 1 --print-loss " + extra_args;

  const Result whole = run_app(EF_CLASSIFY_BIN, common + " --steps 10 --out " + full.path().string());
  REQUIRE_MESSAGE(whole.rc == 0, whole.output);
  const size_t devices = extra_args.find("--devices cpu:");
  CHECK(trained_on(whole.output) ==
        cpu_devices(devices == std::string::npos ? 1 : std::stoi(extra_args.substr(devices + 14))));
  const auto reference = step_losses(whole.output);
  REQUIRE(reference.size() == 10);

  const Result first = run_app(EF_CLASSIFY_BIN, common + " --steps 5 --out " + split.path().string());
  REQUIRE_MESSAGE(first.rc == 0, first.output);
  CHECK(step_losses(first.output).size() == 5);
  CHECK(read_bytes(split.file("loss_accuracy.png")).substr(0, 8) == "\x89PNG\r\n\x1a\n");
  CHECK(first_line(split.file("metrics.csv")) == "epoch,step,train_loss,test_loss,test_accuracy,seconds,images_per_s");
  const auto ckpt = evenflow::io::load_safetensors(split.file("checkpoint.safetensors"));
  CHECK(ckpt.at("train.step").to_int_vector() == std::vector<int64_t>{5});
  CHECK(ckpt.contains("model.0.weight"));
  CHECK(ckpt.contains("optim.state.0.exp_avg"));
  const auto model = evenflow::io::load_safetensors(split.file("model.safetensors"));
  CHECK(model.contains("10.bias"));
  CHECK(!model.contains("model.10.bias"));

  const Result resumed = run_app(EF_CLASSIFY_BIN, common + " --resume --steps 10 --out " + split.path().string());
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
  CHECK_MESSAGE(resumed.output.find("at step 5") != std::string::npos, resumed.output);
  const auto rest = step_losses(resumed.output);
  REQUIRE(rest.size() == 5);
  CHECK(rest.front().first == 6);
  CHECK(rest == std::vector<std::pair<int, std::string>>(reference.begin() + 5, reference.end()));  // bitwise
  const std::string csv = read_bytes(split.file("metrics.csv"));
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 3);  // the header, step 5, step 10
  check_tensorboard(split.path().string(), "learning_rate");
}

}  // namespace

TEST_CASE("classify: --steps writes valid outputs and --resume continues exactly") {
  check_resume("");
}

TEST_CASE("classify: data-parallel on three CPU devices, float64, resumes exactly") {
  check_resume("--devices cpu:3 --dtype float64");
}

TEST_CASE("classify: --precision bf16 on two CPU devices resumes exactly") {
  check_resume("--devices cpu:2 --precision bf16");
}

// --precision bf16 takes effect (the losses leave float32's after the first step's products) and
// stays close to it: six steps of Adam from the same weights, bfloat16 operands (2^-8 relative
// each) moving the loss by well under 1% while training is stable. Two devices give what one does
// to float32 rounding of the sums (1e-5 relative). Measured: at most 0.23% from float32 (step 4).
TEST_CASE("classify: --precision bf16 trains close to float32, and the same on one device or two") {
  TempDir data, fp32, one, two;
  write_fashion_split(data, "train", 40, 0);
  write_fashion_split(data, "t10k", 20, 3);
  const std::string common =
      "--data " + data.path().string() + " --batch-size 8 --epochs 2 --workers 1 --threads 1 --print-loss ";
  const Result f = run_app(EF_CLASSIFY_BIN, common + "--steps 6 --out " + fp32.path().string());
  const Result a = run_app(EF_CLASSIFY_BIN, common + "--steps 6 --precision bf16 --out " + one.path().string());
  const Result b =
      run_app(EF_CLASSIFY_BIN, common + "--steps 6 --precision bf16 --devices cpu:2 --out " + two.path().string());
  for (const Result* r : {&f, &a, &b}) REQUIRE_MESSAGE(r->rc == 0, r->output);
  const auto lf = step_losses(f.output), la = step_losses(a.output), lb = step_losses(b.output);
  REQUIRE(lf.size() == 6);
  REQUIRE(la.size() == 6);
  REQUIRE(lb.size() == 6);
  CHECK(la != lf);
  for (size_t i = 0; i < la.size(); ++i) {
    CAPTURE(la[i].first);
    const double x = std::stod(lf[i].second), y = std::stod(la[i].second), z = std::stod(lb[i].second);
    CHECK(std::abs(y - x) <= 1e-2 * std::abs(x));
    CHECK(std::abs(z - y) <= 1e-5 * std::abs(y));
  }

  // A resume keeps the precision: another one is refused, naming both; a checkpoint from before
  // --precision existed (no such metadata) was float32.
  const Result other = run_app(EF_CLASSIFY_BIN, common + "--resume --steps 8 --out " + one.path().string());
  CHECK(other.rc == 2);
  CHECK_MESSAGE(other.output.find("was written with precision bf16, this run has fp32") != std::string::npos,
                other.output);
  auto old = evenflow::io::load_safetensors(fp32.file("checkpoint.safetensors"));
  REQUIRE(old.metadata.erase("precision") == 1);
  evenflow::io::save_safetensors(fp32.file("checkpoint.safetensors"), old.tensors, old.metadata);
  const Result resumed = run_app(EF_CLASSIFY_BIN, common + "--resume --steps 8 --out " + fp32.path().string());
  CHECK_MESSAGE(resumed.rc == 0, resumed.output);
  CHECK(step_losses(resumed.output).size() == 2);
}

// --augment draws per image (data::SampleStreams), so three devices train what one does (float64,
// 1e-10), the losses leave the unaugmented run's, a resume continues exactly, and a resume with the
// other setting is refused.
TEST_CASE("classify: --augment trains the same on one device or three, and resumes exactly") {
  check_resume("--devices cpu:3 --dtype float64 --augment");
  TempDir data, plain, one, three;
  write_fashion_split(data, "train", 40, 0);
  write_fashion_split(data, "t10k", 20, 3);
  const std::string common = "--data " + data.path().string() +
                             " --batch-size 8 --epochs 2 --threads 1 --dtype float64 "
                             "--print-loss ";
  const Result p = run_app(EF_CLASSIFY_BIN, common + "--steps 6 --workers 1 --out " + plain.path().string());
  const Result a = run_app(EF_CLASSIFY_BIN, common + "--steps 6 --augment --workers 0 --out " + one.path().string());
  const Result b = run_app(EF_CLASSIFY_BIN,
                           common + "--steps 6 --augment --devices cpu:3 --workers 2 --out " + three.path().string());
  for (const Result* r : {&p, &a, &b}) REQUIRE_MESSAGE(r->rc == 0, r->output);
  CHECK(trained_on(b.output) == cpu_devices(3));
  const auto lp = step_losses(p.output), la = step_losses(a.output), lb = step_losses(b.output);
  REQUIRE(la.size() == 6);
  REQUIRE(lb.size() == 6);
  CHECK(la != lp);
  for (size_t i = 0; i < la.size(); ++i) {
    CAPTURE(la[i].first);
    const double x = std::stod(la[i].second), y = std::stod(lb[i].second);
    CHECK(std::abs(x - y) <= 1e-10 * std::abs(x));
  }
  const Result other = run_app(EF_CLASSIFY_BIN, common + "--resume --steps 8 --out " + one.path().string());
  CHECK(other.rc == 2);
  CHECK_MESSAGE(other.output.find("was written with augment on, this run has off") != std::string::npos, other.output);
}

// The GPU check's data-parallel stage (scripts/gpu_check.sh, EF_CUDA_DEVICES=0,0): dropout, the
// convolutions and the gradient all-reduce on two CUDA logical devices train what one CUDA device
// does, in float64 (1e-9: the devices' sums run in another order). Against one CPU device the
// dropout masks differ: they come from the first device's generator, and the CPU's has drawn the
// initial weights (seen on an H200: losses 0.04-0.2 apart); the ops' CPU parity is the parity
// stage's.
TEST_CASE("classify: two CUDA logical devices train what one CUDA device does (float64)") {
  if (!evenflow::testing::cuda_devices_available(2)) return;
  TempDir data, one, two;
  write_fashion_split(data, "train", 40, 0);
  write_fashion_split(data, "t10k", 20, 3);
  const std::string common = "--data " + data.path().string() +
                             " --batch-size 4 --epochs 1 --workers 1 --threads 1 --print-loss --steps 6 " +
                             "--dtype float64 ";
  const Result a = run_app(EF_CLASSIFY_BIN, common + "--devices cuda:0 --out " + one.path().string());
  const Result b = run_app(EF_CLASSIFY_BIN, common + "--devices cuda:0,1 --out " + two.path().string());
  REQUIRE_MESSAGE(a.rc == 0, a.output);
  REQUIRE_MESSAGE(b.rc == 0, b.output);
  const auto la = step_losses(a.output), lb = step_losses(b.output);
  REQUIRE(la.size() == 6);
  REQUIRE(lb.size() == la.size());
  for (size_t i = 0; i < la.size(); ++i) {
    CAPTURE(la[i].first);
    const double x = std::stod(la[i].second), y = std::stod(lb[i].second);
    CHECK(std::abs(y - x) <= 1e-9 * (1.0 + std::abs(x)));
  }
}

TEST_CASE("classify: bad arguments exit 2 with a one-line message") {
  TempDir data, out;
  write_fashion_split(data, "train", 8, 0);
  write_fashion_split(data, "t10k", 4, 3);
  const std::string data_arg = " --data " + data.path().string();
  const std::string out_arg = " --out " + out.path().string();
  for (const auto& [args, expected] :
       std::vector<std::pair<std::string, std::string>>{{"--devices tpu:0" + data_arg, "tpu:0"},
                                                        {"--devices cpu:0" + data_arg, "cpu:0"},
                                                        {"--dtype float16" + data_arg, "float16"},
                                                        {"--data /nonexistent/fashion", "/nonexistent/fashion"}}) {
    const Result r = run_app(EF_CLASSIFY_BIN, args + out_arg);
    CAPTURE(args);
    CHECK(r.rc == 2);
    CHECK_MESSAGE(r.output.find("classify: error:") != std::string::npos, r.output);
    CHECK_MESSAGE(r.output.find(expected) != std::string::npos, r.output);
  }
}

// --config: a run's settings, written to <out>/config.toml, read back give the same run; the command
// line wins over the file.
TEST_CASE("classify: --config reads back the config.toml a run wrote, and the command line wins") {
  TempDir data, first, again, other;
  write_fashion_split(data, "train", 40, 0);
  write_fashion_split(data, "t10k", 20, 3);
  const Result a = run_app(EF_CLASSIFY_BIN, "--data " + data.path().string() +
                                                " --batch-size 4 --epochs 2 --workers 1 --threads 1 --lr 0.002 "
                                                "--print-loss --steps 4 --out " +
                                                first.path().string());
  REQUIRE_MESSAGE(a.rc == 0, a.output);
  const std::string config = read_bytes(first.file("config.toml"));
  CHECK_MESSAGE(config.find("lr=0.002") != std::string::npos, config);
  CHECK_MESSAGE(config.find("batch-size=4") != std::string::npos, config);
  check_tensorboard(first.path().string(), "learning_rate");  // the settings as a text summary too

  const Result b =
      run_app(EF_CLASSIFY_BIN, "--config " + first.file("config.toml") + " --out " + again.path().string());
  REQUIRE_MESSAGE(b.rc == 0, b.output);
  CHECK(step_losses(b.output) == step_losses(a.output));  // bitwise
  CHECK(read_bytes(again.file("config.toml")).find("lr=0.002") != std::string::npos);

  const Result c =
      run_app(EF_CLASSIFY_BIN, "--config " + first.file("config.toml") + " --lr 0.01 --out " + other.path().string());
  REQUIRE_MESSAGE(c.rc == 0, c.output);
  REQUIRE(step_losses(c.output).size() == 4);
  CHECK(step_losses(c.output).front() == step_losses(a.output).front());  // the first loss is before any step
  CHECK(step_losses(c.output).back() != step_losses(a.output).back());
  CHECK(read_bytes(other.file("config.toml")).find("lr=0.01") != std::string::npos);

  const Result missing = run_app(EF_CLASSIFY_BIN, "--config " + data.file("none.toml"));
  CHECK(missing.rc == 2);
  CHECK_MESSAGE(missing.output.find("classify: error: --config " + data.file("none.toml")) != std::string::npos,
                missing.output);

  // A key that names no option (a misspelt setting: CLI11 alone drops it, and the run would have the
  // default) and a section are refused, naming the file; a value out of its bounds is refused as on
  // the command line. (--data, --steps and --out bound the run a regression would start.)
  const std::string bounded = " --data " + data.path().string() + " --steps 1 --out " + again.path().string();
  for (const auto& [name, toml, expected] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"typo.toml", "batch-size = 4\nlearning-rate = 0.5\n", ": learning-rate is not an option of classify"},
           {"section.toml", "[train]\nlr = 0.5\n", ": [train]: classify reads its options as keys outside any section"},
           {"zero.toml", "batch-size = 0\n", "--batch-size: must be an integer >= 1, got \"0\""}}) {
    CAPTURE(name);
    write_bytes(data.file(name), toml);
    const Result r = run_app(EF_CLASSIFY_BIN, "--config " + data.file(name) + bounded);
    CHECK(r.rc == 2);
    const std::string message = expected.starts_with(": ") ? "--config " + data.file(name) + expected : expected;
    CHECK_MESSAGE(r.output.find("classify: error: " + message) != std::string::npos, r.output);
  }
}

// --cuda-graph (Note [Recorded epoch steps] in apps/common/run.cpp): the full batches' step is
// recorded after two eager steps, the epochs' last, partial batch (40 images in batches of 6: six of
// 6 and one of 4) gets its own recording at its third call, in epoch 3; the replays give the eager
// run's losses bitwise, dropout and Adam included, on two devices, and a --resume of a recorded
// run continues it exactly.
namespace {
void check_cuda_graph(const std::string& devices, const std::string& extra_args) {
  CAPTURE(devices);
  TempDir data, eager, recorded, split;
  write_fashion_split(data, "train", 40, 0);
  write_fashion_split(data, "t10k", 20, 3);
  const std::string common = "--data " + data.path().string() + " --devices " + devices +
                             " --batch-size 6 --epochs 3 --workers 1 --threads 1 --print-loss " + extra_args;
  const auto reference = step_losses(output_of(run_app(EF_CLASSIFY_BIN, common + " --out " + eager.path().string())));
  const std::string replayed =
      output_of(run_app(EF_CLASSIFY_BIN, common + " --cuda-graph --out " + recorded.path().string()));
  REQUIRE(reference.size() == 21);
  CHECK(step_losses(replayed) == reference);  // bitwise
  size_t recordings = 0;
  for (size_t at = replayed.find("step graph: recorded the step"); at != std::string::npos;
       at = replayed.find("step graph: recorded the step", at + 1))
    ++recordings;
  CHECK_MESSAGE(recordings == 2, replayed);
  CHECK(replayed.find("running the step eagerly") == std::string::npos);

  auto both = step_losses(
      output_of(run_app(EF_CLASSIFY_BIN, common + " --cuda-graph --steps 10 --out " + split.path().string())));
  for (const auto& l : step_losses(
           output_of(run_app(EF_CLASSIFY_BIN, common + " --cuda-graph --resume --out " + split.path().string()))))
    both.push_back(l);
  CHECK(both == reference);
}
}  // namespace

TEST_CASE("classify: --cuda-graph on CPU devices replays the eager run's losses bitwise, and resumes exactly") {
  check_cuda_graph("cpu:2", "");
}

// On a GPU (scripts/gpu_check.sh): one CUDA graph a step, cuDNN's deterministic algorithms so that
// the eager run repeats bit for bit; float32 (wgan_gp's test covers float64 too).
TEST_CASE("classify: --cuda-graph on a GPU replays the eager run's losses bitwise, and resumes exactly") {
  if (!evenflow::testing::cuda_devices_available(1)) return;
  check_cuda_graph("cuda:0", "--cudnn-deterministic");
}
