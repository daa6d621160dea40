// Note [Channels-last] (engine/ops.h): a channels-last tensor holds the same values as a contiguous
// one; the ops keep the layout where the Note says and give the same results, exactly for
// elementwise ops and copies, to rounding where a sum runs in another order (reductions, and
// oneDNN's channels-last kernels, whose products are summed in their own order: 1e-5 normwise in
// float32, a few units of float32 rounding over these sizes). Gradients and second derivatives in
// float64 are checked for every op in test_gradcheck's table, channels-last cases included.
#include <doctest/doctest.h>

#include <cstring>

#include "evenflow/engine/cpu/cpu_conv.h"
#include "evenflow/engine/ops.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::testing;

namespace {

constexpr MemoryFormat kCL = MemoryFormat::ChannelsLast;

}  // namespace

TEST_CASE("channels-last: a layout change keeps every value, and a one-channel tensor is a view") {
  manual_seed(cpu(), 1);
  // Both float dtypes; sizes that merge into no simpler walk.
  for (const DType dtype : {kFloat32, kFloat64}) {
    for (const Shape& shape : {Shape{2, 3, 4, 5}, Shape{3, 17, 5, 7}, Shape{2, 40, 3, 11}}) {
      CAPTURE(shape_str(shape));
      const Tensor x = randn(shape, {.dtype = dtype});
      const Tensor y = x.contiguous(kCL);
      CHECK(y.is_channels_last());
      CHECK(!y.is_contiguous());
      CHECK(y.strides() == Shape{shape[1] * shape[2] * shape[3], 1, shape[1] * shape[3], shape[1]});
      CHECK(vals(y) == vals(x));
      const Tensor back = y.contiguous();
      CHECK(back.is_contiguous());
      CHECK(vals(back) == vals(x));
      CHECK(y.contiguous(kCL).same(y));
    }
  }
  const Tensor one = randn({2, 1, 4, 5});
  const Tensor one_cl = one.contiguous(kCL);
  CHECK(one_cl.is_channels_last());
  CHECK(one_cl.data_ptr() == one.data_ptr());
  CHECK(error_of([] {
          (void)contiguous(randn({2, 3}), kCL);
        }).find("contiguous: channels-last needs a 4-D [N, C, H, W] tensor, got Tensor[2, 3]") == 0);
}

