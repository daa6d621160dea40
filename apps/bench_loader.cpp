// bench_loader: what the programs' data pipelines cost, and how much of it worker threads or a Ray
// cluster take off the training thread. For classify's (FashionMNIST, batch 100) and segment's (64x64
// canvases drawn from FashionMNIST garments, batch 32) pipelines, plain and with --augment
// (apps/common/pipelines.h), it runs the first B batches of an epoch with 0, 1, 2 ... loader
// threads, and with --ray ADDRESS through that cluster with 1, 2, 4 ... batches in flight (after an
// untimed warm-up: each Ray worker reads the dataset on its first task), and prints,
// per row: batches/s and images/s as the consumer sees them, and the consumer's wait per batch
// (median and 90th percentile). With 0 threads the wait is the whole cost of making a batch on one
// core, which is what sizes a preprocessing cluster (docs/benchmarks.md, "Data loading"). Every
// row's batches are checked to be the same bits as the first row's of its pipeline (the loader's
// promise, Ray included). scripts/bench_loader.sh runs it.
#include <CLI/App.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/pipelines.h"
#include "apps/common/program.h"
#include "evenflow/data/fashion_mnist.h"
#include "evenflow/data/loader.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/error.h"
#include "evenflow/engine/ops.h"

namespace ef = evenflow;

namespace {

struct Args {
  std::string data = ef::data::kFashionMnistRoot;
  int64_t batches = 100;
  std::vector<int> workers = {0, 1, 2};
  std::string ray;
  std::vector<int> in_flight = {1, 2, 4, 8};
  std::string only;
};

struct Pipeline {
  std::string name;
  std::string description;  // apps/common/pipelines.h
  int64_t batch_size;
};

struct Timing {
  double batches_per_s = 0, median_wait_ms = 0, p90_wait_ms = 0;
  double checksum = 0;  // sum of every image value and label, to compare rows
};

// `ray` null: the batches made here by `workers` threads; else by the cluster, `workers` at a time.
Timing measure(const ef::data::Pipeline& p, int64_t batch_size, int workers,
               const std::shared_ptr<const ef::data::RayBatches>& ray, int64_t batches) {
  ef::data::DataLoader loader(p.dataset, {.batch_size = batch_size,
                                          .shuffle = true,
                                          .seed = 1,
                                          .num_workers = workers,
                                          .transforms = ray ? decltype(p.transforms){} : p.transforms,
                                          .ray = ray});
  const int64_t count = std::min(batches, loader.num_batches());
  std::vector<double> waits;
  Timing t;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto last = start;
  auto it = loader.begin();  // waits for batch 0
  for (int64_t k = 0; k < count; ++k) {
    if (k > 0) ++it;
    const auto now = Clock::now();
    waits.push_back(std::chrono::duration<double, std::milli>(now - last).count());
    t.checksum += ef::sum(it->images.to(ef::kFloat64)).item() + ef::sum(it->labels.to(ef::kFloat64)).item();
    last = Clock::now();  // the consumer's own work (the checksum) is not a wait
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  t.batches_per_s = static_cast<double>(count) / seconds;
  std::sort(waits.begin(), waits.end());
  t.median_wait_ms = waits[waits.size() / 2];
  t.p90_wait_ms = waits[std::min(waits.size() - 1, waits.size() * 9 / 10)];
  return t;
}

int run(const Args& a) {
  EF_CHECK(a.batches >= 1, "--batches must be at least 1, got ", a.batches);
  // Each batch is made on one core, as in the programs, where the devices' workers own the cores'
  // OpenMP teams and every other thread, loader threads included, computes alone (Note [One OpenMP
  // team per core] in engine/device.cpp).
  ef::set_num_threads(1);
  for (int w : a.workers) EF_CHECK(w >= 0, "--workers takes counts of 0 or more, got ", w);
  for (int w : a.in_flight) EF_CHECK(w >= 1, "--ray-in-flight takes counts of 1 or more, got ", w);
  constexpr int64_t kCanvas = 64;  // segment's default
  const std::vector<Pipeline> pipelines = {
      {"classify", ef::apps::classify_pipeline(a.data, false), 100},
      {"classify --augment", ef::apps::classify_pipeline(a.data, true), 100},
      {"segment", ef::apps::segment_pipeline(a.data, 4000, kCanvas, 1, false), 32},
      {"segment --augment", ef::apps::segment_pipeline(a.data, 4000, kCanvas, 1, true), 32},
  };
  std::printf("%-20s %-8s %8s %10s %10s %14s %14s\n", "pipeline", "where", "workers", "batches/s", "images/s",
              "wait ms (med)", "wait ms (p90)");
  for (const Pipeline& p : pipelines) {
    if (!a.only.empty() && p.name.find(a.only) == std::string::npos) continue;
    const ef::data::Pipeline pipeline = ef::apps::make_pipeline(p.description);
    EF_CHECK(pipeline.dataset->size() > 0, "--data ", a.data, ": no training images");
    const auto ray = ef::apps::connect_ray(a.ray, p.description);
    std::vector<std::pair<std::string, int>> rows;  // (where, workers)
    for (int w : a.workers) rows.emplace_back("threads", w);
    if (ray)
      for (int w : a.in_flight) rows.emplace_back("ray", w);
    // Every Ray worker process builds the pipeline (reads the dataset) on its first task: a start-up
    // cost, paid here, untimed, so that the rows show the steady state.
    if (ray)
      measure(pipeline, p.batch_size, *std::max_element(a.in_flight.begin(), a.in_flight.end()), ray, 4 * a.batches);
    double reference = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& [where, workers] = rows[i];
      const Timing t = measure(pipeline, p.batch_size, workers, where == "ray" ? ray : nullptr, a.batches);
      if (i == 0) reference = t.checksum;
      EF_CHECK(t.checksum == reference, p.name, ": the batches with ", workers, " ", where,
               " differ from those of the first row");
      std::printf("%-20s %-8s %8d %10.1f %10.0f %14.3f %14.3f\n", p.name.c_str(), where.c_str(), workers,
                  t.batches_per_s, t.batches_per_s * static_cast<double>(p.batch_size), t.median_wait_ms,
                  t.p90_wait_ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  const std::unique_ptr<CLI::App> app_owner = ef::apps::make_app(
      "evenflow data-loading benchmark: the programs' pipelines, plain and augmented, by loader threads and on Ray");
  CLI::App& app = *app_owner;
  app.add_option("--data", a.data, "FashionMNIST folder (IDX files, gzip or raw)");
  ef::apps::add_integer(app, "--batches", a.batches, "batches per row (from the start of an epoch)", 1);
  ef::apps::add_integer(app, "--workers", a.workers, "loader thread counts, one row each (0: on the consumer's thread)",
                        0)
      ->delimiter(',');
  app.add_option("--ray", a.ray, "also through the Ray cluster at this address (ip:port, or auto: as classify's)")
      ->expected(0, 1)
      ->default_str("auto");
  ef::apps::add_integer(app, "--ray-in-flight", a.in_flight, "with --ray, batches in flight, one row each", 1)
      ->delimiter(',');
  app.add_option("--only", a.only, "run only the pipelines whose name contains this");
  return ef::apps::run_program(app, argc, argv, "bench_loader", [&] { return run(a); });
}
