// apps/wgan_gp end to end on a tiny synthetic FashionMNIST: it writes samples, metrics with the
// Fréchet distance, curves and checkpoints; --resume continues with bitwise-identical losses; the
// critic and generator steps on three CPU devices equal one device (float64, every normalization
// and penalty); bad arguments exit 2 with a one-line message.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "apps/common/fashion_cnn.h"
#include "evenflow/io/checkpoint.h"
#include "tests/testing/helpers.h"
#include "tests/train/app_runner.h"

using namespace evenflow::testing;

namespace {

AppResult run_wgan(const std::string& args) {
  return run_app(EF_WGAN_GP_BIN, args);
}

// The losses a run printed (--print-loss) followed by those of its --resume: those of one run.
std::vector<std::pair<std::string, double>> losses_of(const AppResult& first, const AppResult& resumed) {
  auto both = labelled_losses(first.output);
  const auto rest = labelled_losses(resumed.output);
  both.insert(both.end(), rest.begin(), rest.end());
  return both;
}

struct Data {
  TempDir dir;
  std::string classifier;
  Data() {
    write_fashion_split(dir, "train", 48, 0);
    write_fashion_split(dir, "t10k", 24, 3);
    classifier = dir.file("classifier.safetensors");
    evenflow::manual_seed(1);
    evenflow::io::save_module(*evenflow::apps::make_fashion_cnn(), classifier);
  }
  std::string args() const {
    return "--data " + dir.path().string() + " --classifier " + classifier +
           " --batch-size 8 --width 4 --z-dim 8 --workers 1 --threads 1 --fid-samples 16 --final-fid-samples 20 ";
  }
};

}  // namespace

