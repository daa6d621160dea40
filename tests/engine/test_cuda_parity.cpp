// CPU-vs-CUDA parity: every op of the table, its value, its input gradients and its second
// derivatives, computed on the CPU and on a CUDA device from the same inputs; the same at realistic
// sizes, and past 2^31 elements. Skips, saying why, where no GPU is visible (EF_REQUIRE_CUDA=1:
// fails instead).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <string>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/ops_internal.h"
#include "tests/engine/op_table.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::testing;

namespace {

// Value and gradients of case c on `device`, returned on the CPU.
std::vector<Tensor> evaluate(const OpCase& c, DType dtype, const Device& device) {
  std::vector<Tensor> inputs = make_inputs(c, dtype, device);
  std::vector<Tensor> wrt;
  for (Tensor& t : inputs) {
    if (is_floating(t.dtype())) {
      t.requires_grad_(true);
      wrt.push_back(t);
    }
  }
  const Tensor out = c.fn(inputs);
  manual_seed(cpu(), 5);
  const Tensor v = randn(out.shape(), {.dtype = dtype}).to(device);
  std::vector<Tensor> results{out.detach().to(cpu())};
  for (const Tensor& g : grad({out}, wrt, {v}, {.allow_unused = true}))
    results.push_back(g.defined() ? g.to(cpu()) : Tensor());
  return results;
}

// Case c as its first derivative, (inputs..., v) -> the gradients of c along v, so that evaluating
// it compares second derivatives: the backward of every backward, as a gradient penalty runs it.
OpCase differentiated(const OpCase& c) {
  const Shape out_shape = c.fn(make_inputs(c, kFloat64, cpu())).shape();
  OpCase d = c;
  d.inputs.push_back({out_shape});
  d.fn = first_derivative(c.fn, c.inputs.size());
  return d;
}

// Strict parity (float rounding apart) needs full float32 math on the GPU, whatever the defaults.
constexpr CudaMath kNoTf32{.allow_tf32_conv = false, .allow_tf32_matmul = false, .deterministic = false};

// Element-wise |got - ref| <= atol + rtol·|ref|, or, where normwise > 0, Note [Normwise comparison]
// (tests/testing/gradcheck.h): the check for results of long sums, whose rounding error does not
// scale with each element.
struct Tolerance {
  double atol = 0, rtol = 0;
  double normwise = 0;
};

void check_parity(const std::vector<OpCase>& cases, DType dtype, const Tolerance& tol, const CudaMath& math = kNoTf32) {
  const CudaMathGuard guard(math);
  for (const OpCase& c : cases) {
    if (c.cpu_only) continue;
    CAPTURE(c.name);
    const auto ref = evaluate(c, dtype, cpu());
    const auto got = evaluate(c, dtype, cuda(0));
    REQUIRE(ref.size() == got.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      CHECK(ref[i].defined() == got[i].defined());
      if (!ref[i].defined() || !got[i].defined()) continue;
      const std::string diff = tol.normwise > 0 ? compare_normwise(got[i], ref[i], tol.normwise)
                                                : compare(got[i], ref[i], tol.atol, tol.rtol);
      CHECK_MESSAGE(diff.empty(),
                    c.name << (i == 0 ? " value" : " gradient of input " + std::to_string(i - 1)) << ": " << diff);
    }
  }
}

// Normwise tolerances of the realistic sizes (Note [Normwise comparison]). float32: this CPU's own
// float32 results against float64, over every realistic case and gradient, were at most 3.9e-6
// normwise (the conv weight gradient, K = 100352 terms) and 3.1e-5 x rms for one element; the GPU's
// rounding is of the same order, so 1e-4 leaves a margin of 10 or more either way. TF32: inputs keep
// 10 of float32's 23 mantissa bits; truncated rather than rounded (the worse case), each product is
// off by up to 2^-10 relative, with a bias toward zero. The test below ("...tolerances hold for TF32
// rounding") measures it on the CPU: 7.7e-4 normwise for a convolution's output and both gradients,
// so 5e-3 leaves a margin of 6.
constexpr double kFloat32Normwise = 1e-4;
constexpr double kTf32Normwise = 5e-3;

// A result rounded to bfloat16 (CudaMath::allow_bf16_conv_results), element by element: within 2^-8
// of want's value (a round to nearest; truncation moves up to 2^-7), plus kFloat32Normwise of
// rms(want) for the two sums' orders. "" or the first element outside.
std::string within_bf16_rounding(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  if (g.size() != w.size()) return "shape " + shape_str(got.shape()) + " vs " + shape_str(want.shape());
  double squares = 0;
  for (const double v : w) squares += v * v;
  const double slack = kFloat32Normwise * std::sqrt(squares / static_cast<double>(std::max<size_t>(w.size(), 1)));
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::fabs(g[i] - w[i]) <= std::ldexp(std::fabs(w[i]), -8) + slack))
      return "element " + std::to_string(i) + ": " + std::to_string(g[i]) + " vs " + std::to_string(w[i]);
  }
  return "";
}

// x with its float32 mantissa cut to TF32's 10 bits (truncated: the larger error of the two ways
// hardware may convert), as float64.
Tensor truncate_to_tf32(const Tensor& x) {
  std::vector<double> v = x.to_vector();
  for (double& e : v) {
    const float f = static_cast<float>(e);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    bits &= ~((uint32_t{1} << 13) - 1);
    float t = 0;
    std::memcpy(&t, &bits, sizeof t);
    e = t;
  }
  return from_vector(v, x.shape(), {.dtype = kFloat64});
}

std::vector<OpCase> second_derivatives() {
  std::vector<OpCase> out;
  for (const OpCase& c : op_table())
    if (!c.cpu_only) out.push_back(differentiated(c));
  return out;
}

