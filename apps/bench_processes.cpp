// bench_processes: the gradient all-reduce of apps/wgan_gp's critic across processes, next to a
// bare MPI_Allreduce on the same bytes, in one run. Start it under a launcher:
//   mpirun -np 2 build/apps/bench_processes --devices cpu:2
// (scripts/bench_processes.sh does, and also times wgan_gp's step on 1 process x 4 devices
// against 2 processes x 2 devices). Rows, each timed over --repeats calls after --warmup, every
// call started together on every process (a barrier) and timed as the slowest process's:
//   MPI_Allreduce        one in-place MPI_Allreduce (MPI_SUM) of all the gradient bytes of one process
//   ProcessGroup         parallel::processes()->all_reduce of the same buffer (what our paths use
//                        between processes: reduce-scatter + all-gather, the same bits everywhere)
//   gradient sync        DataParallelModel's gradient buckets over D devices per process, as a
//                        training step reduces them (DataParallelModel::finish_gradient_sync): the
//                        devices' gradients summed in the process, between the processes, and
//                        copied back to every device
// Bus bandwidth as nccl-tests define it for all-reduce: bytes x 2(P-1)/P / time over the P
// processes, the traffic each process's link carries; the ratio is the bare MPI_Allreduce's time
// over the row's (1: as fast as MPI alone).
#include <mpi.h>

#include <CLI/App.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/program.h"
#include "apps/common/wgan_critic.h"
#include "evenflow/parallel/data_parallel.h"
#include "evenflow/parallel/process_group.h"

namespace ef = evenflow;
namespace par = evenflow::parallel;

namespace {

struct Config {
  std::string devices = "cpu:2";
  int64_t width = 32;
  std::string norm = "layernorm";
  int repeats = 200, warmup = 20;
};

// The slowest process's seconds for `call`, started by every process at once; each process
// calls it the same number of times.
template <class F>
double timed_together(F&& call) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  call();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

// The median over `repeats` timed calls after `warmup` untimed ones; `prepare` runs before each,
// untimed.
template <class P, class F>
double median_seconds(const Config& c, P&& prepare, F&& call) {
  std::vector<double> times;
  for (int i = 0; i < c.warmup + c.repeats; ++i) {
    prepare();
    const double t = timed_together(call);
    if (i >= c.warmup) times.push_back(t);
  }
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<CLI::App> app_owner = ef::apps::make_app(
      "evenflow multi-process benchmark: the critic's gradient all-reduce against a bare MPI_Allreduce");
  CLI::App& app = *app_owner;
  Config c;
  app.add_option("--devices", c.devices, "each process's devices, as parallel::devices: cpu:N, cuda");
  ef::apps::add_integer(app, "--width", c.width, "the critic's width, as wgan_gp --width", 1, 4096);
  app.add_option("--norm", c.norm, "the critic's normalization, as wgan_gp --norm")
      ->check(CLI::IsMember({"layernorm", "syncbn", "none"}));
  ef::apps::add_integer(app, "--repeats", c.repeats, "timed calls per row", 1);
  ef::apps::add_integer(app, "--warmup", c.warmup, "untimed calls before them", 0);
  return ef::apps::run_program(app, argc, argv, "bench_processes", [&] {
    const std::shared_ptr<par::ProcessGroup>& processes = par::processes();
    EF_CHECK(processes->size() > 1, "bench_processes measures several processes: start it with mpirun -np P (P >= 2)");
    const std::vector<ef::Device> devices = par::devices(c.devices);
    ef::manual_seed(ef::cpu(), 0);
    par::DataParallelModel model(std::make_shared<ef::apps::WganCritic>(c.width, c.norm, ef::nn::ModuleOptions{}),
                                 devices);
    const int local = model.size();

    int64_t elements = 0;
    size_t tensors = 0;
    for (const ef::Tensor& p : model.module().parameters()) {
      elements += p.numel();
      ++tensors;
    }
    const double bytes = static_cast<double>(elements) * 4;
    const int p = processes->size();
    ef::apps::setup_done();
    std::printf("job        %d processes x %d devices (%s), MPI (%s)\n", p, local, c.devices.c_str(),
                processes->kind());
    std::printf("gradients  wgan_gp critic, width %lld, norm %s: %zu tensors, %lld float32 values, %.1f KiB\n",
                static_cast<long long>(c.width), c.norm.c_str(), tensors, static_cast<long long>(elements),
                bytes / 1024);
    std::printf("timing     median of %d calls after %d, each the slowest process's, started together\n\n", c.repeats,
                c.warmup);
    std::fflush(stdout);

    // One process's gradients in one buffer, for the two single-buffer rows.
    const ef::Tensor flat = ef::ones({elements});
    const auto refill = [&] { flat.fill_(1.0); };
    const double bare = median_seconds(c, refill, [&] {
      const int code =
          MPI_Allreduce(MPI_IN_PLACE, flat.data_ptr(), static_cast<int>(elements), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      EF_CHECK(code == MPI_SUCCESS, "MPI_Allreduce failed");
    });
    EF_CHECK(flat.data<float>()[0] == static_cast<float>(p), "MPI_Allreduce summed to ", flat.data<float>()[0]);
    const double channel = median_seconds(c, refill, [&] { processes->all_reduce(flat); });
    EF_CHECK(flat.data<float>()[0] == static_cast<float>(p), "ProcessGroup::all_reduce summed to ",
             flat.data<float>()[0]);

    // Every replica's every gradient set to ones, then the buckets reduced as after a backward.
    const auto set_gradients = [&] {
      model.reset_gradient_sync();
      for (int r = 0; r < local; ++r)
        for (const ef::Tensor& param : model.replica(r).parameters()) param.set_grad(ef::ones_like(param));
    };
    const double sync = median_seconds(c, set_gradients, [&] { model.finish_gradient_sync(); });
    const ef::Tensor g = model.replica(local - 1).parameters()[0].grad().to(ef::cpu());
    EF_CHECK(g.data<float>()[0] == static_cast<float>(p * local), "the gradient sync summed to ", g.data<float>()[0]);

    const double bus = bytes * 2.0 * (p - 1) / p;
    std::printf("%-44s %10s %12s %8s\n", "all-reduce", "time (us)", "bus (GB/s)", "ratio");
    const auto row = [&](const std::string& name, double seconds) {
      std::printf("%-44s %10.1f %12.3f %8.3f\n", name.c_str(), 1e6 * seconds, bus / seconds / 1e9, bare / seconds);
    };
    row("MPI_Allreduce (bare, one buffer)", bare);
    row("ProcessGroup::all_reduce (one buffer)", channel);
    row("gradient sync (" + std::to_string(local) + " devices/process, buckets)", sync);
    return 0;
  });
}
