// float32 convolution on the CPU against the float64 im2col kernels: oneDNN's (where the build has
// it, engine/cpu/onednn_conv.cpp) and whatever the float32 dispatch picks, forward, input gradient
// and weight gradient, over strides, padding, dilation, groups (depthwise too), 1x1 and 1xN / Nx1
// kernels, odd sizes, batch 1, one input or output channel, and the convolutions of bench_engine,
// classify and wgan_gp. Then two threads convolving different shapes at once, which share oneDNN's
// primitive cache, and a oneDNN failure reported as ef::Error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cpu/cpu_conv.h"
#include "evenflow/engine/device.h"
#include "tests/testing/helpers.h"
#if EF_ONEDNN
#include "evenflow/engine/cpu/onednn_conv.h"
#endif

using namespace evenflow;

namespace {

struct Geometry {
  const char* name;
  int64_t n, c_in, h, w, c_out, kh, kw, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1,
                                        groups = 1;

  ConvArgs args() const {
    ConvArgs a{.n = n,
               .c_in = c_in,
               .h = h,
               .w = w,
               .c_out = c_out,
               .kh = kh,
               .kw = kw,
               .stride_h = stride_h,
               .stride_w = stride_w,
               .pad_h = pad_h,
               .pad_w = pad_w,
               .dil_h = dil_h,
               .dil_w = dil_w,
               .groups = groups};
    a.oh = (h + 2 * pad_h - dil_h * (kh - 1) - 1) / stride_h + 1;
    a.ow = (w + 2 * pad_w - dil_w * (kw - 1) - 1) / stride_w + 1;
    return a;
  }
};

std::vector<Geometry> geometries() {
  return {
      {"3x3 pad 1", 2, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1},
      {"3x3 stride 2 pad 1, odd sizes", 2, 4, 9, 11, 6, 3, 3, 2, 2, 1, 1},
      {"2x2 stride 2, last row and column unused", 3, 5, 11, 13, 4, 2, 2, 2, 2},
      {"3x2 stride 2,1 pad 1,0 dilation 1,2 groups 2", 2, 4, 9, 8, 6, 3, 2, 2, 1, 1, 0, 1, 2, 2},
      {"5x5 pad 2 dilation 2", 2, 3, 12, 10, 5, 5, 5, 1, 1, 2, 2, 2, 2},
      {"3x3 pad 1 groups 2", 2, 4, 8, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2},
      {"depthwise 3x3 pad 1", 2, 8, 10, 10, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8},
      {"depthwise, multiplier 2, stride 2", 2, 4, 9, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1, 4},
      {"1x1", 2, 16, 5, 5, 8, 1, 1},
      {"1x1 stride 2", 2, 16, 7, 7, 8, 1, 1, 2, 2},
      {"1x5 pad 0,2", 2, 3, 6, 9, 4, 1, 5, 1, 1, 0, 2},
      {"5x1 pad 2,0", 2, 3, 9, 6, 4, 5, 1, 1, 1, 2, 0},
      {"batch 1", 1, 3, 10, 10, 4, 3, 3, 1, 1, 1, 1},
      {"one input channel", 4, 1, 9, 9, 8, 3, 3, 1, 1, 1, 1},
      {"one output channel", 4, 8, 9, 9, 1, 3, 3, 1, 1, 1, 1},
      {"5x5 kernel over a padded 3x3 image", 2, 3, 3, 3, 4, 5, 5, 1, 1, 2, 2},
      {"bench and classify conv1", 100, 1, 28, 28, 32, 5, 5, 1, 1, 2, 2},
      {"classify conv1 on cpu:2", 50, 1, 28, 28, 32, 5, 5, 1, 1, 2, 2},
      {"bench and classify conv2", 100, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2},
      {"classify conv2 on cpu:2", 50, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2},
      {"bench resnet (batch 4)", 4, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1},
      {"wgan_gp critic conv1, generator up2", 64, 1, 28, 28, 32, 4, 4, 2, 2, 1, 1},
      {"wgan_gp critic conv1, generator up2 on cpu:2", 32, 1, 28, 28, 32, 4, 4, 2, 2, 1, 1},
      {"wgan_gp critic conv2, generator up1", 64, 32, 14, 14, 64, 4, 4, 2, 2, 1, 1},
      {"wgan_gp critic conv2, generator up1 on cpu:2", 32, 32, 14, 14, 64, 4, 4, 2, 2, 1, 1},
  };
}

enum Pass { kForward, kForwardBias, kInputGrad, kWeightGrad };
const char* const kPassNames[] = {"forward", "forward with bias", "input grad", "weight grad"};
constexpr Pass kPasses[] = {kForward, kForwardBias, kInputGrad, kWeightGrad};

template <typename T>
View view_of(std::vector<T>& v, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  View out;
  out.data = v.data();
  out.dtype = std::is_same_v<T, float> ? kFloat32 : kFloat64;
  out.ndim = 4;
  const int64_t shape[4] = {d0, d1, d2, d3};
  int64_t stride = 1;
  for (int d = 3; d >= 0; --d) {
    out.shape[d] = shape[d];
    out.strides[d] = stride;
    stride *= shape[d];
  }
  return out;
}

// x, w and y of a convolution: one pass reads two of them and writes the third. The forward with
// bias also reads b.
template <typename T>
struct Operands {
  std::vector<T> x, w, y, b;
};

template <typename T>
Operands<T> operands(const ConvArgs& a) {
  Operands<T> o;
  o.x.resize(static_cast<size_t>(a.n * a.c_in * a.h * a.w));
  o.w.resize(static_cast<size_t>(a.c_out * (a.c_in / a.groups) * a.kh * a.kw));
  o.y.resize(static_cast<size_t>(a.n * a.c_out * a.oh * a.ow));
  o.b.resize(static_cast<size_t>(a.c_out));
  return o;
}

// Runs one pass of the backend's conv2d kernels on o: reads two of x, w, y and writes the third.
template <typename T>
void backend_pass(const ConvArgs& a, Pass pass, Operands<T>& o) {
  const View x = view_of(o.x, a.n, a.c_in, a.h, a.w), y = view_of(o.y, a.n, a.c_out, a.oh, a.ow);
  const View w = view_of(o.w, a.c_out, a.c_in / a.groups, a.kh, a.kw);
  View b{};
  if (pass == kForwardBias) {
    b.data = o.b.data();
    b.dtype = x.dtype;
    b.ndim = 1;
    b.shape[0] = a.c_out;
    b.strides[0] = 1;
  }
  if (pass == kForward || pass == kForwardBias) cpu_backend::conv2d_forward(a, y, x, w, b);
  if (pass == kInputGrad) cpu_backend::conv2d_input_grad(a, x, y, w);
  if (pass == kWeightGrad) cpu_backend::conv2d_weight_grad(a, w, x, y);
}

#if EF_ONEDNN
// The inputs in bfloat16, as the op gives them for bfloat16 compute.
std::vector<bfloat16> bf16_of(const std::vector<float>& v) {
  std::vector<bfloat16> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](float f) { return bfloat16(f); });
  return out;
}

