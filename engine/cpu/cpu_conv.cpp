// The CPU backend's matrix kernels: batched GEMM on Eigen, and 2-D convolution (forward, input
// gradient, weight gradient) as im2col / col2im around that GEMM. This is the one file of the CPU
// backend that includes Eigen, whose GEMM templates dominate build time.
#include "engine/cpu/cpu_conv.h"

#include <omp.h>

// GCC 12 reports false (maybe-)uninitialized uses inside its own AVX-512 intrinsics (the
// _mm512_undefined_ps() idiom) when it inlines Eigen's packing code with -march=native.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/device.h"
#include "engine/error.h"

namespace evenflow::cpu_backend {
namespace {

template <typename T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMatMap = Eigen::Map<const RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using MatMap = Eigen::Map<RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

// C = alpha·op(A)·op(B) + beta·C for one row-major matrix. Eigen parallelizes a large product over
// omp_get_max_threads() threads, and runs it on the calling thread inside a parallel region.
template <typename T>
void gemm_one(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
              const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  MatMap<T> cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (beta == T(0)) cm.setZero();
    else cm *= beta;
    return;
  }
  const ConstMatMap<T> am(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  const ConstMatMap<T> bm(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  const auto run = [&](const auto& op_a, const auto& op_b) {
    // Assigning a product zeroes C first, so beta == 0 ignores C's contents even when they are NaN.
    if (beta == T(0)) {
      cm.noalias() = alpha * op_a * op_b;
    } else {
      if (beta != T(1)) cm *= beta;
      cm.noalias() += alpha * op_a * op_b;
    }
  };
  if (!trans_a && !trans_b) run(am, bm);
  else if (trans_a && !trans_b) run(am.transpose(), bm);
  else if (!trans_a && trans_b) run(am, bm.transpose());
  else run(am.transpose(), bm.transpose());
}

template <typename T>
void gemm_typed(const GemmArgs& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  const T alpha = static_cast<T>(g.alpha), beta = static_cast<T>(g.beta);
  const int nt = std::max(1, num_threads());
  const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  // Threads take whole matrices when that splits evenly, when there are many, or when each is too
  // small for Eigen to parallelize well; otherwise Eigen parallelizes each product.
  const bool over_batch = g.batch > 1 && nt > 1 && (g.batch % nt == 0 || g.batch >= 4 * nt || flops < 4e6);
  if (over_batch) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < g.batch; ++i)
      gemm_one(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, a + i * g.stride_a, g.lda, b + i * g.stride_b, g.ldb, beta,
               c + i * g.stride_c, g.ldc);
    return;
  }
  // Eigen sizes its team with omp_get_max_threads() of this thread; Eigen::setNbThreads would be a
  // process-wide setting, racing between the devices' threads.
  omp_set_num_threads(nt);
  for (int64_t i = 0; i < g.batch; ++i)
    gemm_one(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, a + i * g.stride_a, g.lda, b + i * g.stride_b, g.ldb, beta,
             c + i * g.stride_c, g.ldc);
}

// ------------------------------------------------------------------------------------------------
// Note [Conv as GEMM]
// Per sample s and group g, with Cg = c_in / groups, Og = c_out / groups, P = oh·ow output pixels
// and Kc = Cg·kh·kw (col[s] = im2col(x[s]) is [c_in·kh·kw, P], the rows of group g contiguous):
//   forward       y[s,g]  [Og, P]  = w[g] [Og, Kc] · col[s,g] [Kc, P]
//   input grad    gcol    [Kc, P]  = w[g]ᵀ [Kc, Og] · gy[s,g] [Og, P],    gx[s] = col2im(gcol)
//   weight grad   gw[g]   [Og, Kc] += gy[s,g] [Og, P] · col[s,g]ᵀ [P, Kc]
// A 1x1 convolution with stride 1 and no padding needs no col: col[s] is x[s] itself.
// Threads take samples, each with its own col buffer (and for the weight gradient its own partial
// gw, summed at the end), when there are at least as many samples as threads; otherwise samples run
// in turn and Eigen parallelizes each GEMM. Large images are cut into tiles of output rows so
// that a col buffer stays a few MB (the GEMMs then use a row stride of P).

struct ConvGeometry {
  int64_t cg, og, p, kc;  // channels in/out per group, output pixels, GEMM depth per group
  bool pointwise;         // 1x1, stride 1, no padding: col is the input itself
  int64_t tile_rows;      // output rows per col tile
  int64_t x_sample, y_sample;

