// bench_engine: GFLOP/s of matmul and conv2d, forward and forward+backward, the bandwidth of an
// elementwise add, and the overhead per op of tiny tensors (µs), on one device.
// scripts/bench_engine.sh runs the same cases in PyTorch in the same run and prints the ratios.
// Output: one line per case, "case<TAB>seconds<TAB>rate<TAB>unit".
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "apps/common/program.h"
#include "evenflow/engine/ops.h"
#include "evenflow/optim/optimizer.h"

namespace ef = evenflow;

namespace {

// Median seconds of fn over enough repetitions to fill ~min_seconds (at least 3), after warm-up.
double time_it(const std::function<void()>& fn, const ef::Device& d, double min_seconds) {
  fn();
  fn();
  ef::synchronize(d);
  std::vector<double> times;
  double total = 0;
  while (times.size() < 3 || (total < min_seconds && times.size() < 50)) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ef::synchronize(d);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    times.push_back(s);
    total += s;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void report(const std::string& name, double seconds, double amount, const char* unit) {
  std::printf("%s\t%.6f\t%.2f\t%s\n", name.c_str(), seconds, amount / seconds / 1e9, unit);
  std::fflush(stdout);
}

// For the overhead cases: seconds per op or step, shown in µs.
void report_latency(const std::string& name, double seconds, double per) {
  std::printf("%s\t%.9f\t%.3f\tus/op\n", name.c_str(), seconds / per, seconds / per * 1e6);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"evenflow engine benchmark"};
  std::string device = "cpu:0", only;
  double min_seconds = 1.0;
  int threads = 0;
  app.add_option("--device", device, "cpu:N or cuda:N");
  app.add_option("--threads", threads, "intra-op threads on CPU (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--min-seconds", min_seconds, "time budget per case")->check(CLI::PositiveNumber & ef::apps::finite());
  app.add_option("--only", only, "run only cases whose name contains this");
  std::string tf32 = "conv", precision = "fp32";
  app.add_option("--precision", precision,
                 "fp32, or bf16: the matmul and conv cases with bfloat16 operands and float32 accumulation")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--tf32", tf32,
                 "CUDA float32 on TF32 tensor cores: conv (convolutions only, the default, as PyTorch's), all or none")
      ->check(CLI::IsMember({"conv", "all", "none"}));
  return ef::apps::run_program(app, argc, argv, "bench_engine", [&] {
    const ef::Device d(device);
    // cuDNN's timed algorithm choice, as bench_torch.py's cudnn.benchmark.
    ef::set_cuda_math({.allow_tf32_conv = tf32 != "none", .allow_tf32_matmul = tf32 == "all", .benchmark = true});
    const ef::DType compute = precision == "bf16" ? ef::kBFloat16 : ef::kFloat32;
    if (threads > 0) ef::set_num_threads(threads);
    const ef::TensorOptions o{.dtype = ef::kFloat32, .device = d};
    ef::manual_seed(d, 0);

    for (auto [m, k, n] :
         {std::tuple<int64_t, int64_t, int64_t>{1024, 1024, 1024}, {4096, 1024, 1024}, {100, 3136, 1024}}) {
      const std::string name = "matmul_" + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
      if (!only.empty() && name.find(only) == std::string::npos) continue;
      const ef::Tensor a = ef::randn({m, k}, o), b = ef::randn({k, n}, o);
      const double flops = 2.0 * static_cast<double>(m * k * n);
      report(name + "_fwd", time_it([&] { ef::matmul(a, b, {.compute = compute}); }, d, min_seconds), flops, "GFLOP/s");
      const ef::Tensor ag = a.detach().requires_grad_(), bg = b.detach().requires_grad_();
      const ef::Tensor gy = ef::randn({m, n}, o);
      report(name + "_fwdbwd", time_it([&] { ef::matmul(ag, bg, {.compute = compute}).backward(gy); }, d, min_seconds),
             3 * flops, "GFLOP/s");
    }

    struct ConvCase {
      const char* name;
      int64_t n, c, h, w, o, k, pad;
    };
    for (const ConvCase& c : {ConvCase{"conv_fmnist1_100x1x28x28_k5x32", 100, 1, 28, 28, 32, 5, 2},
                              ConvCase{"conv_fmnist2_100x32x14x14_k5x64", 100, 32, 14, 14, 64, 5, 2},
                              ConvCase{"conv_resnet_32x64x56x56_k3x64", 32, 64, 56, 56, 64, 3, 1}}) {
      if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
      const ef::Tensor x = ef::randn({c.n, c.c, c.h, c.w}, o), w = ef::randn({c.o, c.c, c.k, c.k}, o);
      const ef::Conv2dOptions co{.padding = {c.pad, c.pad}, .compute = compute};
      const double flops = 2.0 * static_cast<double>(c.n * c.o * c.h * c.w * c.c * c.k * c.k);
      report(std::string(c.name) + "_fwd", time_it([&] { ef::conv2d(x, w, ef::Tensor(), co); }, d, min_seconds), flops,
             "GFLOP/s");
      const ef::Tensor xg = x.detach().requires_grad_(), wg = w.detach().requires_grad_();
      const ef::Tensor gy = ef::randn({c.n, c.o, c.h, c.w}, o);
      report(std::string(c.name) + "_fwdbwd",
             time_it([&] { ef::conv2d(xg, wg, ef::Tensor(), co).backward(gy); }, d, min_seconds), 3 * flops, "GFLOP/s");
    }

    // Normalization (Note [Fused normalization]): a transformer-like layer norm, a ResNet batch norm
    // and the wgan_gp generator's batch norm of [N, C] (after its Linear), in training, in input
    // elements per second.
    struct NormCase {
      std::string name;
      ef::Shape shape;
      int64_t features;
    };
    for (const auto& [name, shape, features] :
         {NormCase{"layer_norm_8192x1024", {8192, 1024}, 1024},
          NormCase{"batch_norm_32x64x56x56", {32, 64, 56, 56}, 64}, NormCase{"batch_norm_64x3136", {64, 3136}, 3136}}) {
      if (!only.empty() && name.find(only) == std::string::npos) continue;
      const bool layer = name.starts_with("layer");
      const ef::Tensor x = ef::randn(shape, o), gy = ef::randn(shape, o);
      const ef::Tensor w = ef::ones({features}, o).requires_grad_(), b = ef::zeros({features}, o).requires_grad_();
      const auto norm = [&](const ef::Tensor& in) {
        return layer ? ef::layer_norm(in, {features}, w, b) : ef::batch_norm(in, w, b, {}, {}, true);
      };
      const auto elements = static_cast<double>(x.numel());
      {
        ef::NoGradGuard no_grad;
        report(name + "_fwd", time_it([&] { norm(x); }, d, min_seconds), elements, "Gelem/s");
      }
      const ef::Tensor xg = x.detach().requires_grad_();
      report(name + "_fwdbwd", time_it([&] { norm(xg).backward(gy); }, d, min_seconds), elements, "Gelem/s");
    }

    if (only.empty() || std::string("add_bandwidth").find(only) != std::string::npos) {
      const int64_t n = int64_t{1} << 26;  // 256 MiB per float32 operand
      const ef::Tensor a = ef::randn({n}, o), b = ef::randn({n}, o);
      report("add_bandwidth_64M", time_it([&] { ef::add(a, b); }, d, min_seconds), 3.0 * 4.0 * static_cast<double>(n),
             "GB/s");
      report("copy_bandwidth_64M", time_it([&] { ef::clone(a); }, d, min_seconds), 2.0 * 4.0 * static_cast<double>(n),
             "GB/s");
    }

    // What a small-batch step pays per op besides arithmetic: allocation, autograd nodes, dispatch.
    if (only.empty() || std::string("overhead").find(only) != std::string::npos) {
      constexpr int kAdds = 10000;
      const ef::Tensor x = ef::randn({16}, o).requires_grad_();
      const auto chain = [&] {
        ef::Tensor y = x;
        for (int i = 0; i < kAdds; ++i) y = y + x;
        return y;
      };
      {
        ef::NoGradGuard no_grad;
        report_latency("overhead_add16_nograd", time_it([&] { chain(); }, d, min_seconds), kAdds);
      }
      report_latency("overhead_add16_autograd_fwd", time_it([&] { chain(); }, d, min_seconds), kAdds);
      report_latency("overhead_add16_autograd_fwdbwd", time_it([&] { ef::sum(chain()).backward(); }, d, min_seconds),
                     kAdds);
      // A tiny MLP (16 → 32 → 32 → 1, batch 16) trained by Adam: forward, loss, backward, step.
      std::vector<ef::Tensor> params;
      for (auto [out, in] : {std::pair<int64_t, int64_t>{32, 16}, {32, 32}, {1, 32}}) {
        params.push_back(ef::mul_scalar(ef::randn({out, in}, o), 0.1).requires_grad_());
        params.push_back(ef::zeros({out}, o).requires_grad_());
      }
      ef::optim::Adam adam(params, {.lr = 1e-3});
      const ef::Tensor input = ef::randn({16, 16}, o), target = ef::randn({16, 1}, o);
      constexpr int kSteps = 100;
      report_latency("overhead_mlp_adam_step",
                     time_it(
                         [&] {
                           for (int i = 0; i < kSteps; ++i) {
                             adam.zero_grad();
                             ef::Tensor h = ef::relu(ef::linear(input, params[0], params[1]));
                             h = ef::relu(ef::linear(h, params[2], params[3]));
                             const ef::Tensor out = ef::linear(h, params[4], params[5]);
                             ef::mean(ef::square(out - target)).backward();
                             adam.step();
                           }
                         },
                         d, min_seconds),
                     kSteps);
    }
    return 0;
  });
}
