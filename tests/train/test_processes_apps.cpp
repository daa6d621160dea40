// The programs across processes (Note [Processes] in parallel/process_group.h): under
// `mpirun -np 2 ... --devices cpu:2` (2 processes x 2 CPU devices) classify (dropout on), wgan_gp
// (critic and generator steps, SyncBatchNorm, every penalty) and segment (also with --augment,
// whose random draws are per image) print the losses one
// process on one device prints (float64, 1e-10); a checkpoint written by 2 x 2 resumes on 1 x 3
// and goes on as the uninterrupted run; a process that fails or is killed ends the job, with the
// other process naming it.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "apps/common/fashion_cnn.h"
#include "evenflow/io/checkpoint.h"
#include "tests/train/app_runner.h"

using namespace evenflow::testing;

namespace {

// mpirun with 2 processes; Open MPI refuses root (CI runs as root) and more processes than cores
// unless told, which its environment variables do.
const std::string kMpirun = [] {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  return std::string(EF_MPIEXEC) + " -np 2 ";
}();

// One device's run and the job's (2 processes x cpu:2, each run on the devices it says) print the
// same `expected` losses (float64, 1e-10).
void check_same_losses(const AppResult& one, const AppResult& job, size_t expected) {
  REQUIRE_MESSAGE(one.rc == 0, one.output);
  REQUIRE_MESSAGE(job.rc == 0, job.output);
  CHECK(trained_on(one.output) == cpu_devices(1));
  CHECK(trained_on(job.output) == cpu_devices(2) + " in each of 2 processes");
  const auto a = labelled_losses(one.output), b = labelled_losses(job.output);
  REQUIRE(a.size() == expected);
  REQUIRE_MESSAGE(b.size() == a.size(), job.output);  // one process prints
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].first);
    CHECK(b[i].first == a[i].first);
    CHECK(std::abs(b[i].second - a[i].second) <= 1e-10 * (1.0 + std::abs(a[i].second)));
  }
}

struct Fashion {
  TempDir dir;
  Fashion(uint32_t train, uint32_t test) {
    write_fashion_split(dir, "train", train, 0);
    write_fashion_split(dir, "t10k", test, 3);
  }
  std::string arg() const { return "--data " + dir.path().string() + " "; }
};

}  // namespace

TEST_CASE("processes: classify on 2 processes x 2 devices equals one device, and resumes on 1 x 3") {
  Fashion data(40, 20);
  TempDir one, job, split;
  const std::string common = data.arg() +
                             "--batch-size 8 --epochs 2 --workers 1 --threads 1 --dtype float64 "
                             "--seed 7 --print-loss ";
  const AppResult a = run_app(EF_CLASSIFY_BIN, common + "--devices cpu --steps 7 --out " + one.path().string());
  const AppResult b =
      run_app(kMpirun + EF_CLASSIFY_BIN, common + "--devices cpu:2 --steps 7 --out " + job.path().string());
  check_same_losses(a, b, 7);
  CHECK(b.output.find("in each of 2 processes") != std::string::npos);

  // 3 steps on 2 x 2, then --resume on one process with three devices: steps 4 to 7 as above.
  const AppResult first =
      run_app(kMpirun + EF_CLASSIFY_BIN, common + "--devices cpu:2 --steps 3 --out " + split.path().string());
  REQUIRE_MESSAGE(first.rc == 0, first.output);
  const AppResult resumed =
      run_app(EF_CLASSIFY_BIN, common + "--devices cpu:3 --resume --steps 7 --out " + split.path().string());
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.output);
  const auto whole = labelled_losses(a.output), rest = labelled_losses(resumed.output);
  REQUIRE(rest.size() == 4);
  for (size_t i = 0; i < rest.size(); ++i) {
    CAPTURE(rest[i].first);
    CHECK(rest[i].first == whole[3 + i].first);
    CHECK(std::abs(rest[i].second - whole[3 + i].second) <= 1e-10 * (1.0 + std::abs(whole[3 + i].second)));
  }
}

