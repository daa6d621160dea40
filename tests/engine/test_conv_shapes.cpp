// Convolution at the edges of its geometry: 1x1, 1xN and Nx1 images, where a kernel overhangs the
// image on every side and whole col rows are padding (the CPU backend's im2col must then write
// exactly its tile's pixels, Note [Shifted im2col]). conv2d, conv2d_input_grad, conv2d_weight_grad
// and conv_transpose2d, values and gradients, against direct loops in float64.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using evenflow::testing::compare;

namespace {

struct ConvCase {
  std::string name;
  int64_t kh, kw;
  Conv2dOptions o;
  std::pair<int64_t, int64_t> output_padding{0, 0};  // conv_transpose2d only
};

// The geometries of the op table (tests/engine/op_table.cpp), plus "same" kernels 3 and 5, plain
// and with groups and dilation.
std::vector<ConvCase> conv_cases() {
  return {
      {"3x2 stride 2,1 pad 1,0 dil 1,2 groups 2",
       3,
       2,
       {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2}},
      {"3x3 pad 1", 3, 3, {.padding = {1, 1}}},
      {"3x3 pad 1 groups 2", 3, 3, {.padding = {1, 1}, .groups = 2}},
      {"3x3 pad 2 dil 2", 3, 3, {.padding = {2, 2}, .dilation = {2, 2}}},
      {"3x3 stride 2 pad 1 (output padding 1)", 3, 3, {.stride = {2, 2}, .padding = {1, 1}}, {1, 1}},
      {"3x3 stride 1,2 pad 1,0 dil 2,1 (output padding 1,1: past the stride in h)",
       3,
       3,
       {.stride = {1, 2}, .padding = {1, 0}, .dilation = {2, 1}},
       {1, 1}},
      {"2x2 stride 2 groups 2", 2, 2, {.stride = {2, 2}, .groups = 2}},
      {"5x5 pad 2", 5, 5, {.padding = {2, 2}}},
      {"5x5 pad 2 groups 2", 5, 5, {.padding = {2, 2}, .groups = 2}},
      {"1x1", 1, 1, {}},
  };
}

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// The convolution of x [n, c, h, w] with w [o, c/groups, kh, kw] as direct loops over every
// (sample, output channel, output pixel, kernel tap) whose input pixel lies inside x; visit(xi, wi,
// yi) receives the flat indices of the three operands that the tap multiplies together.
template <typename Visit>
void for_each_tap(const Shape& xs, const Shape& ws, const Conv2dOptions& o, Visit visit) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], w = xs[3], oc = ws[0], cg = ws[1], kh = ws[2], kw = ws[3];
  const int64_t og = oc / o.groups;
  const int64_t oh = out_size(h, kh, o.stride.first, o.padding.first, o.dilation.first);
  const int64_t ow = out_size(w, kw, o.stride.second, o.padding.second, o.dilation.second);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t k = 0; k < oc; ++k)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x)
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = y * o.stride.first - o.padding.first + i * o.dilation.first;
                const int64_t iw = x * o.stride.second - o.padding.second + j * o.dilation.second;
                if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                const int64_t in_c = k / og * cg + ci;
                visit(((s * c + in_c) * h + ih) * w + iw, ((k * cg + ci) * kh + i) * kw + j,
                      ((s * oc + k) * oh + y) * ow + x);
              }
}

// Direct-loop conv2d and its two adjoints, in float64.
Tensor ref_conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& o) {
  const Shape& xs = x.shape();
  const Shape ys{xs[0], w.size(0), out_size(xs[2], w.size(2), o.stride.first, o.padding.first, o.dilation.first),
                 out_size(xs[3], w.size(3), o.stride.second, o.padding.second, o.dilation.second)};
  const std::vector<double> xv = x.to_vector(), wv = w.to_vector();
  std::vector<double> y(static_cast<size_t>(numel_of(ys)), 0.0);
  for_each_tap(xs, w.shape(), o, [&](int64_t xi, int64_t wi, int64_t yi) {
    y[static_cast<size_t>(yi)] += xv[static_cast<size_t>(xi)] * wv[static_cast<size_t>(wi)];
  });
  return from_vector(y, ys, {.dtype = kFloat64});
}

