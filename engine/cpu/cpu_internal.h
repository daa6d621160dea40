// Internal to the CPU backend: the CpuBackend class, whose members are defined in cpu_backend.cpp
// (memory, copies, and the GEMM and convolutions of cpu_conv.h) and in one file per kernel family
// (cpu_elementwise.cpp, cpu_unary.cpp, cpu_reduce.cpp, cpu_normalization.cpp, cpu_pooling.cpp,
// cpu_indexing.cpp, cpu_adam.cpp), and what those files share: the strided iteration every kernel
// that walks views goes through (Note [Strided iteration]), a loop's thread count, the accumulator
// type and the lanes of a row's sums. Only those files include it; engine/CMakeLists.txt compiles
// them all with -ffp-contract=off.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cpu/isa.h"
#include "evenflow/engine/cpu/threads.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

// Loops over fewer elements than this run on the calling thread: waking an OpenMP team costs
// microseconds, more than such a loop takes.
constexpr int64_t kParallelGrain = 32768;

inline int threads_for(int64_t work) {
  return work > kParallelGrain ? std::max(1, kernel_threads()) : 1;
}

// Float32 sums and softmax normalizers accumulate in double: tests compare against float64
// references, and a float accumulator over 10^6 elements loses about three digits.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, float>, double, T>;

// ------------------------------------------------------------------------------------------------
// Note [Strided iteration]
// Elementwise kernels, reductions and indexing all walk N views of one shape, each with its own
// strides (0 on broadcast dims), with StridedIter. make_iter drops size-1 dims and merges adjacent
// dims across which every operand is contiguous, so a contiguous or plainly broadcast problem
// collapses to a few long rows. The walk hands a kernel whole rows (pointers plus the innermost
// byte strides); the kernel's inner loop is written once and instantiated for unit strides, which
// the compiler vectorizes, and for general strides. Work is split into equal element ranges, one
// per thread, or into whole rows where a kernel needs rows kept together (scatter_add).

template <int N>
struct StridedIter {
  int ndim = 1;
  int64_t shape[kMaxDims] = {1};
  int64_t strides[N][kMaxDims] = {};  // in bytes
  char* data[N] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
};

// The dims of `v` from its largest stride to its smallest, when v is dense but not row-major (a
// permuted layout: channels-last); false (and no order) otherwise, for which row-major order stays.
inline bool memory_order(const View& v, int order[kMaxDims]) {
  if (v.is_contiguous()) return false;
  int n = 0;
  for (int d = 0; d < v.ndim; ++d)
    if (v.shape[d] != 1) order[n++] = d;
  std::stable_sort(order, order + n, [&v](int a, int b) { return v.strides[a] > v.strides[b]; });
  int64_t expected = 1;
  for (int i = n; i-- > 0;) {
    if (v.strides[order[i]] != expected) return false;  // gaps, overlaps or broadcast: not a layout
    expected *= v.shape[order[i]];
  }
  for (int d = 0; d < v.ndim; ++d)  // size-1 dims anywhere: make_iter drops them
    if (v.shape[d] == 1) order[n++] = d;
  return true;
}

// Note [Memory order]: with `order_by` set, the walk follows that operand's memory order where it is
// dense but permuted (a channels-last output or input), so its rows are contiguous and merge like a
// row-major operand's; elementwise kernels order by their output, reductions by their input.
// Row-major and broadcast operands keep row-major order, so their results and summation order are
// unchanged.
template <size_t M>
StridedIter<static_cast<int>(M)> make_iter(const std::array<View, M>& views_in, int order_by = -1) {
  constexpr int N = static_cast<int>(M);
  std::array<View, M> views = views_in;
  int order[kMaxDims];
  if (order_by >= 0 && memory_order(views_in[static_cast<size_t>(order_by)], order)) {
    for (size_t k = 0; k < M; ++k)
      for (int d = 0; d < views[k].ndim; ++d) {
        views[k].shape[d] = views_in[k].shape[order[d]];
        views[k].strides[d] = views_in[k].strides[order[d]];
      }
  }
  const View& ref = views[0];
  StridedIter<N> it;
  int nd = 0;
  for (int d = 0; d < ref.ndim; ++d) {
    const int64_t size = ref.shape[d];
    if (size == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < N && merge; ++k) {
      const int64_t inner = views[k].strides[d] * static_cast<int64_t>(dtype_size(views[k].dtype));
      merge = it.strides[k][nd - 1] == inner * size;
    }
    if (merge) {
      it.shape[nd - 1] *= size;
    } else {
      it.shape[nd] = size;
      ++nd;
    }
    for (int k = 0; k < N; ++k)
      it.strides[k][nd - 1] = views[k].strides[d] * static_cast<int64_t>(dtype_size(views[k].dtype));
  }
  if (nd == 0) {  // a single element
    nd = 1;
    it.shape[0] = 1;
    for (int k = 0; k < N; ++k) it.strides[k][0] = 0;
  }
  it.ndim = nd;
  for (int k = 0; k < N; ++k) {
    EF_ASSERT(views[k].ndim == ref.ndim, "strided operands differ in rank");
    for (int d = 0; d < ref.ndim; ++d) EF_ASSERT(views[k].shape[d] == ref.shape[d], "strided operands differ in shape");
    it.data[k] = static_cast<char*>(views[k].data);
  }
  return it;
}

