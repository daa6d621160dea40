// The CPU backend's max pooling: forward with the argmax of each window, backward as a scatter of the
// gradient at those indices.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "evenflow/engine/cpu/cpu_internal.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

// The common 2x2, stride-2 window without padding or dilation, 8 outputs at a time: the general
// loop's comparisons become unpredictable branches on real data (GCC does not turn them into
// selects), which made it ~45 cycles an output; vector selects take a few. Same rule as the general
// loop: the first element holds the slot, a later one wins when larger or NaN unless NaN holds it.
template <typename T>
void max_pool2x2_row(const T* row0, const T* row1, int64_t base, int64_t w, int64_t ow_n, T* out, int64_t* idx) {
  typedef T Vec __attribute__((vector_size(8 * sizeof(T))));
  typedef int64_t Idx __attribute__((vector_size(8 * sizeof(int64_t))));
  const Idx lane = {0, 2, 4, 6, 8, 10, 12, 14};
  int64_t ow = 0;
  for (; ow + 8 <= ow_n; ow += 8) {
    Vec lo0, hi0, lo1, hi1;
    std::memcpy(&lo0, row0 + 2 * ow, sizeof(Vec));
    std::memcpy(&hi0, row0 + 2 * ow + 8, sizeof(Vec));
    std::memcpy(&lo1, row1 + 2 * ow, sizeof(Vec));
    std::memcpy(&hi1, row1 + 2 * ow + 8, sizeof(Vec));
    const Vec cand[3] = {__builtin_shufflevector(lo0, hi0, 1, 3, 5, 7, 9, 11, 13, 15),
                         __builtin_shufflevector(lo1, hi1, 0, 2, 4, 6, 8, 10, 12, 14),
                         __builtin_shufflevector(lo1, hi1, 1, 3, 5, 7, 9, 11, 13, 15)};
    const Idx first = lane + (base + 2 * ow);
    const Idx cand_i[3] = {first + 1, first + w, first + w + 1};
    Vec best = __builtin_shufflevector(lo0, hi0, 0, 2, 4, 6, 8, 10, 12, 14);
    Idx best_i = first;
    for (int k = 0; k < 3; ++k) {
      const auto take = ((cand[k] > best) | (cand[k] != cand[k])) & (best == best);  // lanes of -1 or 0
      best = take ? cand[k] : best;
      best_i = __builtin_convertvector(take, Idx) ? cand_i[k] : best_i;
    }
    std::memcpy(out + ow, &best, sizeof(Vec));
    std::memcpy(idx + ow, &best_i, sizeof(Idx));
  }
  for (; ow < ow_n; ++ow) {
    const int64_t at = base + 2 * ow;
    T best = row0[2 * ow];
    int64_t best_i = at;
    const T cand[3] = {row0[2 * ow + 1], row1[2 * ow], row1[2 * ow + 1]};
    const int64_t cand_i[3] = {at + 1, at + w, at + w + 1};
    for (int k = 0; k < 3; ++k) {
      if ((cand[k] > best || cand[k] != cand[k]) && best == best) {
        best = cand[k];
        best_i = cand_i[k];
      }
    }
    out[ow] = best;
    idx[ow] = best_i;
  }
}

// One plane at a time: zeroed and scattered into while it is in cache, where zeros() and a
// scatter_add over the whole gradient took two passes over it, and a third over the indices to
// check them.
template <typename T>
void max_pool2d_backward_typed(const PoolArgs& a, T* gx, const T* gy, const int64_t* indices) {
  const int64_t planes = a.n * a.c, plane_in = a.h * a.w, plane_out = a.oh * a.ow;
  [[maybe_unused]] const int nt = threads_for(planes * (plane_in + plane_out));
  bool bad = false;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static) reduction(|| : bad)
  for (int64_t p = 0; p < planes; ++p) {
    T* gxp = gx + p * plane_in;
    const T* gyp = gy + p * plane_out;
    const int64_t* ip = indices + p * plane_out;
    std::fill(gxp, gxp + plane_in, T(0));
    for (int64_t o = 0; o < plane_out; ++o) {
      const int64_t i = ip[o];
      if (static_cast<uint64_t>(i) < static_cast<uint64_t>(plane_in))
        gxp[i] += gyp[o];
      else
        bad = true;
    }
  }
  EF_CHECK(!bad, "max_pool2d backward: an index is outside its ", a.h, "x", a.w, " plane");
}

