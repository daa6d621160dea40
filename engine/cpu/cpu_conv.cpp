// The CPU backend's 2-D convolution (forward, input gradient, weight gradient) as im2col / col2im
// around the packed, register-blocked GEMM of packed_gemm.h (Note [Conv as GEMM]), or through oneDNN
// where it runs a pass faster (onednn_conv.cpp); and the per-thread workspace both use.
#include "evenflow/engine/cpu/cpu_conv.h"

#include "evenflow/engine/cpu/onednn_conv.h"
#include "evenflow/engine/cpu/packed_gemm.h"
#include "evenflow/engine/cpu/threads.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "evenflow/engine/device.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {
namespace {

// ------------------------------------------------------------------------------------------------
// Note [Conv as GEMM]
// Per sample s and group g, with Cg = c_in / groups, Og = c_out / groups, P = oh·ow output pixels
// and Kc = Cg·kh·kw (col[s] = im2col(x[s]) is [c_in·kh·kw, P], the rows of group g contiguous):
//   forward       y[s,g]   [Og, P]  = w[g] [Og, Kc] · col[s,g] [Kc, P]          Wide; w packed, col as B panels
//   input grad    gcol     [Kc, P]  = w[g]ᵀ [Kc, Og] · gy[s,g] [Og, P]          Wide; wᵀ packed, gy packed
//                 gx[s] = col2im(gcol)
//   weight grad   gw[g]ᵀ   [Kc, Og] += col[s,g] [Kc, P] · gy[s,g]ᵀ [P, Og]      Tall; col read in place, gyᵀ packed
// (see Note [Packed GEMM for convolution]). The weight is packed once per call and shared.
// Threads take samples, each with its own buffers (and for the weight gradient its own gwᵀ, summed
// and transposed into gw at the end), when there are at least as many samples as threads;
// otherwise samples run in turn and each GEMM splits its columns between the threads. Large images
// are cut into tiles of output rows so that a col buffer stays a few MB (the GEMMs then address y
// and gy with a row stride of P).

struct ConvGeometry {
  int64_t cg, og, p, kc;  // channels in/out per group, output pixels, GEMM depth per group
  int64_t tile_rows;      // output rows per col tile
  int64_t x_sample, y_sample;