// Calls body(ptrs, inner_strides, n) for each row piece of elements [begin, end) in row-major order.
template <int N, typename Body>
void run_range(const StridedIter<N>& it, char* const* base, int64_t begin, int64_t end, Body& body) {
  const int last = it.ndim - 1;
  int64_t idx[kMaxDims];
  char* p[N];
  for (int k = 0; k < N; ++k) p[k] = base[k];
  int64_t rem = begin;
  for (int d = last; d >= 0; --d) {
    idx[d] = rem % it.shape[d];
    rem /= it.shape[d];
    for (int k = 0; k < N; ++k) p[k] += idx[d] * it.strides[k][d];
  }
  int64_t inner[N];
  for (int k = 0; k < N; ++k) inner[k] = it.strides[k][last];
  while (begin < end) {
    const int64_t n = std::min(it.shape[last] - idx[last], end - begin);
    body(static_cast<char* const*>(p), static_cast<const int64_t*>(inner), n);
    begin += n;
    if (begin >= end) break;
    // The row is done: step to the start of the next one, carrying into outer dims.
    for (int k = 0; k < N; ++k) p[k] += (n - it.shape[last]) * inner[k];
    idx[last] = 0;
    for (int d = last - 1; d >= 0; --d) {
      for (int k = 0; k < N; ++k) p[k] += it.strides[k][d];
      if (++idx[d] < it.shape[d]) break;
      for (int k = 0; k < N; ++k) p[k] -= it.shape[d] * it.strides[k][d];
      idx[d] = 0;
    }
  }
}

// Runs body over every element of `it`, split across threads when large enough. With whole_rows,
// no row is split between threads.
template <int N, typename Body>
void for_each_row(const StridedIter<N>& it, Body body, bool whole_rows = false) {
  const int64_t total = it.numel();
  if (total == 0) return;
  [[maybe_unused]] const int nt = threads_for(total);
  if (nt <= 1) {
    run_range(it, it.data, 0, total, body);
    return;
  }
  const int64_t unit = whole_rows ? it.shape[it.ndim - 1] : 1;
  const int64_t units = total / unit;
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = thread_index(), nteam = team_size();
    const int64_t b = units * t / nteam * unit, e = units * (t + 1) / nteam * unit;
    if (b < e) run_range(it, it.data, b, e, body);
  }
}

// ------------------------------------------------------------------------------------------------
// Note [Streaming stores]
// A plain store first reads the line it writes into the cache (a read for ownership), so writing an
// output costs twice its size in memory traffic, and an output far larger than the caches gains
// nothing from passing through them. A kernel whose output is past kStreamingBytes writes it with
// non-temporal stores instead: each row computed into a small buffer in the L1, then streamed out.
// Measured (docs/benchmarks.md, "Normalizations' outputs streamed"): layer_norm's forward of
// [8192, 1024] float32 (a 32 MiB output) 1.25-1.4x as fast on a Zen 4, 2 threads, an add of 256 MiB
// operands 1.1-1.3x; at 8 MiB and below plain stores were faster (the output stays in the L3 for
// the next op to read), at 16 MiB streaming was. An output written in place is not streamed: its
// lines are in the cache already, and a plain store costs no read.
// Streamed stores are weakly ordered: a thread that made them calls stream_fence before others may
// read them.
constexpr int64_t kStreamingBytes = int64_t{16} << 20;

inline bool streams(int64_t output_bytes) {
  return output_bytes > kStreamingBytes;
}

// dst[0, bytes) = src[0, bytes), the part of dst aligned to the widest register by non-temporal
// stores of that register. The widest store matters: on a Zen 3 (AVX2), 2 threads, a 256 MiB copy
// streamed at 33 GB/s by 16-byte stores and 36-43 GB/s by 32-byte ones (docs/benchmarks.md, "The
// whole table on a Zen 3").
inline void stream_copy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
#if defined(__AVX512F__)
  constexpr size_t kWidth = 64;
  const auto stream = [](char* to, const char* from) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(to), _mm512_loadu_si512(from));
  };