void onednn_pass(const ConvArgs& a, Pass pass, Operands<float>& o) {
  if (a.compute == kBFloat16) {
    const std::vector<bfloat16> x = bf16_of(o.x), w = bf16_of(o.w), y = bf16_of(o.y);
    if (pass == kForward) cpu_backend::onednn_conv2d_forward(a, o.y.data(), x.data(), w.data(), nullptr);
    if (pass == kForwardBias) cpu_backend::onednn_conv2d_forward(a, o.y.data(), x.data(), w.data(), o.b.data());
    if (pass == kInputGrad) cpu_backend::onednn_conv2d_input_grad(a, o.x.data(), y.data(), w.data());
    if (pass == kWeightGrad) cpu_backend::onednn_conv2d_weight_grad(a, o.w.data(), x.data(), y.data());
    return;
  }
  if (pass == kForward) cpu_backend::onednn_conv2d_forward(a, o.y.data(), o.x.data(), o.w.data(), nullptr);
  if (pass == kForwardBias) cpu_backend::onednn_conv2d_forward(a, o.y.data(), o.x.data(), o.w.data(), o.b.data());
  if (pass == kInputGrad) cpu_backend::onednn_conv2d_input_grad(a, o.x.data(), o.y.data(), o.w.data());
  if (pass == kWeightGrad) cpu_backend::onednn_conv2d_weight_grad(a, o.w.data(), o.x.data(), o.y.data());
}
#endif

std::vector<double>& output_of(Operands<double>& o, Pass pass) {
  return pass == kForward || pass == kForwardBias ? o.y : pass == kInputGrad ? o.x : o.w;
}
std::vector<float>& output_of(Operands<float>& o, Pass pass) {
  return pass == kForward || pass == kForwardBias ? o.y : pass == kInputGrad ? o.x : o.w;
}