  // Tiles of at most kTileElems col entries (4 MB of float), whole output rows each: among the
  // sizes from half that up, the one that wastes least of its last GEMM panel (nr pixels wide).
  static constexpr int64_t kTileElems = int64_t{1} << 20;
  ConvGeometry(const ConvArgs& a, int64_t nr)
      : cg(a.c_in / a.groups),
        og(a.c_out / a.groups),
        p(a.oh * a.ow),
        kc(a.c_in / a.groups * a.kh * a.kw),
        x_sample(a.c_in * a.h * a.w),
        y_sample(a.c_out * a.oh * a.ow) {
    const int64_t most = std::clamp<int64_t>(kTileElems / std::max<int64_t>(1, kc * a.groups * a.ow), 1, a.oh);
    tile_rows = most;
    double best = 2;
    for (int64_t rows = most; rows >= std::max<int64_t>(1, most / 2); --rows) {
      const int64_t pixels = rows * a.ow;
      const double waste = static_cast<double>((pixels + nr - 1) / nr * nr) / static_cast<double>(pixels);
      if (waste < best - 0.01) {
        best = waste;
        tile_rows = rows;
      }
    }
  }
  int64_t tile_pixels(const ConvArgs& a) const { return tile_rows * a.ow; }
};

// Whether v, an activation of a pass (x, y or a gradient of one), is laid out as args says:
// contiguous, or channels-last (Note [Channels-last]).
bool activation_laid_out(const ConvArgs& a, const View& v) {
  return a.channels_last ? v.is_channels_last() : v.is_contiguous();
}

bool weight_laid_out(const ConvArgs& a, const View& v) {
  return a.channels_last && a.compute == DType::BFloat16 ? v.is_channels_last() : v.is_contiguous();
}

// `second` is the weight, or (weight gradient) the output's gradient: an activation too.
void check_conv(const char* op, const ConvArgs& a, const View& activation, const View& second,
                bool second_is_activation = false) {
  EF_ASSERT(a.groups > 0 && a.c_in % a.groups == 0 && a.c_out % a.groups == 0, op, ": bad groups");
  EF_ASSERT(activation_laid_out(a, activation) &&
                (second_is_activation ? activation_laid_out(a, second) : weight_laid_out(a, second)) &&
                activation.dtype == second.dtype,
            op, ": expects views of one dtype, contiguous", a.channels_last ? " (activations channels-last)" : "");
  // Note [bfloat16 operands converted once] in ops/conv.cpp.
  EF_ASSERT(a.compute != DType::BFloat16 || activation.dtype == DType::BFloat16, op,
            ": bfloat16 compute takes bfloat16 operands");
}

// Whether our own kernels run `pass` on channels-last activations: the input gradient of a
// one-channel input (wgan_gp's critic's first layer, in a penalty), whose output is the same memory
// in either layout; the kernel reads the output gradient in its channels-last order.
bool own_conv_takes_channels_last(const ConvArgs& args, ConvPass pass) {
  return pass == ConvPass::InputGrad && args.c_in == 1;
}

// Our kernels take channels-last activations only where own_conv_takes_channels_last says so.
void check_own_kernel_layout(const char* op, const ConvArgs& args, ConvPass pass) {
  EF_ASSERT(!args.channels_last || own_conv_takes_channels_last(args, pass), op,
            ": channels-last activations on a pass only oneDNN runs so");
}

// Walks the im2col matrix of one sample for output rows [oh0, oh1): for each col row
// r = (c·kh + i)·kw + j and output row oh, calls seg(r, p0, x_offset, lo, hi), where p0 is the
// tile pixel of (oh, ow = 0); columns ow in [lo, hi) read x[x_offset + ow·stride_w], the others
// are padding (lo == hi == 0 when the whole input row is).
template <typename Seg>
void walk_im2col(const ConvArgs& a, int64_t oh0, int64_t oh1, Seg seg) {
  for (int64_t c = 0; c < a.c_in; ++c) {
    for (int64_t i = 0; i < a.kh; ++i) {
      for (int64_t j = 0; j < a.kw; ++j) {
        const int64_t row = (c * a.kh + i) * a.kw + j;
        const int64_t off_w = j * a.dil_w - a.pad_w;  // iw = ow·stride_w + off_w
        const int64_t lo = off_w >= 0 ? 0 : std::min(a.ow, (-off_w + a.stride_w - 1) / a.stride_w);
        const int64_t hi = a.w - off_w <= 0 ? lo : std::clamp((a.w - off_w + a.stride_w - 1) / a.stride_w, lo, a.ow);
        for (int64_t oh = oh0; oh < oh1; ++oh) {
          const int64_t ih = oh * a.stride_h - a.pad_h + i * a.dil_h;
          const int64_t p0 = (oh - oh0) * a.ow;
          if (ih < 0 || ih >= a.h)
            seg(row, p0, int64_t{0}, int64_t{0}, int64_t{0});
          else
            seg(row, p0, (c * a.h + ih) * a.w + off_w, lo, hi);
        }
      }
    }
  }
}

// Strided accesses written once: the stride-1 instantiation (the common case) vectorizes.
template <typename F>
void with_stride(int64_t stride, F f) {
  if (stride == 1)
    f([] { return int64_t{1}; });
  else
    f([stride] { return stride; });
}

// Note [Shifted im2col]
// For a stride-1 convolution whose output rows are as wide as its input rows ("same" padding
// along W, the common case), pixel p of col row (c, i, j) reads x at p plus a fixed offset. Such a
// row is one shifted copy of the input channel, after which the few padding columns are zeroed
// (and col2im adds the whole row back after zeroing them), which is several times faster than
// going output row by output row.
bool shifted(const ConvArgs& a) {
  return a.stride_h == 1 && a.stride_w == 1 && a.ow == a.w;
}

struct ShiftedRow {
  int64_t row;     // col row (c·kh + i)·kw + j
  int64_t src;     // x index of tile pixel 0 (x index of pixel p is src + p)
  int64_t c0, c1;  // tile pixels of existing input rows, clipped to x; 0 <= c0 <= c1 <= pt
  int64_t v0, v1;  // output rows whose input row exists
  int64_t lo, hi;  // output columns whose input column exists
};

// Calls fn(ShiftedRow) for every col row of a tile of output rows [oh0, oh1); see Note [Shifted im2col].
template <typename F>
void walk_shifted(const ConvArgs& a, int64_t x_sample, int64_t oh0, int64_t oh1, F fn) {
  for (int64_t c = 0; c < a.c_in; ++c) {
    for (int64_t i = 0; i < a.kh; ++i) {
      for (int64_t j = 0; j < a.kw; ++j) {
        ShiftedRow r;
        r.row = (c * a.kh + i) * a.kw + j;
        const int64_t off_h = i * a.dil_h - a.pad_h, off_w = j * a.dil_w - a.pad_w;
        r.v0 = std::clamp(-off_h, oh0, oh1);
        r.v1 = std::clamp(a.h - off_h, r.v0, oh1);
        r.lo = std::clamp<int64_t>(-off_w, 0, a.ow);
        r.hi = std::clamp(a.w - off_w, r.lo, a.ow);
        r.src = c * a.h * a.w + (oh0 + off_h) * a.w + off_w;
        // The padding columns of the valid rows may read a neighbouring row, but never outside x.
        // c0 and c1 stay within the valid rows' pixels [first, last]: -src can lie past them (for a
        // 1xN image under a 3x3 kernel padded by 1, the kernel's top row has no valid rows and src
        // is a row and a column before x), and a c0 past the tile's pt pixels made im2col write
        // past its col rows.
        const int64_t first = (r.v0 - oh0) * a.ow, last = (r.v1 - oh0) * a.ow;
        r.c0 = std::clamp(-r.src, first, last);
        r.c1 = std::clamp(x_sample - r.src, r.c0, last);
        fn(r);
      }
    }
  }
}

// Layouts of the im2col matrix of one tile of pt pixels, one block per group:
// Panels: col[g] [Kc, pt] as Wide B panels (forward);
// Rows: col[g] row-major [Kc, pt], its rows padded to a whole number of Tall MR-row panels (the
//       weight gradient reads it in place as A).
enum class ColLayout { Panels, Rows };

template <typename T, ColLayout L>
int64_t col_group_elems(const ConvGeometry& geo, int64_t pt) {
  if (L == ColLayout::Panels) return packed_b_elems<T, TileShape::Wide>(geo.kc, pt);
  constexpr int64_t mr = Micro<T, TileShape::Tall>::MR;
  return (geo.kc + mr - 1) / mr * mr * pt;
}

template <typename T, ColLayout L>
void im2col(const ConvArgs& a, const ConvGeometry& geo, const T* x, int64_t oh0, int64_t oh1, T* dst) {
  constexpr int64_t nr = Micro<T, TileShape::Wide>::NR;
  const int64_t pt = (oh1 - oh0) * a.ow, group_elems = col_group_elems<T, L>(geo, pt);
  // Writes tile pixels [p0, p1) of a col row: x[src + (p - p0)·stride] for pixel p, or zeros when
  // src < 0.
  const auto store = [&](int64_t row, int64_t p0, int64_t p1, int64_t src, int64_t stride) {
    const int64_t r = row % geo.kc;
    T* base = dst + row / geo.kc * group_elems;
    // n values from x[s], x[s + stride], ... (or zeros) to out.
    const auto run = [&](T* out, int64_t n, int64_t s) {
      if (src < 0)
        std::fill(out, out + n, T(0));
      else if (stride == 1 && n == nr)
        std::memcpy(out, x + s, nr * sizeof(T));  // a whole panel row: 3 vector moves
      else if (stride == 1)
        std::copy(x + s, x + s + n, out);
      else
        for (int64_t t = 0; t < n; ++t) out[t] = x[s + t * stride];
    };
    if constexpr (L == ColLayout::Rows) {
      run(base + r * pt + p0, p1 - p0, src);
    } else {
      // Element (r, p) sits in panel p / NR at r·NR + p % NR: contiguous up to a panel boundary.
      T* d = base + r * nr;
      for (int64_t q = p0; q < p1;) {
        const int64_t o = q % nr, len = std::min(p1 - q, nr - o);
        run(d + q / nr * geo.kc * nr + o, len, src + (q - p0) * stride);
        q += len;
      }
    }
  };
  constexpr int64_t kZero = -1;  // store() src for padding

  if (shifted(a)) {
    walk_shifted(a, geo.x_sample, oh0, oh1, [&](const ShiftedRow& r) {
      store(r.row, 0, r.c0, kZero, 1);
      store(r.row, r.c0, r.c1, r.src + r.c0, 1);
      store(r.row, r.c1, pt, kZero, 1);
      for (int64_t oh = r.v0; oh < r.v1; ++oh) {
        const int64_t p0 = (oh - oh0) * a.ow;
        store(r.row, p0, p0 + r.lo, kZero, 1);
        store(r.row, p0 + r.hi, p0 + a.ow, kZero, 1);
      }
    });
    return;
  }
  walk_im2col(a, oh0, oh1, [&](int64_t row, int64_t p0, int64_t x_off, int64_t lo, int64_t hi) {
    store(row, p0, p0 + lo, kZero, 1);
    store(row, p0 + lo, p0 + hi, x_off + lo * a.stride_w, a.stride_w);
    store(row, p0 + hi, p0 + a.ow, kZero, 1);
  });
}

// The adjoint of im2col: adds each entry of a row-major col [Kc·groups, pt] into the input
// position it was read from.
// Clobbers col's padding entries on the shifted path.
template <typename T>
void col2im_add(const ConvArgs& a, const ConvGeometry& geo, T* col, int64_t oh0, int64_t oh1, T* x) {
  const int64_t pt = (oh1 - oh0) * a.ow;
  if (shifted(a)) {
    walk_shifted(a, geo.x_sample, oh0, oh1, [&](const ShiftedRow& r) {
      T* g = col + r.row * pt;
      for (int64_t oh = r.v0; oh < r.v1; ++oh) {
        const int64_t p0 = (oh - oh0) * a.ow;
        std::fill(g + p0, g + p0 + r.lo, T(0));
        std::fill(g + p0 + r.hi, g + p0 + a.ow, T(0));
      }
      for (int64_t p = r.c0; p < r.c1; ++p) x[r.src + p] += g[p];  // inside x for p in [c0, c1)
    });
    return;
  }
  with_stride(a.stride_w, [&](auto sw) {
    walk_im2col(a, oh0, oh1, [&](int64_t row, int64_t p0, int64_t x_off, int64_t lo, int64_t hi) {
      const T* src = col + row * pt + p0;
      for (int64_t ow = lo; ow < hi; ++ow) x[x_off + ow * sw()] += src[ow];
    });
  });
}

// The workspace of one call: `shared` elements, then one slot of `per_thread` elements for each
// thread that takes samples; and the loop over samples.
template <typename T>
struct ConvWork {
  T* shared;
  T* slots;
  int64_t per_thread;
  int threads;  // threads that take samples (1 when samples run in turn)