// Sizes the tiny op table never reaches on a GPU: reductions split over many blocks, softmax rows
// wider than a block, layers whose cuDNN algorithms are the real ones, index kernels over many
// blocks with repeated indices (atomics).
std::vector<OpCase> realistic_cases() {
  using V = std::vector<Tensor>;
  std::vector<OpCase> t;
  auto add_case = [&](std::string name, std::vector<InputSpec> in, Fn fn) {
    t.push_back({std::move(name), std::move(in), std::move(fn), {}, false});
  };
  auto random_indices = [](int64_t n, int64_t bound) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    uint64_t state = 12345;
    for (auto& i : v) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      i = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(bound));
    }
    return v;
  };
  const int64_t m4 = int64_t{1} << 22;
  add_case("sum", {{{m4}}}, [](const V& x) { return sum(x[0]); });
  add_case("sum", {{{2048, 2048}}}, [](const V& x) { return sum(x[0], {0}); });
  add_case("sum", {{{2048, 2048}}}, [](const V& x) { return sum(x[0], {1}); });
  add_case("mean", {{{64, 65536}}}, [](const V& x) { return mean(x[0], {1}); });
  add_case("var", {{{64, 65536}}}, [](const V& x) { return var(x[0], {1}); });
  add_case("amax", {{{m4}}}, [](const V& x) { return amax(x[0]); });
  add_case("norm", {{{m4}}}, [](const V& x) { return norm(x[0]); });
  add_case("softmax", {{{64, 4096}}}, [](const V& x) { return softmax(x[0], 1); });
  add_case("softmax", {{{4096, 64}}}, [](const V& x) { return softmax(x[0], 0); });
  add_case("log_softmax", {{{16, 20000}}}, [](const V& x) { return log_softmax(x[0], 1); });
  add_case("matmul", {{{1024, 2048}}, {{2048, 512}}}, [](const V& x) { return matmul(x[0], x[1]); });
  add_case("conv2d", {{{32, 64, 56, 56}}, {{64, 64, 3, 3}}, {{64}}}, [](const V& x) {
    return conv2d(x[0], x[1], x[2], {.padding = {1, 1}});
  });
  add_case("conv2d", {{{32, 64, 56, 56}}, {{128, 64, 1, 1}}}, [](const V& x) {
    return conv2d(x[0], x[1], Tensor(), {.stride = {2, 2}});
  });
  add_case("batch_norm", {{{32, 64, 56, 56}}, {{64}}, {{64}}},
           [](const V& x) { return batch_norm(x[0], x[1], x[2], Tensor(), Tensor(), true); });
  add_case("layer_norm", {{{256, 4096}}, {{4096}}, {{4096}}},
           [](const V& x) { return layer_norm(x[0], {4096}, x[1], x[2]); });
  // Note [Fused normalization]: a warp per row (up to 1024 features, in registers: 4 and 32 slots a
  // lane, the last ones partly filled) and a block per channel whose planes are narrower than the
  // block.
  add_case("layer_norm", {{{8192, 96}}, {{96}}, {{96}}}, [](const V& x) { return layer_norm(x[0], {96}, x[1], x[2]); });
  add_case("layer_norm", {{{512, 1000}}, {{1000}}, {{1000}}},
           [](const V& x) { return layer_norm(x[0], {1000}, x[1], x[2]); });
  add_case("batch_norm", {{{256, 32, 7, 7}}}, [](const V& x) { return batch_norm(x[0], {}, {}, {}, {}, true); });
  // A layer norm over [C, H, W] of a channels-last input, whose features come in H, W, C order and
  // its parameters in C, H, W order (NormArgs::param_channels): rows in registers (256 features),
  // a block per row (wgan_gp's critic, 3136 features, its gradients summed over rows in two
  // chunks), rows in chunks (65536 features); and without a bias.
  for (const Shape& shape : {Shape{32, 16, 4, 4}, Shape{64, 64, 7, 7}, Shape{2, 64, 32, 32}}) {
    const Shape features(shape.begin() + 1, shape.end());
    add_case("layer_norm", {{shape}, {features}, {features}}, [features](const V& x) {
      return layer_norm(contiguous(x[0], MemoryFormat::ChannelsLast), features, x[1], x[2]);
    });
  }
  add_case("layer_norm", {{{64, 64, 7, 7}}, {{64, 7, 7}}}, [](const V& x) {  // a weight alone
    return layer_norm(contiguous(x[0], MemoryFormat::ChannelsLast), {64, 7, 7}, x[1], Tensor());
  });
  // Note [Group statistics in chunks] in cuda_normalization.cu: groups of more than two chunks (the
  // 32x64x56x56 case above: 12 whole chunks and a part), also in channels-last memory (a channel's
  // elements 8 apart) and as a layer norm's few long rows; these two with a trend along the group
  // (0 to 4 over its chunks), so that the chunks' means differ and their merge's between-chunk term
  // is most of the variance (on i.i.d. inputs it is 1e-4 of it, under the tolerance).
  const auto trend = [](const Tensor& x, int64_t dim) {
    Shape shape(static_cast<size_t>(x.dim()), 1);
    shape[static_cast<size_t>(dim)] = x.size(dim);
    std::vector<double> ramp(static_cast<size_t>(x.size(dim)));
    for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = 4.0 * static_cast<double>(i) / static_cast<double>(ramp.size());
    return x + from_vector(ramp, shape, {.dtype = x.dtype(), .device = x.device()});
  };
  add_case("batch_norm", {{{16, 8, 48, 48}}, {{8}}, {{8}}}, [trend](const V& x) {
    return batch_norm(contiguous(trend(x[0], 0), MemoryFormat::ChannelsLast), x[1], x[2], Tensor(), Tensor(), true);
  });
  add_case("layer_norm", {{{3, 70001}}, {{70001}}, {{70001}}},
           [trend](const V& x) { return layer_norm(trend(x[0], 1), {70001}, x[1], x[2]); });
  // Batch norm's running statistics, which the normalization kernels update (RunningStats in
  // backend.h), beside the output: a warp a group (one image of 8x8), a block a group, a group in
  // chunks (also channels-last).
  const auto with_running = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    const TensorOptions o{.dtype = x.dtype(), .device = x.device()};
    const Tensor running_mean = full({x.size(1)}, 0.5, o), running_var = full({x.size(1)}, 2.0, o);
    const Tensor y = batch_norm(x, w, b, running_mean, running_var, true, 0.3);
    return cat({flatten(y), running_mean, running_var}, 0);
  };
  for (const Shape& shape : {Shape{1, 16, 8, 8}, Shape{256, 32, 7, 7}, Shape{32, 64, 56, 56}}) {
    const Shape channels{shape[1]};
    add_case("batch_norm", {{shape}, {channels}, {channels}},
             [with_running](const V& x) { return with_running(x[0], x[1], x[2]); });
  }
  add_case("batch_norm", {{{16, 8, 48, 48}}}, [with_running](const V& x) {
    return with_running(contiguous(x[0], MemoryFormat::ChannelsLast), Tensor(), Tensor());
  });
  add_case("max_pool2d", {{{32, 64, 56, 56}}}, [](const V& x) {
    return max_pool2d(x[0], {.kernel = {3, 3}, .stride = {{2, 2}}, .padding = {1, 1}});
  });
  add_case("upsample_nearest2d", {{{8, 32, 64, 64}}}, [](const V& x) { return upsample_nearest2d(x[0], {128, 128}); });
  const std::vector<int64_t> columns = random_indices(4096, 1000);
  add_case("gather", {{{4096, 1000}}}, [columns](const V& x) {
    return gather(x[0], 1, from_int_vector(columns, {4096, 1}, x[0].device()));
  });
  const std::vector<int64_t> rows = random_indices(200000, 100000);
  add_case("index_select", {{{100000, 64}}},
           [rows](const V& x) { return index_select(x[0], 0, from_int_vector(rows, {200000}, x[0].device())); });
  return t;
}

}  // namespace

