// bench_loader: what the programs' data pipelines cost, and how much of it worker threads take off
// the training thread. For classify's (FashionMNIST, batch 100) and segment's (64x64 canvases drawn
// from FashionMNIST garments, batch 32) pipelines, plain and with --augment (apps/common/augment.h),
// it runs the first B batches of an epoch with 0, 1, 2 ... loader threads and prints, per row:
// batches/s and images/s as the consumer sees them, and the consumer's wait per batch (median and
// 90th percentile). With 0 threads the wait is the whole cost of making a batch on one core, which
// is what sizes a preprocessing cluster (docs/benchmarks.md, "Data loading"). Every row's batches
// are checked to be the same bits as the first row's of its pipeline (the loader's promise).
// scripts/bench_loader.sh runs it.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/augment.h"
#include "apps/common/program.h"
#include "apps/segment/segmentation.h"
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
  std::string only;
};

struct Pipeline {
  std::string name;
  std::shared_ptr<const ef::data::Dataset> dataset;
  int64_t batch_size;
  ef::apps::Transforms transforms;
};

struct Timing {
  double batches_per_s = 0, median_wait_ms = 0, p90_wait_ms = 0;
  double checksum = 0;  // sum of every image value and label, to compare rows
};

Timing measure(const Pipeline& p, int workers, int64_t batches) {
  ef::data::DataLoader loader(
      p.dataset,
      {.batch_size = p.batch_size, .shuffle = true, .seed = 1, .num_workers = workers, .transforms = p.transforms});
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
  const auto train = std::make_shared<ef::data::FashionMNIST>(ef::data::Split::Train, a.data);
  EF_CHECK(train->size() > 0, "--data ", a.data, ": no training images");
  constexpr int64_t kCanvas = 64;  // segment's default
  const auto canvases = std::make_shared<ef::segment::CanvasSet>(
      ef::data::load_fashion_mnist(ef::data::Split::Train, a.data), 4000, kCanvas, 1, 0);
  const std::vector<Pipeline> pipelines = {
      {"classify", train, 100, {}},
      {"classify --augment", train, 100, ef::apps::fashion_augmentation()},
      {"segment", canvases, 32, {}},
      {"segment --augment", canvases, 32, ef::apps::canvas_augmentation(kCanvas, ef::segment::kBackground)},
  };
  std::printf("%-20s %8s %10s %10s %14s %14s\n", "pipeline", "threads", "batches/s", "images/s", "wait ms (med)",
              "wait ms (p90)");
  for (const Pipeline& p : pipelines) {
    if (!a.only.empty() && p.name.find(a.only) == std::string::npos) continue;
    double reference = 0;
    for (size_t i = 0; i < a.workers.size(); ++i) {
      const Timing t = measure(p, a.workers[i], a.batches);
      if (i == 0) reference = t.checksum;
      EF_CHECK(t.checksum == reference, p.name, ": the batches with ", a.workers[i],
               " loader threads differ from those with ", a.workers[0]);
      std::printf("%-20s %8d %10.1f %10.0f %14.3f %14.3f\n", p.name.c_str(), a.workers[i], t.batches_per_s,
                  t.batches_per_s * static_cast<double>(p.batch_size), t.median_wait_ms, t.p90_wait_ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"evenflow data-loading benchmark: the programs' pipelines, plain and augmented, by loader threads"};
  app.add_option("--data", a.data, "FashionMNIST folder (IDX files, gzip or raw)");
  app.add_option("--batches", a.batches, "batches per row (from the start of an epoch)")->check(CLI::PositiveNumber);
  app.add_option("--workers", a.workers, "loader thread counts, one row each (0: on the consumer's thread)")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  app.add_option("--only", a.only, "run only the pipelines whose name contains this");
  return ef::apps::run_program(app, argc, argv, "bench_loader", [&] { return run(a); });
}