// The float64 result of one pass, and the magnitude of each output element (the same pass on the
// inputs' absolute values: the sum of the absolute values of its terms), which scales the error a
// float32 sum may carry.
struct Reference {
  Operands<float> inputs;  // the inputs in float32; the output is scratch
  std::vector<double> want, magnitude;
};

// With bf16_inputs the inputs are bfloat16 values, which a bfloat16 kernel multiplies unrounded.
Reference reference(const ConvArgs& a, Pass pass, uint32_t seed, bool bf16_inputs = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  Operands<double> o = operands<double>(a);
  // Inputs are drawn in float32 so that both sides multiply the same numbers.
  for (std::vector<double>* v : {&o.x, &o.w, &o.y, &o.b})
    for (double& e : *v) {
      const auto drawn = static_cast<float>(normal(rng));
      e = bf16_inputs ? static_cast<float>(bfloat16(drawn)) : drawn;
    }
  Reference r;
  r.inputs = operands<float>(a);
  for (auto [d, f] : {std::pair{&o.x, &r.inputs.x}, std::pair{&o.w, &r.inputs.w}, std::pair{&o.y, &r.inputs.y},
                      std::pair{&o.b, &r.inputs.b}})
    for (size_t i = 0; i < d->size(); ++i) (*f)[i] = static_cast<float>((*d)[i]);
  ConvArgs float64 = a;  // the float64 kernels, whatever `a` computes in
  float64.compute = kFloat32;
  backend_pass(float64, pass, o);
  r.want = output_of(o, pass);
  for (std::vector<double>* v : {&o.x, &o.w, &o.y, &o.b})
    for (double& e : *v) e = std::abs(e);
  backend_pass(float64, pass, o);
  r.magnitude = output_of(o, pass);
  return r;
}

// The references of the four passes (kPasses' order), inputs drawn from seed, seed + 1 and seed + 2:
// the forward with bias is the forward's, inputs and all, with the bias added to its float64 sums
// and |b| to their magnitudes, which halves what the float64 kernels compute for the two passes (the
// largest cost of the tests below under the sanitizers).
std::vector<Reference> references(const ConvArgs& a, uint32_t seed) {
  Reference forward = reference(a, kForward, seed);
  Reference with_bias = forward;
  const size_t plane = static_cast<size_t>(a.oh * a.ow);
  for (size_t i = 0; i < with_bias.want.size(); ++i) {
    const double b = with_bias.inputs.b[i / plane % static_cast<size_t>(a.c_out)];
    with_bias.want[i] += b;
    with_bias.magnitude[i] += std::abs(b);
  }
  return {std::move(forward), std::move(with_bias), reference(a, kInputGrad, seed + 1),
          reference(a, kWeightGrad, seed + 2)};
}

// "" when every element is within 1e-5 of its magnitude of the float64 result, else the worst.
std::string mismatch(const std::vector<float>& got, const Reference& r) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess = std::abs(static_cast<double>(got[i]) - r.want[i]) - 1e-5 * r.magnitude[i] - 1e-30;
    if (!(excess <= worst)) {
      worst = std::isnan(excess) ? INFINITY : excess;
      at = i;
    }
  }
  if (worst == 0) return "";
  std::ostringstream os;
  os << "element " << at << ": " << got[at] << " vs " << r.want[at] << " (magnitude " << r.magnitude[at] << ")";
  return os.str();
}

using Float32Pass = std::function<void(const ConvArgs&, Pass, Operands<float>&)>;

std::vector<std::pair<const char*, Float32Pass>> float32_kernels() {
  std::vector<std::pair<const char*, Float32Pass>> kernels{{"float32 dispatch", backend_pass<float>}};
#if EF_ONEDNN
  kernels.emplace_back("oneDNN", onednn_pass);
#endif
  return kernels;
}

}  // namespace

TEST_CASE("conv float32 (oneDNN and the float32 dispatch) equals the float64 im2col kernels over geometries") {
  uint32_t seed = 1;
  for (const Geometry& g : geometries()) {
    const ConvArgs a = g.args();
    const std::vector<Reference> refs = references(a, seed);
    seed += 3;
    for (Pass pass : kPasses) {
      const Reference& r = refs[pass];
      for (const auto& [kernel, run] : float32_kernels()) {
        CAPTURE(g.name);
        CAPTURE(kPassNames[pass]);
        CAPTURE(kernel);
        Operands<float> o = r.inputs;
        std::vector<float>& out = output_of(o, pass);
        std::fill(out.begin(), out.end(), NAN);  // every element must be written
        run(a, pass, o);
        const std::string bad = mismatch(out, r);
        CHECK_MESSAGE(bad.empty(), bad);
      }
    }
  }
}

