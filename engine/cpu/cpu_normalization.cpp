// The CPU backend's group normalizations: the fused layer norm / batch norm forward, backward and
// double backward (NormArgs in backend.h). Softmax is cpu_softmax.cpp.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <immintrin.h>

#include "evenflow/engine/cpu/cpu_internal.h"
#include "evenflow/engine/cpu/threads.h"
#include "evenflow/engine/cpu/vector_math.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

// Normalization (NormArgs in backend.h). Groups are independent, so threads take whole groups; a
// group's outer x inner elements are read three times (mean, variance, output), each pass over
// rows of `inner` contiguous elements.
//
// A group's sums go into lanes (for_lanes), as reduce_row's do: with one accumulator each element
// waits for the previous addition, and layer_norm's forward ran far slower (docs/benchmarks.md,
// "oneDNN 3.2 instead of Debian's 2.6": the normalization table). The lanes are added up in a
// fixed order, so a group's statistics depend on its elements alone, not on threads or devices.

// One element a row and a group (batch_norm of [N, C]: a group is a column of x): the general loop
// walks each column alone, one element a row, and ran far slower than layer_norm over as many
// elements (docs/benchmarks.md, "Small products off oneDNN"). Here a block of columns is
// summed side by side along each row, which vectorizes. Every column's sums are added in row order,
// from 0, as the general loop's lane 0 takes them, so the results are the same bit for bit.
constexpr int64_t kColumnBlock = 128;

bool columns_layout(const NormArgs& a, bool per_feature_affine) {
  return a.inner == 1 && a.outer > 1 && !per_feature_affine;
}

template <typename T>
void normalize_columns(const NormArgs& a, T* y, T* mean_out, T* var_out, T* rstd_out, const T* x, const T* w,
                       const T* b) {
  using A = acc_t<T>;
  const int64_t blocks = (a.groups + kColumnBlock - 1) / kColumnBlock, rows = a.outer, stride = a.groups;
  [[maybe_unused]] const int nt = threads_for(a.groups * rows);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t g0 = blk * kColumnBlock, m = std::min(kColumnBlock, a.groups - g0);
    A sums[kColumnBlock] = {}, squares[kColumnBlock] = {};
    T mean[kColumnBlock], rstd[kColumnBlock], scale[kColumnBlock], shift[kColumnBlock];
    for (int64_t o = 0; o < rows; ++o) {
      const T* xr = x + o * stride + g0;
      for (int64_t j = 0; j < m; ++j) sums[j] += static_cast<A>(xr[j]);
    }
    for (int64_t j = 0; j < m; ++j) mean[j] = static_cast<T>((A(0) + sums[j]) / static_cast<A>(rows));
    for (int64_t o = 0; o < rows; ++o) {
      const T* xr = x + o * stride + g0;
      for (int64_t j = 0; j < m; ++j) {
        const T d = xr[j] - mean[j];
        squares[j] += static_cast<A>(d * d);
      }
    }
    for (int64_t j = 0; j < m; ++j) {
      const auto var = static_cast<T>((A(0) + squares[j]) / static_cast<A>(rows));
      rstd[j] = T(1) / std::sqrt(static_cast<T>(var + static_cast<T>(a.eps)));
      mean_out[g0 + j] = mean[j];
      var_out[g0 + j] = var;
      rstd_out[g0 + j] = rstd[j];
      scale[j] = w != nullptr ? w[g0 + j] : T(1);
      shift[j] = b != nullptr ? b[g0 + j] : T(-0.0);
    }
    for (int64_t o = 0; o < rows; ++o) {
      const T* xr = x + o * stride + g0;
      T* yr = y + o * stride + g0;
      for (int64_t j = 0; j < m; ++j) yr[j] = static_cast<T>(xr[j] - mean[j]) * rstd[j] * scale[j] + shift[j];
    }
  }
}