Tensor ref_input_grad(const Tensor& gy, const Tensor& w, const Shape& xs, const Conv2dOptions& o) {
  const std::vector<double> gv = gy.to_vector(), wv = w.to_vector();
  std::vector<double> gx(static_cast<size_t>(numel_of(xs)), 0.0);
  for_each_tap(xs, w.shape(), o, [&](int64_t xi, int64_t wi, int64_t yi) {
    gx[static_cast<size_t>(xi)] += gv[static_cast<size_t>(yi)] * wv[static_cast<size_t>(wi)];
  });
  return from_vector(gx, xs, {.dtype = kFloat64});
}

Tensor ref_weight_grad(const Tensor& x, const Tensor& gy, const Shape& ws, const Conv2dOptions& o) {
  const std::vector<double> xv = x.to_vector(), gv = gy.to_vector();
  std::vector<double> gw(static_cast<size_t>(numel_of(ws)), 0.0);
  for_each_tap(x.shape(), ws, o, [&](int64_t xi, int64_t wi, int64_t yi) {
    gw[static_cast<size_t>(wi)] += xv[static_cast<size_t>(xi)] * gv[static_cast<size_t>(yi)];
  });
  return from_vector(gw, ws, {.dtype = kFloat64});
}

void check_close(const Tensor& got, const Tensor& ref, const std::string& what) {
  REQUIRE_MESSAGE(got.shape() == ref.shape(),
                  what << ": shape " << shape_str(got.shape()) << " vs reference " << shape_str(ref.shape()));
  const std::string failure = compare(got, ref, 1e-10, 1e-10);
  CHECK_MESSAGE(failure.empty(), what << ": " << failure);
}

}  // namespace

TEST_CASE(
    "conv shapes: conv2d and its gradients and conv_transpose2d at 1x1 and 1xN and Nx1 images match direct loops") {
  const TensorOptions f64{.dtype = kFloat64};
  const std::vector<std::pair<int64_t, int64_t>> images{{1, 1}, {1, 5}, {5, 1}, {1, 7}, {7, 1}, {2, 2}, {3, 5}};
  const int64_t n = 3, c_in = 4, c_out = 6;
  manual_seed(cpu(), 11);
  int checked = 0;
  for (const ConvCase& cc : conv_cases()) {
    const Conv2dOptions& o = cc.o;
    for (const auto& [h, w] : images) {
      CAPTURE(cc.name);
      CAPTURE(h);
      CAPTURE(w);
      const Shape xs{n, c_in, h, w}, ws{c_out, c_in / o.groups, cc.kh, cc.kw};

      // conv2d where the padded image holds the kernel: forward, then both gradients through grad().
      if (out_size(h, cc.kh, o.stride.first, o.padding.first, o.dilation.first) >= 1 &&
          out_size(w, cc.kw, o.stride.second, o.padding.second, o.dilation.second) >= 1 &&
          h + 2 * o.padding.first >= o.dilation.first * (cc.kh - 1) + 1 &&
          w + 2 * o.padding.second >= o.dilation.second * (cc.kw - 1) + 1) {
        const Tensor x = randn(xs, {.dtype = kFloat64, .requires_grad = true});
        const Tensor wt = randn(ws, {.dtype = kFloat64, .requires_grad = true});
        const Tensor b = randn({c_out}, {.dtype = kFloat64, .requires_grad = true});
        const Tensor y = conv2d(x, wt, b, o);
        const Tensor y_ref = ref_conv2d(x, wt, o) + reshape(b.detach(), {1, c_out, 1, 1});
        check_close(y, y_ref, "conv2d");
        const Tensor gy = randn(y.shape(), f64);
        const std::vector<Tensor> g = grad({y}, {x, wt, b}, {gy});
        check_close(g[0], ref_input_grad(gy, wt, xs, o), "conv2d d/dx");
        check_close(g[1], ref_weight_grad(x, gy, ws, o), "conv2d d/dw");
        check_close(g[2], sum(gy, {0, 2, 3}), "conv2d d/dbias");
        // The gradient ops called directly.
        check_close(conv2d_input_grad(gy, wt.detach(), xs, o), ref_input_grad(gy, wt, xs, o), "conv2d_input_grad");
        check_close(conv2d_weight_grad(x.detach(), gy, ws, o), ref_weight_grad(x, gy, ws, o), "conv2d_weight_grad");
        ++checked;
      }

      // conv_transpose2d of the small image, weight [c_in, c_out/groups, kh, kw]: the adjoint of a
      // conv2d from its output back to the small image.
      const ConvTranspose2dOptions to{.stride = o.stride,
                                      .padding = o.padding,
                                      .output_padding = cc.output_padding,
                                      .dilation = o.dilation,
                                      .groups = o.groups};
      const int64_t th =
          (h - 1) * o.stride.first - 2 * o.padding.first + o.dilation.first * (cc.kh - 1) + cc.output_padding.first + 1;
      const int64_t tw = (w - 1) * o.stride.second - 2 * o.padding.second + o.dilation.second * (cc.kw - 1) +
                         cc.output_padding.second + 1;
      if (th < 1 || tw < 1) continue;
      const Tensor x = randn(xs, {.dtype = kFloat64, .requires_grad = true});
      const Tensor wt = randn({c_in, c_out / o.groups, cc.kh, cc.kw}, {.dtype = kFloat64, .requires_grad = true});
      const Tensor y = conv_transpose2d(x, wt, Tensor(), to);
      const Shape ys{n, c_out, th, tw};
      // An output_padding of stride or more: the convolution from ys has more outputs than x (Note
      // [Output padding past the stride] in ops/conv.cpp); they are zero in the adjoint's input.
      const int64_t extra_h = cc.output_padding.first / o.stride.first;
      const int64_t extra_w = cc.output_padding.second / o.stride.second;
      const Tensor x_full = pad(x.detach(), {0, extra_w, 0, extra_h});
      check_close(y, ref_input_grad(x_full, wt, ys, o), "conv_transpose2d");
      const Tensor gy = randn(ys, f64);
      const std::vector<Tensor> g = grad({y}, {x, wt}, {gy});
      check_close(g[0], slice(slice(ref_conv2d(gy, wt, o), 2, 0, h), 3, 0, w), "conv_transpose2d d/dx");
      check_close(g[1], ref_weight_grad(gy, x_full, wt.shape(), o), "conv_transpose2d d/dw");
      ++checked;
    }
  }
  CHECK(checked > 100);
}