template <typename T>
void max_pool2d_typed(const PoolArgs& a, T* out, int64_t* indices, const T* x) {
  const int64_t planes = a.n * a.c, plane_out = a.oh * a.ow;
  // Each window's rows [i0, i1) and columns [j0, j1) that lie inside the image, computed once per
  // call so the inner loops carry no bounds tests (costly inline: docs/benchmarks.md, "Where the time goes").
  const auto window = [](int64_t o, int64_t stride, int64_t pad, int64_t dil, int64_t k, int64_t size) {
    const int64_t start = o * stride - pad;
    int64_t lo = 0, hi = k;
    while (lo < k && start + lo * dil < 0) ++lo;
    while (hi > lo && start + (hi - 1) * dil >= size) --hi;
    return std::array<int64_t, 3>{start, lo, hi};
  };
  std::vector<std::array<int64_t, 3>> rows(static_cast<size_t>(a.oh)), cols(static_cast<size_t>(a.ow));
  for (int64_t oh = 0; oh < a.oh; ++oh)
    rows[static_cast<size_t>(oh)] = window(oh, a.stride_h, a.pad_h, a.dil_h, a.kh, a.h);
  for (int64_t ow = 0; ow < a.ow; ++ow)
    cols[static_cast<size_t>(ow)] = window(ow, a.stride_w, a.pad_w, a.dil_w, a.kw, a.w);
  [[maybe_unused]] const int nt = threads_for(planes * plane_out * a.kh * a.kw);
  const bool two_by_two = a.kh == 2 && a.kw == 2 && a.stride_h == 2 && a.stride_w == 2 && a.pad_h == 0 &&
                          a.pad_w == 0 && a.dil_h == 1 && a.dil_w == 1;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t p = 0; p < planes; ++p) {
    const T* xp = x + p * a.h * a.w;
    T* op = out + p * plane_out;
    int64_t* ip = indices + p * plane_out;
    if (two_by_two) {
      for (int64_t oh = 0; oh < a.oh; ++oh)
        max_pool2x2_row(xp + 2 * oh * a.w, xp + (2 * oh + 1) * a.w, 2 * oh * a.w, a.w, a.ow, op + oh * a.ow,
                        ip + oh * a.ow);
      continue;
    }
    for (int64_t oh = 0; oh < a.oh; ++oh) {
      const auto [h0, i0, i1] = rows[static_cast<size_t>(oh)];
      for (int64_t ow = 0; ow < a.ow; ++ow) {
        const auto [w0, j0, j1] = cols[static_cast<size_t>(ow)];
        // An empty window (padding wider than the kernel reaches) gives -inf at index 0.
        T best = -std::numeric_limits<T>::infinity();
        int64_t best_i = 0;
        bool first = true;
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t row = (h0 + i * a.dil_h) * a.w;
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t at = row + w0 + j * a.dil_w;
            const T v = xp[at];
            // The first element always takes the slot (so -inf inputs get an index); a NaN wins
            // and then keeps it.
            if (first || ((v > best || v != v) && best == best)) {
              best = v;
              best_i = at;
              first = false;
            }
          }
        }
        op[oh * a.ow + ow] = best;
        ip[oh * a.ow + ow] = best_i;
      }
    }
  }
}

}  // namespace

void CpuBackend::max_pool2d(const PoolArgs& args, const View& out, const View& indices, const View& x) {
  EF_ASSERT(out.is_contiguous() && indices.is_contiguous() && x.is_contiguous() && indices.dtype == DType::Int64,
            "max_pool2d: expects contiguous views and int64 indices");
  EF_DISPATCH_FLOAT(x.dtype, "max_pool2d", [&] {
    max_pool2d_typed(args, static_cast<scalar_t*>(out.data), static_cast<int64_t*>(indices.data),
                     static_cast<const scalar_t*>(x.data));
  });
}

void CpuBackend::max_pool2d_backward(const PoolArgs& args, const View& gx, const View& gy, const View& indices) {
  EF_ASSERT(gx.is_contiguous() && gy.is_contiguous() && indices.is_contiguous() && gx.dtype == gy.dtype &&
                indices.dtype == DType::Int64,
            "max_pool2d_backward: expects contiguous views and int64 indices");
  EF_DISPATCH_FLOAT(gx.dtype, "max_pool2d_backward", [&] {
    max_pool2d_backward_typed(args, static_cast<scalar_t*>(gx.data), static_cast<const scalar_t*>(gy.data),
                              static_cast<const int64_t*>(indices.data));
  });
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