TEST_CASE("conv float32: two threads convolving different shapes at once get the right results") {
  // Each thread takes its own geometries and runs every pass of each several times, as two CPU
  // devices of one team thread each do; the first call of each shape creates its primitives while
  // the other thread runs its own.
  const std::vector<Geometry> all = geometries();
  const std::vector<std::vector<Geometry>> per_thread{{all[1], all[3], all[19]}, {all[6], all[10], all[23]}};
  std::vector<std::vector<Reference>> refs(per_thread.size());
  uint32_t seed = 100;
  for (size_t t = 0; t < per_thread.size(); ++t)
    for (const Geometry& g : per_thread[t]) {
      for (Reference& r : references(g.args(), seed)) refs[t].push_back(std::move(r));
      seed += 3;
    }

  const int threads_before = num_threads();
  set_num_threads(1);
  std::vector<std::string> failures(per_thread.size());
  std::vector<std::thread> workers;
  for (size_t t = 0; t < per_thread.size(); ++t) {
    workers.emplace_back([&, t] {
      try {
        for (int round = 0; round < 4; ++round) {
          size_t i = 0;
          for (const Geometry& g : per_thread[t]) {
            for (Pass pass : kPasses) {
              const Reference& r = refs[t][i++];
              for (const auto& [kernel, run] : float32_kernels()) {
                Operands<float> o = r.inputs;
                run(g.args(), pass, o);
                const std::string bad = mismatch(output_of(o, pass), r);
                if (!bad.empty() && failures[t].empty())
                  failures[t] = std::string(g.name) + ", " + kPassNames[pass] + ", " + kernel + ": " + bad;
              }
            }
          }
        }
      } catch (const std::exception& e) {
        failures[t] = e.what();
      }
    });
  }
  for (std::thread& w : workers) w.join();
  set_num_threads(threads_before);
  for (size_t t = 0; t < failures.size(); ++t) CHECK_MESSAGE(failures[t].empty(), "thread ", t, ": ", failures[t]);
}

#if EF_ONEDNN
// Note [Weight gradients split by images] in engine/cpu/onednn_conv.cpp: teams of 2 and 3 threads
// share out the images (3 in slices of unequal size), a team of 1 runs oneDNN's own primitive; each
// gets the float64 result, float32 and bfloat16 operands alike.
TEST_CASE("conv weight gradient on teams of 1, 2 and 3 threads, the images split among them, equals float64") {
  const int threads_before = num_threads();
  uint32_t seed = 500;
  for (const Geometry& g : geometries()) {
    for (DType compute : {kFloat32, kBFloat16}) {
      ConvArgs a = g.args();
      a.compute = compute;
      // Elsewhere the op rounds bfloat16 operands for the float32 kernels (the float32 case).
      if (compute == kBFloat16 && !cpu_backend::onednn_takes_bf16(a, ConvPass::WeightGrad)) continue;
      const Reference r = reference(a, kWeightGrad, seed++, compute == kBFloat16);
      for (int threads : {1, 2, 3}) {
        CAPTURE(g.name);
        CAPTURE(dtype_name(compute));
        CAPTURE(threads);
        set_num_threads(threads);
        Operands<float> o = r.inputs;
        std::fill(o.w.begin(), o.w.end(), NAN);  // every element must be written
        onednn_pass(a, kWeightGrad, o);
        const std::string bad = mismatch(o.w, r);
        CHECK_MESSAGE(bad.empty(), bad);
      }
    }
  }
  set_num_threads(threads_before);
}

TEST_CASE("conv float32: a case oneDNN refuses is an ef::Error naming the op and the geometry") {
  // 3 output channels in 2 groups: oneDNN rejects the descriptor (the dispatch never sends this).
  const ConvArgs a = Geometry{"3x3 groups 2", 1, 2, 5, 5, 3, 3, 3, 1, 1, 0, 0, 1, 1, 2}.args();
  std::vector<float> x(static_cast<size_t>(2 * 5 * 5)), w(static_cast<size_t>(3 * 3 * 3)),
      y(static_cast<size_t>(3 * 3 * 3));
  const std::string msg = evenflow::testing::error_of(
      [&] { cpu_backend::onednn_conv2d_forward(a, y.data(), x.data(), w.data(), nullptr); });
  CHECK_MESSAGE(msg.find("conv2d: oneDNN failed") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("groups 2") != std::string::npos, msg);
}
#endif