  ConvWork(int64_t n, int64_t shared_elems, int64_t per_thread_elems)
      : per_thread((per_thread_elems + 15) / 16 * 16),
        threads(static_cast<int>(std::min<int64_t>(std::max(1, kernel_threads()), n))) {
    const int64_t shared_rounded = (shared_elems + 15) / 16 * 16;
    shared = static_cast<T*>(thread_workspace(static_cast<size_t>(shared_rounded + per_thread * threads) * sizeof(T)));
    slots = shared + shared_rounded;
  }
  T* slot(int t) const { return slots + t * per_thread; }
  // Threads each GEMM may use: all of them when samples run in turn.
  int gemm_threads() const { return threads > 1 ? 1 : std::max(1, kernel_threads()); }

  // Runs sample(s, t) for every sample, in parallel when threads > 1 (thread t takes one
  // contiguous range of samples).
  template <typename F>
  void for_each_sample(int64_t n, F sample) const {
    if (threads <= 1) {
      for (int64_t s = 0; s < n; ++s) sample(s, 0);
      return;
    }
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = thread_index(), team = team_size();
      for (int64_t s = n * t / team; s < n * (t + 1) / team; ++s) sample(s, static_cast<int>(t));
    }
  }
};

template <typename T>
void conv_forward_typed(const ConvArgs& a, T* y, const T* x, const T* w, const T* bias) {
  constexpr TileShape S = TileShape::Wide;
  const ConvGeometry geo(a, Micro<T, S>::NR);
  const int64_t a_elems = packed_a_elems<T, S>(geo.og, geo.kc);
  const int64_t col_group = col_group_elems<T, ColLayout::Panels>(geo, geo.tile_pixels(a));
  const ConvWork<T> work(a.n, a_elems * a.groups, col_group * a.groups);
  for (int64_t g = 0; g < a.groups; ++g)
    pack_a<T, S>(geo.og, geo.kc, w + g * geo.og * geo.kc, geo.kc, int64_t{1}, work.shared + g * a_elems);
  work.for_each_sample(a.n, [&](int64_t s, int t) {
    T* col = work.slot(t);
    for (int64_t oh0 = 0; oh0 < a.oh; oh0 += geo.tile_rows) {
      const int64_t oh1 = std::min(a.oh, oh0 + geo.tile_rows), pt = (oh1 - oh0) * a.ow;
      im2col<T, ColLayout::Panels>(a, geo, x + s * geo.x_sample, oh0, oh1, col);
      const int64_t group_elems = col_group_elems<T, ColLayout::Panels>(geo, pt);
      for (int64_t g = 0; g < a.groups; ++g)
        packed_gemm<T, S, true>(geo.og, pt, geo.kc, work.shared + g * a_elems, 0, col + g * group_elems,
                                y + s * geo.y_sample + g * geo.og * geo.p + oh0 * a.ow, geo.p, false,
                                work.gemm_threads());
    }
    if (bias != nullptr) {  // while the sample's output is still in cache
      T* ys = y + s * geo.y_sample;
      for (int64_t c = 0; c < a.c_out; ++c)
        for (int64_t i = 0; i < geo.p; ++i) ys[c * geo.p + i] += bias[c];
    }
  });
}

