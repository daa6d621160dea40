// bench_engine: GFLOP/s of matmul and conv2d, forward and forward+backward, the bandwidth of an
// elementwise add, and the overhead per op of tiny tensors (µs), on one device.
// scripts/bench_engine.sh runs the same cases in PyTorch in the same run and prints the ratios.
// Output: one line per case, "case<TAB>seconds<TAB>rate<TAB>unit"; a case that throws prints
// "case<TAB>failed<TAB>reason" instead, and the next one runs.
#include <CLI/App.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <new>

#include "apps/common/program.h"
#include "apps/common/run.h"
#include "apps/common/wgan_critic.h"
#include "apps/common/wgan_generator.h"
#include "evenflow/engine/ops.h"
#include "evenflow/losses/losses.h"
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

// The row of a case that threw: "name<TAB>failed<TAB>reason", the reason on one line.
void report_failure(const std::string& name, std::string reason) {
  for (char& ch : reason)
    if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
  if (reason.size() > 300) reason.resize(300);
  std::printf("%s\tfailed\t%s\n", name.c_str(), reason.c_str());
  std::fflush(stdout);
}

// Runs fn (a case, or a group's setup and its cases): one that throws costs its row, not the table
// (scripts/bench_engine.sh prints it as failed, with the reason, among the others).
void attempt(const std::string& name, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    report_failure(name, "out of memory");
  } catch (const std::exception& e) {
    report_failure(name, e.what());
  }
}

// Configurations that take turns: each runs `steps` steps, one after the other, round after
// round (this VM's speed drifts within minutes: docs/benchmarks.md, "On an AMD Zen 4"; only what
// was measured side by side compares). Seconds a step, per configuration, per round; round 0 warms
// up and is left out.
std::vector<std::vector<double>> time_in_turns(const std::vector<std::function<void()>>& step, int steps, int rounds,
                                               const ef::Device& d) {
  std::vector<std::vector<double>> seconds(step.size());
  for (int round = 0; round <= rounds; ++round) {
    for (size_t c = 0; c < step.size(); ++c) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) step[c]();
      ef::synchronize(d);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (round > 0) seconds[c].push_back(s / steps);
    }
  }
  return seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median over rounds of configuration num's time over den's (> 1: den is faster).