TEST_CASE("processes: wgan_gp critic and generator steps on 2 processes x 2 devices equal one device") {
  Fashion data(48, 24);
  const std::string classifier = data.dir.file("classifier.safetensors");
  evenflow::manual_seed(1);
  evenflow::io::save_module(*evenflow::apps::make_fashion_cnn(), classifier);
  for (const char* variant : {"--norm none --penalty wgan-gp", "--norm layernorm --penalty dragan",
                              "--norm syncbn --penalty wgan-gp", "--norm syncbn --penalty r1"}) {
    CAPTURE(variant);
    TempDir one, job;
    const std::string common =
        data.arg() + "--classifier " + classifier +
        " --batch-size 8 --width 4 --z-dim 8 --workers 1 --threads 1 --fid-samples 16 --final-fid-samples 16 " +
        variant + " --dtype float64 --steps 2 --critic-steps 2 --print-loss ";
    const AppResult a = run_app(EF_WGAN_GP_BIN, common + "--devices cpu --out " + one.path().string());
    const AppResult b = run_app(kMpirun + EF_WGAN_GP_BIN, common + "--devices cpu:2 --out " + job.path().string());
    check_same_losses(a, b, 6);
  }
}

TEST_CASE("processes: segment on 2 processes x 2 devices equals one device, with and without --augment") {
  Fashion data(24, 12);
  for (const char* augment : {"", "--augment "}) {
    CAPTURE(augment);
    TempDir one, job;
    const std::string common = data.arg() +
                               "--canvas 32 --train-size 24 --test-size 8 --batch-size 4 --workers 1 --threads 1 "
                               "--loss ce+dice --dtype float64 --steps 3 --print-loss " +
                               augment;
    const AppResult a = run_app(EF_SEGMENT_BIN, common + "--devices cpu --out " + one.path().string());
    const AppResult b = run_app(kMpirun + EF_SEGMENT_BIN, common + "--devices cpu:2 --out " + job.path().string());
    check_same_losses(a, b, 3);
  }
}

TEST_CASE("processes: a process that fails makes the other name it and the job end") {
  Fashion data(40, 20);
  TempDir out;
  // Process 1 alone is given a folder with no dataset: it fails while loading, process 0 waits for
  // it in the model's first collective and hears why.
  const std::string script = std::string("if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then d=/nonexistent; else d=") +
                             data.dir.path().string() + "; fi; exec " + EF_CLASSIFY_BIN +
                             " --data $d --devices cpu:2 --batch-size 8 --steps 3 --workers 1 --threads 1 --out " +
                             out.path().string();
  const auto start = std::chrono::steady_clock::now();
  const AppResult r = run_app(kMpirun + "sh -c", "'" + script + "'");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(r.rc != 0);
  CHECK_MESSAGE(r.output.find("classify: error: process 1 of 2: FashionMNIST: /nonexistent/") != std::string::npos,
                r.output);
  CHECK_MESSAGE(r.output.find("classify: error: process 0 of 2: ") != std::string::npos, r.output);
  CHECK_MESSAGE(r.output.find("process 1 of 2 failed: FashionMNIST: /nonexistent/") != std::string::npos, r.output);
  CHECK(seconds < 60);  // not the collective timeout (5 minutes)
  // --cuda-graph records a step on one process's devices: across processes it is a bad argument.
  const AppResult graph =
      run_app(kMpirun + EF_CLASSIFY_BIN, data.arg() +
                                             "--devices cpu:2 --cuda-graph --steps 1 --workers 1 --threads 1 "
                                             "--out " +
                                             out.path().string() + "/graph");
  CHECK(graph.rc != 0);  // each process exits 2; mpirun reports a failed job
  CHECK_MESSAGE(graph.output.find("--cuda-graph across processes") != std::string::npos, graph.output);
}

TEST_CASE("processes: a process killed mid-step ends the job with a message") {
  Fashion data(400, 20);
  TempDir out;
  // Process 1 kills itself (SIGKILL: no word to anyone) two seconds into a long run.
  const std::string script =
      std::string("if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then (sleep 2; kill -9 $$) & fi; exec ") + EF_CLASSIFY_BIN +
      " " + data.arg() + "--devices cpu:2 --batch-size 8 --epochs 50 --workers 1 --threads 1 --out " +
      out.path().string();
  const auto start = std::chrono::steady_clock::now();
  const AppResult r = run_app(kMpirun + "sh -c", "'" + script + "'");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(r.rc != 0);
  CHECK_MESSAGE(r.output.find("signal 9") != std::string::npos, r.output);
  CHECK(seconds < 60);
}