#elif defined(__AVX__)
  constexpr size_t kWidth = 32;
  const auto stream = [](char* to, const char* from) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from)));
  };
#elif defined(__SSE2__)
  constexpr size_t kWidth = 16;
  const auto stream = [](char* to, const char* from) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(to), _mm_loadu_si128(reinterpret_cast<const __m128i*>(from)));
  };
#endif
#if defined(__SSE2__)
  const size_t head = std::min(bytes, (kWidth - reinterpret_cast<uintptr_t>(d) % kWidth) % kWidth);
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= kWidth; bytes -= kWidth, d += kWidth, s += kWidth) stream(d, s);
#endif
  std::memcpy(d, s, bytes);
}

inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Note [Prefetching the next row]
// A row kernel (a normalization's, a softmax's) reads its row from memory in a first pass and then
// works on it in the L1; that first pass waits on memory line by line. Asking for the next row's
// first lines before this row's last pass lets the wait overlap that pass's arithmetic. On a Zen 3
// (AVX2), 2 threads, layer_norm's forward of [8192, 1024] float32 went 2.0 -> 2.3-2.6 Gelem/s in a
// harness (docs/benchmarks.md, "The whole table on a Zen 3"). Up to kPrefetchBytes: with the row
// being worked on, they stay within a 32 KiB L1; a longer row's rest the hardware's prefetcher
// follows once the pass is under way.
constexpr int64_t kPrefetchBytes = int64_t{8} << 10;

template <typename T>
void prefetch_row(const T* row, int64_t n) {
  const int64_t bytes = std::min(n * static_cast<int64_t>(sizeof(T)), kPrefetchBytes);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(reinterpret_cast<const char*>(row) + b, 0, 3);
}

// out[k] = value(k) for k in [0, n), by plain stores or streamed (then the caller owes a stream_fence).
template <typename T, typename F>
void write_row(T* out, int64_t n, bool streaming, F value) {
  if (!streaming) {
    for (int64_t k = 0; k < n; ++k) out[k] = value(k);
    return;
  }
  constexpr int64_t kChunk = 256;
  alignas(64) T chunk[kChunk];
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t m = std::min(kChunk, n - c);
    for (int64_t k = 0; k < m; ++k) chunk[k] = value(c + k);
    stream_copy(out + c, chunk, static_cast<size_t>(m) * sizeof(T));
  }
}

// The element-wise loop every elementwise kernel uses: out[i] = f(in_0[i], in_1[i], ...) over
// make_iter({out, in_0, in_1, ...}, 0) (map_elements builds it; a kernel that looked at the walk
// first hands it over). A large contiguous output not written in place is streamed (Note [Streaming
// stores]).
template <typename Out, typename... In, typename F>
void map_iter(const StridedIter<1 + static_cast<int>(sizeof...(In))>& it, F f) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    const bool streaming =
        streams(it.numel() * static_cast<int64_t>(sizeof(Out))) && ((it.data[I + 1] != it.data[0]) && ...);
    for_each_row(it, [&f, streaming](char* const* p, const int64_t* s, int64_t n) {
      // A local copy: a functor's scalar (LeakyReluGrad's slope) read through the reference would
      // be reloaded for every element, and the loops would not vectorize.
      const F fn = f;
      constexpr size_t kOperands = 1 + sizeof...(In);
      Out* o = reinterpret_cast<Out*>(p[0]);
      const std::tuple<const In*...> in{reinterpret_cast<const In*>(p[I + 1])...};
      const int64_t es[kOperands] = {s[0] / static_cast<int64_t>(sizeof(Out)),
                                     (s[I + 1] / static_cast<int64_t>(sizeof(In)))...};
      // Written once; stride(i) is the constant 1 in the unit-stride instantiation.
      const auto loop = [&](auto stride) {
        for (int64_t k = 0; k < n; ++k) o[k * stride(0)] = fn(std::get<I>(in)[k * stride(I + 1)]...);
      };
      if (std::all_of(es, es + kOperands, [](int64_t e) { return e == 1; })) {
        if (streaming) {
          write_row(o, n, true, [&]([[maybe_unused]] int64_t k) { return fn(std::get<I>(in)[k]...); });
          stream_fence();
        } else {
          loop([](size_t) { return int64_t{1}; });
        }
      } else if (es[0] == 1 && std::all_of(es + 1, es + kOperands, [](int64_t e) { return e == 0 || e == 1; })) {
        // Inputs broadcast along the row (a bias over an image plane, a scalar): their value is
        // constant here, so a chunk-sized copy of it lets the unit-stride loop, which vectorizes,
        // run chunk by chunk (the general-stride loop is several times slower).
        constexpr int64_t kChunk = 256;
        std::tuple<std::array<In, kChunk>...> copies;
        [[maybe_unused]] const int64_t filled = std::min(kChunk, n);
        ((es[I + 1] == 0 ? void(std::fill_n(std::get<I>(copies).data(), filled, std::get<I>(in)[0])) : void()), ...);
        for (int64_t c = 0; c < n; c += kChunk) {
          const int64_t m = std::min(kChunk, n - c);
          const std::tuple<const In*...> src{(es[I + 1] == 0 ? std::get<I>(copies).data() : std::get<I>(in) + c)...};
          Out* oc = o + c;
          for (int64_t k = 0; k < m; ++k) oc[k] = fn(std::get<I>(src)[k]...);
        }
      } else {
        loop([&es](size_t i) { return es[i]; });
      }
    });
  }
  (std::index_sequence_for<In...>{});
}