TEST_CASE("cuda parity: every op, float64") {
  if (!cuda_devices_available()) return;
  check_parity(op_table(), kFloat64, {.atol = 1e-10, .rtol = 1e-8});
}

TEST_CASE("cuda parity: every op, float32") {
  if (!cuda_devices_available()) return;
  check_parity(op_table(), kFloat32, {.atol = 1e-4, .rtol = 1e-3});
}

TEST_CASE("cuda parity: every op's second derivatives, float64") {
  if (!cuda_devices_available()) return;
  check_parity(second_derivatives(), kFloat64, {.atol = 1e-10, .rtol = 1e-8});
}

TEST_CASE("cuda parity: realistic sizes, float64 and float32") {
  if (!cuda_devices_available()) return;
  const std::vector<OpCase> cases = realistic_cases();
  check_parity(cases, kFloat64, {.atol = 1e-10, .rtol = 1e-8});
  check_parity(cases, kFloat32, {.normwise = kFloat32Normwise});
}

// The normalizations' second derivatives (a gradient penalty's backward through them: the CUDA
// backend's normalize_double_backward kernel) at the sizes that take its every path: wgan_gp's
// critic LayerNorm ([64, 64, 7, 7] channels-last over [64, 7, 7], its parameters permuted to the
// group's order), per-feature dw summed in one chunk of rows, in 2, 8 and 256
// (feature_sum_rows_per_chunk), a batch norm's per-group dw in both layouts, groups larger than a
// block's threads, an input without a gradient (no ggx reaches the kernel, no dx is asked of it),
// and no rows at all (dw zeroed). The op table's second derivatives (above) take the small shapes
// and an absent weight or bias.
TEST_CASE("cuda parity: normalizations' second derivatives at realistic sizes, float64 and float32") {
  if (!cuda_devices_available()) return;
  using V = std::vector<Tensor>;
  std::vector<OpCase> cases;
  auto add_case = [&](std::string name, std::vector<InputSpec> in, Fn fn) {
    cases.push_back(differentiated({std::move(name), std::move(in), std::move(fn), {}, false}));
  };
  add_case("layer_norm", {{{64, 64, 7, 7}}, {{64, 7, 7}}, {{64, 7, 7}}}, [](const V& x) {
    return layer_norm(contiguous(x[0], MemoryFormat::ChannelsLast), {64, 7, 7}, x[1], x[2]);
  });
  add_case("layer_norm", {{{16, 50}}, {{50}}, {{50}}}, [](const V& x) { return layer_norm(x[0], {50}, x[1], x[2]); });
  add_case("layer_norm", {{{16, 50}}, {{50}}, {{50}}},
           [](const V& x) { return layer_norm(x[0].detach(), {50}, x[1], x[2]); });
  add_case("layer_norm", {{{0, 50}}, {{50}}, {{50}}}, [](const V& x) { return layer_norm(x[0], {50}, x[1], x[2]); });
  add_case("layer_norm", {{{256, 4096}}, {{4096}}, {{4096}}},
           [](const V& x) { return layer_norm(x[0], {4096}, x[1], x[2]); });
  add_case("layer_norm", {{{8192, 96}}, {{96}}}, [](const V& x) { return layer_norm(x[0], {96}, x[1], Tensor()); });
  add_case("batch_norm", {{{16, 32, 28, 28}}, {{32}}, {{32}}},
           [](const V& x) { return batch_norm(x[0], x[1], x[2], Tensor(), Tensor(), true); });
  add_case("batch_norm", {{{16, 32, 28, 28}}, {{32}}, {{32}}}, [](const V& x) {
    return batch_norm(contiguous(x[0], MemoryFormat::ChannelsLast), x[1], x[2], Tensor(), Tensor(), true);
  });
  add_case("batch_norm", {{{256, 32, 7, 7}}}, [](const V& x) { return batch_norm(x[0], {}, {}, {}, {}, true); });
  // A gradient penalty's: the input's gradient alone differentiated, so that the weight's and bias's
  // first-order gradients get none and reach the kernel as null views (Node::accept_missing_grads).
  const auto penalty = [](const Shape& shape, MemoryFormat layout) {
    return [shape, layout](const V& x) {
      const Tensor y = layer_norm(contiguous(x[0], layout), shape, x[1], x[2]);
      return grad({y}, {x[0]}, {x[3]}, {.create_graph = true})[0];
    };
  };
  cases.push_back({"layer_norm's input gradient alone",
                   {{{64, 64, 7, 7}}, {{64, 7, 7}}, {{64, 7, 7}}, {{64, 64, 7, 7}}},
                   penalty({64, 7, 7}, MemoryFormat::ChannelsLast),
                   {},
                   false});
  cases.push_back({"layer_norm's input gradient alone",
                   {{{256, 4096}}, {{4096}}, {{4096}}, {{256, 4096}}},
                   penalty({4096}, MemoryFormat::Contiguous),
                   {},
                   false});
  check_parity(cases, kFloat64, {.atol = 1e-10, .rtol = 1e-8});
  check_parity(cases, kFloat32, {.normwise = kFloat32Normwise});
}

