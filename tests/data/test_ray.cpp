// Preprocessing on a Ray cluster (data/ray_batches.h), against a local cluster this test starts
// itself on a free port and stops at exit: the programs' --augment batches made by Ray are the bits
// made on the training thread (classify and segment train the same losses, bitwise, in float64, and
// classify does with every Ray worker killed mid-run, and resumed mid-epoch; 2 processes x 2 devices
// under mpirun on Ray train what 1 x 1 does locally); killing the Ray workers mid-epoch, twice,
// costs retries and no bit of any batch; a task whose workers die is submitted again, and one whose
// workers always die, a task that fails, an unreachable cluster and a driver that dies end in
// ef::Error naming the address and batch, in bounded time. One CTest entry
// (one cluster); built and run only with Ray (EF_RAY).
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "apps/common/pipelines.h"
#include "evenflow/data/loader.h"
#include "evenflow/engine/ops.h"
#include "tests/testing/helpers.h"
#include "tests/train/app_runner.h"

using namespace evenflow;
using namespace evenflow::data;
using evenflow::testing::AppResult;
using evenflow::testing::error_of;
using evenflow::testing::run_app;
using evenflow::testing::step_losses;
using evenflow::testing::TempDir;
using evenflow::testing::write_fashion_split;
using Clock = std::chrono::steady_clock;

namespace {

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n) == 0;
  ::close(s);
  EF_CHECK(ok, "test_ray: no free port");
  return ntohs(a.sin_port);
}