template <typename Out, typename... In, typename F>
void map_elements(const View& out, const std::array<View, sizeof...(In)>& ins, F f) {
  std::array<View, 1 + sizeof...(In)> views{out};
  std::copy(ins.begin(), ins.end(), views.begin() + 1);
  map_iter<Out, In...>(make_iter(views, 0), f);
}

// Reductions along a row keep eight independent accumulators, lanes: one accumulator makes each
// element wait for the previous step, and lanes let the compiler vectorize a unit-stride row (and
// are a step towards pairwise summation's accuracy).
constexpr int kLanes = 8;

// The bytes of the widest vector register this copy's instruction set has. A vector of GCC's
// extension wider than that is split by the compiler, and one kept across a loop's iterations may
// be kept in memory, moved 8 bytes at a time (LaneVectors, below).
#if defined(__AVX512F__)
constexpr int kRegisterBytes = 64;
#elif defined(__AVX__)
constexpr int kRegisterBytes = 32;
#else
constexpr int kRegisterBytes = 16;
#endif

// Calls body(i, lane) for i in [0, n), lane = i % kLanes for all but the last n % kLanes elements,
// which go to lane 0.
template <typename F>
void for_lanes(int64_t n, F body) {
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int j = 0; j < kLanes; ++j) body(k + j, j);
  for (; k < n; ++k) body(k, 0);
}

// The sum of the lanes, in lane order: an array of them, or a vector (GCC's vector extension) of
// kLanes elements, which a loop GCC would leave scalar lane by lane keeps them in.
template <typename Lanes>
auto lanes_total(const Lanes& lanes) {
  std::remove_cvref_t<decltype(lanes[0])> total = 0;
  for (int l = 0; l < kLanes; ++l) total += lanes[l];
  return total;
}

// A vector of lanes loaded from / stored to memory without alignment. By reference, not returned:
// a vector wider than the instruction set's registers passed by value draws GCC's -Wpsabi (the
// baseline and AVX2 copies of a portable build).
template <typename Vec, typename E>
void load_lanes(Vec& v, const E* p) {
  std::memcpy(&v, p, sizeof(Vec));
}
template <typename Vec, typename E>
void store_lanes(E* p, const Vec& v) {
  std::memcpy(static_cast<void*>(p), &v, sizeof(Vec));  // bytes, into any element type (bfloat16's too)
}

// A row's elements and their lanes (acc_t) as vectors (GCC's vector extension): the kLanes lanes in
// kParts parts of kPartLanes, a part of lanes filling one vector register of doubles. Eight doubles
// are one register with AVX-512 only; as one vector elsewhere, GCC kept the lanes in memory
// through the loop, moved 8 bytes at a time, and layer norm's backward took 1.5x the AVX-512
// copy's time on the same CPU (docs/benchmarks.md, "The AVX2 kernels on an AVX-512 CPU"). Spelled out
// per type: GCC 12 lost the vector_size of a typedef depending on a template parameter in some
// uses (it refused a __builtin_convertvector to it).
constexpr int kPartLanes = kRegisterBytes / static_cast<int>(sizeof(double));
constexpr int kParts = kLanes / kPartLanes;
template <typename T>
struct LaneVectors;
template <>
struct LaneVectors<float> {
  typedef float Register __attribute__((vector_size(kRegisterBytes)));  // a whole register of T
  typedef float Row __attribute__((vector_size(kPartLanes * sizeof(float))));
  typedef double Acc __attribute__((vector_size(kPartLanes * sizeof(double))));
};
template <>
struct LaneVectors<double> {
  typedef double Register __attribute__((vector_size(kRegisterBytes)));
  typedef double Row __attribute__((vector_size(kPartLanes * sizeof(double))));
  typedef double Acc __attribute__((vector_size(kPartLanes * sizeof(double))));
};
// A row's kLanes lanes: lane l is part l / kPartLanes, element l % kPartLanes.
template <typename T>
using LaneParts = std::array<typename LaneVectors<T>::Acc, kParts>;

