// Note [bfloat16 compute] (engine/ops.h): matrix products and convolutions with bfloat16 operands
// and float32 accumulation. What they compute is the float32 product of the operands rounded to
// bfloat16 (exactly, or in another summation order where oneDNN's bfloat16 kernels run); their
// backward and double backward products are bfloat16 too; and against float64 their value,
// gradients and second-order gradients stay within bfloat16's precision (unit roundoff 2^-8 =
// 3.9e-3 per operand, about 2.3e-3 on average: products off by about 3e-3 normwise), the tolerance
// every op in bfloat16 is held to here.
#include <doctest/doctest.h>

#include "evenflow/engine/ops.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::testing;

namespace {

Tensor rounded(const Tensor& t) {
  return t.detach().to(kBFloat16).to(kFloat32);
}

// The normwise relative error that bfloat16 operands may cause in a product or convolution and in
// its first and second derivatives (each a product of bfloat16-rounded factors): 3e-3 expected,
// three times that allowed.
constexpr double kBf16Normwise = 1e-2;

}  // namespace

TEST_CASE("bfloat16 compute: a product multiplies the operands rounded to bfloat16") {
  manual_seed(cpu(), 1);
  const Tensor a = randn({33, 70}), b = randn({70, 20});
  const Tensor want = matmul(rounded(a), rounded(b));
  // Where oneDNN multiplies in bfloat16 itself (AVX512-BF16 or AMX machines) it sums in its own
  // order: the same products to float32 rounding.
  CHECK(compare_normwise(matmul(a, b, {.compute = kBFloat16}), want, 1e-6) == "");
  CHECK(compare_normwise(matmul(a, b), want, 1e-4) != "");
  const Tensor x = randn({4, 3, 9, 9}), w = randn({5, 3, 3, 3}), bias = randn({5});
  const Conv2dOptions bf16{.padding = {1, 1}, .compute = kBFloat16};
  CHECK(compare_normwise(conv2d(x, w, bias, bf16), conv2d(rounded(x), rounded(w), bias, {.padding = {1, 1}}), 1e-6) ==
        "");
  CHECK(error_of([&] {
          (void)matmul(a.to(kFloat64), b.to(kFloat64), {.compute = kBFloat16});
        }).find("matmul: bfloat16 compute takes float32 operands, got float64") == 0);
}

// Sixteen input channels and more: where the backend multiplies in bfloat16 itself (oneDNN on
// AVX-512 machines, Backend::bf16_conv), each of the three passes must still be the float32
// convolution of the rounded operands, summed in another order (float32 rounding: 1e-6 normwise),
// and not the float32 convolution of the unrounded ones.
TEST_CASE("bfloat16 compute: every convolution pass with a backend's own bfloat16 kernels") {
  manual_seed(cpu(), 4);
  const Conv2dOptions f32{.stride = {1, 1}, .padding = {1, 1}};
  Conv2dOptions bf16 = f32;
  bf16.compute = kBFloat16;
  for (const int64_t c_in : {16, 32}) {
    CAPTURE(c_in);
    const Tensor x = randn({4, c_in, 10, 10}), w = randn({24, c_in, 3, 3}) * 0.1, bias = randn({24});
    const Tensor gy = randn({4, 24, 10, 10});
    const std::vector<std::pair<Tensor, Tensor>> passes = {
        {conv2d(x, w, bias, bf16), conv2d(rounded(x), rounded(w), bias, f32)},
        {conv2d_input_grad(gy, w, x.shape(), bf16), conv2d_input_grad(rounded(gy), rounded(w), x.shape(), f32)},
        {conv2d_weight_grad(x, gy, w.shape(), bf16), conv2d_weight_grad(rounded(x), rounded(gy), w.shape(), f32)},
    };
    const std::vector<Tensor> unrounded = {conv2d(x, w, bias, f32), conv2d_input_grad(gy, w, x.shape(), f32),
                                           conv2d_weight_grad(x, gy, w.shape(), f32)};
    for (size_t i = 0; i < passes.size(); ++i) {
      CAPTURE(i);
      CHECK(compare_normwise(passes[i].first, passes[i].second, 1e-6) == "");
      CHECK(compare_normwise(passes[i].first, unrounded[i], 1e-4) != "");
    }
  }
}