// Note [One-channel input gradient]
// The input gradient of a convolution from one input channel (wgan_gp's critic's first layer, in
// every gradient penalty, and the generator's last, a transposed convolution to the images: twelve
// calls a training step of five critic steps) is, per output pixel, its output gradient's channels
// times the weight's [c_out, kh·kw] matrix: kh·kw numbers a pixel, added to the kernel's footprint
// in gx. The packed-GEMM path spent most of its time packing the output gradient and in col2im's
// scalar adds (perf, 4x4 stride 2, 32 channels, 28x28). Here the taps of a block of pixels at a
// time are accumulated in registers straight from the output gradient (read in either layout
// through its strides), then added to gx. A pixel's taps are whole vectors: 16 (4x4 kernels, read
// in place; 3x3 and smaller, from a copy of the weight padded with zero taps) or 32 (5x5 and up to
// 32 taps, padded likewise): a 5x5 kernel wastes 7 of 32 lanes, and still runs 3.5x as fast as the
// packed GEMM or oneDNN. Larger kernels take the packed-GEMM path.
// Timings: docs/benchmarks.md, "The issue's targets at its close" (4x4) and "First layers'
// convolutions on AVX2" (the others).

// The taps of kPixels output pixels (`out`: kTaps a pixel), from their output gradient `g`
// (element (pixel q, channel c) at g[q·pixel_stride + c·channel_stride]) and the weight w [c_out, kTaps].
template <typename T, int kTaps, int kPixels>
void one_channel_taps(const T* g, int64_t pixel_stride, int64_t channel_stride, int64_t c_out, const T* w, T* out) {
  using V = typename Micro<T, TileShape::Wide>::V;
  constexpr int64_t kLanes = Micro<T, TileShape::Wide>::kLanes, kVecs = kTaps / kLanes;
  static_assert(kTaps % kLanes == 0, "a pixel's taps are whole vectors");
  V acc[kPixels][kVecs];  // as micro_tile's: no other use, so GCC keeps them in registers
  for (int q = 0; q < kPixels; ++q)
    for (int64_t v = 0; v < kVecs; ++v) acc[q][v] = V{};
  // Unrolled whole: otherwise GCC kept a 5x5 kernel's accumulators on the stack (classify's first
  // layer's input gradient took 7.6 ms on a Zen 2, against 3.9 with kBlock's registers).
  for (int64_t c = 0; c < c_out; ++c) {
    V wv[kVecs];
#pragma GCC unroll 8
    for (int64_t v = 0; v < kVecs; ++v) std::memcpy(&wv[v], w + c * kTaps + v * kLanes, sizeof(V));
#pragma GCC unroll 8
    for (int q = 0; q < kPixels; ++q) {
      const V gv = -V{} + g[q * pixel_stride + c * channel_stride];  // a broadcast (see micro_tile)
#pragma GCC unroll 8
      for (int64_t v = 0; v < kVecs; ++v) acc[q][v] += gv * wv[v];
    }
  }
  for (int q = 0; q < kPixels; ++q)
    for (int64_t v = 0; v < kVecs; ++v) std::memcpy(out + q * kTaps + v * kLanes, &acc[q][v], sizeof(V));
}