template <typename T>
void normalize_typed(const NormArgs& a, T* y, T* mean_out, T* var_out, T* rstd_out, const T* x, const T* w,
                     const T* b) {
  if (columns_layout(a, !a.affine_per_group && (w != nullptr || b != nullptr)))
    return normalize_columns(a, y, mean_out, var_out, rstd_out, x, w, b);
  using A = acc_t<T>;
  const int64_t n = a.outer * a.inner, stride = a.groups * a.inner;
  const bool streaming = streams(a.groups * n * static_cast<int64_t>(sizeof(T)));
  [[maybe_unused]] const int nt = threads_for(a.groups * n);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
#pragma omp for schedule(static)
    for (int64_t g = 0; g < a.groups; ++g) {
      const T* xg = x + g * a.inner;
      T* yg = y + g * a.inner;
      A sums[kLanes] = {};
      for (int64_t o = 0; o < a.outer; ++o) {
        const T* xr = xg + o * stride;
        for_lanes(a.inner, [&](int64_t i, int l) { sums[l] += static_cast<A>(xr[i]); });
      }
      const auto mean = static_cast<T>(lanes_total(sums) / static_cast<A>(n));
      A squares[kLanes] = {};
      for (int64_t o = 0; o < a.outer; ++o) {
        const T* xr = xg + o * stride;
        for_lanes(a.inner, [&](int64_t i, int l) {
          const T d = xr[i] - mean;
          squares[l] += static_cast<A>(d * d);
        });
      }
      const auto var = static_cast<T>(lanes_total(squares) / static_cast<A>(n));
      const T rstd = T(1) / std::sqrt(static_cast<T>(var + static_cast<T>(a.eps)));
      mean_out[g] = mean;
      var_out[g] = var;
      rstd_out[g] = rstd;
      // y = x̂·w + b with w and b per feature (varying along i) or one number for the group; a
      // missing weight is 1 and a missing bias -0, which leave x̂ as it is (x + -0 is x for every x,
      // -0 included). The loop is written once per kind, so that each compiles to plain vector code.
      const auto write = [&](auto weight_at, auto bias_at) {
        for (int64_t o = 0; o < a.outer; ++o) {
          const T* xr = xg + o * stride;
          write_row(yg + o * stride, a.inner, streaming,
                    [&](int64_t i) { return static_cast<T>(xr[i] - mean) * rstd * weight_at(i) + bias_at(i); });
        }
      };
      const T gw = w != nullptr && a.affine_per_group ? w[g] : T(1),
              gb = b != nullptr && a.affine_per_group ? b[g] : T(-0.0);
      const auto group_w = [gw](int64_t) { return gw; };
      const auto group_b = [gb](int64_t) { return gb; };
      const auto feature_w = [w](int64_t i) { return w[i]; };
      const auto feature_b = [b](int64_t i) { return b[i]; };
      const bool per_feature_w = w != nullptr && !a.affine_per_group,
                 per_feature_b = b != nullptr && !a.affine_per_group;
      if (g + 1 < a.groups) prefetch_row(xg + a.inner, a.inner);  // Note [Prefetching the next row]
      if (per_feature_w && per_feature_b)
        write(feature_w, feature_b);
      else if (per_feature_w)
        write(feature_w, group_b);
      else if (per_feature_b)
        write(group_w, feature_b);
      else
        write(group_w, group_b);
    }
    if (streaming) stream_fence();
  }
}

