// Every program against bad arguments, hostile files and an earlier run in its folder: a clean
// exit -- 2 for bad input, 1 for a failure while running -- with one line "<program>: error: ..."
// naming the option or file, never a signal; and the rules of apps/common/run.h (Note [Save order]): a run
// never replaces another's checkpoint unless told to, a resume sees the metrics that match its
// checkpoint, a non-finite loss stops the run before a save.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "evenflow/engine/device.h"
#include "tests/train/app_runner.h"

using namespace evenflow::testing;
namespace fs = std::filesystem;

namespace {

std::string bin(const std::string& program) {
  return std::string(EF_BIN_DIR) + "/" + program;
}

struct Case {
  std::string program, args, expected;
  int rc = 2;
};

void check_case(const Case& c) {
  CAPTURE(c.program);
  CAPTURE(c.args);
  const AppResult r = run_app(bin(c.program), c.args);
  CHECK_MESSAGE(r.rc == c.rc, r.output);  // a signal would read -1
  CHECK_MESSAGE(r.output.find(c.program + ": error:") != std::string::npos, r.output);
  CHECK_MESSAGE(r.output.find(c.expected) != std::string::npos, "expected \"" << c.expected << "\" in " << r.output);
  CHECK_MESSAGE(r.output.find("terminate called") == std::string::npos, r.output);
}

// A tiny FashionMNIST (raw IDX) and the arguments that make each program quick on it.
struct Data {
  TempDir dir;
  Data() {
    write_fashion_split(dir, "train", 40, 0);
    write_fashion_split(dir, "t10k", 20, 3);
  }
  std::string args(const std::string& program) const {
    const std::string common = "--data " + dir.path().string() + " --workers 1 --threads 1 ";
    if (program == "classify") return common + "--batch-size 4 --epochs 3 ";
    if (program == "segment") return common + "--batch-size 4 --epochs 3 --train-size 8 --test-size 4 --canvas 32 ";
    if (program == "wgan_gp")
      return common + "--batch-size 8 --width 4 --z-dim 8 --fid-samples 16 --final-fid-samples 16 --sample-every 1 ";
    return "";
  }
};

}  // namespace

// The programs' numeric options (add_integer, add_number in apps/common/program.h): a message naming
// the option and its bounds, in the programs' one-line form. CLI11's own checks said "Value 0 not in
// range 0.000000 to 1797693134862315708145..." and took an integer past int64 as its largest.
TEST_CASE("bad input: numbers that are not finite, not integers or out of range are refused, naming the bounds") {
  const Data data;
  const TempDir out;
  for (const auto& [program, args, expected] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"wgan_gp", "--lambda nan", "--lambda: must be a finite number >= 0, got \"nan\""},
           {"wgan_gp", "--lambda inf", "--lambda: must be a finite number >= 0, got \"inf\""},
           {"wgan_gp", "--lr nan", "--lr: must be a finite number > 0, got \"nan\""},
           {"wgan_gp", "--beta1 1.5", "--beta1: must be a finite number in [0, 1), got \"1.5\""},
           {"wgan_gp", "--beta1 1", "--beta1: must be a finite number in [0, 1), got \"1\""},
           {"wgan_gp", "--beta2 nan", "--beta2: must be a finite number in [0, 1), got \"nan\""},
           {"wgan_gp", "--ema-decay 1", "--ema-decay: must be a finite number in [0, 0.99999], got \"1\""},
           {"wgan_gp", "--seed -1", "--seed: must be an integer >= 0, got \"-1\""},
           {"wgan_gp", "--z-dim 4611686018427387904", "--z-dim: must be an integer in [1, 65536]"},
           {"wgan_gp", "--width 0", "--width: must be an integer in [1, 4096], got \"0\""},
           {"wgan_gp", "--critic-steps 1.5", "--critic-steps: must be an integer >= 1, got \"1.5\""},
           {"classify", "--lr -inf", "--lr: must be a finite number > 0, got \"-inf\""},
           {"classify", "--lr 1e-3x", "--lr: must be a finite number > 0, got \"1e-3x\""},
           {"classify", "--seed 18446744073709551616", "--seed: must be an integer in [0, 18446744073709551615]"},
           {"classify", "--epochs 99999999999999999999", "--epochs: must be an integer in [1, 9223372036854775807]"},
           {"classify", "--batch-size 0", "--batch-size: must be an integer >= 1, got \"0\""},
           {"classify", "--batch-size 0x10", "--batch-size: must be an integer >= 1, got \"0x10\""},
           {"classify", "--threads -1", "--threads: must be an integer >= 0, got \"-1\""},
           {"classify", "--threads 99999999999", "--threads: must be an integer in [0, 2147483647]"},
           {"wgan_gp", "--lambda 1e-400",
            "--lambda: must be a finite number >= 0, got \"1e-400\" (past a double's range)"},
           {"segment", "--lr nan", "--lr: must be a finite number > 0"},
           {"segment", "--canvas 0x40", "--canvas: must be an integer in [28, 1024], got \"0x40\""},
           {"segment", "--train-size 10000000000000", "--train-size: must be an integer in [1, 10000000]"},
           {"train_demo", "--penalty nan", "--penalty: must be a finite number >= 0"},
           {"train_demo", "--lr inf", "--lr: must be a finite number > 0"},
           {"bench_parallel", "--threads -1", "--threads: must be an integer >= 0"},
           {"bench_engine", "--min-seconds nan", "--min-seconds: must be a finite number > 0"},
           {"bench_loader", "--workers 0,-1", "--workers: must be an integer >= 0, got \"-1\""},
           {"bench_loader", "--batches 0", "--batches: must be an integer >= 1"},
       }) {
    // Refused while the command line is read; the rest bounds the run a regression would start.
    const bool trains = program == "classify" || program == "segment" || program == "wgan_gp";
    check_case(
        {program,
         args + (trains ? " --steps 1 --data " + data.dir.path().string() + " --out " + out.path().string() : ""),
         expected});
  }
  check_case({"segment", "--data " + data.dir.path().string() + " --canvas 4294967296", "--canvas"});
}