// One sample's gx. `w`: [c_out, kTaps], a pixel's kh·kw taps first; `row`: an output row's taps.
template <typename T, int kTaps>
void one_channel_input_grad(const ConvArgs& a, T* gx, const T* gy, const T* w, int64_t s, T* row) {
  // Pixels a block: their kTaps/kLanes accumulators each, a broadcast and the weight's vectors in
  // the vector registers (16 with AVX2, 32 with AVX-512), or GCC spills accumulators to the stack:
  // with AVX2, 7 pixels of 2 vectors, 3 of 4 (the weight then read from memory).
  constexpr int64_t kVecs = kTaps / Micro<T, TileShape::Wide>::kLanes;
  constexpr int64_t kRegisters = kVecBytes == 64 ? 32 : 16;
  constexpr int kBlock = static_cast<int>(std::clamp<int64_t>((kRegisters - 2) / kVecs, 1, 8));
  const int64_t p = a.oh * a.ow, ow = a.ow;
  const int64_t pixel_stride = a.channels_last ? a.c_out : 1, channel_stride = a.channels_last ? 1 : p;
  const T* gys = gy + s * a.c_out * p;
  T* gxs = gx + s * a.h * a.w;
  std::fill(gxs, gxs + a.h * a.w, T(0));
  for (int64_t oh = 0; oh < a.oh; ++oh) {
    // row: the taps of the output row's pixels, in blocks of kBlock pixels, then of 4, 2 and 1
    // (several pixels' sums are independent chains of multiply-adds, one pixel's a single
    // latency-bound one).
    const T* g = gys + oh * ow * pixel_stride;
    const auto taps = [&]<int kPixels>(int64_t& ox) {
      one_channel_taps<T, kTaps, kPixels>(g + ox * pixel_stride, pixel_stride, channel_stride, a.c_out, w,
                                          row + ox * kTaps);
      ox += kPixels;
    };
    int64_t ox = 0;
    while (ox + kBlock <= ow) taps.template operator()<kBlock>(ox);
    if constexpr (kBlock > 4)
      if (ox + 4 <= ow) taps.template operator()<4>(ox);
    if constexpr (kBlock > 2)
      if (ox + 2 <= ow) taps.template operator()<2>(ox);
    if (ox < ow) taps.template operator()<1>(ox);
    // Each tap of the row's pixels to its input pixel, as col2im_add does from a col matrix (one
    // input channel: the tap is the col row; padding taps are never read).
    walk_im2col(a, oh, oh + 1, [&](int64_t tap, int64_t, int64_t x_offset, int64_t lo, int64_t hi) {
      for (int64_t x = lo; x < hi; ++x) gxs[x_offset + x * a.stride_w] += row[x * kTaps + tap];
    });
  }
}