// The sum of the lanes, in lane order (lanes_total's).
template <typename T>
acc_t<T> parts_total(const LaneParts<T>& parts) {
  return lanes_total(std::bit_cast<std::array<acc_t<T>, kLanes>>(parts));
}

// out = value, for every storage dtype (cpu_elementwise.cpp; reduce_impl fills argmax over a dim
// of size 1 with it).
void fill_impl(const View& out, double value);

class CpuBackend final : public Backend {
 public:
  // Memory, copies (cpu_backend.cpp).
  void* raw_alloc(size_t nbytes) override;
  void raw_free(void* ptr) override;
  void copy_from_host(void* dst, const void* src, size_t nbytes) override;
  void copy_to_host(void* dst, const void* src, size_t nbytes) override;
  std::function<void()> copy_to_host_later(void* dst, const void* src, size_t nbytes) override;
  void synchronize() override;

  // Elementwise ops and random numbers (cpu_elementwise.cpp), unary ops (cpu_unary.cpp).
  void fill(const View& out, double value) override;
  void arange(const View& out, double start, double step) override;
  void copy(const View& out, const View& x) override;
  void unary(UnaryOp op, const View& out, const View& x, double a, double b) override;
  void binary(BinaryOp op, const View& out, const View& x, const View& y, double a) override;
  void where(const View& out, const View& cond, const View& x, const View& y) override;
  void add_n(const View& out, const std::vector<View>& xs) override;
  void random(const View& out, RandomKind kind, double a, double b, const RandomKey& key) override;

  // Reductions (cpu_reduce.cpp).
  void reduce(ReduceOp op, const View& out, const View& x) override;

  // GEMM and convolutions (cpu_backend.cpp, forwarding to cpu_conv.h).
  void gemm(const GemmArgs& args) override;
  bool bf16_gemm(const GemmArgs& args) const override;
  void conv2d(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias) override;
  void conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) override;
  void conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) override;
  bool bf16_conv(const ConvArgs& args, ConvPass pass) override;
  bool channels_last_conv(const ConvArgs& args, ConvPass pass, DType dtype) override;

  // Softmax (cpu_softmax.cpp).
  void softmax(const View& out, const View& x, bool log) override;
  bool has_softmax_dim1() const override { return true; }
  void softmax_dim1(const View& out, const View& x, bool log) override;

  // Normalization (cpu_normalization.cpp).
  void normalize(const NormArgs& args, const View& y, const View& mean, const View& var, const View& rstd,
                 const View& x, const View& weight, const View& bias, const RunningStats& running) override;
  void normalize_backward(const NormArgs& args, const View& gx, const View& gw, const View& gb, const View& gy,
                          const View& x, const View& mean, const View& rstd, const View& weight) override;
  bool normalize_double_backward(const NormArgs& args, const View& dgy, const View& dx, const View& dw, const View& ggx,
                                 const View& ggw, const View& ggb, const View& gy, const View& x, const View& mean,
                                 const View& rstd, const View& weight) override;

  // Max pooling (cpu_pooling.cpp).
  void max_pool2d(const PoolArgs& args, const View& out, const View& indices, const View& x) override;
  void max_pool2d_backward(const PoolArgs& args, const View& gx, const View& gy, const View& indices) override;

  // The fused Adam step (cpu_adam.cpp).
  void adam(const AdamArgs& args, const std::vector<AdamOperands>& params) override;

  // Indexing (cpu_indexing.cpp).
  void check_index_range(const View& index, int64_t size, int64_t allowed,
                         std::function<std::string(int64_t)> describe) override;
  void gather(const View& out, const View& x, int dim, const View& index) override;
  void scatter_add(const View& out, int dim, const View& index, const View& src) override;
  void index_select(const View& out, const View& x, int dim, const View& index) override;
  void index_add(const View& out, int dim, const View& index, const View& src) override;
};

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