TEST_CASE(
    "cuda parity: float32 convolutions and products on TF32 tensor cores stay within TF32's precision, "
    "with heuristic and timed algorithm choice") {
  if (!cuda_devices_available()) return;
  std::vector<OpCase> cases;
  for (const OpCase& c : realistic_cases())
    if (c.name == "conv2d" || c.name == "matmul") cases.push_back(c);
  REQUIRE(cases.size() == 3);
  check_parity(cases, kFloat32, {.normwise = kTf32Normwise}, {.allow_tf32_conv = true, .allow_tf32_matmul = true});
  // The algorithms cuDNN's timing picks (CudaMath::benchmark) compute the same convolutions.
  check_parity(cases, kFloat32, {.normwise = kTf32Normwise},
               {.allow_tf32_conv = true, .allow_tf32_matmul = true, .benchmark = true});
  check_parity(cases, kFloat64, {.atol = 1e-10, .rtol = 1e-8}, {.benchmark = true});
  check_parity(cases, kFloat32, {.normwise = kFloat32Normwise},
               {.allow_tf32_conv = false, .allow_tf32_matmul = false, .deterministic = true});
}

// Runs on the CPU, so the tolerance above is checked where no GPU is: a convolution's output and
// gradients computed (in float64) from inputs truncated to TF32, against the exact ones, pass the
// normwise check with room to spare and failed the element-wise one this test used before (5e-2
// absolute, 1e-2 relative: the weight gradient sums 8·56·56 = 25088 terms, so its error is ~0.1 on
// every element, small or not); one wrong element of the 36864 fails it.
TEST_CASE("cuda parity: the TF32 tolerances hold for TF32 rounding (emulated on the CPU) and catch a wrong element") {
  manual_seed(cpu(), 3);
  const Tensor x = randn({8, 64, 56, 56}, {.dtype = kFloat64}), w = randn({64, 64, 3, 3}, {.dtype = kFloat64});
  const Tensor gy = randn({8, 64, 56, 56}, {.dtype = kFloat64});
  auto conv_and_grads = [&](const Tensor& xi, const Tensor& wi, const Tensor& gyi) {
    const Tensor xl = xi.detach().requires_grad_(true), wl = wi.detach().requires_grad_(true);
    const Tensor y = conv2d(xl, wl, Tensor(), {.padding = {1, 1}});
    std::vector<Tensor> out{y.detach()};
    for (const Tensor& g : grad({y}, {xl, wl}, {gyi})) out.push_back(g);
    return out;
  };
  const std::vector<Tensor> exact = conv_and_grads(x, w, gy);
  const std::vector<Tensor> tf32 = conv_and_grads(truncate_to_tf32(x), truncate_to_tf32(w), truncate_to_tf32(gy));
  for (size_t i = 0; i < exact.size(); ++i) {
    CAPTURE(i);
    CHECK(compare_normwise(tf32[i], exact[i], kTf32Normwise / 2) == "");
  }
  CHECK(compare(tf32[2], exact[2], 5e-2, 1e-2) != "");  // the element-wise tolerance of before
  // In the input gradient (1.6M elements) one element off by rms(reference) moves the norm by 8e-4
  // only: the element bound catches it.
  std::vector<double> wrong = tf32[1].to_vector();
  wrong[1234] += std::sqrt(mean(square(exact[1])).item());
  const std::string found =
      compare_normwise(from_vector(wrong, exact[1].shape(), {.dtype = kFloat64}), exact[1], kTf32Normwise);
  CHECK_MESSAGE(found.find("element 1234") == 0, found);
}

TEST_CASE("CUDA math settings: PyTorch's defaults, and what is set is what is read") {
  const CudaMath defaults = cuda_math();
  CHECK(defaults.allow_tf32_conv);          // torch.backends.cudnn.allow_tf32
  CHECK_FALSE(defaults.allow_tf32_matmul);  // torch.backends.cuda.matmul.allow_tf32
  CHECK_FALSE(defaults.deterministic);      // torch.backends.cudnn.deterministic
  CHECK_FALSE(defaults.benchmark);          // torch.backends.cudnn.benchmark
  CHECK_FALSE(defaults.allow_bf16_conv_results);
  {
    const CudaMathGuard guard({.allow_tf32_conv = false,
                               .allow_tf32_matmul = true,
                               .deterministic = true,
                               .benchmark = true,
                               .allow_bf16_conv_results = true});
    const CudaMath now = cuda_math();
    CHECK_FALSE(now.allow_tf32_conv);
    CHECK(now.allow_tf32_matmul);
    CHECK(now.deterministic);
    CHECK(now.benchmark);
    CHECK(now.allow_bf16_conv_results);
  }
  {
    const CudaMathGuard guard({.allow_bf16_conv_results = true});  // the bit of its own
    CHECK(cuda_math().allow_bf16_conv_results);
    CHECK_FALSE(cuda_math().benchmark);
  }
  CHECK(cuda_math().allow_tf32_conv);
  CHECK_FALSE(cuda_math().benchmark);
  CHECK_FALSE(cuda_math().allow_bf16_conv_results);
}