// normalize_backward_typed's two passes for normalize_columns' layout, with the same arithmetic.
template <typename T>
void normalize_backward_columns(const NormArgs& a, T* gx, T* gw, T* gb, const T* gy, const T* x, const T* mean,
                                const T* rstd, const T* w) {
  using A = acc_t<T>;
  const int64_t blocks = (a.groups + kColumnBlock - 1) / kColumnBlock, rows = a.outer, stride = a.groups;
  [[maybe_unused]] const int nt = threads_for(a.groups * rows * 2);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t g0 = blk * kColumnBlock, m = std::min(kColumnBlock, a.groups - g0);
    const T* mb = mean + g0;
    const T* rb = rstd + g0;
    A sum_g[kColumnBlock] = {}, sum_g_x_hat[kColumnBlock] = {};
    for (int64_t o = 0; o < rows; ++o) {
      const T* xr = x + o * stride + g0;
      const T* gyr = gy + o * stride + g0;
      for (int64_t j = 0; j < m; ++j) {
        const T x_hat = (xr[j] - mb[j]) * rb[j];
        sum_g[j] += gyr[j];
        sum_g_x_hat[j] += gyr[j] * x_hat;
      }
    }
    T scale[kColumnBlock], mean_g[kColumnBlock], mean_g_x_hat[kColumnBlock];
    for (int64_t j = 0; j < m; ++j) {
      const A sg = A(0) + sum_g[j], sgx = A(0) + sum_g_x_hat[j];
      if (gw != nullptr) gw[g0 + j] = static_cast<T>(sgx);
      if (gb != nullptr) gb[g0 + j] = static_cast<T>(sg);
      scale[j] = w != nullptr ? w[g0 + j] : T(1);
      mean_g[j] = static_cast<T>(sg / static_cast<A>(rows)) * scale[j];
      mean_g_x_hat[j] = static_cast<T>(sgx / static_cast<A>(rows)) * scale[j];
    }
    if (gx == nullptr) continue;
    for (int64_t o = 0; o < rows; ++o) {
      const T* xr = x + o * stride + g0;
      const T* gyr = gy + o * stride + g0;
      T* gxr = gx + o * stride + g0;
      for (int64_t j = 0; j < m; ++j) {
        const T x_hat = (xr[j] - mb[j]) * rb[j], g_hat = gyr[j] * scale[j];
        gxr[j] = rb[j] * (g_hat - mean_g[j] - x_hat * mean_g_x_hat[j]);
      }
    }
  }
}

// acc += v, each lane widened (float to double; double as it is). GCC lowers
// __builtin_convertvector from 8 floats to 8 doubles (4 to 4) as two 4-lane (2-lane) conversions
// and an insert even where AVX-512 (AVX) converts them in one instruction, which it is given here:
// layer norm's backward 4-8% faster (docs/benchmarks.md, "Layer norm's backward sums widened in
// one instruction"). The same values: widening is exact. By reference, as load_lanes: a vector
// passed or returned by value changes the ABI between ISAs (-Wpsabi). The masked conversion: GCC
// 12's unmasked `_mm512_cvtps_pd` trips -Wmaybe-uninitialized.
template <typename Acc, typename Row>
inline void add_widened(Acc& acc, const Row& v) {
  if constexpr (std::is_same_v<Row, LaneVectors<float>::Row>) {
#if defined(__AVX512F__)
    static_assert(sizeof(Row) == sizeof(__m256) && sizeof(Acc) == sizeof(__m512d));
    acc += std::bit_cast<Acc>(_mm512_maskz_cvtps_pd(0xFF, std::bit_cast<__m256>(v)));
    return;
#elif defined(__AVX__)
    static_assert(sizeof(Row) == sizeof(__m128) && sizeof(Acc) == sizeof(__m256d));
    acc += std::bit_cast<Acc>(_mm256_cvtps_pd(std::bit_cast<__m128>(v)));
    return;
#endif
  }
  acc += __builtin_convertvector(v, Acc);
}