TEST_CASE("wgan_gp: outputs, the Frechet distance, and an exact --resume") {
  Data data;
  TempDir whole, split;
  const std::string common = data.args() + "--critic-steps 2 --sample-every 2 --fid-every 2 --print-loss";
  const AppResult full = run_wgan(common + " --steps 4 --out " + whole.path().string());
  REQUIRE_MESSAGE(full.rc == 0, full.output);
  CHECK(full.output.find("Frechet distance floor") != std::string::npos);
  const auto reference = labelled_losses(full.output);
  REQUIRE(reference.size() == 12);  // 4 steps x (2 critic + 1 generator)
  for (const char* file : {"samples/step_000002.png", "samples/step_000004.png", "curves.png"})
    CHECK(read_bytes(whole.file(file)).substr(0, 8) == "\x89PNG\r\n\x1a\n");
  const std::string csv = read_bytes(whole.file("metrics.csv"));
  CHECK(csv.rfind("step,critic_loss,generator_loss,wasserstein,frechet,frechet_floor,seconds,images_per_s\n", 0) == 0);
  std::istringstream rows(csv);
  std::string line;
  std::getline(rows, line);
  int count = 0, with_distance = 0;
  while (std::getline(rows, line)) {
    ++count;
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    REQUIRE(cells.size() >= 6);
    if (!cells[4].empty()) {
      ++with_distance;
      CHECK(std::stod(cells[4]) >= 0.0);
      CHECK(std::stod(cells[5]) >= 0.0);
    }
  }
  CHECK(count == 4);
  CHECK(with_distance == 2);  // steps 2 and 4
  const auto ckpt = evenflow::io::load_safetensors(whole.file("checkpoint.safetensors"));
  CHECK(ckpt.contains("gen.model.fc.weight"));
  CHECK(ckpt.contains("critic.optim.state.0.exp_avg"));
  CHECK(evenflow::io::load_safetensors(whole.file("generator.safetensors")).contains("up2.weight"));

  check_tensorboard(whole.path().string(), "penalty,learning_rate,final_frechet", "samples");

  // Note [Final evaluation]: its own count of images, its own noise (not the periodic distance's:
  // the last row of metrics.csv holds another figure), written once the last step is done.
  const std::string evaluation = read_bytes(whole.file("evaluation.json"));
  const nlohmann::json parsed = nlohmann::json::parse(evaluation);
  CHECK(parsed.at("step") == 4);
  CHECK(parsed.at("images") == 20);
  CHECK(parsed.at("floor").get<double>() > 0.0);
  const double final_distance = parsed.at("frechet").get<double>();
  CHECK(std::isfinite(final_distance));
  CHECK(final_distance >= 0.0);
  CHECK(full.output.find("final Frechet distance (20 generated images vs the test set)") != std::string::npos);

  const AppResult first = run_wgan(common + " --steps 2 --out " + split.path().string());
  REQUIRE_MESSAGE(first.rc == 0, first.output);
  // As if the first run had gone on to log steps 3 and 4 and been killed before saving them: its
  // event file replaced by the whole run's (steps 1-4). The resumed run's restart must hide steps 3
  // and 4 of it from TensorBoard (check_tensorboard: each step once, with the resumed values).
  const auto event_files = [](const TempDir& d) {
    std::vector<std::filesystem::path> files;
    for (const auto& f : std::filesystem::directory_iterator(d.path()))
      if (f.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(f.path());
    return files;
  };
  REQUIRE(event_files(split).size() == 1);
  std::filesystem::remove(event_files(split)[0]);
  std::filesystem::copy_file(event_files(whole)[0], split.path() / "events.out.tfevents.0000000001.killed.evenflow");
  const AppResult resumed = run_wgan(common + " --steps 4 --resume --out " + split.path().string());
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
  CHECK(resumed.output.find("at generator step 2") != std::string::npos);
  CHECK(losses_of(first, resumed) == reference);  // bitwise
  CHECK(event_files(split).size() == 2);
  // The final evaluation does not depend on how the run got there, nor on being run again.
  CHECK(read_bytes(split.file("evaluation.json")) == evaluation);
  const AppResult again = run_wgan(common + " --steps 4 --resume --out " + whole.path().string());
  REQUIRE_MESSAGE(again.rc == 0, again.output);
  CHECK(read_bytes(whole.file("evaluation.json")) == evaluation);
  // Steps 1 and 2 of the stand-in file are the whole run's: the same losses, other timings.
  check_tensorboard(split.path().string(), "penalty,learning_rate", "samples", "seconds,images_per_s");
}

TEST_CASE("wgan_gp: three CPU devices equal one device (float64)") {
  Data data;
  for (const char* variant : {"--norm none --penalty wgan-gp", "--norm layernorm --penalty dragan",
                              "--norm syncbn --penalty wgan-gp", "--norm syncbn --penalty r1"}) {
    CAPTURE(variant);
    TempDir one, three;
    const std::string common = data.args() + variant + " --dtype float64 --steps 2 --critic-steps 2 --print-loss ";
    const AppResult a = run_wgan(common + "--devices cpu --out " + one.path().string());
    const AppResult b = run_wgan(common + "--devices cpu:3 --out " + three.path().string());
    REQUIRE_MESSAGE(a.rc == 0, a.output);
    REQUIRE_MESSAGE(b.rc == 0, b.output);
    CHECK(trained_on(a.output) == cpu_devices(1));
    CHECK(trained_on(b.output) == cpu_devices(3));
    const auto la = labelled_losses(a.output), lb = labelled_losses(b.output);
    REQUIRE(la.size() == 6);
    REQUIRE(lb.size() == la.size());
    for (size_t i = 0; i < la.size(); ++i) {
      CAPTURE(la[i].first);
      CHECK(lb[i].first == la[i].first);
      CHECK(std::abs(lb[i].second - la[i].second) <= 1e-10 * (1.0 + std::abs(la[i].second)));
    }
  }
}

// --layout changes where the networks' activations lie in memory, not what they compute: the
// losses are the contiguous networks' up to float32 rounding of sums in another order (reductions in
// memory order, oneDNN's channels-last kernels), in
// float32 and in bfloat16 alike: measured 9.3e-8 relative at most over three steps, 0 for some
// losses, and not 0 for all (the option takes effect); 1e-6 allowed.
TEST_CASE("wgan_gp: --layout channels-last gives the contiguous networks' losses") {
  Data data;
  for (const std::string precision : {"fp32", "bf16"}) {
    CAPTURE(precision);
    TempDir contiguous, channels_last;
    const std::string common = data.args() + "--precision " + precision + " --steps 3 --critic-steps 2 --print-loss ";
    const AppResult a = run_wgan(common + "--layout contiguous --out " + contiguous.path().string());
    const AppResult b = run_wgan(common + "--layout channels-last --out " + channels_last.path().string());
    REQUIRE_MESSAGE(a.rc == 0, a.output);
    REQUIRE_MESSAGE(b.rc == 0, b.output);
    CHECK(a.output.find("layout contiguous") != std::string::npos);
    CHECK(b.output.find("layout channels-last") != std::string::npos);
    const auto la = labelled_losses(a.output), lb = labelled_losses(b.output);
    REQUIRE(la.size() == 9);
    REQUIRE(lb.size() == la.size());
    CHECK(lb != la);
    for (size_t i = 0; i < la.size(); ++i) {
      CAPTURE(la[i].first);
      CHECK(std::abs(lb[i].second - la[i].second) <= 1e-6 * (1.0 + std::abs(la[i].second)));
    }
  }
}

// --precision bf16 through the data-parallel paths (SyncBatchNorm's collectives, the penalty's
// double backward, the gradient all-reduce in float32): three devices give what one gives up to
// float32 rounding of the sums in another order, and the losses are not float32's (the option
// takes effect: 1-3% apart here). The first loss, before any update, agrees to 1e-7; the others to
// 1e-3 relative: Adam's first update is lr times the gradient's sign, so a gradient element within
// rounding of 0 moves its weight by +lr on one side and -lr on the other, and weights 2·lr apart
// can round to other bfloat16 neighbours (measured 7.8e-5 at lr 2e-4, 4.5e-8 at 1e-4, where the
// moves stayed below bfloat16's spacing).
TEST_CASE("wgan_gp: --precision bf16 on three CPU devices equals one device") {
  Data data;
  for (const char* variant : {"--norm syncbn --penalty wgan-gp", "--norm layernorm --penalty wgan-gp"}) {
    CAPTURE(variant);
    TempDir f32, one, three;
    const std::string common = data.args() + variant + " --steps 2 --critic-steps 2 --print-loss ";
    const AppResult f = run_wgan(common + "--devices cpu --out " + f32.path().string());
    const AppResult a = run_wgan(common + "--precision bf16 --devices cpu --out " + one.path().string());
    const AppResult b = run_wgan(common + "--precision bf16 --devices cpu:3 --out " + three.path().string());
    for (const AppResult* r : {&f, &a, &b}) REQUIRE_MESSAGE(r->rc == 0, r->output);
    CHECK(trained_on(b.output) == cpu_devices(3));
    const auto lf = labelled_losses(f.output), la = labelled_losses(a.output), lb = labelled_losses(b.output);
    REQUIRE(la.size() == 6);
    REQUIRE(lb.size() == la.size());
    REQUIRE(lf.size() == la.size());
    CHECK(lf != la);
    for (size_t i = 0; i < la.size(); ++i) {
      CAPTURE(la[i].first);
      const double tolerance = la[i].first == "step 1 critic 1" ? 1e-7 : 1e-3;
      CHECK(std::abs(lb[i].second - la[i].second) <= tolerance * (1.0 + std::abs(la[i].second)));
    }
  }
}

// The GPU check's data-parallel stage (scripts/gpu_check.sh, EF_CUDA_DEVICES=0,0): the critic's
// penalty, SyncBatchNorm's collectives and the generator step on two CUDA logical devices give the
// losses of one CPU device. CUDA and the CPU round float64 differently (cuDNN's and cuBLAS's sums
// in another order), hence 1e-9 rather than the CPU's 1e-10.
TEST_CASE("wgan_gp: two CUDA logical devices equal one CPU device (float64)") {
  if (!cuda_devices_available(2)) return;
  Data data;
  for (const char* variant : {"--norm syncbn --penalty wgan-gp", "--norm layernorm --penalty dragan"}) {
    CAPTURE(variant);
    TempDir one, two;
    const std::string common = data.args() + variant + " --dtype float64 --steps 2 --critic-steps 2 --print-loss ";
    const AppResult a = run_wgan(common + "--devices cpu --out " + one.path().string());
    const AppResult b = run_wgan(common + "--devices cuda:0,1 --out " + two.path().string());
    REQUIRE_MESSAGE(a.rc == 0, a.output);
    REQUIRE_MESSAGE(b.rc == 0, b.output);
    const auto la = labelled_losses(a.output), lb = labelled_losses(b.output);
    REQUIRE(la.size() == 6);
    REQUIRE(lb.size() == la.size());
    for (size_t i = 0; i < la.size(); ++i) {
      CAPTURE(la[i].first);
      CHECK(std::abs(lb[i].second - la[i].second) <= 1e-9 * (1.0 + std::abs(la[i].second)));
    }
  }
}

// --cuda-graph records one generator step after two eager ones and replays it (Note [Step buffers] in
// apps/wgan_gp.cpp). On CPU devices the replay runs the recorded kernel calls: the eager run's losses
// to the bit, every penalty, in bfloat16 too (whose weights' copies a step keeps: Note [Conversions
// kept for a step] in engine/capture_internal.h), and a --resume of a recorded run continues it
// exactly.
TEST_CASE("wgan_gp: --cuda-graph on CPU devices replays the eager run's losses bitwise, and resumes exactly") {
  Data data;
  for (const char* variant :
       {"--norm layernorm --penalty wgan-gp", "--norm syncbn --penalty r1", "--norm layernorm --precision bf16"}) {
    CAPTURE(variant);
    TempDir eager, recorded, split;
    const std::string common = data.args() + variant + " --devices cpu:2 --critic-steps 2 --print-loss ";
    const AppResult a = run_wgan(common + "--steps 6 --out " + eager.path().string());
    const AppResult b = run_wgan(common + "--steps 6 --cuda-graph --out " + recorded.path().string());
    REQUIRE_MESSAGE(a.rc == 0, a.output);
    REQUIRE_MESSAGE(b.rc == 0, b.output);
    CHECK(trained_on(b.output) == cpu_devices(2));
    CHECK(b.output.find("step graph: recorded the step on cpu:0 and 1 more") != std::string::npos);
    const auto reference = labelled_losses(a.output);
    REQUIRE(reference.size() == 18);
    CHECK(labelled_losses(b.output) == reference);  // bitwise
    // Resumed at step 3: two eager steps, then the step recorded again and replayed.
    const AppResult first = run_wgan(common + "--steps 3 --cuda-graph --out " + split.path().string());
    const AppResult resumed = run_wgan(common + "--steps 6 --cuda-graph --resume --out " + split.path().string());
    REQUIRE_MESSAGE(first.rc == 0, first.output);
    REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
    CHECK(resumed.output.find("step graph: recorded the step") != std::string::npos);
    CHECK(losses_of(first, resumed) == reference);
  }
  const AppResult dragan = run_wgan(data.args() + "--penalty dragan --cuda-graph --steps 1");
  CHECK(dragan.rc == 2);
  CHECK(dragan.output.find("--cuda-graph with --penalty dragan") != std::string::npos);
}

// On a GPU: the recorded step is one CUDA graph. With cuDNN's deterministic algorithms the replays
// give the eager run's losses to the bit, in float32, float64 and bfloat16; on two logical devices of
// the GPU (one graph over both streams) they equal one device's in float64 to cuDNN's rounding; a
// --resume continues a recorded run exactly.
TEST_CASE("wgan_gp: --cuda-graph on a GPU replays the eager run bitwise, on two logical devices too, and resumes") {
  if (!cuda_devices_available(2)) return;
  Data data;
  for (const char* precision : {"--dtype float32", "--dtype float64", "--dtype float32 --precision bf16"}) {
    CAPTURE(precision);
    TempDir eager, recorded, split;
    const std::string common =
        data.args() + precision + " --devices cuda:0 --cudnn-deterministic --critic-steps 2 --print-loss ";
    const AppResult a = run_wgan(common + "--steps 6 --out " + eager.path().string());
    const AppResult b = run_wgan(common + "--steps 6 --cuda-graph --out " + recorded.path().string());
    REQUIRE_MESSAGE(a.rc == 0, a.output);
    REQUIRE_MESSAGE(b.rc == 0, b.output);
    CHECK(b.output.find("step graph: recorded the step on cuda:0") != std::string::npos);
    const auto reference = labelled_losses(a.output);
    REQUIRE(reference.size() == 18);
    CHECK(labelled_losses(b.output) == reference);
    const AppResult first = run_wgan(common + "--steps 3 --cuda-graph --out " + split.path().string());
    const AppResult resumed = run_wgan(common + "--steps 6 --cuda-graph --resume --out " + split.path().string());
    REQUIRE_MESSAGE(first.rc == 0, first.output);
    REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
    CHECK(losses_of(first, resumed) == reference);
  }
  TempDir one, two;
  const std::string common =
      data.args() + "--dtype float64 --cudnn-deterministic --critic-steps 2 --steps 4 --cuda-graph --print-loss ";
  const AppResult a = run_wgan(common + "--devices cuda:0 --out " + one.path().string());
  const AppResult b = run_wgan(common + "--devices cuda:0,1 --out " + two.path().string());
  REQUIRE_MESSAGE(a.rc == 0, a.output);
  REQUIRE_MESSAGE(b.rc == 0, b.output);
  CHECK(b.output.find("step graph: recorded the step on cuda:0 and 1 more") != std::string::npos);
  const auto la = labelled_losses(a.output), lb = labelled_losses(b.output);
  REQUIRE(la.size() == 12);
  REQUIRE(lb.size() == la.size());
  for (size_t i = 0; i < la.size(); ++i) {
    CAPTURE(la[i].first);
    CHECK(std::abs(lb[i].second - la[i].second) <= 1e-9 * (1.0 + std::abs(la[i].second)));
  }
}

TEST_CASE("wgan_gp: a classifier whose weights hold NaN is refused, naming the file and the tensor") {
  Data data;
  TempDir out;
  const std::string bad = data.dir.file("nan_classifier.safetensors");
  const auto net = evenflow::apps::make_fashion_cnn();
  evenflow::NoGradGuard no_grad;
  net->tensor("3.weight").fill_(std::nan(""));
  evenflow::io::save_module(*net, bad);
  std::string args = data.args();
  args.replace(args.find(data.classifier), data.classifier.size(), bad);
  const AppResult r = run_wgan(args + "--steps 1 --out " + out.path().string());
  CHECK_MESSAGE(r.rc == 2, r.output);
  CHECK_MESSAGE(
      r.output.find("wgan_gp: error: --classifier " + bad + ": '3.weight' holds nan at element 0") != std::string::npos,
      r.output);
}

// --width and --norm default to the model's: a run's config.toml leaves them out where they were not
// given (it held width=0, which did not read back), so the file reproduces the run and, read with
// another --model, gives that model's normalization.
TEST_CASE("wgan_gp: --config reads back the config.toml a run wrote; the model's defaults stay the model's") {
  Data data;
  TempDir first, again, resnet;
  // Data::args without --width: the model's 32.
  std::string args = data.args();
  args.erase(args.find("--width 4 "), std::string("--width 4 ").size());
  const AppResult a = run_wgan(args + "--steps 2 --print-loss --out " + first.path().string());
  REQUIRE_MESSAGE(a.rc == 0, a.output);
  const std::string config = read_bytes(first.file("config.toml"));
  CHECK_MESSAGE(config.find("\nwidth=") == std::string::npos, config);
  CHECK_MESSAGE(config.find("\nnorm=") == std::string::npos, config);
  CHECK_MESSAGE(config.find("\nz-dim=8\n") != std::string::npos, config);
  const AppResult b = run_wgan("--config " + first.file("config.toml") + " --out " + again.path().string());
  REQUIRE_MESSAGE(b.rc == 0, b.output);
  REQUIRE(labelled_losses(a.output).size() == 6);
  CHECK(labelled_losses(b.output) == labelled_losses(a.output));  // bitwise
  // The ResNet's normalization is none: a written norm="layernorm" would be refused for it.
  const AppResult c = run_wgan("--config " + first.file("config.toml") + " --model resnet --width 8 --steps 1 --out " +
                               resnet.path().string());
  REQUIRE_MESSAGE(c.rc == 0, c.output);
  CHECK(evenflow::io::load_safetensors(resnet.file("checkpoint.safetensors")).metadata.at("norm") == "none");
}

TEST_CASE("wgan_gp: bad arguments exit 2 with a one-line message") {
  Data data;
  TempDir out;
  for (const auto& [args, expected] : std::vector<std::pair<std::string, std::string>>{
           {data.args() + "--norm batch", "--norm must be none, layernorm or syncbn"},
           {data.args() + "--penalty wgan", "--penalty must be wgan-gp, dragan or r1"},
           {data.args() + "--devices tpu:1", "unknown device kind in 'tpu:1'"},
           {"--final-fid-samples 1 --data " + data.dir.path().string(),
            "--final-fid-samples 1: a distance needs at least 2 images"},
           {"--data /nonexistent/fashion", "/nonexistent/fashion"}}) {
    CAPTURE(args);
    const AppResult r = run_wgan(args + " --steps 1 --out " + out.path().string());
    CHECK(r.rc == 2);
    CHECK_MESSAGE(r.output.find("wgan_gp: error:") != std::string::npos, r.output);
    CHECK_MESSAGE(r.output.find(expected) != std::string::npos, r.output);
  }
}

TEST_CASE("wgan_gp: --ema-decay samples from the average, which a resume continues exactly") {
  Data data;
  TempDir whole, split, plain;
  const std::string common = data.args() + "--critic-steps 2 --sample-every 2 --fid-every 2 --ema-decay 0.9";
  const AppResult full = run_wgan(common + " --steps 4 --out " + whole.path().string());
  REQUIRE_MESSAGE(full.rc == 0, full.output);
  REQUIRE(run_wgan(common + " --steps 2 --out " + split.path().string()).rc == 0);
  const AppResult resumed = run_wgan(common + " --steps 4 --resume --out " + split.path().string());
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
  // The average is in the checkpoint: the resumed one is the uninterrupted one, bitwise.
  CHECK(evenflow::io::load_safetensors(split.file("checkpoint.safetensors")).contains("gen_average.model.fc.weight"));
  CHECK(read_bytes(split.file("generator.safetensors")) == read_bytes(whole.file("generator.safetensors")));
  CHECK(read_bytes(split.file("samples/step_000004.png")) == read_bytes(whole.file("samples/step_000004.png")));
  // Its batch-norm statistics are its own (Note [Generator average]), not the trained generator's.
  const auto average = evenflow::io::load_safetensors(whole.file("generator.safetensors"));
  const auto checkpoint = evenflow::io::load_safetensors(whole.file("checkpoint.safetensors"));
  CHECK(average.at("bn0.running_mean").to_vector() != checkpoint.at("gen.model.bn0.running_mean").to_vector());
  CHECK(average.at("bn0.num_batches_tracked").item() == 256);  // 2048 noise vectors in batches of 8
  // And it is not the trained generator.
  const std::string no_average = data.args() + "--critic-steps 2 --sample-every 2 --fid-every 2 --steps 4";
  REQUIRE(run_wgan(no_average + " --out " + plain.path().string()).rc == 0);
  CHECK(read_bytes(plain.file("generator.safetensors")) != read_bytes(whole.file("generator.safetensors")));
  // The final evaluation measures the trained generator too, from the same noise: what the plain
  // run (the same training, bitwise) reports as its distance.
  const auto field = [](const std::string& json, const std::string& key) {
    const nlohmann::json parsed = nlohmann::json::parse(json);
    REQUIRE_MESSAGE(parsed.contains(key), key, " in ", json);
    return parsed.at(key).get<double>();
  };
  const std::string with_average = read_bytes(whole.file("evaluation.json"));
  const std::string without = read_bytes(plain.file("evaluation.json"));
  CHECK(field(with_average, "frechet_trained_generator") == field(without, "frechet"));
  CHECK(field(with_average, "frechet") != field(without, "frechet"));
  CHECK(without.find("frechet_trained_generator") == std::string::npos);
  // A run written without it refuses a resume with it, naming the option.
  const AppResult mixed = run_wgan(no_average + " --ema-decay 0.9 --resume --out " + plain.path().string());
  CHECK(mixed.rc == 2);
  CHECK_MESSAGE(mixed.output.find("--ema-decay") != std::string::npos, mixed.output);
}

TEST_CASE("wgan_gp: --lr-decay-steps lowers the learning rates from the first step, and a resume continues them") {
  Data data;
  TempDir whole, split, constant;
  const std::string common = data.args() + "--critic-steps 2 --sample-every 2 --fid-every 2 --print-loss";
  const AppResult full = run_wgan(common + " --lr-decay-steps 4 --steps 4 --out " + whole.path().string());
  REQUIRE_MESSAGE(full.rc == 0, full.output);
  const auto decayed = labelled_losses(full.output);
  const AppResult plain = run_wgan(common + " --steps 4 --out " + constant.path().string());
  REQUIRE_MESSAGE(plain.rc == 0, plain.output);
  const auto reference = labelled_losses(plain.output);
  REQUIRE(decayed.size() == 12);  // 4 steps x (2 critic + 1 generator)
  REQUIRE(reference.size() == 12);
  // Step 1 runs at --lr, so its three losses and step 2's first critic loss (computed before any
  // update of step 2) are the constant run's; step 2's rate is 3/4 of it, so from step 2's second
  // critic loss on (after a critic update at that rate) the runs differ.
  for (size_t i = 0; i < 4; ++i) CHECK(decayed[i] == reference[i]);
  CHECK(decayed[4] != reference[4]);
  // Stopped at step 2 and resumed to 4: the uninterrupted run, bitwise.
  const std::string schedule = common + " --lr-decay-steps 4";
  const AppResult first = run_wgan(schedule + " --steps 2 --out " + split.path().string());
  REQUIRE_MESSAGE(first.rc == 0, first.output);
  const AppResult resumed = run_wgan(schedule + " --steps 4 --resume --out " + split.path().string());
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
  CHECK(losses_of(first, resumed) == decayed);
  // Another schedule is refused on resume, naming the option; and steps past the schedule's end.
  const AppResult other = run_wgan(common + " --lr-decay-steps 6 --steps 4 --resume --out " + split.path().string());
  CHECK(other.rc == 2);
  CHECK_MESSAGE(
      other.output.find("lr_decay_steps 4, this run has 6; resume with the same --lr-decay-steps") != std::string::npos,
      other.output);
  const AppResult past = run_wgan(schedule + " --steps 5 --overwrite --out " + split.path().string());
  CHECK(past.rc == 2);
  CHECK_MESSAGE(past.output.find("--steps 5 beyond --lr-decay-steps 4") != std::string::npos, past.output);
}