  explicit ConvGeometry(const ConvArgs& a)
      : cg(a.c_in / a.groups),
        og(a.c_out / a.groups),
        p(a.oh * a.ow),
        kc(a.c_in / a.groups * a.kh * a.kw),
        pointwise(a.kh == 1 && a.kw == 1 && a.stride_h == 1 && a.stride_w == 1 && a.pad_h == 0 && a.pad_w == 0),
        x_sample(a.c_in * a.h * a.w),
        y_sample(a.c_out * a.oh * a.ow) {
    constexpr int64_t kTileElems = int64_t{1} << 21;  // 8 MB of float per col tile
    tile_rows = pointwise ? a.oh : std::clamp<int64_t>(kTileElems / std::max<int64_t>(1, kc * a.groups * a.ow), 1, a.oh);
  }
  int64_t col_elems(const ConvArgs& a) const { return pointwise ? 0 : kc * a.groups * tile_rows * a.ow; }
};

void check_conv(const char* op, const ConvArgs& a, const View& big, const View& w) {
  EF_ASSERT(a.groups > 0 && a.c_in % a.groups == 0 && a.c_out % a.groups == 0, op, ": bad groups");
  EF_ASSERT(big.is_contiguous() && w.is_contiguous() && big.dtype == w.dtype, op, ": expects contiguous views of one dtype");
}

// Walks the im2col matrix of one sample for output rows [oh0, oh1) (a tile of width
// P_t = (oh1 - oh0)·ow): for each col row r = (c·kh + i)·kw + j and output row oh, calls
// seg(col_offset, x_offset, lo, hi): columns [lo, hi) of that output row read x[x_offset + ow·stride_w],
// the others are padding (lo == hi == 0 when the whole input row is).
template <typename Seg>
void walk_im2col(const ConvArgs& a, int64_t oh0, int64_t oh1, Seg seg) {
  const int64_t pt = (oh1 - oh0) * a.ow;
  for (int64_t c = 0; c < a.c_in; ++c) {
    for (int64_t i = 0; i < a.kh; ++i) {
      for (int64_t j = 0; j < a.kw; ++j) {
        const int64_t row = (c * a.kh + i) * a.kw + j;
        const int64_t off_w = j * a.dil_w - a.pad_w;  // iw = ow·stride_w + off_w
        const int64_t lo = off_w >= 0 ? 0 : std::min(a.ow, (-off_w + a.stride_w - 1) / a.stride_w);
        const int64_t hi = a.w - off_w <= 0 ? lo : std::clamp((a.w - off_w + a.stride_w - 1) / a.stride_w, lo, a.ow);
        for (int64_t oh = oh0; oh < oh1; ++oh) {
          const int64_t ih = oh * a.stride_h - a.pad_h + i * a.dil_h;
          const int64_t col_off = row * pt + (oh - oh0) * a.ow;
          if (ih < 0 || ih >= a.h) seg(col_off, int64_t{0}, int64_t{0}, int64_t{0});
          else seg(col_off, (c * a.h + ih) * a.w + off_w, lo, hi);
        }
      }
    }
  }
}

// Strided accesses written once: the stride-1 instantiation (the common case) vectorizes.
template <typename F>
void with_stride(int64_t stride, F f) {
  if (stride == 1) f([] { return int64_t{1}; });
  else f([stride] { return stride; });
}

template <typename T>
void im2col(const ConvArgs& a, const T* x, int64_t oh0, int64_t oh1, T* col) {
  with_stride(a.stride_w, [&](auto sw) {
    walk_im2col(a, oh0, oh1, [&](int64_t col_off, int64_t x_off, int64_t lo, int64_t hi) {
      T* dst = col + col_off;
      std::fill(dst, dst + lo, T(0));
      for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = x[x_off + ow * sw()];
      std::fill(dst + hi, dst + a.ow, T(0));
    });
  });
}

// The adjoint of im2col: adds each col entry into the input position it was read from.
template <typename T>
void col2im_add(const ConvArgs& a, const T* col, int64_t oh0, int64_t oh1, T* x) {
  with_stride(a.stride_w, [&](auto sw) {
    walk_im2col(a, oh0, oh1, [&](int64_t col_off, int64_t x_off, int64_t lo, int64_t hi) {
      const T* src = col + col_off;
      for (int64_t ow = lo; ow < hi; ++ow) x[x_off + ow * sw()] += src[ow];
    });
  });
}

// A workspace that grows and is kept: one per calling thread (each device has its own worker
// thread), so concurrent devices never share it, and steady-state training allocates nothing.
void* workspace(size_t bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buf;
  if (buf.size < bytes) {
    std::free(buf.data);
    buf.size = 0;
    buf.data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    EF_CHECK(buf.data != nullptr, "conv2d: out of memory allocating a ", bytes, "-byte workspace");
    buf.size = bytes;
  }
  return buf.data;
}

// Runs sample(s, thread) for every sample: in parallel, one sample per thread at a time, when
// there are enough samples; otherwise in turn, letting Eigen parallelize each GEMM. Returns the
// number of threads that took samples (each thread's samples form one contiguous range).
template <typename F>
int for_each_sample(int64_t n, F sample) {
  const int nt = static_cast<int>(std::min<int64_t>(std::max(1, num_threads()), n));
  if (nt > 1) {
#pragma omp parallel num_threads(nt)
    {
      const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
      for (int64_t s = n * t / team; s < n * (t + 1) / team; ++s) sample(s, static_cast<int>(t));
    }
    return nt;
  }
  omp_set_num_threads(std::max(1, num_threads()));  // see gemm_typed
  for (int64_t s = 0; s < n; ++s) sample(s, 0);
  return 1;
}

template <typename T>
void conv_forward_typed(const ConvArgs& a, T* y, const T* x, const T* w) {
  const ConvGeometry geo(a);
  const int64_t col_elems = geo.col_elems(a);
  const int slots = static_cast<int>(std::min<int64_t>(std::max(1, num_threads()), a.n));
  T* cols = static_cast<T*>(workspace(static_cast<size_t>(col_elems * slots) * sizeof(T)));
  for_each_sample(a.n, [&](int64_t s, int t) {
    const T* xs = x + s * geo.x_sample;
    T* ys = y + s * geo.y_sample;
    T* col = cols + t * col_elems;
    for (int64_t oh0 = 0; oh0 < a.oh; oh0 += geo.tile_rows) {
      const int64_t oh1 = std::min(a.oh, oh0 + geo.tile_rows), pt = (oh1 - oh0) * a.ow;
      const T* src = xs;
      if (!geo.pointwise) {
        im2col(a, xs, oh0, oh1, col);
        src = col;
      }
      for (int64_t g = 0; g < a.groups; ++g)
        gemm_one(false, false, geo.og, pt, geo.kc, T(1), w + g * geo.og * geo.kc, geo.kc, src + g * geo.kc * pt, pt,
                 T(0), ys + g * geo.og * geo.p + oh0 * a.ow, geo.p);
    }
  });
}

template <typename T>
void conv_input_grad_typed(const ConvArgs& a, T* gx, const T* gy, const T* w) {
  const ConvGeometry geo(a);
  const int64_t col_elems = geo.col_elems(a);
  const int slots = static_cast<int>(std::min<int64_t>(std::max(1, num_threads()), a.n));
  T* cols = static_cast<T*>(workspace(static_cast<size_t>(col_elems * slots) * sizeof(T)));
  for_each_sample(a.n, [&](int64_t s, int t) {
    T* gxs = gx + s * geo.x_sample;
    const T* gys = gy + s * geo.y_sample;
    if (geo.pointwise) {  // gx[s,g] [Cg, P] = w[g]ᵀ · gy[s,g]
      for (int64_t g = 0; g < a.groups; ++g)
        gemm_one(true, false, geo.kc, geo.p, geo.og, T(1), w + g * geo.og * geo.kc, geo.kc, gys + g * geo.og * geo.p,
                 geo.p, T(0), gxs + g * geo.kc * geo.p, geo.p);
      return;
    }
    T* col = cols + t * col_elems;
    std::fill(gxs, gxs + geo.x_sample, T(0));
    for (int64_t oh0 = 0; oh0 < a.oh; oh0 += geo.tile_rows) {
      const int64_t oh1 = std::min(a.oh, oh0 + geo.tile_rows), pt = (oh1 - oh0) * a.ow;
      for (int64_t g = 0; g < a.groups; ++g)
        gemm_one(true, false, geo.kc, pt, geo.og, T(1), w + g * geo.og * geo.kc, geo.kc,
                 gys + g * geo.og * geo.p + oh0 * a.ow, geo.p, T(0), col + g * geo.kc * pt, pt);
      col2im_add(a, col, oh0, oh1, gxs);
    }
  });
}

template <typename T>
void conv_weight_grad_typed(const ConvArgs& a, T* gw, const T* x, const T* gy) {
  const ConvGeometry geo(a);
  const int64_t col_elems = geo.col_elems(a), gw_elems = a.c_out * geo.kc;
  if (a.n == 0) {
    std::fill(gw, gw + gw_elems, T(0));
    return;
  }
  const int slots = static_cast<int>(std::min<int64_t>(std::max(1, num_threads()), a.n));
  // Per thread: a col buffer, and (but for thread 0, which accumulates into gw) a partial gw.
  const int64_t per_slot = col_elems + gw_elems;
  T* work = static_cast<T*>(workspace(static_cast<size_t>(per_slot * slots) * sizeof(T)));
  std::vector<char> started(static_cast<size_t>(slots), 0);  // bytes: threads write their own
  const int used = for_each_sample(a.n, [&](int64_t s, int t) {
    const T* xs = x + s * geo.x_sample;
    const T* gys = gy + s * geo.y_sample;
    T* col = work + t * per_slot;
    T* acc = t == 0 ? gw : col + col_elems;
    for (int64_t oh0 = 0; oh0 < a.oh; oh0 += geo.tile_rows) {
      const int64_t oh1 = std::min(a.oh, oh0 + geo.tile_rows), pt = (oh1 - oh0) * a.ow;
      const T* src = xs;
      if (!geo.pointwise) {
        im2col(a, xs, oh0, oh1, col);
        src = col;
      }
      // The first product of each thread overwrites its accumulator (gw may hold anything).
      const T beta = started[static_cast<size_t>(t)] ? T(1) : T(0);
      started[static_cast<size_t>(t)] = 1;
      for (int64_t g = 0; g < a.groups; ++g)
        gemm_one(false, true, geo.og, geo.kc, pt, T(1), gys + g * geo.og * geo.p + oh0 * a.ow, geo.p,
                 src + g * geo.kc * pt, pt, beta, acc + g * geo.og * geo.kc, geo.kc);
    }
  });
  if (used > 1) {
    for (int t = 1; t < used; ++t) {
      const T* part = work + t * per_slot + col_elems;
      for (int64_t i = 0; i < gw_elems; ++i) gw[i] += part[i];
    }
  }
}

}  // namespace