// Note [Transposing copies] (engine/cpu/cpu_elementwise.cpp): layout changes of one dtype go by
// 8 x 8 tiles. The memory of both layouts, read raw, against the place each element must have, for
// every storage dtype: tiles cut by the edges (13 channels, 35 pixels), whole tiles, planes split
// into several threads' blocks of rows, with and without a cut tile (203 channels back, 70 pixels
// forth), and planes under a tile (the elementwise walk).
TEST_CASE("channels-last: layout changes by tiles put every element where the layout says, every dtype") {
  manual_seed(cpu(), 3);
  for (const DType dtype : {kFloat32, kFloat64, kInt64, kBFloat16}) {
    for (const Shape& s : {Shape{3, 13, 5, 7}, Shape{2, 64, 7, 7}, Shape{1, 8, 8, 8}, Shape{1, 203, 9, 1},
                           Shape{1, 9, 70, 1}, Shape{2, 3, 4, 4}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(shape_str(s));
      const Tensor x = mul_scalar(randn(s, {.dtype = kFloat64}), 1000.0).to(dtype);
      const Tensor cl = x.contiguous(kCL);
      const Tensor back = cl.contiguous();
      const auto size = static_cast<int64_t>(dtype_size(dtype));
      const auto* xb = static_cast<const unsigned char*>(x.data_ptr());
      const auto* cb = static_cast<const unsigned char*>(cl.data_ptr());
      const auto* bb = static_cast<const unsigned char*>(back.data_ptr());
      int64_t misplaced = 0, misplaced_back = 0;
      for (int64_t n = 0; n < s[0]; ++n)
        for (int64_t c = 0; c < s[1]; ++c)
          for (int64_t h = 0; h < s[2]; ++h)
            for (int64_t w = 0; w < s[3]; ++w) {
              const int64_t at = ((n * s[1] + c) * s[2] + h) * s[3] + w, at_cl = ((n * s[2] + h) * s[3] + w) * s[1] + c;
              misplaced += std::memcmp(xb + at * size, cb + at_cl * size, static_cast<size_t>(size)) != 0;
              misplaced_back += std::memcmp(xb + at * size, bb + at * size, static_cast<size_t>(size)) != 0;
            }
      CHECK(misplaced == 0);
      CHECK(misplaced_back == 0);
    }
  }
}

TEST_CASE("channels-last: elementwise ops keep the layout of their first operand of the result's shape") {
  manual_seed(cpu(), 2);
  const Tensor a = randn({2, 5, 3, 4}, {.dtype = kFloat64}), b = randn({2, 5, 3, 4}, {.dtype = kFloat64});
  const Tensor a_cl = a.contiguous(kCL), b_cl = b.contiguous(kCL);
  const Tensor bias = randn({1, 5, 1, 1}, {.dtype = kFloat64}), per_sample = randn({2, 1, 1, 1}, {.dtype = kFloat64});
  CHECK(exp(a_cl).is_channels_last());
  CHECK(vals(exp(a_cl)) == vals(exp(a)));
  CHECK((a_cl + b).is_channels_last());
  CHECK((b + a_cl).is_contiguous());
  CHECK(vals(a_cl + b) == vals(a + b));
  CHECK(vals(b + a_cl) == vals(a + b));
  CHECK(vals(a_cl * b_cl) == vals(a * b));
  CHECK((a_cl * bias).is_channels_last());
  CHECK(vals(a_cl * bias - per_sample) == vals(a * bias - per_sample));
  // An expanded operand has no layout of its own: the next operand's counts.
  const Tensor expanded = expand(per_sample, a.shape());
  CHECK((expanded * a_cl).is_channels_last());
  CHECK(vals(expanded * a_cl) == vals(expanded * a));
  CHECK(vals(where(gt(a_cl, b), a_cl, b_cl)) == vals(where(gt(a, b), a, b)));
  CHECK(where(gt(a_cl, b), a_cl, b_cl).is_channels_last());
  // Reductions sum in memory order: the same values to rounding.
  for (const Shape& dims : {Shape{0, 2, 3}, Shape{1, 2, 3}, Shape{1}, Shape{}}) {
    CAPTURE(shape_str(dims));
    CHECK(compare(sum(a_cl, dims), sum(a, dims), 1e-13, 1e-13) == "");
  }
}

TEST_CASE("channels-last: layer_norm over [C, H, W] keeps the layout, with the contiguous one's gradients") {
  manual_seed(cpu(), 3);
  const TensorOptions f64{.dtype = kFloat64};
  const Tensor x = randn({3, 6, 4, 5}, f64), w = randn({6, 4, 5}, f64), b = randn({6, 4, 5}, f64);
  const Tensor gy = randn({3, 6, 4, 5}, f64);
  // Each case: the layout of x; the output, the first gradients and, with create_graph, a second
  // derivative (the gradient of a function of gx, as a gradient penalty takes it).
  std::vector<std::vector<Tensor>> results;
  for (const bool channels_last : {false, true}) {
    const Tensor xl = (channels_last ? x.contiguous(kCL) : x).detach().requires_grad_();
    const Tensor wl = w.detach().requires_grad_(), bl = b.detach().requires_grad_();
    const Tensor y = layer_norm(xl, {6, 4, 5}, wl, bl);
    CHECK(y.is_channels_last() == channels_last);
    const std::vector<Tensor> first = grad({y}, {xl, wl, bl}, {gy});  // the fused backward kernel
    CHECK(first[0].is_channels_last() == channels_last);
    const std::vector<Tensor> g = grad({layer_norm(xl, {6, 4, 5}, wl, bl)}, {xl, wl}, {gy}, {.create_graph = true});
    const std::vector<Tensor> second = grad({sum(square(g[0])) + sum(g[1] * g[1])}, {xl, wl});
    results.push_back({y, first[0], first[1], first[2], second[0], second[1]});
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    CAPTURE(i);
    CHECK(compare(results[1][i], results[0][i], 1e-12, 1e-12) == "");
  }
}

// A channels-last layer norm's parameters are indexed in their own [C, H, W] order by the kernels
// (NormArgs::param_channels; on the CPU, copied into the group's order and their gradients back):
// every mix of a weight and a bias present or absent, each wanting its gradient or not, and x
// wanting its own or not, against the contiguous layout's, to second order.
TEST_CASE("channels-last: layer_norm with either parameter absent or without a gradient matches the contiguous one") {
  manual_seed(cpu(), 7);
  const TensorOptions f64{.dtype = kFloat64};
  const Tensor x = randn({5, 6, 4, 5}, f64), w = randn({6, 4, 5}, f64), b = randn({6, 4, 5}, f64);
  const Tensor gy = randn({5, 6, 4, 5}, f64);
  for (const bool has_w : {false, true})
    for (const bool has_b : {false, true})
      for (const bool w_grad : {false, true})
        for (const bool b_grad : {false, true})
          for (const bool x_grad : {false, true}) {
            if ((w_grad && !has_w) || (b_grad && !has_b) || !(x_grad || w_grad || b_grad)) continue;
            CAPTURE(has_w);
            CAPTURE(has_b);
            CAPTURE(w_grad);
            CAPTURE(b_grad);
            CAPTURE(x_grad);
            std::vector<std::vector<Tensor>> results;
            for (const bool channels_last : {false, true}) {
              Tensor xl = (channels_last ? x.contiguous(kCL) : x).detach();
              Tensor wl = has_w ? w.detach() : Tensor(), bl = has_b ? b.detach() : Tensor();
              std::vector<Tensor> inputs;
              for (auto [t, wanted] : {std::pair{&xl, x_grad}, std::pair{&wl, w_grad}, std::pair{&bl, b_grad}}) {
                if (!wanted) continue;
                t->requires_grad_();
                inputs.push_back(*t);
              }
              const Tensor y = layer_norm(xl, {6, 4, 5}, wl, bl);
              std::vector<Tensor> out{y.detach()};
              const std::vector<Tensor> g = grad({y}, inputs, {gy}, {.create_graph = true});
              Tensor penalty = zeros({}, f64);
              for (const Tensor& t : g) {
                out.push_back(t.detach());
                penalty = penalty + sum(square(t));
              }
              if (penalty.requires_grad())
                for (const Tensor& t : grad({penalty}, inputs, {}, {.allow_unused = true})) out.push_back(t);
              results.push_back(out);
            }
            REQUIRE(results[0].size() == results[1].size());
            for (size_t i = 0; i < results[0].size(); ++i) {
              CAPTURE(i);
              CHECK(results[0][i].defined() == results[1][i].defined());
              if (results[0][i].defined()) CHECK(compare(results[1][i], results[0][i], 1e-12, 1e-12) == "");
            }
          }
}

TEST_CASE("channels-last: batch_norm keeps the layout, with the contiguous one's values, gradients and statistics") {
  manual_seed(cpu(), 5);
  const TensorOptions f64{.dtype = kFloat64};
  const Tensor x = randn({3, 6, 4, 5}, f64) * 2.0 + 1.0, w = randn({6}, f64), b = randn({6}, f64);
  const Tensor gy = randn({3, 6, 4, 5}, f64);
  // Each case: the output, the running statistics, the first gradients (the fused backward kernel),
  // a second derivative through create_graph (the double backward kernel), and eval mode's output.
  std::vector<std::vector<Tensor>> results;
  for (const bool channels_last : {false, true}) {
    const Tensor xl = (channels_last ? x.contiguous(kCL) : x).detach().requires_grad_();
    const Tensor wl = w.detach().requires_grad_(), bl = b.detach().requires_grad_();
    const Tensor running_mean = zeros({6}, f64), running_var = ones({6}, f64);
    const Tensor y = batch_norm(xl, wl, bl, running_mean, running_var, true, 0.1, 1e-5);
    CHECK(y.is_channels_last() == channels_last);
    const std::vector<Tensor> first = grad({y}, {xl, wl, bl}, {gy});
    CHECK(first[0].is_channels_last() == channels_last);
    const std::vector<Tensor> g =
        grad({batch_norm(xl, wl, bl, Tensor(), Tensor(), true, 0.1, 1e-5)}, {xl, wl}, {gy}, {.create_graph = true});
    const std::vector<Tensor> second = grad({sum(square(g[0])) + sum(g[1] * g[1])}, {xl, wl});
    const Tensor eval = batch_norm(xl.detach(), w, b, running_mean, running_var, false, 0.1, 1e-5);
    results.push_back({y, running_mean, running_var, first[0], first[1], first[2], second[0], second[1], eval});
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    CAPTURE(i);
    CHECK(compare(results[1][i], results[0][i], 1e-12, 1e-12) == "");
  }
}

// A transposed convolution is conv2d_input_grad (Note [Conv double backward] in ops/conv.cpp): its
// memory_format is that pass's.
TEST_CASE("channels-last: conv_transpose2d gives the contiguous one's values, forward, backward and double backward") {
  manual_seed(cpu(), 6);
  for (const int64_t c_out : {1, 32}) {
    CAPTURE(c_out);
    const Tensor x = randn({4, 32, 7, 7}), w = randn({32, c_out, 4, 4}) * 0.2, bias = randn({c_out});
    std::vector<std::vector<Tensor>> results;
    for (const bool channels_last : {false, true}) {
      const ConvTranspose2dOptions o{
          .stride = {2, 2}, .padding = {1, 1}, .memory_format = channels_last ? kCL : MemoryFormat::Contiguous};
      const Tensor xl = (channels_last ? x.contiguous(kCL) : x).detach().requires_grad_();
      const Tensor wl = w.detach().requires_grad_();
      const Tensor y = conv_transpose2d(xl, wl, bias, o);
      // oneDNN runs the pass channels-last for 32 output channels; our one-channel kernel writes a
      // one-channel image, the same memory in either layout.
      CHECK(y.is_channels_last() == (channels_last && (EF_ONEDNN || c_out == 1)));
      const std::vector<Tensor> g = grad({sum(square(tanh(y)))}, {xl, wl}, {}, {.create_graph = true});
      const std::vector<Tensor> second = grad({sum(square(g[0])) + sum(square(g[1]))}, {xl, wl});
      results.push_back({y, g[0], g[1], second[0], second[1]});
    }
    for (size_t i = 0; i < results[0].size(); ++i) {
      CAPTURE(i);
      CHECK(compare_normwise(results[1][i], results[0][i], 1e-5) == "");
    }
  }
}

// Where oneDNN runs a pass (float32; bfloat16 compute on AVX-512 machines), its channels-last kernels
// take and give our channels-last tensors themselves; elsewhere the pass runs contiguous. Either way
// each pass must give the contiguous pass's values.
TEST_CASE("channels-last: convolutions give the contiguous ones' values, forward, backward and double backward") {
  manual_seed(cpu(), 4);
  for (const DType compute : {kFloat32, kBFloat16}) {
    for (const int64_t c_in : {1, 3, 32}) {
      CAPTURE(c_in);
      CAPTURE(dtype_name(compute));
      const Tensor x = rand({4, c_in, 14, 14}), w = randn({16, c_in, 4, 4}) * 0.2, bias = randn({16});
      std::vector<std::vector<Tensor>> results;
      for (const bool channels_last : {false, true}) {
        const Conv2dOptions o{.stride = {2, 2},
                              .padding = {1, 1},
                              .compute = compute,
                              .memory_format = channels_last ? kCL : MemoryFormat::Contiguous};
        const Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_();
        const Tensor y = conv2d(xl, wl, bias, o);
        CHECK(y.is_channels_last() == (channels_last && EF_ONEDNN));  // oneDNN runs every forward here
        // A critic's penalty: the gradient of the output at x, then its norm's gradient.
        const Tensor h = leaky_relu(y, 0.2);
        const std::vector<Tensor> g = grad({sum(square(h))}, {xl, wl}, {}, {.create_graph = true});
        // The input gradient is channels-last where the CPU backend runs it so: oneDNN's passes
        // (which of the first layer's depends on the CPU: Note [oneDNN convolution dispatch]) and
        // our one-channel input gradient.
        const ConvArgs args{.n = 4,
                            .c_in = c_in,
                            .h = 14,
                            .w = 14,
                            .c_out = 16,
                            .kh = 4,
                            .kw = 4,
                            .oh = 7,
                            .ow = 7,
                            .stride_h = 2,
                            .stride_w = 2,
                            .pad_h = 1,
                            .pad_w = 1,
                            .channels_last = true};
        const bool input_grad_cl = cpu_backend::conv_takes_channels_last(args, ConvPass::InputGrad, kFloat32);
        if (c_in != 3) CHECK(input_grad_cl == (c_in == 1 || EF_ONEDNN));
        CHECK(g[0].is_channels_last() == (channels_last && input_grad_cl));
        const std::vector<Tensor> second = grad({sum(square(g[0]))}, {xl, wl});
        results.push_back({y, g[0], g[1], second[0], second[1]});
      }
      for (size_t i = 0; i < results[0].size(); ++i) {
        CAPTURE(i);
        CHECK(compare_normwise(results[1][i], results[0][i], 1e-5) == "");
      }
    }
  }
}