// One row of normalize_backward_typed's sums: Σĝ and Σĝ·x̂ into lanes as the forward's sums (lane l
// takes the row's elements i ≡ l mod kLanes, lane 0 also its last inner % kLanes), with ĝ = gy·w
// (kWeights: w per feature, else 1); with kFeatureSums also the per-feature Σgy·x̂ and Σgy of the
// affine parameters' gradients, in the same pass. The lanes are vectors: written lane by lane
// (for_lanes), GCC left this loop scalar, and it was most of layer norm's backward
// (docs/benchmarks.md, "Normalizations' outputs streamed").
template <bool kWeights, bool kFeatureSums, typename T>
void backward_sums_row(int64_t inner, const T* xr, const T* gyr, const T* fw, T m, T r, LaneParts<T>& lanes_g,
                       LaneParts<T>& lanes_g_x_hat, acc_t<T>* part_w, acc_t<T>* part_b) {
  using Row = typename LaneVectors<T>::Row;
  using Acc = typename LaneVectors<T>::Acc;
  Row dy, xv, weight = Row{} + T(1);
  Acc pw, pb;
  int64_t k = 0;
  for (; k + kLanes <= inner; k += kLanes) {
    for (int p = 0; p < kParts; ++p) {
      const int64_t i = k + p * kPartLanes;
      load_lanes(dy, gyr + i);
      load_lanes(xv, xr + i);
      if constexpr (kWeights) load_lanes(weight, fw + i);
      const Row x_hat = (xv - m) * r, g_hat = dy * weight;
      add_widened(lanes_g[p], g_hat);
      add_widened(lanes_g_x_hat[p], Row(g_hat * x_hat));
      if constexpr (kFeatureSums) {
        load_lanes(pw, part_w + i);
        load_lanes(pb, part_b + i);
        add_widened(pw, Row(dy * x_hat));
        add_widened(pb, dy);
        store_lanes(part_w + i, pw);
        store_lanes(part_b + i, pb);
      }
    }
  }
  for (; k < inner; ++k) {
    const T d = gyr[k], x_hat = (xr[k] - m) * r, g_hat = kWeights ? d * fw[k] : d * T(1);
    lanes_g[0][0] += g_hat;
    lanes_g_x_hat[0][0] += g_hat * x_hat;
    if constexpr (kFeatureSums) {
      part_w[k] += d * x_hat;
      part_b[k] += d;
    }
  }
}

// Backend::normalize_backward. Two passes over a group: the sums, then gx. Per-feature gw and gb
// (layer norm) add up over groups, so each thread keeps its own row of them, summed at the end.
template <typename T>
void normalize_backward_typed(const NormArgs& a, T* gx, T* gw, T* gb, const T* gy, const T* x, const T* mean,
                              const T* rstd, const T* w) {
  if (columns_layout(a, !a.affine_per_group && (w != nullptr || gw != nullptr || gb != nullptr)))
    return normalize_backward_columns(a, gx, gw, gb, gy, x, mean, rstd, w);
  const int64_t n = a.outer * a.inner, stride = a.groups * a.inner;
  const bool feature_sums = !a.affine_per_group && (gw != nullptr || gb != nullptr);
  const bool streaming = gx != nullptr && streams(a.groups * n * static_cast<int64_t>(sizeof(T)));
  const int nt = threads_for(a.groups * n * 2);
  std::vector<acc_t<T>> partial(feature_sums ? static_cast<size_t>(nt) * 2 * static_cast<size_t>(a.inner) : 0, 0);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    acc_t<T>* part_w = feature_sums ? partial.data() + thread_index() * 2 * a.inner : nullptr;
    acc_t<T>* part_b = feature_sums ? part_w + a.inner : nullptr;
#pragma omp for schedule(static)
    for (int64_t g = 0; g < a.groups; ++g) {
      const T* xg = x + g * a.inner;
      const T* gyg = gy + g * a.inner;
      const T m = mean[g], r = rstd[g];
      // A per-group weight factors out of the sums: they are taken without it (gw and gb), then scaled.
      const T* fw = w != nullptr && !a.affine_per_group ? w : nullptr;
      // Σĝ, Σĝ·x̂ (per group: Σgy, Σgy·x̂), and the per-feature sums, in one pass a row.
      LaneParts<T> lanes_g = {}, lanes_g_x_hat = {};
      for (int64_t o = 0; o < a.outer; ++o) {
        const T* xr = xg + o * stride;
        const T* gyr = gyg + o * stride;
        if (fw != nullptr && feature_sums)
          backward_sums_row<true, true>(a.inner, xr, gyr, fw, m, r, lanes_g, lanes_g_x_hat, part_w, part_b);
        else if (fw != nullptr)
          backward_sums_row<true, false>(a.inner, xr, gyr, fw, m, r, lanes_g, lanes_g_x_hat, part_w, part_b);
        else if (feature_sums)
          backward_sums_row<false, true>(a.inner, xr, gyr, fw, m, r, lanes_g, lanes_g_x_hat, part_w, part_b);
        else
          backward_sums_row<false, false>(a.inner, xr, gyr, fw, m, r, lanes_g, lanes_g_x_hat, part_w, part_b);
      }
      const acc_t<T> sum_g = parts_total<T>(lanes_g), sum_g_x_hat = parts_total<T>(lanes_g_x_hat);
      T group_w = 1;
      if (a.affine_per_group) {
        if (gw != nullptr) gw[g] = static_cast<T>(sum_g_x_hat);
        if (gb != nullptr) gb[g] = static_cast<T>(sum_g);
        if (w != nullptr) group_w = w[g];
      }
      if (gx == nullptr) continue;
      const T mean_g = static_cast<T>(sum_g / static_cast<acc_t<T>>(n)) * group_w;
      const T mean_g_x_hat = static_cast<T>(sum_g_x_hat / static_cast<acc_t<T>>(n)) * group_w;
      T* gxg = gx + g * a.inner;
      if (g + 1 < a.groups) {  // Note [Prefetching the next row]
        prefetch_row(xg + a.inner, a.inner);
        prefetch_row(gyg + a.inner, a.inner);
      }
      for (int64_t o = 0; o < a.outer; ++o) {
        const T* xr = xg + o * stride;
        const T* gyr = gyg + o * stride;
        write_row(gxg + o * stride, a.inner, streaming, [&](int64_t i) {
          const T x_hat = (xr[i] - m) * r, g_hat = gyr[i] * (fw != nullptr ? fw[i] : group_w);
          return r * (g_hat - mean_g - x_hat * mean_g_x_hat);
        });
      }
    }
    if (streaming) stream_fence();
  }
  if (!feature_sums) return;
  for (int64_t i = 0; i < a.inner; ++i) {
    acc_t<T> sw = 0, sb = 0;
    for (int t = 0; t < nt; ++t) {
      sw += partial[static_cast<size_t>(t * 2 * a.inner + i)];
      sb += partial[static_cast<size_t>(t * 2 * a.inner + a.inner + i)];
    }
    if (gw != nullptr) gw[i] = static_cast<T>(sw);
    if (gb != nullptr) gb[i] = static_cast<T>(sb);
  }
}

// One row (`inner` elements) of the second pass. Operands absent or per group come as rows of
// that value, outputs not asked for as a scratch row, so the loop has no branches and vectorizes.
template <typename T>
void normalize_double_backward_row(int64_t inner, T* __restrict dgy, T* __restrict dx, acc_t<T>* __restrict dw,
                                   const T* __restrict ggx, const T* __restrict bw, const T* __restrict bb,
                                   const T* __restrict gy, const T* __restrict x, const T* __restrict w, T m, T r, T a1,
                                   T a2, T a3, T r_m2, T r_a2, T mean_big_g, T mean_big_g_x_hat) {
  for (int64_t i = 0; i < inner; ++i) {
    const T x_hat = (x[i] - m) * r, dy = gy[i], gg = ggx[i];
    const T t = r * (gg - a1 - x_hat * a2);
    dgy[i] = w[i] * t + bb[i] + bw[i] * x_hat;
    const T big_g = bw[i] * dy - r_m2 * gg - r_a2 * (dy * w[i]);
    dx[i] = r * (big_g - mean_big_g - x_hat * mean_big_g_x_hat) - r * x_hat * a3;
    dw[i] += static_cast<acc_t<T>>(dy * t);
  }
}

// Backend::normalize_double_backward, for every layout (normalize_columns' too: batch_norm of [N, C],
// whose double backward no training here takes, walks its columns one element a row). Per group,
// with x̂, ĝ, r as in the backward, A the gradient reaching gx and Bw, Bb those reaching gw, gb (each
// per feature, or one number for the group), and m1 = mean(ĝ), m2 = mean(ĝ·x̂), a1 = mean(A),
// a2 = mean(A·x̂):
//   t = r·(A - a1 - x̂·a2)                       (the gradient reaching ĝ)
//   dgy = w·t + Bb + Bw·x̂,  dw = Σ gy·t
//   G = Bw·gy - r·m2·A - r·a2·ĝ                  (the gradient reaching x̂)
//   dx = r·(G - mean(G) - x̂·mean(G·x̂)) - r·x̂·mean(A·gx)
// (the last term: gx's own factor r depends on x). Two passes over a group: seven sums (mean(G) and
// mean(G·x̂) follow from them), then the outputs. ops/normalization.cpp's normalize_double_backward_ops is the
// same formula as differentiable ops.
template <typename T>
void normalize_double_backward_typed(const NormArgs& a, T* dgy, T* dx, T* dw, const T* ggx, const T* ggw, const T* ggb,
                                     const T* gy, const T* x, const T* mean, const T* rstd, const T* w) {
  using A = acc_t<T>;
  const int64_t n = a.outer * a.inner, stride = a.groups * a.inner;
  const auto inner = static_cast<size_t>(a.inner);
  const bool per_feature = !a.affine_per_group;
  const int nt = threads_for(a.groups * n * 3);
  // dw's sums per feature, one row a thread (summed in thread order at the end); per group, a row
  // summed at the end of each group.
  std::vector<A> dw_rows(static_cast<size_t>(nt) * inner, A(0));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    A* dw_row = dw_rows.data() + static_cast<size_t>(thread_index()) * inner;
    // Rows standing in for operands absent or per group, and for outputs not asked for.
    std::vector<T> w_row(inner, T(1)), bw_row(inner, T(0)), bb_row(inner, T(0)), zero_row(inner, T(0)), dgy_sink(inner),
        dx_sink(inner);
    const T* fw = per_feature && w != nullptr ? w : w_row.data();
    const T* fbw = per_feature && ggw != nullptr ? ggw : bw_row.data();
    const T* fbb = per_feature && ggb != nullptr ? ggb : bb_row.data();
#pragma omp for schedule(static)
    for (int64_t g = 0; g < a.groups; ++g) {
      const T m = mean[g], r = rstd[g];
      if (!per_feature) {
        std::fill(w_row.begin(), w_row.end(), w != nullptr ? w[g] : T(1));
        std::fill(bw_row.begin(), bw_row.end(), ggw != nullptr ? ggw[g] : T(0));
        std::fill(bb_row.begin(), bb_row.end(), ggb != nullptr ? ggb[g] : T(0));
        std::fill(dw_row, dw_row + inner, A(0));
      }
      const int64_t base = g * a.inner;
      A s_g[kLanes] = {}, s_gx[kLanes] = {}, s_a[kLanes] = {}, s_ax[kLanes] = {}, s_ag[kLanes] = {}, s_b[kLanes] = {},
        s_bx[kLanes] = {};
      for (int64_t o = 0; o < a.outer; ++o) {
        const T* xr = x + base + o * stride;
        const T* gyr = gy + base + o * stride;
        const T* ggr = ggx != nullptr ? ggx + base + o * stride : zero_row.data();
        for_lanes(a.inner, [&](int64_t i, int l) {
          const T x_hat = (xr[i] - m) * r, g_hat = gyr[i] * fw[i], gg = ggr[i], b_gy = gyr[i] * fbw[i];
          s_g[l] += g_hat;
          s_gx[l] += g_hat * x_hat;
          s_a[l] += gg;
          s_ax[l] += gg * x_hat;
          s_ag[l] += gg * g_hat;
          s_b[l] += b_gy;
          s_bx[l] += b_gy * x_hat;
        });
      }
      const A inv_n = A(1) / static_cast<A>(n);
      const A sum_g = lanes_total(s_g), sum_gx = lanes_total(s_gx), sum_a = lanes_total(s_a),
              sum_ax = lanes_total(s_ax);
      const T m1 = static_cast<T>(sum_g * inv_n), m2 = static_cast<T>(sum_gx * inv_n);
      const T a1 = static_cast<T>(sum_a * inv_n), a2 = static_cast<T>(sum_ax * inv_n);
      const T a3 = r * static_cast<T>(lanes_total(s_ag) * inv_n - A(a1) * A(m1) - A(a2) * A(m2));
      const T r_m2 = r * m2, r_a2 = r * a2;
      const T mean_big_g = static_cast<T>((lanes_total(s_b) - A(r_m2) * sum_a - A(r_a2) * sum_g) * inv_n);
      const T mean_big_g_x_hat = static_cast<T>((lanes_total(s_bx) - A(r_m2) * sum_ax - A(r_a2) * sum_gx) * inv_n);
      for (int64_t o = 0; o < a.outer; ++o) {
        const int64_t at = base + o * stride;
        normalize_double_backward_row<T>(a.inner, dgy != nullptr ? dgy + at : dgy_sink.data(),
                                         dx != nullptr ? dx + at : dx_sink.data(), dw_row,
                                         ggx != nullptr ? ggx + at : zero_row.data(), fbw, fbb, gy + at, x + at, fw, m,
                                         r, a1, a2, a3, r_m2, r_a2, mean_big_g, mean_big_g_x_hat);
      }
      if (dw != nullptr && !per_feature) {
        A sum = 0;
        for (size_t i = 0; i < inner; ++i) sum += dw_row[i];
        dw[g] = static_cast<T>(sum);
      }
    }
  }
  if (dw == nullptr || !per_feature) return;
  for (size_t i = 0; i < inner; ++i) {
    A sum = 0;
    for (int t = 0; t < nt; ++t) sum += dw_rows[static_cast<size_t>(t) * inner + i];
    dw[i] = static_cast<T>(sum);
  }
}

// NormArgs::param_channels for the kernels above, which take per-feature parameters in a group's
// feature order: the parameters copied into that order (H, W, C, from [C, H, W]), and the gradients
// the kernels write in it copied back -- thousands of elements, beside a normalization of the
// activations (the CUDA kernels index them in place instead). Without param_channels, the
// parameters and outputs themselves.
template <typename T>
class FeatureOrder {
 public:
  explicit FeatureOrder(NormArgs& a)
      : channels_(a.param_channels),
        planes_(channels_ > 0 ? a.inner / channels_ : 0),
        inner_(static_cast<size_t>(a.inner)) {
    a.param_channels = 0;  // the kernels' view: parameters in feature order
  }
  // p in feature order: a copy in `buf`, or p itself.
  const T* in(const T* p, std::vector<T>& buf) const {
    if (channels_ == 0 || p == nullptr) return p;
    buf.resize(inner_);
    for (int64_t s = 0; s < planes_; ++s)
      for (int64_t c = 0; c < channels_; ++c) buf[static_cast<size_t>(s * channels_ + c)] = p[c * planes_ + s];
    return buf.data();
  }
  // Where a kernel writes the gradient of a parameter p: `buf` (copied back by back()), or p itself.
  T* out(T* p, std::vector<T>& buf) const {
    if (channels_ == 0 || p == nullptr) return p;
    buf.resize(inner_);
    return buf.data();
  }
  void back(T* p, const std::vector<T>& buf) const {
    if (channels_ == 0 || p == nullptr) return;
    for (int64_t s = 0; s < planes_; ++s)
      for (int64_t c = 0; c < channels_; ++c) p[c * planes_ + s] = buf[static_cast<size_t>(s * channels_ + c)];
  }

 private:
  int64_t channels_, planes_;
  size_t inner_;
};

}  // namespace

void CpuBackend::normalize(const NormArgs& args, const View& y, const View& mean, const View& var, const View& rstd,
                           const View& x, const View& weight, const View& bias, const RunningStats& running) {
  EF_ASSERT(
      x.is_contiguous() && y.is_contiguous() && mean.is_contiguous() && var.is_contiguous() && rstd.is_contiguous(),
      "normalize: expects contiguous views");
  EF_DISPATCH_FLOAT(x.dtype, "normalize", [&] {
    using T = scalar_t;
    NormArgs a = args;
    const FeatureOrder<T> order(a);
    std::vector<T> w_buf, b_buf;
    normalize_typed<T>(a, static_cast<T*>(y.data), static_cast<T*>(mean.data), static_cast<T*>(var.data),
                       static_cast<T*>(rstd.data), static_cast<const T*>(x.data),
                       order.in(static_cast<const T*>(weight.data), w_buf),
                       order.in(static_cast<const T*>(bias.data), b_buf));
    // RunningStats: each product and sum rounded (this file compiles without contraction).
    const auto update = [&](const View& stat, const View& group_stat, double stat_weight) {
      if (stat.data == nullptr) return;
      EF_ASSERT(stat.is_contiguous() && stat.dtype == x.dtype && stat.numel() == args.groups,
                "normalize: running statistics are contiguous [groups] views of the input's dtype");
      auto* r = static_cast<T*>(stat.data);
      const auto* s = static_cast<const T*>(group_stat.data);
      const auto keep = static_cast<T>(running.keep), w = static_cast<T>(stat_weight);
      for (int64_t g = 0; g < args.groups; ++g) {
        const T kept = r[g] * keep, added = w * s[g];
        r[g] = kept + added;
      }
    };
    update(running.mean, mean, running.mean_weight);
    update(running.var, var, running.var_weight);
  });
}

void CpuBackend::normalize_backward(const NormArgs& args, const View& gx, const View& gw, const View& gb,
                                    const View& gy, const View& x, const View& mean, const View& rstd,
                                    const View& weight) {
  EF_ASSERT(x.is_contiguous() && gy.is_contiguous() && mean.is_contiguous() && rstd.is_contiguous(),
            "normalize_backward: expects contiguous views");
  EF_DISPATCH_FLOAT(x.dtype, "normalize_backward", [&] {
    using T = scalar_t;
    NormArgs a = args;
    const FeatureOrder<T> order(a);
    std::vector<T> w_buf, gw_buf, gb_buf;
    auto* gwp = static_cast<T*>(gw.data);
    auto* gbp = static_cast<T*>(gb.data);
    normalize_backward_typed<T>(a, static_cast<T*>(gx.data), order.out(gwp, gw_buf), order.out(gbp, gb_buf),
                                static_cast<const T*>(gy.data), static_cast<const T*>(x.data),
                                static_cast<const T*>(mean.data), static_cast<const T*>(rstd.data),
                                order.in(static_cast<const T*>(weight.data), w_buf));
    order.back(gwp, gw_buf);
    order.back(gbp, gb_buf);
  });
}

bool CpuBackend::normalize_double_backward(const NormArgs& args, const View& dgy, const View& dx, const View& dw,
                                           const View& ggx, const View& ggw, const View& ggb, const View& gy,
                                           const View& x, const View& mean, const View& rstd, const View& weight) {
  EF_ASSERT(x.is_contiguous() && gy.is_contiguous() && mean.is_contiguous() && rstd.is_contiguous(),
            "normalize_double_backward: expects contiguous views");
  EF_DISPATCH_FLOAT(x.dtype, "normalize_double_backward", [&] {
    using T = scalar_t;
    NormArgs a = args;
    const FeatureOrder<T> order(a);
    std::vector<T> dw_buf, ggw_buf, ggb_buf, w_buf;
    auto* dwp = static_cast<T*>(dw.data);
    normalize_double_backward_typed<T>(
        a, static_cast<T*>(dgy.data), static_cast<T*>(dx.data), order.out(dwp, dw_buf), static_cast<const T*>(ggx.data),
        order.in(static_cast<const T*>(ggw.data), ggw_buf), order.in(static_cast<const T*>(ggb.data), ggb_buf),
        static_cast<const T*>(gy.data), static_cast<const T*>(x.data), static_cast<const T*>(mean.data),
        static_cast<const T*>(rstd.data), order.in(static_cast<const T*>(weight.data), w_buf));
    order.back(dwp, dw_buf);
  });
  return true;
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