// The input gradient of a one-input-channel convolution of up to 32 taps has its own CPU kernel
// (Note [One-channel input gradient] in engine/cpu/cpu_conv.cpp): taps padded to 16 or 32 (4x4 and
// 4x8 exactly, 1x1 to 5x5 padded), blocks of 8, 4, 2 and 1 output pixels, taps that overhang the
// image on either side, the output gradient contiguous or channels-last, float32 and float64, and
// the transposed convolution to one channel that runs it; 6x6 (36 taps) takes the packed GEMM.
TEST_CASE("conv shapes: the one-input-channel input gradient matches direct loops, kernels of 1 to 36 taps") {
  const std::vector<std::pair<std::string, Conv2dOptions>> geometries{
      {"stride 2 pad 1 (wgan_gp's)", {.stride = {2, 2}, .padding = {1, 1}}},
      {"stride 1", {}},
      {"stride 1,3 pad 3,2 dil 1,2", {.stride = {1, 3}, .padding = {3, 2}, .dilation = {1, 2}}},
      {"stride 3 pad 2 dil 2", {.stride = {3, 3}, .padding = {2, 2}, .dilation = {2, 2}}},
  };
  const std::vector<std::pair<int64_t, int64_t>> kernels{{4, 4}, {1, 1}, {3, 3}, {2, 3},
                                                         {5, 5}, {3, 7}, {4, 8}, {6, 6}};
  const std::vector<std::pair<int64_t, int64_t>> images{{1, 1}, {4, 4}, {5, 1}, {3, 5}, {9, 13}, {28, 28}, {6, 37}};
  manual_seed(cpu(), 12);
  int checked = 0;
  for (const auto& [kh, kw] : kernels) {
    for (const auto& [name, o] : geometries) {
      for (const auto& [h, w] : images) {
        for (const int64_t c_out : {1, 6, 33}) {
          if (h + 2 * o.padding.first < (kh - 1) * o.dilation.first + 1 ||
              w + 2 * o.padding.second < (kw - 1) * o.dilation.second + 1)
            continue;
          const int64_t oh = out_size(h, kh, o.stride.first, o.padding.first, o.dilation.first);
          const int64_t ow = out_size(w, kw, o.stride.second, o.padding.second, o.dilation.second);
          if (oh < 1 || ow < 1) continue;
          CAPTURE(kh);
          CAPTURE(kw);
          CAPTURE(name);
          CAPTURE(h);
          CAPTURE(w);
          CAPTURE(c_out);
          const Shape xs{3, 1, h, w};
          const Tensor gy = randn({3, c_out, oh, ow}, {.dtype = kFloat64});
          const Tensor wt = randn({c_out, 1, kh, kw}, {.dtype = kFloat64});
          const Tensor want = ref_input_grad(gy, wt, xs, o);
          for (const MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
            CAPTURE(static_cast<int>(format));
            check_close(conv2d_input_grad(contiguous(gy, format), wt, xs, o), want, "conv2d_input_grad float64");
            const Tensor got32 =
                conv2d_input_grad(contiguous(to_dtype(gy, kFloat32), format), to_dtype(wt, kFloat32), xs, o);
            // float32: operands and sums rounded, sums of at most 33 * 36 products of standard
            // normals (errors near 1e-6); a tap missed or misplaced moves an element by about 1.
            const std::string failure = compare(to_dtype(got32, kFloat64), want, 1e-4, 1e-4);
            CHECK_MESSAGE(failure.empty(), "conv2d_input_grad float32: " << failure);
          }
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 400);
  // The generator's last layer: a transposed convolution from 32 channels to one image, 14x14 to 28x28.
  const Tensor z = randn({2, 32, 14, 14}, {.dtype = kFloat64});
  const Tensor wt = randn({32, 1, 4, 4}, {.dtype = kFloat64});
  const Conv2dOptions o{.stride = {2, 2}, .padding = {1, 1}};
  check_close(conv_transpose2d(z, wt, Tensor(), {.stride = o.stride, .padding = o.padding}),
              ref_input_grad(z, wt, {2, 1, 28, 28}, o), "conv_transpose2d to one channel");
}

// Max pooling's 2x2 stride-2 kernel takes 8 outputs at a time plus a scalar tail: values and argmax
// (seen through the gradient) against the window rule written out here, with NaN, -inf and ties.
TEST_CASE("max_pool2d 2x2 stride 2: vector blocks and tail follow the window rule") {
  for (const DType dt : {kFloat32, kFloat64}) {
    const int64_t n = 2, c = 3, h = 9, w = 37, oh = 4, ow = 18;  // 2 blocks of 8 and a tail of 2
    manual_seed(5);
    std::vector<double> v = randn({n, c, h, w}, {.dtype = kFloat64}).to_vector();
    for (size_t i = 0; i < v.size(); i += 7) v[i] = std::round(v[i]);  // ties
    for (size_t i = 3; i < v.size(); i += 29) v[i] = -std::numeric_limits<double>::infinity();
    for (size_t i = 11; i < v.size(); i += 53) v[i] = std::numeric_limits<double>::quiet_NaN();
    const Tensor x = from_vector(v, {n, c, h, w}, {.dtype = dt}).requires_grad_();
    const Tensor y = max_pool2d(x, {.kernel = {2, 2}});
    sum(y).backward();
    const std::vector<double> got = y.to_vector(), grad = x.grad().to_vector();
    const std::vector<double> xs = x.detach().to_vector();  // the values as rounded to dt
    std::vector<double> want_grad(xs.size(), 0.0);
    bool ok = true;
    for (int64_t p = 0; p < n * c; ++p) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t at[4] = {(2 * i) * w + 2 * j, (2 * i) * w + 2 * j + 1, (2 * i + 1) * w + 2 * j,
                                 (2 * i + 1) * w + 2 * j + 1};
          int64_t best = at[0];
          for (int k = 1; k < 4; ++k) {
            const double cand = xs[static_cast<size_t>(p * h * w + at[k])],
                         cur = xs[static_cast<size_t>(p * h * w + best)];
            if ((cand > cur || std::isnan(cand)) && !std::isnan(cur)) best = at[k];
          }
          const double want = xs[static_cast<size_t>(p * h * w + best)],
                       out = got[static_cast<size_t>((p * oh + i) * ow + j)];
          ok = ok && (want == out || (std::isnan(want) && std::isnan(out)));
          want_grad[static_cast<size_t>(p * h * w + best)] += 1.0;
        }
      }
    }
    CHECK_MESSAGE(ok, dtype_name(dt));
    CHECK_MESSAGE(grad == want_grad, dtype_name(dt));
  }
}