// Note [bfloat16 operands converted once] (engine/ops/conv.cpp): a convolution's nodes carry the
// bfloat16 copies of their operands to the passes of their backward, and those of the backward to
// the double backward (bfloat16 ones for the backend's bfloat16 kernels: 16 or more input channels
// a group, the weight's copy OHWI beside channels-last activations; rounded float32 ones for the
// float32 kernels: 1). Each product there must still be the float32 product of its own operands
// rounded (1e-6 normwise), in both layouts: a copy carried to a pass must be of the right tensor.
TEST_CASE("bfloat16 compute: a convolution's gradients and second-order gradients multiply rounded operands") {
  manual_seed(cpu(), 6);
  struct Case {
    int64_t c_in, groups;
    MemoryFormat layout;
  };
  for (const Case& c : {Case{32, 1, MemoryFormat::Contiguous}, Case{32, 1, MemoryFormat::ChannelsLast},
                        Case{32, 2, MemoryFormat::ChannelsLast}, Case{1, 1, MemoryFormat::ChannelsLast}}) {
    CAPTURE(c.c_in);
    CAPTURE(c.groups);
    CAPTURE(c.layout == MemoryFormat::ChannelsLast);
    const Conv2dOptions f32{.stride = {2, 2}, .padding = {1, 1}, .groups = c.groups, .memory_format = c.layout};
    Conv2dOptions bf16 = f32;
    bf16.compute = kBFloat16;
    const Tensor x = randn({4, c.c_in, 10, 10}).contiguous(c.layout).requires_grad_(true);
    const Tensor w = (randn({16, c.c_in / c.groups, 4, 4}) * 0.1).requires_grad_(true);
    const Tensor y = conv2d(x, w, Tensor(), bf16);
    const Tensor gy = randn(y.shape()).requires_grad_(true);
    const auto first = grad({y}, {x, w}, {gy}, {.create_graph = true});
    CHECK(compare_normwise(first[0], conv2d_input_grad(rounded(gy), rounded(w), x.shape(), f32), 1e-6) == "");
    CHECK(compare_normwise(first[1], conv2d_weight_grad(rounded(x), rounded(gy), w.shape(), f32), 1e-6) == "");
    // A penalty's second order: <gx, vx> + <gw, vw> differentiated by x, w and gy.
    const Tensor vx = randn(x.shape()), vw = randn(w.shape());
    const auto second = grad({sum(first[0] * vx) + sum(first[1] * vw)}, {x, w, gy});
    const Tensor want_x = conv2d_input_grad(rounded(gy), rounded(vw), x.shape(), f32);
    const Tensor want_w = conv2d_weight_grad(rounded(vx), rounded(gy), w.shape(), f32);
    const Tensor want_gy =
        conv2d(rounded(vx), rounded(w), Tensor(), f32) + conv2d(rounded(x), rounded(vw), Tensor(), f32);
    CHECK(compare_normwise(second[0], want_x, 1e-6) == "");
    CHECK(compare_normwise(second[1], want_w, 1e-6) == "");
    CHECK(compare_normwise(second[2], want_gy, 1e-6) == "");
    CHECK(compare_normwise(second[2], conv2d(vx, w, Tensor(), f32) + conv2d(x, vw, Tensor(), f32), 1e-4) != "");
  }
}

// Every layout a product's operands come in (Backend::gemm's transposes, leading dimensions past
// the row, batches, a broadcast operand): with a backend's own bfloat16 kernel (oneDNN's matmul,
// whose reorders read our strides) each must be the float32 product of the rounded operands, summed
// in another order (1e-6 normwise), and not the product of the unrounded ones.
TEST_CASE("bfloat16 compute: products of every operand layout") {
  manual_seed(cpu(), 5);
  const Tensor a = randn({3, 40, 50}), b = randn({3, 50, 30}), wide = randn({40, 64}), square = randn({40, 40});
  // A long inner dimension: oneDNN's B kept dense in its own layout, transposed or not, rather than
  // blocked (make_plan in engine/cpu/onednn_matmul.cpp), with a leading dimension past the row too.
  const Tensor deep_a = randn({20, 1100}), deep_b = randn({24, 1130}), deep_wide = randn({1100, 40});
  struct Case {
    std::string name;
    Tensor x, y;
  };
  const std::vector<Case> cases = {
      {"plain", a.select(0, 0), b.select(0, 0)},
      {"A transposed", a.select(0, 0).t().contiguous().t(), b.select(0, 0)},
      {"B transposed", a.select(0, 0), b.select(0, 0).t().contiguous().t()},
      {"both transposed", a.select(0, 0).t().contiguous().t(), b.select(0, 0).t().contiguous().t()},
      {"leading dimension past the row", slice(wide, 1, 0, 50), b.select(0, 0)},
      {"batched", a, b},
      {"batched, B broadcast", a, b.select(0, 1)},
      {"batched, A transposed", a.transpose(1, 2).contiguous().transpose(1, 2), b},
      // A side under 16: the rounded operands on the float32 GEMM even where oneDNN could take it.
      {"one row", a.select(0, 0).slice(0, 0, 1), b.select(0, 0)},
      {"one column", a.select(0, 0), b.select(0, 0).slice(1, 0, 1)},
      {"outer product", a.select(0, 0).slice(1, 0, 1), b.select(0, 0).slice(0, 0, 1)},
      // Same sizes and leading dimensions, only the transposes differ: plans must not be shared.
      {"square", square, wide.slice(1, 0, 40)},
      {"square, A transposed", square.t(), wide.slice(1, 0, 40)},
      {"square, B transposed", square, wide.slice(1, 0, 40).t()},
      {"deep, B transposed", deep_a, deep_b.slice(1, 0, 1100).t()},
      {"deep, B transposed contiguous", deep_a, deep_b.slice(1, 0, 1100).contiguous().t()},
      {"deep, B plain", deep_a, deep_b.slice(1, 0, 1100).t().contiguous()},
      {"deep, B plain, leading dimension past the row", deep_a, slice(deep_wide, 1, 0, 24)},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const Tensor got = matmul(c.x, c.y, {.compute = kBFloat16});
    CHECK(compare_normwise(got, matmul(rounded(c.x), rounded(c.y)), 1e-6) == "");
    CHECK(compare_normwise(got, matmul(c.x, c.y), 1e-4) != "");
  }
}