TEST_CASE("cuda: tensors past 2^31 elements index with 64 bits") {
  if (!cuda_devices_available()) return;
  const int64_t n = (int64_t{1} << 31) + 4096;  // float32: 8 GiB per tensor
  try {
    const Tensor x = full({n}, 1.5, {.device = cuda(0)});
    narrow(x, 0, n - 1, 1).fill_(7.0);
    const Tensor y = x * 2.0;
    CHECK(narrow(y, 0, n - 4096, 4096).to(cpu()).to_vector() == [] {
      std::vector<double> v(4096, 3.0);
      v.back() = 14.0;
      return v;
    }());
    CHECK(amax(x).item() == 7.0);
    CHECK(index_select(x, 0, from_int_vector({n - 1, 0, n - 4096}, {3}, cuda(0))).to_vector() ==
          std::vector<double>{7.0, 1.5, 1.5});
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("out of memory") == std::string::npos) throw;
    EF_SKIP_CUDA_TEST("this test needs 16 GiB free on cuda:0: " << what);
  }
}

// The multi-tensor Adam step: more parameters than one launch takes (32), empty and large ones,
// a strided one, amsgrad; three steps, against the CPU's.
TEST_CASE("cuda parity: the multi-tensor Adam step") {
  if (!cuda_devices_available()) return;
  for (const DType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    manual_seed(cpu(), 21);
    std::vector<Shape> shapes;
    for (int k = 0; k < 40; ++k) shapes.push_back({k % 7, 3 + k});
    shapes.push_back({1 << 20});
    std::map<std::string, std::vector<Tensor>> on;  // "cpu" / "cuda": param, m, v, v_max per shape
    std::vector<std::vector<Tensor>> grads(3);
    for (const Shape& shape : shapes) {
      const Tensor p = randn(shape, {.dtype = dtype});
      for (auto& g : grads) g.push_back(randn(shape, {.dtype = dtype}));
      for (const char* where : {"cpu", "cuda"}) {
        const Device d = std::string(where) == "cpu" ? cpu() : cuda(0);
        on[where].push_back(p.to(d));
        for (int i = 0; i < 3; ++i) on[where].push_back(zeros(shape, {.dtype = dtype, .device = d}));
      }
    }
    // One parameter strided: a transposed view of a [3 + k, k % 7] tensor.
    for (const char* where : {"cpu", "cuda"}) on[where][4 * 5] = transpose(on[where][4 * 5].t().contiguous(), 0, 1);
    for (int step = 1; step <= 3; ++step) {
      const AdamArgs args{.decay = 0.999,
                          .weight_decay = 0.01,
                          .inv_bias_correction2_sqrt = 1.0 / std::sqrt(1 - std::pow(0.999, step)),
                          .step = -1e-2 / (1 - std::pow(0.9, step)),
                          .amsgrad = true};
      for (const char* where : {"cpu", "cuda"}) {
        std::vector<AdamTensors> list;
        const std::vector<Tensor>& t = on[where];
        for (size_t k = 0; k < shapes.size(); ++k) {
          const Tensor g = grads[static_cast<size_t>(step - 1)][k].to(t[4 * k].device());
          list.push_back({t[4 * k], g, t[4 * k + 1], t[4 * k + 2], t[4 * k + 3]});
        }
        adam_(args, list);
      }
    }
    const double tol = dtype == kFloat64 ? 1e-12 : 1e-5;
    for (size_t i = 0; i < on["cpu"].size(); ++i) {
      CAPTURE(i);
      CHECK(compare(on["cuda"][i].to(cpu()), on["cpu"][i], tol, tol).empty());
    }
  }
}

TEST_CASE("cuda: copies between host, device and logical devices") {
  if (!cuda_devices_available()) return;
  const Tensor x = arange(0, 1000, 1, {.dtype = kFloat64});
  const Tensor on_gpu = x.to(cuda(0));
  CHECK(on_gpu.device() == cuda(0));
  CHECK(on_gpu.to(cpu()).to_vector() == x.to_vector());
  if (cuda_device_count() > 1) {
    CHECK(on_gpu.to(cuda(1)).to(cpu()).to_vector() == x.to_vector());
  }
  // Same generator state, same numbers on both backends (Philox): bitwise for uniform draws (with
  // bounds, so a product and a sum round as on the CPU) and Bernoulli ones; normal draws to the
  // last bits of log and cos, which the backends compute differently (engine/random_internal.h).
  for (const Device& d : {cpu(), cuda(0)}) manual_seed(d, 9);
  CHECK(uniform({257}, -0.3, 1.7, {.dtype = kFloat64}).to_vector() ==
        uniform({257}, -0.3, 1.7, {.dtype = kFloat64, .device = cuda(0)}).to_vector());
  CHECK(bernoulli({257}, 0.3, {.dtype = kFloat64}).to_vector() ==
        bernoulli({257}, 0.3, {.dtype = kFloat64, .device = cuda(0)}).to_vector());
  const Tensor normal_cpu = randn({257}, {.dtype = kFloat64});
  CHECK(compare(randn({257}, {.dtype = kFloat64, .device = cuda(0)}).to(cpu()), normal_cpu, 1e-14, 1e-13) == "");
}