void report_turn_ratio(const std::string& name, const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r;
  for (size_t i = 0; i < num.size(); ++i) r.push_back(num[i] / den[i]);
  std::printf("%s\t%.4f\t%.3f\tratio\n", name.c_str(), median(r), median(r));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<CLI::App> app_owner = ef::apps::make_app("evenflow engine benchmark");
  CLI::App& app = *app_owner;
  std::string device = "cpu:0", only;
  double min_seconds = 1.0;
  int threads = 0;
  app.add_option("--device", device, "cpu:N or cuda:N");
  ef::apps::add_integer(app, "--threads", threads, "intra-op threads on CPU (default: all cores)", 0);
  ef::apps::add_number(app, "--min-seconds", min_seconds, "time budget per case", {.min = 0, .min_excluded = true});
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
    // One row each: the case's rate (or µs), or the row "failed". A group's setup runs under attempt()
    // too, named by the group.
    const auto timed = [&](const std::string& name, double amount, const char* unit, const std::function<void()>& fn) {
      attempt(name, [&] { report(name, time_it(fn, d, min_seconds), amount, unit); });
    };
    const auto timed_latency = [&](const std::string& name, double per, const std::function<void()>& fn) {
      attempt(name, [&] { report_latency(name, time_it(fn, d, min_seconds), per); });
    };

    for (auto [m, k, n] :
         {std::tuple<int64_t, int64_t, int64_t>{1024, 1024, 1024}, {4096, 1024, 1024}, {100, 3136, 1024}}) {
      const std::string name = "matmul_" + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
      if (!only.empty() && name.find(only) == std::string::npos) continue;
      attempt(name, [&] {
        const ef::Tensor a = ef::randn({m, k}, o), b = ef::randn({k, n}, o);
        const double flops = 2.0 * static_cast<double>(m * k * n);
        timed(name + "_fwd", flops, "GFLOP/s", [&] { ef::matmul(a, b, {.compute = compute}); });
        const ef::Tensor ag = a.detach().requires_grad_(), bg = b.detach().requires_grad_();
        const ef::Tensor gy = ef::randn({m, n}, o);
        timed(name + "_fwdbwd", 3 * flops, "GFLOP/s", [&] { ef::matmul(ag, bg, {.compute = compute}).backward(gy); });
      });
    }

    struct ConvCase {
      const char* name;
      int64_t n, c, h, w, o, k, pad;
    };
    for (const ConvCase& c : {ConvCase{"conv_fmnist1_100x1x28x28_k5x32", 100, 1, 28, 28, 32, 5, 2},
                              ConvCase{"conv_fmnist2_100x32x14x14_k5x64", 100, 32, 14, 14, 64, 5, 2},
                              ConvCase{"conv_resnet_32x64x56x56_k3x64", 32, 64, 56, 56, 64, 3, 1}}) {
      if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
      attempt(c.name, [&] {
        const ef::Tensor x = ef::randn({c.n, c.c, c.h, c.w}, o), w = ef::randn({c.o, c.c, c.k, c.k}, o);
        const ef::Conv2dOptions co{.padding = {c.pad, c.pad}, .compute = compute};
        const double flops = 2.0 * static_cast<double>(c.n * c.o * c.h * c.w * c.c * c.k * c.k);
        timed(std::string(c.name) + "_fwd", flops, "GFLOP/s", [&] { ef::conv2d(x, w, ef::Tensor(), co); });
        const ef::Tensor xg = x.detach().requires_grad_(), wg = w.detach().requires_grad_();
        const ef::Tensor gy = ef::randn({c.n, c.o, c.h, c.w}, o);
        timed(std::string(c.name) + "_fwdbwd", 3 * flops, "GFLOP/s",
              [&] { ef::conv2d(xg, wg, ef::Tensor(), co).backward(gy); });
      });
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
      attempt(name, [&] {
        const bool layer = name.starts_with("layer");
        const ef::Tensor x = ef::randn(shape, o), gy = ef::randn(shape, o);
        const ef::Tensor w = ef::ones({features}, o).requires_grad_(), b = ef::zeros({features}, o).requires_grad_();
        const auto norm = [&](const ef::Tensor& in) {
          return layer ? ef::layer_norm(in, {features}, w, b) : ef::batch_norm(in, w, b, {}, {}, true);
        };
        const auto elements = static_cast<double>(x.numel());
        {
          ef::NoGradGuard no_grad;
          timed(name + "_fwd", elements, "Gelem/s", [&] { norm(x); });
        }
        const ef::Tensor xg = x.detach().requires_grad_();
        timed(name + "_fwdbwd", elements, "Gelem/s", [&] { norm(xg).backward(gy); });
      });
    }

    // Exponentials and erf, elementwise and along rows (Note [Vectorized float32 exp, log, sigmoid,
    // softplus and elu]): activations and the losses' softmax, a segmentation's over the classes of
    // each pixel (dim 1 of [N, C, H, W]) too, forward only, in input elements per second.
    if (only.empty() || std::string("pointwise_exp softmax").find(only) != std::string::npos) {
      attempt("pointwise", [&] {
        ef::NoGradGuard no_grad;
        const ef::Tensor x = ef::randn({4096, 1024}, o), pixels = ef::randn({8, 21, 128, 128}, o);
        const auto elements = static_cast<double>(x.numel());
        timed("pointwise_exp_4096x1024", elements, "Gelem/s", [&] { ef::exp(x); });
        timed("pointwise_sigmoid_4096x1024", elements, "Gelem/s", [&] { ef::sigmoid(x); });
        timed("pointwise_softplus_4096x1024", elements, "Gelem/s", [&] { ef::softplus(x, 1.0, 20.0); });
        timed("pointwise_erf_4096x1024", elements, "Gelem/s", [&] { ef::erf(x); });
        timed("softmax_4096x1024", elements, "Gelem/s", [&] { ef::softmax(x, 1); });
        timed("log_softmax_8x21x128x128_dim1", static_cast<double>(pixels.numel()), "Gelem/s",
              [&] { ef::log_softmax(pixels, 1); });
      });
    }

    // Indices of the largest values (Note [CPU argmax]): a classifier's predictions (the last dim), a
    // column's (dim 0), a segmentation's per pixel (dim 1 of [N, C, H, W]), and amax over all, in input
    // elements per second.
    if (only.empty() || std::string("argmax").find(only) != std::string::npos) {
      attempt("argmax", [&] {
        ef::NoGradGuard no_grad;
        const ef::Tensor x = ef::randn({4096, 1024}, o), pixels = ef::randn({8, 21, 128, 128}, o);
        const auto elements = static_cast<double>(x.numel());
        timed("argmax_4096x1024_dim1", elements, "Gelem/s", [&] { ef::argmax(x, 1); });
        timed("argmax_4096x1024_dim0", elements, "Gelem/s", [&] { ef::argmax(x, 0); });
        timed("argmax_8x21x128x128_dim1", static_cast<double>(pixels.numel()), "Gelem/s",
              [&] { ef::argmax(pixels, 1); });
        timed("amax_4096x1024", elements, "Gelem/s", [&] { ef::amax(x); });
      });
    }

    // A gradient penalty's pass through the wgan_gp critic's LayerNorm ([64, 64, 7, 7] channels-last,
    // over [64, 7, 7]): the forward, the input gradient with create_graph, and the gradient of that
    // gradient's sum of squares (the double backward) -- by the kernel (Backend::normalize_double_backward),
    // and as differentiable ops (what a third order, or a backend without the kernel, runs: the same
    // second backward with create_graph). In input elements per second.
    if (only.empty() || std::string("layer_norm_penalty").find(only) != std::string::npos) {
      attempt("layer_norm_penalty_64x64x7x7", [&] {
        const ef::Tensor x = ef::randn({64, 64, 7, 7}, o).contiguous(ef::MemoryFormat::ChannelsLast).requires_grad_();
        const ef::Tensor w = ef::randn({64, 7, 7}, o).requires_grad_(), b = ef::randn({64, 7, 7}, o).requires_grad_();
        const ef::Tensor gy = ef::randn({64, 64, 7, 7}, o).contiguous(ef::MemoryFormat::ChannelsLast);
        const auto elements = static_cast<double>(x.numel());
        for (const bool ops : {false, true}) {
          timed(std::string("layer_norm_penalty_64x64x7x7_") + (ops ? "ops" : "kernel"), elements, "Gelem/s", [&] {
            const ef::Tensor gx = ef::grad({ef::layer_norm(x, {64, 7, 7}, w, b)}, {x}, {gy}, {.create_graph = true})[0];
            ef::grad({ef::sum(ef::square(gx))}, {x, w}, {}, {.create_graph = ops});
          });
        }
      });
    }

    // The wgan_gp critic's first layer's input gradient (a penalty's gradient at the images: 32 -> 1
    // channel, 4x4, stride 2, 14x14 -> 28x28, batch 64), which our own kernel computes: from a
    // channels-last output gradient as the channels-last critic gives it (read in place), from a
    // contiguous one, and from a channels-last one asked for contiguous (copied first).
    if (only.empty() || std::string("conv1_input_grad").find(only) != std::string::npos) {
      attempt("conv1_input_grad", [&] {
        const ef::Tensor gy = ef::randn({64, 32, 14, 14}, o), w = ef::randn({32, 1, 4, 4}, o);
        const ef::Tensor gy_cl = gy.contiguous(ef::MemoryFormat::ChannelsLast);
        const ef::Conv2dOptions contiguous{.stride = {2, 2}, .padding = {1, 1}};
        ef::Conv2dOptions channels_last = contiguous;
        channels_last.memory_format = ef::MemoryFormat::ChannelsLast;
        for (const auto& [name, g, co] :
             {std::tuple{"channels_last", gy_cl, channels_last}, std::tuple{"contiguous", gy, contiguous},
              std::tuple{"channels_last_copied", gy_cl, contiguous}})
          timed_latency(std::string("conv1_input_grad_") + name, 1, [&] {
            ef::conv2d_input_grad(g, w, {64, 1, 28, 28}, co);
          });
      });
    }

    // Copies between layouts (a transpose per image) against a plain copy of the same tensor: the
    // critic's activations. What a flatten of a channels-last tensor costs (WganCritic::forward).
    if (only.empty() || std::string("layout_copy").find(only) != std::string::npos) {
      for (const ef::Shape& shape : {ef::Shape{64, 64, 7, 7}, ef::Shape{64, 32, 14, 14}}) {
        const std::string name = "layout_copy_" + std::to_string(shape[0]) + "x" + std::to_string(shape[1]) + "x" +
                                 std::to_string(shape[2]) + "x" + std::to_string(shape[3]);
        attempt(name, [&] {
          const ef::Tensor x = ef::randn(shape, o), x_cl = x.contiguous(ef::MemoryFormat::ChannelsLast);
          const double bytes = 2.0 * 4.0 * static_cast<double>(x.numel());
          timed(name + "_plain", bytes, "GB/s", [&] { ef::clone(x); });
          timed(name + "_to_contiguous", bytes, "GB/s", [&] { ef::clone(x_cl); });
          timed(name + "_to_channels_last", bytes, "GB/s", [&] { ef::contiguous(x, ef::MemoryFormat::ChannelsLast); });
        });
      }
    }

    // One critic step of wgan_gp (batch 64, width 32, LayerNorm): the critic on a real and a generated
    // batch, the WGAN-GP penalty (a double backward), and the weights' gradients, with the critic's
    // activations contiguous (NCHW) and channels-last, in float32 and with bfloat16 compute (whatever
    // --precision says: the point is their ratios), the same weights. The four take turns, three
    // steps each (time_in_turns): medians over rounds in µs a step, and the medians of each round's
    // ratios.
    if (only.empty() || std::string("wgan_critic_step").find(only) != std::string::npos) {
      attempt("wgan_critic_step", [&] {
        struct Config {
          std::string name;
          ef::DType compute;
          bool channels_last;
        };
        const std::vector<Config> configs = {{"fp32_nchw", ef::kFloat32, false},
                                             {"fp32_channels_last", ef::kFloat32, true},
                                             {"bf16_nchw", ef::kBFloat16, false},
                                             {"bf16_channels_last", ef::kBFloat16, true}};
        std::vector<std::shared_ptr<ef::apps::WganCritic>> critics;
        for (const Config& c : configs) {
          ef::manual_seed(d, 1);
          critics.push_back(std::make_shared<ef::apps::WganCritic>(32, "layernorm", ef::nn::ModuleOptions{.device = d},
                                                                   c.channels_last));
          ef::apps::set_precision(*critics.back(), c.compute, ef::apps::WganCritic::kFloat32Layers);
        }
        const ef::Tensor real = ef::rand({64, 1, 28, 28}, o), fake = ef::rand({64, 1, 28, 28}, o);
        const ef::Tensor eps = ef::rand({64, 1, 1, 1}, o);
        std::vector<std::function<void()>> steps;
        for (const auto& critic : critics) {
          steps.push_back([&, critic] {
            const ef::losses::Critic net = [&critic](const ef::Tensor& x) { return (*critic)(x); };
            const ef::Tensor loss = ef::mean(net(fake)) - ef::mean(net(real)) +
                                    ef::losses::wgan_gp_penalty(net, real, fake, {.lambda = 10, .eps = eps});
            loss.backward();
          });
        }
        const auto seconds = time_in_turns(steps, 3, 25, d);
        for (size_t c = 0; c < configs.size(); ++c)
          report_latency("wgan_critic_step_" + configs[c].name, median(seconds[c]), 1);
        const auto ratio = [&](size_t num, size_t den) {
          report_turn_ratio("wgan_critic_step_" + configs[num].name + "_over_" + configs[den].name, seconds[num],
                            seconds[den]);
        };
        ratio(0, 2);  // bfloat16's gain, NCHW
        ratio(1, 3);  // bfloat16's gain, channels-last
        ratio(0, 3);  // channels-last bfloat16 over NCHW float32
        ratio(0, 1);  // channels-last's gain in float32
        ratio(2, 3);  // channels-last's gain in bfloat16
      });
    }

    // The whole wgan_gp training step, as `wgan_gp --devices cpu` runs it on one device (the figure
    // issue 25's 1.3x is about): 5 critic steps (a generated batch made without gradients, the critic
    // on it and on a real batch, the WGAN-GP penalty, Adam), then a generator step (the critic's
    // verdict on a generated batch, Adam); width 32, LayerNorm, batch 64, both networks channels-last
    // (wgan_gp's default --layout). Float32 against wgan_gp --precision bf16's setting (apps::set_precision),
    // from the same weights, taking turns a whole step at a time; µs a step (the 5 critic steps and
    // the generator step) and the median of each round's ratio.
    if (only.empty() || std::string("wgan_step").find(only) != std::string::npos) {
      attempt("wgan_step", [&] {
        struct Networks {
          std::shared_ptr<ef::apps::WganGenerator> generator;
          std::shared_ptr<ef::apps::WganCritic> critic;
          std::unique_ptr<ef::optim::Adam> opt_g, opt_d;
        };
        const std::vector<std::pair<std::string, ef::DType>> configs = {{"fp32", ef::kFloat32},
                                                                        {"bf16", ef::kBFloat16}};
        std::vector<Networks> nets;
        for (const auto& config : configs) {
          ef::manual_seed(d, 1);
          Networks n;
          n.generator = std::make_shared<ef::apps::WganGenerator>(128, 32, ef::nn::ModuleOptions{.device = d}, true);
          n.critic = std::make_shared<ef::apps::WganCritic>(32, "layernorm", ef::nn::ModuleOptions{.device = d}, true);
          ef::apps::set_precision(*n.generator, config.second, ef::apps::WganGenerator::kFloat32Layers);
          ef::apps::set_precision(*n.critic, config.second, ef::apps::WganCritic::kFloat32Layers);
          const ef::optim::AdamOptions adam{.lr = 1e-4, .betas = {0.0, 0.9}};
          n.opt_g = std::make_unique<ef::optim::Adam>(n.generator->parameters(), adam);
          n.opt_d = std::make_unique<ef::optim::Adam>(n.critic->parameters(), adam);
          nets.push_back(std::move(n));
        }
        const ef::Tensor real = ef::add_scalar(ef::mul_scalar(ef::rand({64, 1, 28, 28}, o), 2.0), -1.0);  // in [-1, 1]
        std::vector<std::function<void()>> steps;
        for (Networks& n : nets) {
          steps.push_back([&] {
            ef::nn::Module& critic = *n.critic;
            const ef::losses::Critic net = [&critic](const ef::Tensor& x) { return critic(x); };
            for (int k = 0; k < 5; ++k) {
              ef::Tensor fake;
              {
                ef::NoGradGuard no_grad;
                fake = (*n.generator)(ef::randn({64, 128}, o));
              }
              const ef::Tensor eps = ef::rand({64, 1, 1, 1}, o);
              const ef::Tensor loss = ef::losses::wasserstein_critic_loss(net(real), net(fake)) +
                                      ef::losses::wgan_gp_penalty(net, real, fake, {.lambda = 10, .eps = eps});
              n.opt_d->zero_grad();
              loss.backward();
              n.opt_d->step();
            }
            for (ef::Tensor p : critic.parameters()) p.requires_grad_(false);
            const ef::Tensor loss =
                ef::losses::wasserstein_generator_loss(net((*n.generator)(ef::randn({64, 128}, o))));
            n.opt_g->zero_grad();
            loss.backward();
            n.opt_g->step();
            for (ef::Tensor p : critic.parameters()) p.requires_grad_(true);
          });
        }
        const auto seconds = time_in_turns(steps, 1, 15, d);
        for (size_t c = 0; c < configs.size(); ++c)
          report_latency("wgan_step_" + configs[c].first, median(seconds[c]), 1);
        report_turn_ratio("wgan_step_fp32_over_bf16", seconds[0], seconds[1]);
      });
    }

    if (only.empty() || std::string("add_bandwidth").find(only) != std::string::npos) {
      attempt("add_bandwidth", [&] {
        const int64_t n = int64_t{1} << 26;  // 256 MiB per float32 operand
        const ef::Tensor a = ef::randn({n}, o), b = ef::randn({n}, o);
        timed("add_bandwidth_64M", 3.0 * 4.0 * static_cast<double>(n), "GB/s", [&] { ef::add(a, b); });
        timed("copy_bandwidth_64M", 2.0 * 4.0 * static_cast<double>(n), "GB/s", [&] { ef::clone(a); });
      });
    }

    // wgan_gp's host draws each critic step (Note [Vectorized draws] in cpu_elementwise.cpp): the noise z
    // (normal) and, for DRAGAN, a perturbation of the batch (uniform); the host draws them with the
    // devices waiting.
    if (only.empty() || std::string("random").find(only) != std::string::npos) {
      timed("random_uniform_64x1x28x28", 64.0 * 28 * 28, "Gelem/s", [&] { ef::rand({64, 1, 28, 28}, o); });
      timed("random_normal_64x128", 64.0 * 128, "Gelem/s", [&] { ef::randn({64, 128}, o); });
    }

    // What a small-batch step pays per op besides arithmetic: allocation, autograd nodes, dispatch.
    if (only.empty() || std::string("overhead").find(only) != std::string::npos) {
      attempt("overhead", [&] {
        constexpr int kAdds = 10000;
        const ef::Tensor x = ef::randn({16}, o).requires_grad_();
        const auto chain = [&] {
          ef::Tensor y = x;
          for (int i = 0; i < kAdds; ++i) y = y + x;
          return y;
        };
        {
          ef::NoGradGuard no_grad;
          timed_latency("overhead_add16_nograd", kAdds, [&] { chain(); });
        }
        timed_latency("overhead_add16_autograd_fwd", kAdds, [&] { chain(); });
        timed_latency("overhead_add16_autograd_fwdbwd", kAdds, [&] { ef::sum(chain()).backward(); });
        // A tiny MLP (16 → 32 → 32 → 1, batch 16) trained by Adam: forward, loss, backward, step.
        std::vector<ef::Tensor> params;
        for (auto [out, in] : {std::pair<int64_t, int64_t>{32, 16}, {32, 32}, {1, 32}}) {
          params.push_back(ef::mul_scalar(ef::randn({out, in}, o), 0.1).requires_grad_());
          params.push_back(ef::zeros({out}, o).requires_grad_());
        }
        ef::optim::Adam adam(params, {.lr = 1e-3});
        const ef::Tensor input = ef::randn({16, 16}, o), target = ef::randn({16, 1}, o);
        constexpr int kSteps = 100;
        timed_latency("overhead_mlp_adam_step", kSteps, [&] {
          for (int i = 0; i < kSteps; ++i) {
            adam.zero_grad();
            ef::Tensor h = ef::relu(ef::linear(input, params[0], params[1]));
            h = ef::relu(ef::linear(h, params[2], params[3]));
            const ef::Tensor out = ef::linear(h, params[4], params[5]);
            ef::mean(ef::square(out - target)).backward();
            adam.step();
          }
        });
      });
    }
    return 0;
  });
}