// Every sample's gx, the weight padded to kTaps taps a channel where it has fewer.
template <typename T, int kTaps>
void one_channel_input_grad(const ConvArgs& a, T* gx, const T* gy, const T* w) {
  const int64_t taps = a.kh * a.kw;
  const ConvWork<T> work(a.n, taps == kTaps ? 0 : a.c_out * kTaps, a.ow * kTaps);
  if (taps != kTaps) {
    for (int64_t c = 0; c < a.c_out; ++c) {
      std::copy(w + c * taps, w + (c + 1) * taps, work.shared + c * kTaps);
      std::fill(work.shared + c * kTaps + taps, work.shared + (c + 1) * kTaps, T(0));
    }
    w = work.shared;
  }
  work.for_each_sample(a.n, [&](int64_t s, int t) { one_channel_input_grad<T, kTaps>(a, gx, gy, w, s, work.slot(t)); });
}

// gy channels-last where a.channels_last (own_conv_takes_channels_last: one input channel, so gx's
// memory is NCHW's either way).
template <typename T>
void conv_input_grad_typed(const ConvArgs& a, T* gx, const T* gy, const T* w) {
  if (a.c_in == 1 && a.kh * a.kw <= 16) return one_channel_input_grad<T, 16>(a, gx, gy, w);
  if (a.c_in == 1 && a.kh * a.kw <= 32) return one_channel_input_grad<T, 32>(a, gx, gy, w);
  constexpr TileShape S = TileShape::Wide;
  const ConvGeometry geo(a, Micro<T, S>::NR);
  const int64_t pt_max = geo.tile_pixels(a);
  const int64_t a_elems = packed_a_elems<T, S>(geo.kc, geo.og), b_elems = packed_b_elems<T, S>(geo.og, pt_max);
  const ConvWork<T> work(a.n, a_elems * a.groups, b_elems + geo.kc * a.groups * pt_max);
  for (int64_t g = 0; g < a.groups; ++g)  // w[g]ᵀ: element (row, o) at w[g][o·Kc + row]
    pack_a<T, S>(geo.kc, geo.og, w + g * geo.og * geo.kc, int64_t{1}, geo.kc, work.shared + g * a_elems);
  work.for_each_sample(a.n, [&](int64_t s, int t) {
    T* gy_packed = work.slot(t);
    T* gcol = gy_packed + b_elems;
    T* gxs = gx + s * geo.x_sample;
    std::fill(gxs, gxs + geo.x_sample, T(0));
    for (int64_t oh0 = 0; oh0 < a.oh; oh0 += geo.tile_rows) {
      const int64_t oh1 = std::min(a.oh, oh0 + geo.tile_rows), pt = (oh1 - oh0) * a.ow;
      for (int64_t g = 0; g < a.groups; ++g) {
        // Element (o, pixel) of the group's gy rows: at o·P + pixel, or channels-last at pixel·c_out + o.
        const T* gy_tile = gy + s * geo.y_sample +
                           (a.channels_last ? g * geo.og + oh0 * a.ow * a.c_out : g * geo.og * geo.p + oh0 * a.ow);
        pack_b<T, S>(geo.og, pt, gy_tile, a.channels_last ? int64_t{1} : geo.p, a.channels_last ? a.c_out : int64_t{1},
                     gy_packed);
        packed_gemm<T, S, true>(geo.kc, pt, geo.og, work.shared + g * a_elems, 0, gy_packed, gcol + g * geo.kc * pt, pt,
                                false, work.gemm_threads());
      }
      col2im_add(a, geo, gcol, oh0, oh1, gxs);
    }
  });
}

