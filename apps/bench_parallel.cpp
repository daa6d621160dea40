// bench_parallel: memory balance and step time of data-parallel training for a segmentation-sized
// output (default batch 32 x 10 classes x 128 x 128 logits). On N devices it measures, in one run,
// each device's peak memory with the balanced criterion (each device's loss on its own chunk, only
// the scalar losses meet on the first device) and with the gather-on-first-device baseline (torch
// DataParallel: every output gathered on the first device and the loss computed there), the ratio
// first-device peak / mean of the others for each, and the step time on N devices against one.
// scripts/bench_parallel.sh runs it. Works on CPU devices ("cpu:4") and CUDA logical devices
// ("cuda:0,1"; EF_CUDA_DEVICES="0,0,0,0" makes four logical devices of one GPU).
#include <CLI/App.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "apps/common/program.h"
#include "evenflow/engine/allocator.h"
#include "evenflow/layers/layers.h"
#include "evenflow/optim/optim.h"
#include "evenflow/parallel/data_parallel.h"

namespace ef = evenflow;
namespace par = evenflow::parallel;

namespace {

struct Config {
  std::vector<ef::Device> devices;
  int64_t batch = 32, classes = 10, size = 128;
  int steps = 3;
  ef::DType dtype = ef::kFloat32;
};

enum class Mode { Balanced, Gathered };

struct Result {
  std::string name;
  std::vector<ef::Device> devices;
  std::vector<size_t> peak_bytes;  // per device, the largest over the timed steps
  double step_seconds = 0;         // median over the timed steps
  double loss = 0;                 // of the last step
};

// A small fully-convolutional segmentation net: [B, 3, H, W] images -> [B, classes, H, W] logits.
std::shared_ptr<ef::nn::Module> make_net(const Config& c) {
  ef::manual_seed(ef::cpu(), 0);
  const ef::nn::ModuleOptions o{.dtype = c.dtype};
  return std::make_shared<ef::nn::Sequential>(ef::nn::Conv2d(3, 16, 3, {.padding = 1}, o), ef::nn::ReLU(),
                                              ef::nn::Conv2d(16, 16, 3, {.padding = 1}, o), ef::nn::ReLU(),
                                              ef::nn::Conv2d(16, c.classes, 1, {}, o));
}

// The same batch for every mode and device count: images from cpu:0's generator, labels from a
// host generator, both seeded by the step number.
std::pair<ef::Tensor, ef::Tensor> make_batch(const Config& c, int step) {
  ef::manual_seed(ef::cpu(), 1000 + static_cast<uint64_t>(step));
  ef::Tensor images = ef::randn({c.batch, 3, c.size, c.size}, {.dtype = c.dtype, .device = ef::cpu()});
  std::mt19937_64 gen(2000 + static_cast<uint64_t>(step));
  std::uniform_int_distribution<int64_t> label(0, c.classes - 1);
  std::vector<int64_t> values(static_cast<size_t>(c.batch * c.size * c.size));
  for (int64_t& v : values) v = label(gen);
  return {images, ef::from_int_vector(values, {c.batch, c.size, c.size}, ef::cpu())};
}

Result run(const Config& c, Mode mode, const std::vector<ef::Device>& devices, const std::string& name) {
  par::DataParallelModel model(make_net(c), devices);
  par::DataParallelCriterion criterion(model, ef::losses::CrossEntropyLoss{});  // per-pixel, the whole batch's mean
  par::ReplicatedOptimizer<ef::optim::SGD> opt(model, ef::optim::SGDOptions{.lr = 0.01});
  Result r{.name = name, .devices = devices, .peak_bytes = std::vector<size_t>(devices.size(), 0)};
  std::vector<double> times;
  for (int step = 0; step <= c.steps; ++step) {  // step 0 warms up (allocator caches, kernels)
    // The batch is made on cpu:0 before the peaks are reset, and dropped right after the scatter,
    // so that on CPU devices, where cpu:0 is both the host and the first device, the first device's
    // peak is not inflated by the host's copy of the batch (on CUDA devices it is not on a device).
    auto [images, labels] = make_batch(c, step);
    opt.zero_grad();
    for (const ef::Device& d : devices) ef::synchronize(d);
    for (const ef::Device& d : devices) ef::reset_peak_memory(d);
    const auto t0 = std::chrono::steady_clock::now();
    {
      const par::PerDevice<ef::Tensor> xs = model.scatter(images);
      const par::PerDevice<ef::Tensor> ys = model.scatter(labels);
      images = ef::Tensor();
      labels = ef::Tensor();
      const par::PerDevice<ef::Tensor> outputs = model(xs);
      const ef::Tensor loss = mode == Mode::Balanced ? criterion(outputs, ys) : criterion.gathered(outputs, ys);
      loss.backward();
      opt.step();
      r.loss = loss.item();
    }
    for (const ef::Device& d : devices) ef::synchronize(d);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step == 0) continue;
    times.push_back(seconds);
    for (size_t i = 0; i < devices.size(); ++i)
      r.peak_bytes[i] = std::max(r.peak_bytes[i], ef::memory_stats(devices[i]).peak_allocated);
  }
  std::sort(times.begin(), times.end());
  const size_t mid = times.size() / 2;
  r.step_seconds = times.size() % 2 == 1 ? times[mid] : (times[mid - 1] + times[mid]) / 2;
  return r;
}