// add_(y, alpha) is one kernel (AddScaled) whose product is rounded before the add on both backends:
// nvcc would otherwise fuse them into one FMA (scalar::product_rounded).
TEST_CASE("cuda: add_ of a number, and of a tensor times alpha, in place, float and int64, the CPU's bits") {
  if (!cuda_devices_available()) return;
  manual_seed(cpu(), 13);
  for (const DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dtype));
    const Tensor x = randn({33, 65}, {.dtype = dtype}), y = randn({33, 65}, {.dtype = dtype});
    const Tensor on_cpu = x.clone(), on_gpu = x.to(cuda(0));
    on_cpu.select(1, 3).add_(-0.3);  // a strided view, then the whole tensor
    on_gpu.select(1, 3).add_(-0.3);
    on_cpu.add_(1.7);
    on_gpu.add_(1.7);
    CHECK(on_gpu.to(cpu()).to_vector() == on_cpu.to_vector());
    on_cpu.add_(y, -0.1);  // SGD's p.add_(d, -lr)
    on_gpu.add_(y.to(cuda(0)), -0.1);
    CHECK(on_gpu.to(cpu()).to_vector() == on_cpu.to_vector());
  }
  const Tensor count = full({}, 0x1p53, {.dtype = kInt64, .device = cuda(0)});
  count.add_(1.0);
  count.add_(1.0);
  CHECK(count.to(cpu()).to_int_vector() == std::vector<int64_t>{(int64_t{1} << 53) + 2});
}

TEST_CASE("cuda: bfloat16 casts round on the GPU as on the CPU, bit for bit") {
  if (!cuda_devices_available()) return;
  manual_seed(cpu(), 12);
  const Tensor x = randn({1 << 16}, {.dtype = kFloat64}) * 1e3;
  for (const DType from : {kFloat64, kFloat32}) {
    const Tensor on_cpu = x.to(from).to(kBFloat16), on_gpu = x.to(from).to(cuda(0)).to(kBFloat16);
    CHECK(on_gpu.to(cpu()).to_vector() == on_cpu.to_vector());
    CHECK(on_gpu.to(kFloat32).to(cpu()).to_vector() == on_cpu.to(kFloat32).to_vector());
  }
}

// Note [bfloat16 compute] on the GPU: the products of the operands rounded to bfloat16, summed in
// float32, as on the CPU -- through a convolution, a transposed convolution and a linear layer, for
// the value, the input gradient (create_graph) and the parameter gradients of that gradient's
// squared norm (a penalty's). Tolerance 1e-3 normwise: the value differs by float32 summation order
// alone (kFloat32Normwise; the rounded operands are exact in TF32 too), but a gradient's operand
// that differs in its last float32 bits can round to the other neighbouring bfloat16 (2^-7
// apart), on a few elements in 10^4; ten times below bfloat16's own error (3e-3 and more).
TEST_CASE("cuda parity: bfloat16 compute, its gradients and a penalty's second-order gradients") {
  if (!cuda_devices_available()) return;
  manual_seed(cpu(), 13);
  const std::vector<Tensor> host = {randn({8, 16, 12, 12}),     randn({32, 16, 3, 3}) * 0.1,     randn({32}),
                                    randn({32, 8, 4, 4}) * 0.1, randn({10, 8 * 24 * 24}) * 0.02, randn({10})};
  const auto run = [&](const Device& d) {
    std::vector<Tensor> t;
    // detach: on the CPU, to() returns the host tensor itself, which then requires gradients, and
    // the CUDA run's copy of it would not be a leaf.
    for (const Tensor& h : host) t.push_back(h.to(d).detach().requires_grad_(true));
    const Tensor h = leaky_relu(conv2d(t[0], t[1], t[2], {.padding = {1, 1}, .compute = kBFloat16}), 0.2);
    const Tensor up = conv_transpose2d(h, t[3], Tensor(), {.stride = {2, 2}, .padding = {1, 1}, .compute = kBFloat16});
    const Tensor y = linear(flatten(up, 1), t[4], t[5], {.compute = kBFloat16});
    const Tensor gx = grad({sum(y)}, {t[0]}, {}, {.create_graph = true})[0];
    std::vector<Tensor> out = {y, gx};
    for (const Tensor& g : grad({sum(square(gx))}, {t[1], t[3], t[4]})) out.push_back(g);
    return out;
  };
  const std::vector<Tensor> on_cpu = run(cpu()), on_gpu = run(cuda(0));
  const std::vector<std::string> names = {"value", "input gradient", "conv2d weight", "conv_transpose2d weight",
                                          "linear weight"};
  for (size_t i = 0; i < names.size(); ++i) {
    CAPTURE(names[i]);
    CHECK(on_gpu[i].dtype() == kFloat32);
    CHECK(compare_normwise(on_gpu[i].to(cpu()), on_cpu[i], 1e-3) == "");
  }
  // The operand layouts cuBLAS's bfloat16 copies are made from (Note [bfloat16 products on
  // cuBLAS]): transposed, past-the-row leading dimension, batched, one operand shared by the batch.
  // The same rounded operands on both sides: float32 summation order alone (kFloat32Normwise).
  // The layouts are made on each device (a copy to another device is contiguous).
  const Tensor a_host = randn({3, 40, 50}), b_host = randn({3, 50, 30}), wide_host = randn({40, 64});
  const auto layouts = [&](const Device& d) {
    const Tensor a = a_host.to(d), b = b_host.to(d), wide = wide_host.to(d);
    return std::vector<std::pair<Tensor, Tensor>>{
        {a.select(0, 0).t().contiguous().t(), b.select(0, 0)},
        {slice(wide, 1, 0, 50), b.select(0, 0).t().contiguous().t()},
        {a, b},
        {a, b.select(0, 1)},
    };
  };
  const auto host_products = layouts(cpu()), device_products = layouts(cuda(0));
  for (size_t i = 0; i < host_products.size(); ++i) {
    CAPTURE(i);
    const auto& [x, y] = host_products[i];
    const Tensor got = matmul(device_products[i].first, device_products[i].second, {.compute = kBFloat16}).to(cpu());
    CHECK(compare_normwise(got, matmul(x, y, {.compute = kBFloat16}), kFloat32Normwise) == "");
    CHECK(compare_normwise(got, matmul(x, y), kFloat32Normwise) != "");
  }
}