template <typename T>
void conv_weight_grad_typed(const ConvArgs& a, T* gw, const T* x, const T* gy) {
  constexpr TileShape S = TileShape::Tall;
  const ConvGeometry geo(a, 1);  // pixels are the GEMM's depth here: any tile fits
  const int64_t gw_elems = a.c_out * geo.kc;
  if (a.n == 0) {
    std::fill(gw, gw + gw_elems, T(0));
    return;
  }
  const int64_t pt_max = geo.tile_pixels(a);
  const int64_t col_elems = col_group_elems<T, ColLayout::Rows>(geo, pt_max) * a.groups;
  const int64_t b_elems = packed_b_elems<T, S>(pt_max, geo.og), gwt_elems = (gw_elems + 15) / 16 * 16;
  // Per thread: col, packed gyᵀ and its own gwᵀ.
  const ConvWork<T> work(a.n, 0, col_elems + b_elems + gwt_elems);
  // The padding rows of col are read by edge tiles (whose extra rows are dropped): make them
  // finite once.
  for (int t = 0; t < work.threads; ++t) std::fill(work.slot(t), work.slot(t) + col_elems, T(0));
  std::vector<char> started(static_cast<size_t>(work.threads), 0);  // bytes: each thread writes its own
  work.for_each_sample(a.n, [&](int64_t s, int t) {
    T* col = work.slot(t);
    T* gyt_packed = col + col_elems;
    T* gwt = gyt_packed + b_elems;
    for (int64_t oh0 = 0; oh0 < a.oh; oh0 += geo.tile_rows) {
      const int64_t oh1 = std::min(a.oh, oh0 + geo.tile_rows), pt = (oh1 - oh0) * a.ow;
      im2col<T, ColLayout::Rows>(a, geo, x + s * geo.x_sample, oh0, oh1, col);
      const int64_t group_elems = col_group_elems<T, ColLayout::Rows>(geo, pt);
      // The first product of each thread overwrites its gwᵀ.
      const bool accumulate = started[static_cast<size_t>(t)] != 0;
      started[static_cast<size_t>(t)] = 1;
      for (int64_t g = 0; g < a.groups; ++g) {
        // gy[s,g]ᵀ: element (pixel p, o) at gy[s,g][o·P + p]
        pack_b<T, S>(pt, geo.og, gy + s * geo.y_sample + g * geo.og * geo.p + oh0 * a.ow, int64_t{1}, geo.p,
                     gyt_packed);
        packed_gemm<T, S, false>(geo.kc, geo.og, pt, col + g * group_elems, pt, gyt_packed, gwt + g * geo.kc * geo.og,
                                 geo.og, accumulate, work.gemm_threads());
      }
    }
  });
  // gw[g][o][r] = Σ over threads of gwᵀ[g][r][o], over the threads that took samples: a team can be
  // smaller than asked for (no OpenMP, a nested region), and a slot no thread wrote holds whatever
  // the kept workspace held before.
  for (int64_t g = 0; g < a.groups; ++g) {
    for (int64_t o = 0; o < geo.og; ++o) {
      for (int64_t r = 0; r < geo.kc; ++r) {
        T sum = T(0);
        for (int t = 0; t < work.threads; ++t)
          if (started[static_cast<size_t>(t)] != 0)
            sum += work.slot(t)[col_elems + b_elems + (g * geo.kc + r) * geo.og + o];
        gw[(g * geo.og + o) * geo.kc + r] = sum;
      }
    }
  }
}

}  // namespace