// Read as decimal (CLI11 alone read "010" as 8: strtoll in base 0), spaces around a number dropped
// and a sign taken, as CLI11's conversions did.
TEST_CASE("the programs read integers as decimal, and --help shows each option's bounds and default") {
  const Data data;
  const TempDir out;
  const AppResult r =
      run_app(bin("classify"), "--data " + data.dir.path().string() +
                                   " --workers ' 1' --threads +1 --batch-size 4 --epochs 010 --seed -0 --lr ' 2e-3 ' "
                                   "--steps 1 --out " +
                                   out.path().string());
  REQUIRE_MESSAGE(r.rc == 0, r.output);
  const std::string config = read_bytes(out.file("config.toml"));
  for (const std::string expected : {"\nepochs=10\n", "\nworkers=1\n", "\nthreads=1\n", "\nseed=0\n", "\nlr=2e-3\n"})
    CHECK_MESSAGE(config.find(expected) != std::string::npos, expected << " in " << config);

  const AppResult help = run_app(bin("wgan_gp"), "--help");
  CHECK_MESSAGE(help.rc == 0, help.output);
  for (const std::string expected :
       {"--steps INT (>= 1, default 10000)", "--lr FLOAT (> 0, default 0.0002)",
        "--beta2 FLOAT (in [0, 1), default 0.9)", "--model TEXT ({dcgan,resnet}, default dcgan)"})
    CHECK_MESSAGE(help.output.find(expected) != std::string::npos, expected << " in " << help.output);
  // The model's default, which 0 is not, is in the option's text.
  CHECK_MESSAGE(help.output.find("--width INT (in [1, 4096])") != std::string::npos, help.output);
}

TEST_CASE("bad input: --precision is fp32, or bf16 with float32 weights") {
  const Data data;
  TempDir dir;
  for (const std::string program : {"classify", "segment", "wgan_gp"}) {
    check_case({program, data.args(program) + "--out " + dir.file(program) + " --precision fp16",
                "--precision must be fp32 or bf16, got \"fp16\""});
    check_case({program, data.args(program) + "--out " + dir.file(program) + " --precision bf16 --dtype float64",
                "--precision bf16 needs --dtype float32"});
  }
}

TEST_CASE("bad input: --cudnn-bf16-results needs --precision bf16 and --cudnn-benchmark") {
  const Data data;
  TempDir dir;
  for (const std::string program : {"classify", "segment", "wgan_gp"}) {
    const std::string args = data.args(program) + "--out " + dir.file(program) + " --cudnn-bf16-results ";
    check_case({program, args + "--cudnn-benchmark", "--cudnn-bf16-results needs --precision bf16"});
    check_case({program, args + "--precision bf16", "got --precision bf16 without --cudnn-benchmark"});
  }
}

TEST_CASE("bad input: penalty_grads names an inputs file it cannot use") {
  TempDir dir;
  write_bytes(dir.file("not_safetensors"), "x");
  check_case({"penalty_grads", "--inputs " + dir.file("missing") + " --out " + dir.file("out"), dir.file("missing")});
  check_case({"penalty_grads", "--inputs " + dir.file("not_safetensors") + " --out " + dir.file("out"),
              dir.file("not_safetensors")});
}

TEST_CASE("bad input: output folders that cannot be written are refused before any work") {
  const Data data;
  TempDir dir;
  write_bytes(dir.file("a_file"), "x");
  const std::string long_name(300, 'n');  // over NAME_MAX
  for (const std::string program : {"classify", "segment", "wgan_gp"}) {
    check_case({program, data.args(program) + "--out " + dir.file("a_file"), "is a file, not a folder"});
    check_case({program, data.args(program) + "--out " + dir.file("a_file") + "/below", "--out"});
    check_case({program, data.args(program) + "--out " + dir.file(long_name), "--out"});
  }
}

TEST_CASE("bad input: symlink loops and missing files name the option or path") {
  const Data data;
  TempDir dir;
  fs::create_symlink(dir.file("loop"), dir.file("loop"));
  for (const std::string program : {"classify", "segment", "wgan_gp"})
    check_case({program, "--out " + dir.file("out") + " --data " + dir.file("loop"), dir.file("loop")});
  check_case({"wgan_gp", data.args("wgan_gp") + "--out " + dir.file("out") + " --classifier " + dir.file("loop"),
              "--classifier"});
  // A classifier named on the command line must exist (a typo would silently drop the metric).
  check_case({"wgan_gp", data.args("wgan_gp") + "--out " + dir.file("out") + " --classifier " + dir.file("typo"),
              "--classifier " + dir.file("typo") + " does not exist"});
}

TEST_CASE("bad input: classify refuses empty datasets") {
  TempDir empty, out;
  write_fashion_split(empty, "train", 0, 0);
  write_fashion_split(empty, "t10k", 0, 3);
  check_case({"classify", "--data " + empty.path().string() + " --out " + out.path().string(),
              "the training set has 0 images"});
}

namespace {
// Runs `program` for 2 steps into `out`; returns the arguments that run used (--steps aside).
std::string run_two_steps(const Data& data, const std::string& program, const TempDir& out) {
  const std::string args = data.args(program) + "--out " + out.path().string() + " ";
  const AppResult first = run_app(bin(program), args + "--steps 2");
  REQUIRE_MESSAGE(first.rc == 0, first.output);
  return args;
}
}  // namespace

TEST_CASE("an earlier run's checkpoint is replaced only with --overwrite, continued only with --resume") {
  const Data data;
  for (const std::string program : {"classify", "segment", "wgan_gp"}) {
    CAPTURE(program);
    TempDir out;
    const std::string args = run_two_steps(data, program, out);
    const std::string before = read_bytes(out.file("checkpoint.safetensors"));
    check_case({program, args + "--steps 2", "pass --resume to continue it, or --overwrite"});
    CHECK(read_bytes(out.file("checkpoint.safetensors")) == before);
    check_case({program, args + "--steps 2 --resume --overwrite", "--resume excludes --overwrite"});
    // A changed learning rate would silently be the checkpoint's: refused, naming the option.
    check_case({program, args + "--steps 3 --resume --lr 0.5", "resume with the same --lr"});
    const AppResult again = run_app(bin(program), args + "--steps 2 --overwrite");
    CHECK_MESSAGE(again.rc == 0, again.output);
    // --resume and --overwrite say what to do with --out's run: not settings, so not in config.toml
    // (a resumed run's, read back into a new folder, found nothing to resume), nor read from a file.
    const AppResult resumed = run_app(bin(program), args + "--steps 3 --resume");
    REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
    const std::string config = read_bytes(out.file("config.toml"));
    CHECK_MESSAGE(config.find("resume") == std::string::npos, config);
    TempDir fresh;
    write_bytes(fresh.file("resume.toml"), "resume = true\n");
    check_case({program,
                data.args(program) + "--config " + fresh.file("resume.toml") + " --out " + fresh.path().string(),
                "resume is not a setting of the run; give --resume on the command line"});
    check_case({program, data.args(program) + "--steps 1 --resume --out " + fresh.path().string(),
                "--resume: --out " + fresh.path().string() + " holds no checkpoint.safetensors to continue"});
  }
}

TEST_CASE("--resume: metrics past the checkpoint are dropped, a history short of it or corrupt is refused") {
  const Data data;
  for (const std::string program : {"classify", "segment", "wgan_gp"}) {
    CAPTURE(program);
    TempDir out;
    const std::string args = run_two_steps(data, program, out);
    const std::string csv = read_bytes(out.file("metrics.csv"));
    const std::string last_row = csv.substr(csv.rfind('\n', csv.size() - 2) + 1);

    // Killed after writing metrics.csv, before the checkpoint: a row for step 5 the checkpoint never
    // saw. The resume drops it and writes its own rows.
    std::string future = last_row;
    const size_t step_at = program == "wgan_gp" ? 0 : future.find(',') + 1;
    future.replace(step_at, future.find(',', step_at) - step_at, "5");
    write_bytes(out.file("metrics.csv"), csv + future);
    const AppResult resumed = run_app(bin(program), args + "--steps 3 --resume");
    REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
    const std::string after = read_bytes(out.file("metrics.csv"));
    CHECK(after.find(future) == std::string::npos);
    CHECK(after.substr(0, csv.size()) == csv);

    // The history misses the checkpoint's step, or holds what is not a finite number.
    write_bytes(out.file("metrics.csv"), csv);
    check_case({program, args + "--steps 4 --resume", "has no row for step 3"});
    std::string corrupt = after;
    corrupt.replace(corrupt.rfind(',') + 1, std::string::npos, "1e999\n");
    write_bytes(out.file("metrics.csv"), corrupt);
    check_case({program, args + "--steps 4 --resume", "metrics.csv: line"});
    corrupt.replace(corrupt.rfind(',') + 1, std::string::npos, "abc\n");
    write_bytes(out.file("metrics.csv"), corrupt);
    check_case({program, args + "--steps 4 --resume", "metrics.csv: line"});
    fs::remove(out.file("metrics.csv"));
    check_case({program, args + "--steps 4 --resume", "cannot read " + out.file("metrics.csv")});
  }
}

TEST_CASE("a loss that stops being finite ends the run with exit 1, naming the step, before a save") {
  const Data data;
  TempDir out;
  // Adam at 1e30 takes the critic's weights to overflow at once.
  check_case({"wgan_gp", data.args("wgan_gp") + "--steps 2 --lr 1e30 --out " + out.path().string(),
              "step 1: the critic loss is NaN", 1});
  CHECK_FALSE(fs::exists(out.file("checkpoint.safetensors")));
}

TEST_CASE("temporaries that killed saves left in --out are removed when a run starts") {
  const Data data;
  TempDir out;
  const pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale = out.file("checkpoint.safetensors.tmp." + std::to_string(dead));
  write_bytes(stale, std::string(1000, 'x'));
  REQUIRE(run_app(bin("classify"), data.args("classify") + "--steps 1 --out " + out.path().string()).rc == 0);
  CHECK_FALSE(fs::exists(stale));
}

// Not bad input: bench_loader on a small dataset, so that the benchmark cannot rot between runs. It
// checks itself that every row's batches equal the first row's (exit 1 otherwise).
TEST_CASE("bench_loader runs, and the batches are the same with 0 and 2 loader threads") {
  const Data data;
  const AppResult r = run_app(bin("bench_loader"), "--data " + data.dir.path().string() + " --batches 3 --workers 0,2");
  CHECK_MESSAGE(r.rc == 0, r.output);
  CHECK_MESSAGE(r.output.find("segment --augment") != std::string::npos, r.output);
}

TEST_CASE("--version: every program says its version, commit and what the build runs on, and exits 0") {
  for (const std::string program : {"classify", "segment", "wgan_gp", "bench_engine"}) {
    CAPTURE(program);
    const AppResult r = run_app(bin(program), "--version");
    CHECK_MESSAGE(r.rc == 0, r.output);
    CHECK_MESSAGE(r.output.find(program + " (evenflow " + EF_VERSION + ", commit ") == 0, r.output);
    CHECK_MESSAGE(r.output.find("\nCPU kernels: ") != std::string::npos, r.output);
    CHECK_MESSAGE(r.output.find("\nCUDA: ") != std::string::npos, r.output);
    CHECK_MESSAGE(r.output.find("\nprocesses: ") != std::string::npos, r.output);
    CHECK_MESSAGE(r.output.find("\nRay: ") != std::string::npos, r.output);
  }
}

TEST_CASE("--devices auto, every program's default: every GPU, else the program's CPU devices") {
  const Data data;
  const int gpus = evenflow::cuda_device_count();
  std::string every_gpu;
  for (int i = 0; i < gpus; ++i) every_gpu += (i ? ",cuda:" : "cuda:") + std::to_string(i);
  for (const auto& [program, on_cpu] : std::vector<std::pair<std::string, std::string>>{
           {"classify", cpu_devices(1)}, {"segment", cpu_devices(1)}, {"wgan_gp", cpu_devices(2)}}) {
    CAPTURE(program);
    const TempDir out;
    const AppResult r = run_app(bin(program), data.args(program) + "--steps 1 --out " + out.path().string());
    REQUIRE_MESSAGE(r.rc == 0, r.output);
    CHECK(trained_on(r.output) == (gpus > 0 ? every_gpu : on_cpu));
  }
}