double mib(size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// First / mean of the others over the first `active` values (devices that got a chunk: a batch
// smaller than the group leaves the last devices idle); 0 when fewer than two.
template <typename T>
double first_over_others(const std::vector<T>& v, size_t active) {
  active = std::min(active, v.size());
  if (active < 2) return 0;
  double others = 0;
  for (size_t i = 1; i < active; ++i) others += static_cast<double>(v[i]);
  return static_cast<double>(v[0]) / (others / static_cast<double>(active - 1));
}

std::string join_devices(const std::vector<ef::Device>& devices) {
  std::string s;
  for (const ef::Device& d : devices) s += (s.empty() ? "" : " ") + d.str();
  return s;
}

void print_table(const std::vector<ef::Device>& devices, size_t active, const std::vector<Result>& results) {
  std::printf("%-10s %4s", "mode", "devs");
  for (const ef::Device& d : devices) std::printf(" %10s", (d.str() + " MiB").c_str());
  std::printf(" %12s %10s %12s\n", "first/others", "step ms", "loss");
  for (const Result& r : results) {
    std::printf("%-10s %4zu", r.name.c_str(), r.devices.size());
    for (size_t i = 0; i < devices.size(); ++i) {
      if (i < r.peak_bytes.size())
        std::printf(" %10.1f", mib(r.peak_bytes[i]));
      else
        std::printf(" %10s", "-");
    }
    if (std::min(active, r.peak_bytes.size()) > 1)
      std::printf(" %12.3f", first_over_others(r.peak_bytes, active));
    else
      std::printf(" %12s", "-");
    std::printf(" %10.1f %12.6f\n", 1e3 * r.step_seconds, r.loss);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<CLI::App> app_owner =
      ef::apps::make_app("evenflow data-parallel benchmark: per-device peak memory and step time");
  CLI::App& app = *app_owner;
  std::string devices_spec = "cpu:4", dtype = "float32";
  int threads = 0;
  Config c;
  app.add_option("--devices", devices_spec, "devices, as parallel::devices: cpu:N, cuda, cuda:0,2");
  ef::apps::add_integer(app, "--batch", c.batch, "images per step", 1);
  ef::apps::add_integer(app, "--classes", c.classes, "output channels (classes)", 1);
  ef::apps::add_integer(app, "--size", c.size, "image height and width", 1);
  ef::apps::add_integer(app, "--steps", c.steps, "timed steps, after one warm-up step", 1);
  app.add_option("--dtype", dtype, "float32 or float64")->check(CLI::IsMember({"float32", "float64"}));
  ef::apps::add_integer(app, "--threads", threads, "intra-op threads of the CPU devices (0: leave as is)", 0);
  return ef::apps::run_program(app, argc, argv, "bench_parallel", [&] {
    c.devices = par::devices(devices_spec);
    c.dtype = dtype == "float64" ? ef::kFloat64 : ef::kFloat32;
    if (threads > 0) ef::set_num_threads(threads);
    const int n = static_cast<int>(c.devices.size());

    const std::vector<int64_t> sizes = par::split_sizes(c.batch, n);
    std::string chunks;
    for (int64_t s : sizes) chunks += (chunks.empty() ? "" : " ") + std::to_string(s);
    // With uneven chunks the first device holds the largest, so a balanced run's memory ratio is
    // about the chunk ratio, not 1; say so next to the table.
    const double chunk_ratio = first_over_others(sizes, sizes.size());
    if (chunk_ratio > 1) {
      char note[64];
      std::snprintf(note, sizeof note, "; uneven, chunk ratio first/others %.3f", chunk_ratio);
      chunks += note;
    }
    if (sizes.size() < c.devices.size()) chunks += "; idle devices left out of first/others";
    std::printf("devices   %s\n", join_devices(c.devices).c_str());
    std::printf("batch     %lld (chunks %s)\n", static_cast<long long>(c.batch), chunks.c_str());
    std::printf("shape     input [%lld, 3, %lld, %lld] -> logits [%lld, %lld, %lld, %lld], %s\n",
                static_cast<long long>(c.batch), static_cast<long long>(c.size), static_cast<long long>(c.size),
                static_cast<long long>(c.batch), static_cast<long long>(c.classes), static_cast<long long>(c.size),
                static_cast<long long>(c.size), ef::dtype_name(c.dtype));
    std::printf("threads   %d intra-op per CPU device (CPU devices share the machine's cores)\n", ef::num_threads());
    std::printf("steps     1 warm-up + %d timed; peak = max over timed steps, step = median\n\n", c.steps);
    std::fflush(stdout);

    std::vector<Result> results;
    results.push_back(run(c, Mode::Balanced, c.devices, "balanced"));
    results.push_back(run(c, Mode::Gathered, c.devices, "gathered"));
    results.push_back(run(c, Mode::Balanced, {c.devices[0]}, "single"));
    print_table(c.devices, sizes.size(), results);
    std::printf("\nspeed-up %d devices vs 1: %.2fx (balanced, %.1f ms vs %.1f ms per step)\n", n,
                results[2].step_seconds / results[0].step_seconds, 1e3 * results[0].step_seconds,
                1e3 * results[2].step_seconds);
    return 0;
  });
}