void gemm(const GemmArgs& args) {
  if (args.m <= 0 || args.n <= 0 || args.batch <= 0) return;
  EF_DISPATCH_FLOAT(args.dtype, "matmul", [&] { gemm_typed<scalar_t>(args); });
}

void conv2d_forward(const ConvArgs& args, const View& y, const View& x, const View& w) {
  check_conv("conv2d", args, x, w);
  EF_ASSERT(y.is_contiguous() && y.dtype == x.dtype, "conv2d: bad output view");
  EF_DISPATCH_FLOAT(x.dtype, "conv2d", [&] {
    conv_forward_typed(args, static_cast<scalar_t*>(y.data), static_cast<const scalar_t*>(x.data),
                       static_cast<const scalar_t*>(w.data));
  });
}

void conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) {
  check_conv("conv2d_input_grad", args, gy, w);
  EF_ASSERT(gx.is_contiguous() && gx.dtype == gy.dtype, "conv2d_input_grad: bad output view");
  EF_DISPATCH_FLOAT(gy.dtype, "conv2d_input_grad", [&] {
    conv_input_grad_typed(args, static_cast<scalar_t*>(gx.data), static_cast<const scalar_t*>(gy.data),
                          static_cast<const scalar_t*>(w.data));
  });
}

void conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) {
  check_conv("conv2d_weight_grad", args, x, gy);
  EF_ASSERT(gw.is_contiguous() && gw.dtype == x.dtype, "conv2d_weight_grad: bad output view");
  EF_DISPATCH_FLOAT(x.dtype, "conv2d_weight_grad", [&] {
    conv_weight_grad_typed(args, static_cast<scalar_t*>(gw.data), static_cast<const scalar_t*>(x.data),
                           static_cast<const scalar_t*>(gy.data));
  });
}

}  // namespace evenflow::cpu_backend