void* thread_workspace(size_t bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  // One scratch buffer per thread (each OpenMP or worker thread runs its own im2col), grown as
  // needed and freed when the thread ends: no allocation per convolution.
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

namespace {

// A pass's result: float32 for bfloat16 compute (bfloat16 operands, float32 sums), else the operands'.
DType result_dtype(const ConvArgs& args, DType operands) {
  return args.compute == DType::BFloat16 ? DType::Float32 : operands;
}

#if EF_ONEDNN
// Whether oneDNN runs a pass on operands of `dtype`: every one of bfloat16 compute (whose operands
// the op converts to bfloat16, Note [bfloat16 operands converted once] in ops/conv.cpp), and the
// float32 ones it runs faster than our kernels (Note [oneDNN convolution dispatch]).
bool onednn_runs(const ConvArgs& args, ConvPass pass, DType dtype) {
  return args.compute == DType::BFloat16 || (dtype == DType::Float32 && onednn_takes(args, pass));
}
#endif

}  // namespace

bool conv_takes_channels_last(const ConvArgs& args, ConvPass pass, DType dtype) {
#if EF_ONEDNN
  if (onednn_runs(args, pass, dtype)) return true;
#else
  (void)dtype;
#endif
  return own_conv_takes_channels_last(args, pass);
}

void conv2d_forward(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias) {
  check_conv("conv2d", args, x, w);
  EF_ASSERT(activation_laid_out(args, y) && y.dtype == result_dtype(args, x.dtype), "conv2d: bad output view");
  EF_ASSERT(bias.data == nullptr || (bias.is_contiguous() && bias.numel() == args.c_out && bias.dtype == y.dtype),
            "conv2d: bad bias view");
#if EF_ONEDNN
  if (onednn_runs(args, ConvPass::Forward, x.dtype))
    return onednn_conv2d_forward(args, static_cast<float*>(y.data), x.data, w.data,
                                 static_cast<const float*>(bias.data));
#endif
  check_own_kernel_layout("conv2d", args, ConvPass::Forward);
  EF_DISPATCH_FLOAT(x.dtype, "conv2d", [&] {
    conv_forward_typed(args, static_cast<scalar_t*>(y.data), static_cast<const scalar_t*>(x.data),
                       static_cast<const scalar_t*>(w.data), static_cast<const scalar_t*>(bias.data));
  });
}

void conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) {
  check_conv("conv2d_input_grad", args, gy, w);
  EF_ASSERT(activation_laid_out(args, gx) && gx.dtype == result_dtype(args, gy.dtype),
            "conv2d_input_grad: bad output view");
#if EF_ONEDNN
  if (onednn_runs(args, ConvPass::InputGrad, gy.dtype))
    return onednn_conv2d_input_grad(args, static_cast<float*>(gx.data), gy.data, w.data);
#endif
  check_own_kernel_layout("conv2d_input_grad", args, ConvPass::InputGrad);
  EF_DISPATCH_FLOAT(gy.dtype, "conv2d_input_grad", [&] {
    conv_input_grad_typed(args, static_cast<scalar_t*>(gx.data), static_cast<const scalar_t*>(gy.data),
                          static_cast<const scalar_t*>(w.data));
  });
}

void conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) {
  check_conv("conv2d_weight_grad", args, x, gy, true);
  EF_ASSERT(gw.is_contiguous() && gw.dtype == result_dtype(args, x.dtype), "conv2d_weight_grad: bad output view");
#if EF_ONEDNN
  if (onednn_runs(args, ConvPass::WeightGrad, x.dtype))
    return onednn_conv2d_weight_grad(args, static_cast<float*>(gw.data), x.data, gy.data);
#endif
  check_own_kernel_layout("conv2d_weight_grad", args, ConvPass::WeightGrad);
  EF_DISPATCH_FLOAT(x.dtype, "conv2d_weight_grad", [&] {
    conv_weight_grad_typed(args, static_cast<scalar_t*>(gw.data), static_cast<const scalar_t*>(x.data),
                           static_cast<const scalar_t*>(gy.data));
  });
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend