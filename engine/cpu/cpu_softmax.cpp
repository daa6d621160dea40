// The CPU backend's softmax and log-softmax: along the rows of a [rows, cols] tensor, and along dim 1
// of an [outer, cols, inner] one (a segmentation's classes).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

#include "evenflow/engine/cpu/cpu_internal.h"
#include "evenflow/engine/cpu/threads.h"
#include "evenflow/engine/cpu/vector_math.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

// e^x for softmax's rows, x - max(x) ≤ 0: float32's by our own functions (Note [Vectorized float32
// exp, log, sigmoid, softplus and elu]: glibc's expf kept the row loops scalar), with fewer steps
// where the copy has FMA; float64's by glibc's.
inline float row_exp(float x) {
#if defined(__FMA__)
  return exp_of_nonpositive(x);
#else
  return exp_vectorizable(x);
#endif
}
inline double row_exp(double x) {
  return std::exp(x);
}

// Softmax of each row: its maximum m, e^(x - m) written to the output, their sum s (in lanes, as
// the normalizations' sums), then the output scaled by 1/s; log-softmax writes x - m - log s over
// the same e^(x - m). Each pass is a loop that vectorizes.
template <typename T>
void softmax_typed(T* out, const T* x, int64_t rows, int64_t cols, bool log) {
  [[maybe_unused]] const int nt = threads_for(rows * cols);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = out + r * cols;
    // The maximum (std::max's: a NaN is passed over, and the row's outputs are NaN), in four whole
    // registers: in one register of kPartLanes each comparison waited on the one before, a fifth of
    // the row's time with AVX2 (docs/benchmarks.md, "Softmax's exponential in fewer steps"). Then
    // one register, then its halves (for float32) and kPartLanes at a time, so that a short row takes
    // as few scalar steps as before. No lane ever holds a NaN.
    using Register = typename LaneVectors<T>::Register;
    using Row = typename LaneVectors<T>::Row;
    constexpr int kWidth = kRegisterBytes / static_cast<int>(sizeof(T)), kRegisters = 4;
    const auto larger = [](const auto& a, const auto& b) { return a < b ? b : a; };
    std::array<Register, kRegisters> maxima;
    maxima.fill(Register{} - std::numeric_limits<T>::infinity());
    Register v;
    int64_t k = 0;
    for (; k + kRegisters * kWidth <= cols; k += kRegisters * kWidth)
      for (int p = 0; p < kRegisters; ++p) {
        load_lanes(v, xr + k + p * kWidth);
        maxima[p] = larger(maxima[p], v);
      }
    Register m = maxima[0];
    for (int p = 1; p < kRegisters; ++p) m = larger(m, maxima[p]);
    for (; k + kWidth <= cols; k += kWidth) {
      load_lanes(v, xr + k);
      m = larger(m, v);
    }
    Row half, other_half;
    load_lanes(half, reinterpret_cast<const T*>(&m));
    load_lanes(other_half, reinterpret_cast<const T*>(&m) + (kWidth - kPartLanes));  // the same half for float64
    half = larger(half, other_half);
    for (; k + kPartLanes <= cols; k += kPartLanes) {
      load_lanes(other_half, xr + k);
      half = larger(half, other_half);
    }
    T mx = -std::numeric_limits<T>::infinity();
    for (int l = 0; l < kPartLanes; ++l) mx = std::max(mx, half[l]);
    for (; k < cols; ++k) mx = std::max(mx, xr[k]);
    for (int64_t c = 0; c < cols; ++c) yr[c] = row_exp(xr[c] - mx);
    acc_t<T> sums[kLanes] = {};
    for_lanes(cols, [&](int64_t c, int l) { sums[l] += static_cast<acc_t<T>>(yr[c]); });
    const acc_t<T> sum = lanes_total(sums);
    if (log) {
      const T lse = mx + static_cast<T>(std::log(sum));
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] - lse;
    } else {
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
  }
}

// log of a softmax's sum (at least 1, or NaN), for float32 outputs through our own (a call per
// pixel kept softmax_dim1_typed's log-softmax loop scalar), for float64 ones glibc's.
inline double sum_log(double s, float) {
  return s != s ? s : log_vectorizable(s);
}
inline double sum_log(double s, double) {
  return std::log(s);
}

// Softmax over dim 1 of a contiguous [outer, cols, inner]: a block of kPixels positions along
// inner side by side, a pass over the cols for each of the maximum, e^(x - m) and its sum, and the
// output -- each a loop along inner, which vectorizes where softmax_typed's rows would be a few
// elements long (a segmentation's classes). A position's sum adds its cols in order, from 0.
template <typename T>
void softmax_dim1_typed(T* out, const T* x, int64_t outer, int64_t cols, int64_t inner, bool log) {
  using A = acc_t<T>;
  constexpr int64_t kPixels = 256;
  const int64_t blocks = (inner + kPixels - 1) / kPixels, tasks = outer * blocks;
  [[maybe_unused]] const int nt = threads_for(outer * cols * inner);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t o = task / blocks, i0 = (task % blocks) * kPixels, m = std::min(kPixels, inner - i0);
    const T* xb = x + o * cols * inner + i0;
    T* yb = out + o * cols * inner + i0;
    T mx[kPixels];
    A sums[kPixels] = {};
    std::fill(mx, mx + m, -std::numeric_limits<T>::infinity());
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t i = 0; i < m; ++i) {  // std::max's choice, by value: its reference kept GCC from vectorizing
        const T v = xb[c * inner + i];
        mx[i] = mx[i] < v ? v : mx[i];
      }
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t i = 0; i < m; ++i) {
        const T e = row_exp(xb[c * inner + i] - mx[i]);
        yb[c * inner + i] = e;
        sums[i] += static_cast<A>(e);
      }
    if (log) {
      T lse[kPixels];
      for (int64_t i = 0; i < m; ++i) lse[i] = mx[i] + static_cast<T>(sum_log(sums[i], T{}));
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t i = 0; i < m; ++i) yb[c * inner + i] = xb[c * inner + i] - lse[i];
    } else {
      T inv[kPixels];
      for (int64_t i = 0; i < m; ++i) inv[i] = static_cast<T>(1.0 / sums[i]);
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t i = 0; i < m; ++i) yb[c * inner + i] *= inv[i];
    }
  }
}

}  // namespace

void CpuBackend::softmax(const View& out, const View& x, bool log) {
  EF_ASSERT(out.ndim == 2 && out.is_contiguous() && x.is_contiguous() && out.dtype == x.dtype,
            "softmax: expects contiguous [rows, cols] views");
  EF_DISPATCH_FLOAT(x.dtype, "softmax", [&] {
    softmax_typed(static_cast<scalar_t*>(out.data), static_cast<const scalar_t*>(x.data), out.shape[0], out.shape[1],
                  log);
  });
}

void CpuBackend::softmax_dim1(const View& out, const View& x, bool log) {
  EF_ASSERT(out.ndim == 3 && x.ndim == 3 && out.is_contiguous() && x.is_contiguous() && out.dtype == x.dtype,
            "softmax_dim1: expects contiguous [outer, cols, inner] views");
  EF_DISPATCH_FLOAT(x.dtype, "softmax", [&] {
    softmax_dim1_typed(static_cast<scalar_t*>(out.data), static_cast<const scalar_t*>(x.data), x.shape[0], x.shape[1],
                       x.shape[2], log);
  });
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