TEST_CASE("bfloat16 compute: the backward products round their operands too") {
  manual_seed(cpu(), 2);
  const Tensor a = randn({8, 16}).requires_grad_(true), b = randn({16, 4}).requires_grad_(true);
  const Tensor g = randn({8, 4});
  const auto grads = grad({matmul(a, b, {.compute = kBFloat16})}, {a, b}, {g});
  CHECK(compare_normwise(grads[0], matmul(rounded(g), rounded(b).t()), 1e-6) == "");
  CHECK(compare_normwise(grads[1], matmul(rounded(a).t(), rounded(g)), 1e-6) == "");
}

// Value, gradients and second derivatives of conv2d and linear in bfloat16 compute, against the
// same computed in float64 from the same float32 inputs.
TEST_CASE("bfloat16 compute: values, gradients and second-order gradients within bfloat16's precision of float64") {
  manual_seed(cpu(), 3);
  struct Case {
    std::string name;
    std::vector<Tensor> inputs;
    std::function<Tensor(const std::vector<Tensor>&, DType)> fn;
  };
  const std::vector<Case> cases = {
      {"conv2d",
       {randn({6, 8, 12, 12}), randn({16, 8, 3, 3}) * 0.2, randn({16})},
       [](const std::vector<Tensor>& t, DType c) {
         return conv2d(t[0], t[1], t[2], {.padding = {1, 1}, .compute = c});
       }},
      {"conv_transpose2d",
       {randn({6, 8, 7, 7}), randn({8, 4, 4, 4}) * 0.2},
       [](const std::vector<Tensor>& t, DType c) {
         return conv_transpose2d(t[0], t[1], Tensor(), {.stride = {2, 2}, .padding = {1, 1}, .compute = c});
       }},
      {"linear",
       {randn({32, 64}), randn({48, 64}) * 0.1, randn({48})},
       [](const std::vector<Tensor>& t, DType c) { return linear(t[0], t[1], t[2], {.compute = c}); }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    // tanh makes the second derivative depend on the product's value, as a penalty's does.
    const auto derivatives = [&](DType dtype, DType compute) {
      std::vector<Tensor> leaves;
      for (const Tensor& t : c.inputs) leaves.push_back(t.detach().to(dtype).requires_grad_(true));
      const Tensor y = tanh(c.fn(leaves, compute));
      const std::vector<Tensor> g = grad({sum(y)}, leaves, {}, {.create_graph = true});
      Tensor norm2;
      for (const Tensor& gi : g) norm2 = norm2.defined() ? norm2 + sum(square(gi)) : sum(square(gi));
      std::vector<Tensor> out{y.detach()};
      for (const Tensor& gi : g) out.push_back(gi.detach());
      for (const Tensor& gg : grad({norm2}, leaves)) out.push_back(gg);
      return out;
    };
    const auto ref = derivatives(kFloat64, kFloat32), bf16 = derivatives(kFloat32, kBFloat16);
    REQUIRE(ref.size() == bf16.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      CAPTURE(i);
      CHECK(compare_normwise(bf16[i].to(kFloat64), ref[i], kBf16Normwise) == "");
    }
  }
}