// Note [bfloat16 convolutions on cuDNN]: each pass of a bfloat16 convolution on the GPU is the
// float32 convolution of the operands rounded to bfloat16 (the CPU's, float32 summation order alone:
// kFloat32Normwise) and not of the unrounded ones -- run on cuDNN's graph-API plan (called on the
// backend directly, where cuDNN 9.19 on an H200 has one: every pass of these shapes but the strided
// input gradient and the one-channel layer), and through the ops under cuda_math().benchmark, where
// bf16_conv times the plan against the float32 kernels and either may run.
TEST_CASE("cuda parity: bfloat16 convolutions on cuDNN's bfloat16 plans, every pass") {
  if (!cuda_devices_available()) return;
  struct Case {
    Shape x, w;
    Conv2dOptions o;
    std::array<bool, 3> has_plan;  // forward, input gradient, weight gradient
  };
  const std::vector<Case> cases = {
      {{8, 16, 12, 12}, {32, 16, 3, 3}, {.padding = {1, 1}}, {true, true, true}},
      {{16, 32, 14, 14}, {64, 32, 4, 4}, {.stride = {2, 2}, .padding = {1, 1}}, {true, false, true}},  // wgan_gp's
      {{4, 32, 10, 10}, {32, 16, 3, 3}, {.padding = {1, 1}, .groups = 2}, {true, true, true}},
      {{4, 16, 12, 12}, {16, 16, 3, 3}, {.padding = {2, 2}, .dilation = {2, 2}}, {true, true, true}},
      {{8, 1, 28, 28}, {32, 1, 4, 4}, {.stride = {2, 2}, .padding = {1, 1}}, {false, false, false}},  // wgan_gp's
  };
  manual_seed(cpu(), 14);
  const auto rounded = [](const Tensor& t) { return t.detach().to(kBFloat16).to(kFloat32); };
  int bf16_results = 0;  // passes whose plan, with bfloat16 results allowed, gave one
  for (const Case& c : cases) {
    CAPTURE(shape_str(c.x));
    CAPTURE(shape_str(c.w));
    const Tensor x = randn(c.x), w = randn(c.w) * 0.1;
    const Tensor y = conv2d(x, w, Tensor(), c.o), gy = randn(y.shape());
    const Conv2dOptions f32 = c.o;
    Conv2dOptions bf16 = c.o;
    bf16.compute = kBFloat16;
    const std::vector<Tensor> want = {conv2d(rounded(x), rounded(w), Tensor(), f32),
                                      conv2d_input_grad(rounded(gy), rounded(w), x.shape(), f32),
                                      conv2d_weight_grad(rounded(x), rounded(gy), w.shape(), f32)};
    const std::vector<Tensor> unrounded = {conv2d(x, w, Tensor(), f32), conv2d_input_grad(gy, w, x.shape(), f32),
                                           conv2d_weight_grad(x, gy, w.shape(), f32)};
    const Tensor xg = x.to(cuda(0)), wg = w.to(cuda(0)), gyg = gy.to(cuda(0));
    const auto check = [&](size_t pass, const Tensor& got) {
      CAPTURE(pass);
      CHECK(compare_normwise(got.to(cpu()), want[pass], kFloat32Normwise) == "");
      CHECK(compare_normwise(got.to(cpu()), unrounded[pass], kFloat32Normwise) != "");
    };
    // The plan itself, on the backend.
    const ConvArgs a{.n = c.x[0],
                     .c_in = c.x[1],
                     .h = c.x[2],
                     .w = c.x[3],
                     .c_out = c.w[0],
                     .kh = c.w[2],
                     .kw = c.w[3],
                     .oh = y.size(2),
                     .ow = y.size(3),
                     .stride_h = c.o.stride.first,
                     .stride_w = c.o.stride.second,
                     .pad_h = c.o.padding.first,
                     .pad_w = c.o.padding.second,
                     .dil_h = c.o.dilation.first,
                     .dil_w = c.o.dilation.second,
                     .groups = c.o.groups,
                     .compute = DType::BFloat16};
    Backend& gpu = detail::backend_of(xg);
    // bfloat16 operands, as the ops give them (Note [bfloat16 operands converted once] in ops/conv.cpp).
    const Tensor xb = xg.to(kBFloat16), wb = wg.to(kBFloat16), gyb = gyg.to(kBFloat16);
    const auto on_plan = [&](size_t pass) {  // the pass on the backend: its output, on the GPU
      const Tensor out = empty(want[pass].shape(), {.device = cuda(0)});
      CHECK(error_of([&] {
              if (pass == 0) gpu.conv2d(a, out.view(), xb.view(), wb.view(), View{});
              if (pass == 1) gpu.conv2d_input_grad(a, out.view(), gyb.view(), wb.view());
              if (pass == 2) gpu.conv2d_weight_grad(a, out.view(), xb.view(), gyb.view());
            }) == "(no error)");
      return out;
    };
    for (size_t pass = 0; pass < 3; ++pass) {
      if (c.has_plan[pass]) check(pass, on_plan(pass));
    }
    // The ops, with the timed choice.
    CudaMath timed = cuda_math();
    timed.benchmark = true;
    const CudaMathGuard benchmark(timed);
    check(0, conv2d(xg, wg, Tensor(), bf16));
    check(1, conv2d_input_grad(gyg, wg, x.shape(), bf16));
    check(2, conv2d_weight_grad(xg, gyg, w.shape(), bf16));
    // With bfloat16 results allowed: where the plan's result is bfloat16 (every element then one),
    // the same sums rounded once more; otherwise the float32 result as above. The ops' timed choice
    // may take either.
    CudaMath relaxed = timed;
    relaxed.allow_bf16_conv_results = true;
    const CudaMathGuard allow_bf16_results(relaxed);
    for (size_t pass = 0; pass < 3; ++pass) {
      if (!c.has_plan[pass]) continue;
      CAPTURE(pass);
      const Tensor got = on_plan(pass).to(cpu());
      const bool bf16_result = got.to_vector() == rounded(got).to_vector();
      bf16_results += bf16_result ? 1 : 0;
      CHECK((bf16_result ? within_bf16_rounding(got, want[pass])
                         : compare_normwise(got, want[pass], kFloat32Normwise)) == "");
      CHECK(compare_normwise(got, unrounded[pass], kFloat32Normwise) != "");
    }
    const std::vector<Tensor> relaxed_ops = {conv2d(xg, wg, Tensor(), bf16),
                                             conv2d_input_grad(gyg, wg, x.shape(), bf16),
                                             conv2d_weight_grad(xg, gyg, w.shape(), bf16)};
    for (size_t pass = 0; pass < 3; ++pass) {
      CAPTURE(pass);
      CHECK(within_bf16_rounding(relaxed_ops[pass].to(cpu()), want[pass]) == "");
    }
  }
  // cuDNN's kernels with a bfloat16 result are its common ones (the legacy API's bfloat16
  // configuration): some pass of these shapes has one.
  CHECK_MESSAGE(bf16_results > 0, "no pass took a bfloat16-result plan (EF_CUDNN_VERBOSE=1 says why)");
}

TEST_CASE("cuda: data<T>() refuses a CUDA tensor instead of handing the host a device address") {
  if (!cuda_devices_available()) return;
  const Tensor x = zeros({4}, {.device = cuda(0)});
  CHECK(error_of([&] { (void)x.data<float>(); }).find("data<float32>() on a tensor of cuda:0") == 0);
  CHECK(x.data_ptr() != nullptr);
}

TEST_CASE("cuda: a host-to-device copy lets the caller reuse its buffer at once") {
  if (!cuda_devices_available()) return;
  // Queue work first so the copies below are still in flight when the host buffer changes
  // (Note [Host-to-device copies]): each upload must hold the values the buffer had at its call.
  const Tensor busy = randn({2048, 2048}, {.device = cuda(0)});
  for (int i = 0; i < 8; ++i) (void)matmul(busy, busy);
  Tensor host = zeros({100000}, {.dtype = kFloat64});
  std::vector<Tensor> uploads;
  for (int i = 0; i < 32; ++i) {
    host.fill_(i);
    uploads.push_back(host.to(cuda(0)));
  }
  for (int i = 0; i < 32; ++i) CHECK(uploads[static_cast<size_t>(i)].sum().item() == 100000.0 * i);
  // Above the staging limit the copy is synchronous, with the same guarantee.
  Tensor big = full({int64_t{10} << 20}, 3.0, {.dtype = kFloat64});  // 80 MiB
  const Tensor big_on_gpu = big.to(cuda(0));
  big.fill_(0.0);
  CHECK(big_on_gpu.sum().item() == 3.0 * (int64_t{10} << 20));
}

TEST_CASE("cuda: an allocation failure is an ef::Error with the device's statistics") {
  if (!cuda_devices_available()) return;
  std::string message;
  try {
    empty({int64_t{1} << 45}, {.device = cuda(0)});  // 128 TiB
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("out of memory on cuda:0") == 0);
  CHECK(zeros({4}, {.device = cuda(0)}).to_vector() == std::vector<double>(4, 0.0));
}

TEST_CASE("cuda: a bad index is reported at the next synchronization, named, and only once") {
  if (!cuda_devices_available()) return;
  const Device d = cuda(0);
  const Tensor x = arange(0, 6, 1, {.dtype = kFloat64}).reshape({2, 3}).to(d);
  // Queued without waiting (Note [Index checks] in engine/cuda/deferred_errors.h); found when values
  // reach the host.
  const Tensor bad = gather(x, 1, from_int_vector({0, 5}, {2, 1}).to(d));
  CHECK(error_of([&] { (void)bad.to(cpu()); }).find("gather: index 5 is out of range for dim 1 of size 3") == 0);
  // Reported once: the device goes on, and a good gather reads back.
  const Tensor good = gather(x, 1, from_int_vector({2, 0}, {2, 1}).to(d));
  CHECK(vals(good.to(cpu())) == std::vector<double>{2, 3});
  // More indexing kernels queued than there are flags (the queue then waits for the device): the
  // bad one, early, still names itself.
  CHECK(error_of([&] {
          (void)index_select(x, 0, from_int_vector({1, 7}, {2}).to(d));
          for (int i = 0; i < 1500; ++i) (void)index_select(x, 0, from_int_vector({1}, {1}).to(d));
          synchronize(d);
        }).find("index_select: index 7 is out of range for dim 0 of size 2") == 0);
  synchronize(d);  // nothing left
  // Data checked before use (a loss's targets): not at the call, at the next synchronization, with
  // the caller's message; the allowed value (an ignore_index) passes.
  const Tensor targets = from_int_vector({0, -100, 4, 2}, {4}).to(d);
  check_index_range(targets, 3, -100, [](int64_t v) { return "targets: class " + std::to_string(v); });
  CHECK(error_of([&] { synchronize(d); }).find("targets: class 4") == 0);
  check_index_range(targets, 5, -100, [](int64_t v) { return "targets: class " + std::to_string(v); });
  synchronize(d);
}