std::string shell(const std::string& cmd) {
  std::string out;
  if (std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

// A head node with 2 CPUs on a free port, stopped when the test ends. Its address is the one
// `ray start` prints (the node's IP: a driver that names 127.0.0.1 instead waits forever).
struct Cluster {
  std::string address;
  Cluster() {
    const std::string out = shell(std::string(EF_RAY_BIN) + "/ray start --head --port=" + std::to_string(free_port()) +
                                  " --num-cpus=2 --disable-usage-stats --include-dashboard=false");
    std::smatch m;
    if (!std::regex_search(out, m, std::regex("--address='([^']+)'"))) {
      shell(std::string(EF_RAY_BIN) + "/ray stop --force");
      EF_ERROR("test_ray: `ray start --head` failed: ", out);
    }
    address = m[1];
  }
  ~Cluster() { shell(std::string(EF_RAY_BIN) + "/ray stop --force"); }
};

const std::string& cluster() {
  static Cluster c;
  return c.address;
}

struct TinyData {
  TempDir dir;
  TinyData() {
    write_fashion_split(dir, "train", 200, 0);
    write_fashion_split(dir, "t10k", 40, 3);
  }
  std::string path() const { return dir.path().string(); }
};

// Kills every Ray worker process (their tasks in flight among them) and says how many there were;
// Ray starts new ones. `-x`: the process name, not the raylet whose command line names it.
int kill_ray_workers() {
  return std::stoi(shell("p=$(pgrep -x default_worker); [ -n \"$p\" ] && kill -9 $p; echo $p | wc -w"));
}

// run_app, killing every Ray worker process once the output has shown step `kill_at`.
AppResult run_app_killing_workers(const std::string& binary, const std::string& args, int kill_at, int* killed) {
  std::FILE* p = ::popen((binary + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  AppResult r;
  char line[4096];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    r.output += line;
    if (std::string(line).rfind("step " + std::to_string(kill_at) + " loss", 0) == 0) {
      *killed = kill_ray_workers();
      r.output += "(killed the Ray workers)\n";
    }
  }
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void check_same_losses(const AppResult& a, const AppResult& b, size_t steps, double rtol) {
  REQUIRE_MESSAGE(a.rc == 0, a.output);
  REQUIRE_MESSAGE(b.rc == 0, b.output);
  const auto la = step_losses(a.output), lb = step_losses(b.output);
  REQUIRE(la.size() == steps);
  REQUIRE(lb.size() == steps);
  for (size_t i = 0; i < steps; ++i) {
    CAPTURE(i);
    CHECK(la[i].first == lb[i].first);
    if (rtol == 0) {
      CHECK(la[i].second == lb[i].second);
    } else {
      const double x = std::stod(la[i].second), y = std::stod(lb[i].second);
      CHECK(std::abs(x - y) <= rtol * std::abs(x));
    }
  }
}

// One epoch's batches, every Ray worker killed after each batch in `kill_after` (adding up how many
// processes that killed in `killed`).
std::vector<std::pair<std::vector<double>, std::vector<int64_t>>> epoch_batches(DataLoader& loader, int64_t epoch,
                                                                                const std::set<int>& kill_after = {},
                                                                                int* killed = nullptr) {
  std::vector<std::pair<std::vector<double>, std::vector<int64_t>>> out;
  loader.epoch(epoch);
  for (Batch& b : loader) {
    out.emplace_back(b.images.to_vector(), b.labels.to_int_vector());
    if (kill_after.count(static_cast<int>(out.size())) > 0) {
      const int n = kill_ray_workers();
      if (killed != nullptr) *killed += n;
      MESSAGE("killed ", n, " Ray workers after batch ", out.size());
    }
  }
  return out;
}

// segment's arguments for the Ray tests: small augmented canvases in float64, `steps` steps.
std::string segment_args(const TinyData& data, int steps) {
  return "--data " + data.path() +
         " --augment --canvas 32 --train-size 48 --test-size 8 --batch-size 8 --loss ce+dice --dtype float64 "
         "--steps " +
         std::to_string(steps) + " --threads 1 --print-loss";
}

}  // namespace

TEST_CASE("ray: classify --augment trains the same losses, bitwise, on Ray, with its workers killed, resumed") {
  TinyData data;
  TempDir local, ray, split;
  const std::string common =
      "--data " + data.path() + " --augment --dtype float64 --batch-size 16 --epochs 2 --threads 1 --print-loss";
  const AppResult a = run_app(EF_CLASSIFY_BIN, common + " --steps 15 --workers 0 --out " + local.path().string());
  const std::string on_ray = common + " --workers 3 --ray " + cluster();
  // Every Ray worker killed after step 4 (its next batches in flight): Ray runs them again.
  int killed = 0;
  const AppResult b =
      run_app_killing_workers(EF_CLASSIFY_BIN, on_ray + " --steps 15 --out " + ray.path().string(), 4, &killed);
  CHECK(killed >= 1);
  check_same_losses(a, b, 15, 0);
  // The kill came mid-run: the program printed steps after it (--print-loss flushes each line).
  CHECK(b.output.find("(killed the Ray workers)\nstep 5 loss") != std::string::npos);
  CHECK(b.output.find("training batches made on the Ray cluster at " + cluster()) != std::string::npos);
  // Stopped at step 8 (mid-epoch: 13 steps an epoch) and resumed: the same batches from step 9 on.
  const AppResult first = run_app(EF_CLASSIFY_BIN, on_ray + " --steps 8 --out " + split.path().string());
  REQUIRE_MESSAGE(first.rc == 0, first.output);
  const AppResult rest = run_app(EF_CLASSIFY_BIN, on_ray + " --steps 15 --resume --out " + split.path().string());
  REQUIRE_MESSAGE(rest.rc == 0, rest.output);
  const auto whole = step_losses(a.output), resumed = step_losses(rest.output);
  REQUIRE(resumed.size() == 7);
  CHECK(std::vector(whole.begin() + 8, whole.end()) == resumed);
}

TEST_CASE("ray: segment --augment trains the same losses, bitwise, on Ray; --ray alone reads RAY_ADDRESS") {
  TinyData data;
  TempDir local, ray;
  const std::string common = segment_args(data, 8);
  const AppResult a = run_app(EF_SEGMENT_BIN, common + " --workers 0 --out " + local.path().string());
  const AppResult b =
      run_app(EF_SEGMENT_BIN, common + " --workers 4 --ray " + cluster() + " --out " + ray.path().string());
  check_same_losses(a, b, 8, 0);
  CHECK(b.output.find("training batches made on the Ray cluster at " + cluster()) != std::string::npos);
  // `--ray` alone takes RAY_ADDRESS, here in the form a user on one machine writes, 127.0.0.1:PORT,
  // which the program resolves to the address the node registered (data::resolve_ray_address).
  const std::string port = cluster().substr(cluster().rfind(':') + 1);
  TempDir by_env;
  const AppResult c = run_app("RAY_ADDRESS=127.0.0.1:" + port + " " + EF_SEGMENT_BIN,
                              common + " --workers 4 --out " + by_env.path().string() + " --ray");
  check_same_losses(a, c, 8, 0);
  CHECK_MESSAGE(c.output.find("training batches made on the Ray cluster at " + cluster()) != std::string::npos,
                c.output);
}

#ifdef EF_MPIEXEC
TEST_CASE("ray: segment --augment on 2 processes x 2 devices, batches from Ray, trains what 1 x 1 does locally") {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  TinyData data;
  TempDir local, ray;
  const std::string common = segment_args(data, 4);
  const AppResult a = run_app(EF_SEGMENT_BIN, common + " --devices cpu --workers 0 --out " + local.path().string());
  const AppResult b =
      run_app(std::string(EF_MPIEXEC) + " -np 2 " + EF_SEGMENT_BIN,
              common + " --devices cpu:2 --workers 2 --ray " + cluster() + " --out " + ray.path().string());
  // As the other N-devices-equal-one tests: float64 sums in another order.
  check_same_losses(a, b, 4, 1e-10);
}
#endif

TEST_CASE("ray: killing the Ray workers mid-epoch, twice, costs retries, not a bit of any batch") {
  TinyData data;
  const std::string description = apps::classify_pipeline(data.path(), true);
  const Pipeline p = apps::make_pipeline(description);
  DataLoader here(p.dataset, {.batch_size = 10, .shuffle = true, .seed = 7, .transforms = p.transforms});
  const auto ray = std::make_shared<const RayBatches>(RayOptions{.address = cluster(), .pipeline = description});
  DataLoader there(p.dataset, {.batch_size = 10, .shuffle = true, .seed = 7, .num_workers = 4, .ray = ray});
  const auto start = Clock::now();
  int workers = 0;
  // Killed after batches 5 and 6: the tasks Ray ran again after the first kill (batches 7 to 9, in
  // flight then) die again, and Ray's C++ API retries a task only once: the driver submits them anew.
  const auto killed = epoch_batches(there, 1, {5, 6}, &workers);
  CHECK(workers >= 1);
  MESSAGE("the epoch with the kill took ", std::chrono::duration<double>(Clock::now() - start).count(), " s");
  const auto expected = epoch_batches(here, 1);
  REQUIRE(killed.size() == 20);
  CHECK(killed == expected);
  // And the next epoch, on the new workers.
  CHECK(epoch_batches(there, 2) == epoch_batches(here, 2));
}

TEST_CASE("ray: a failing task, a missing task library, an unreachable cluster and a dead driver end in ef::Error") {
  // The workers cannot read the data: the task's exception, with the path, reaches the caller.
  const RayBatches broken({.address = cluster(), .pipeline = apps::classify_pipeline("/nonexistent/fashion", false)});
  const std::string failed = error_of([&] { broken.make({3, 4}, 1, 0); });
  CHECK(failed.find("dataset index 3 on the Ray cluster at " + cluster() + " failed") != std::string::npos);
  CHECK(failed.find("/nonexistent/fashion") != std::string::npos);

  // The workers cannot find the task library (on a real cluster: not at the same path on a node).
  // A copy of the driver and library, the library deleted once the driver has loaded it.
  TinyData data;
  TempDir copy;
  const std::filesystem::path built = RayBatches::built_driver();
  std::filesystem::copy_file(built, copy.path() / "ef_ray_driver");
  std::filesystem::copy_file(built.parent_path() / "libef_ray_tasks.so", copy.path() / "libef_ray_tasks.so");
  {
    std::ofstream(copy.file("driver.sh")) << "#!/bin/sh\nLD_LIBRARY_PATH=" << copy.path().string() << " exec "
                                          << copy.file("ef_ray_driver") << " \"$@\"\n";
  }
  std::filesystem::permissions(copy.file("driver.sh"), std::filesystem::perms::owner_all);
  const RayBatches lost({.address = cluster(),
                         .pipeline = apps::classify_pipeline(data.path(), false),
                         .driver = copy.file("driver.sh")});
  std::filesystem::remove(copy.path() / "libef_ray_tasks.so");
  const std::string missing = error_of([&] { lost.make({5}, 1, 0); });
  CHECK(missing.find("dataset index 5 on the Ray cluster at " + cluster() + " failed") != std::string::npos);
  CHECK(missing.find("the workers load the task library " + copy.file("libef_ray_tasks.so")) != std::string::npos);

  const std::string nowhere = "127.0.0.1:" + std::to_string(free_port());
  auto start = Clock::now();
  const std::string unreachable =
      error_of([&] { RayBatches({.address = nowhere, .pipeline = "x", .connect_timeout_s = 20}); });
  CHECK(unreachable.find(nowhere) != std::string::npos);
  CHECK(Clock::now() - start < std::chrono::seconds(60));

  const RayBatches ray({.address = cluster(), .pipeline = apps::classify_pipeline(data.path(), false)});
  CHECK(ray.make({0, 1, 2}, 1, 0).labels.to_int_vector().size() == 3);
  shell("pkill -9 -x ef_ray_driver");
  start = Clock::now();
  const std::string dead = error_of([&] { ray.make({0, 1, 2}, 1, 0); });
  CHECK(dead.find("on the Ray cluster at " + cluster()) != std::string::npos);
  CHECK(dead.find("stopped answering (killed by signal 9)") != std::string::npos);
  CHECK(Clock::now() - start < std::chrono::seconds(30));
}

TEST_CASE("ray: a batch whose worker dies is submitted again, up to 4 times, then ends in ef::Error saying so") {
  // ray_dying_pipelines.cpp's workers die (SIGKILL) the first k times they build the pipeline,
  // leaving one file per attempt in a folder. Ray's C++ API runs a task at most twice; the driver
  // submits it again, up to 4 times in all.
  TinyData data;
  TempDir thrice, always;
  const std::string pipeline = apps::classify_pipeline(data.path(), true);
  const auto attempts = [](const TempDir& d) {
    return std::distance(std::filesystem::directory_iterator(d.path()), std::filesystem::directory_iterator());
  };
  const RayBatches dies_thrice({.address = cluster(),
                                .pipeline = "die 3 " + thrice.path().string() + " " + pipeline,
                                .driver = EF_RAY_DYING_DRIVER});
  const Batch made = dies_thrice.make({7, 8, 9}, 5, 2);
  const Batch expected = make_batch(apps::make_pipeline(pipeline), {7, 8, 9}, 5, 2);
  CHECK(made.images.to_vector() == expected.images.to_vector());
  CHECK(made.labels.to_int_vector() == expected.labels.to_int_vector());
  CHECK(attempts(thrice) == 4);

  const RayBatches dies_always({.address = cluster(),
                                .pipeline = "die 1000 " + always.path().string() + " " + pipeline,
                                .driver = EF_RAY_DYING_DRIVER});
  const auto start = Clock::now();
  const std::string died = error_of([&] { dies_always.make({11, 12}, 5, 2); });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  MESSAGE("4 submissions, 8 dead workers, in ", seconds, " s: ", died);
  CHECK(died.find("dataset index 11 on the Ray cluster at " + cluster() +
                  " failed: its Ray worker died on each of 4 submissions") != std::string::npos);
  CHECK(attempts(always) == 8);
  CHECK(seconds < 120);
}
