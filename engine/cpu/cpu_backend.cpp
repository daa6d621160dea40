// The CPU backend (see backend.h): memory, elementwise ops, reductions, softmax, pooling, indexing
// and random numbers as OpenMP loops over strided views. Every kernel that walks views goes through
// one strided-iteration helper (Note [Strided iteration]); the scalar math comes from scalar_ops.h,
// shared with the CUDA backend. GEMM and convolution need Eigen and live in cpu_conv.cpp.
#include "evenflow/engine/cpu/cpu_backend.h"

#include <unistd.h>
#include "evenflow/engine/cpu/threads.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "evenflow/engine/cpu/cpu_conv.h"
#if EF_ONEDNN
#include "evenflow/engine/cpu/onednn_conv.h"
#include "evenflow/engine/cpu/onednn_matmul.h"
#endif
#include "evenflow/engine/cpu/vector_math.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/error.h"
#include "evenflow/engine/random.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {
namespace {

// Loops over fewer elements than this run on the calling thread: waking an OpenMP team costs
// microseconds, more than such a loop takes.
constexpr int64_t kParallelGrain = 32768;

int threads_for(int64_t work) {
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
bool memory_order(const View& v, int order[kMaxDims]) {
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

// The element-wise loop every elementwise kernel uses: out[i] = f(in_0[i], in_1[i], ...).
template <typename Out, typename... In, typename F>
void map_elements(const View& out, const std::array<View, sizeof...(In)>& ins, F f) {
  constexpr int N = 1 + static_cast<int>(sizeof...(In));
  [&]<size_t... I>(std::index_sequence<I...>) {
    const StridedIter<N> it = make_iter(std::array<View, N>{out, ins[I]...}, 0);
    for_each_row(it, [&f](char* const* p, const int64_t* s, int64_t n) {
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
        loop([](size_t) { return int64_t{1}; });
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

// ------------------------------------------------------------------------------------------------
// Elementwise kernels.

void fill_impl(const View& out, double value) {
  EF_DISPATCH_STORAGE(out.dtype, "fill", [&] {
    const auto v = dtype_cast<scalar_t>(value);
    map_elements<scalar_t>(out, {}, [v]() { return v; });
  });
}

template <typename T>
void arange_typed(T* o, int64_t n, double start, double step) {
  [[maybe_unused]] const int nt = threads_for(n);
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(start + static_cast<double>(i) * step);
}

void arange_impl(const View& out, double start, double step) {
  EF_ASSERT(out.ndim == 1 && out.is_contiguous(), "arange: output must be contiguous 1-D");
  EF_DISPATCH_ALL(out.dtype, "arange",
                  [&] { arange_typed(static_cast<scalar_t*>(out.data), out.shape[0], start, step); });
}

// Between any two dtypes (dtype_cast).
template <typename Out>
void copy_to(const View& out, const View& x) {
  EF_DISPATCH_STORAGE(x.dtype, "copy",
                      [&] { map_elements<Out, scalar_t>(out, {x}, [](scalar_t v) { return dtype_cast<Out>(v); }); });
}

void copy_impl(const View& out, const View& x) {
  EF_DISPATCH_STORAGE(out.dtype, "copy", [&] { copy_to<scalar_t>(out, x); });
}

void unary_impl(UnaryOp op, const View& out, const View& x, double a, double b) {
  EF_ASSERT(out.dtype == x.dtype, "unary: output and input dtypes differ");
  if (op == UnaryOp::Tanh && out.dtype == DType::Float32) {  // Note [Vectorized tanh]
    map_elements<float, float>(out, {x}, [](float v) { return tanh_vectorizable(v); });
    return;
  }
  EF_DISPATCH_FLOAT(out.dtype, "unary", [&] {
    visit_unary(op, [&](auto fn) {
      map_elements<scalar_t, scalar_t>(out, {x}, [fn, a, b](scalar_t v) { return fn(v, a, b); });
    });
  });
}

void binary_impl(BinaryOp op, const View& out, const View& x, const View& y, double a) {
  EF_ASSERT(out.dtype == x.dtype && out.dtype == y.dtype, "binary: operand dtypes differ");
  // Integer division by zero is undefined behaviour in C++; PyTorch's int64 division is floor
  // division anyway, not what the Div functor computes.
  EF_CHECK(!(op == BinaryOp::Div && out.dtype == DType::Int64),
           "div: int64 tensors are not supported (convert to a float dtype first)");
  EF_DISPATCH_ALL(out.dtype, "binary", [&] {
    visit_binary(op, a, [&](auto fn) { map_elements<scalar_t, scalar_t, scalar_t>(out, {x, y}, fn); });
  });
}

void where_impl(const View& out, const View& cond, const View& x, const View& y) {
  EF_ASSERT(out.dtype == cond.dtype && out.dtype == x.dtype && out.dtype == y.dtype, "where: operand dtypes differ");
  EF_DISPATCH_ALL(out.dtype, "where", [&] {
    map_elements<scalar_t, scalar_t, scalar_t, scalar_t>(
        out, {cond, x, y}, [](scalar_t c, scalar_t a, scalar_t b) { return c != scalar_t(0) ? a : b; });
  });
}

// ------------------------------------------------------------------------------------------------
// Reductions.

// Max and Min propagate NaN, as PyTorch does (x != x only for NaN; false for integers).
template <ReduceOp Op, typename A>
struct Reducer {
  static A init() {
    if constexpr (Op == ReduceOp::Sum)
      return A(0);
    else if constexpr (std::numeric_limits<A>::has_infinity)
      return Op == ReduceOp::Max ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::infinity();
    else
      return Op == ReduceOp::Max ? std::numeric_limits<A>::lowest() : std::numeric_limits<A>::max();
  }
  static A step(A acc, A v) {
    if constexpr (Op == ReduceOp::Sum)
      return acc + v;
    else if constexpr (Op == ReduceOp::Max)
      return (v > acc || v != v) ? v : acc;
    else
      return (v < acc || v != v) ? v : acc;
  }
};

// Reductions along a row keep eight independent accumulators, lanes: one accumulator makes each
// element wait for the previous step, and lanes let the compiler vectorize a unit-stride row (and
// are a step towards pairwise summation's accuracy).
constexpr int kLanes = 8;

// Calls body(i, lane) for i in [0, n), lane = i % kLanes for all but the last n % kLanes elements,
// which go to lane 0.
template <typename F>
void for_lanes(int64_t n, F body) {
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int j = 0; j < kLanes; ++j) body(k + j, j);
  for (; k < n; ++k) body(k, 0);
}

// The sum of the lanes, in lane order.
template <typename A>
A lanes_total(const A (&lanes)[kLanes]) {
  A total = 0;
  for (const A& l : lanes) total += l;
  return total;
}

// Reduces n elements at p with the given element stride into acc, in lanes.
template <typename R, typename T, typename A>
A reduce_row(const T* p, int64_t n, int64_t stride, A acc) {
  A lanes[kLanes];
  for (A& l : lanes) l = R::init();
  const auto loop = [&](auto st) {
    for_lanes(n, [&](int64_t i, int l) { lanes[l] = R::step(lanes[l], static_cast<A>(p[i * st()])); });
  };
  if (stride == 1)
    loop([] { return int64_t{1}; });
  else
    loop([stride] { return stride; });
  for (const A& l : lanes) acc = R::step(acc, l);
  return acc;
}

// A set of dims pulled out of a collapsed iterator: the kept (output) dims or the reduced ones.
struct DimSet {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t out_stride[kMaxDims] = {};  // bytes
  int64_t x_stride[kMaxDims] = {};    // bytes
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
  // Byte offsets into out and x of the i-th element (row-major).
  void offsets(int64_t i, int64_t& out_off, int64_t& x_off) const {
    out_off = x_off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t j = i % shape[d];
      i /= shape[d];
      out_off += j * out_stride[d];
      x_off += j * x_stride[d];
    }
  }
  StridedIter<1> x_iter() const {
    StridedIter<1> it;
    it.ndim = std::max(ndim, 1);
    if (ndim == 0) it.strides[0][0] = 0;
    for (int d = 0; d < ndim; ++d) {
      it.shape[d] = shape[d];
      it.strides[0][d] = x_stride[d];
    }
    return it;
  }
};

// Note [CPU reductions]
// Out is viewed with x's shape and stride 0 on reduced dims, and the pair is collapsed like an
// elementwise problem, so reduced and kept dims alternate. Two layouts cover the common cases:
// - the innermost dim is reduced (sum over the last dims, or over N,H,W of NCHW): each output
//   reduces contiguous rows with reduce_row; threads take outputs, or, when there are fewer
//   outputs than threads, split each output's reduction and combine the partials in order;
// - the innermost dim is kept (sum over leading dims, as for a bias gradient): each task keeps a
//   chunk of adjacent outputs in accumulators and adds whole input rows into them.
template <ReduceOp Op, typename T>
void reduce_typed(const View& out, const View& x) {
  using A = acc_t<T>;
  using R = Reducer<Op, A>;
  View ob = out;
  for (int d = 0; d < x.ndim; ++d) {
    ob.shape[d] = x.shape[d];
    if (out.shape[d] == 1 && x.shape[d] != 1) ob.strides[d] = 0;
  }
  const StridedIter<2> it = make_iter(std::array<View, 2>{ob, x}, 1);
  DimSet kept, red;
  for (int d = 0; d < it.ndim; ++d) {
    if (it.shape[d] == 1) continue;
    DimSet& s = it.strides[0][d] == 0 ? red : kept;
    s.shape[s.ndim] = it.shape[d];
    s.out_stride[s.ndim] = it.strides[0][d];
    s.x_stride[s.ndim] = it.strides[1][d];
    ++s.ndim;
  }
  char* const out_data = static_cast<char*>(out.data);
  char* const x_data = static_cast<char*>(x.data);
  const int64_t outputs = kept.numel(), per_output = red.numel();
  [[maybe_unused]] const int nt = threads_for(outputs * per_output);
  const StridedIter<1> red_it = red.x_iter();
  const bool inner_reduced = red.ndim > 0 && (kept.ndim == 0 || it.strides[0][it.ndim - 1] == 0);

  if (inner_reduced || kept.ndim == 0) {
    // Reduces elements [b, e) of one output's reduction, starting from x_base.
    const auto reduce_part = [&](char* x_base, int64_t b, int64_t e) {
      A acc = R::init();
      auto body = [&acc](char* const* p, const int64_t* s, int64_t n) {
        acc = reduce_row<R>(reinterpret_cast<const T*>(p[0]), n, s[0] / static_cast<int64_t>(sizeof(T)), acc);
      };
      char* const base[1] = {x_base};
      run_range(red_it, base, b, e, body);
      return acc;
    };
    if (nt == 1 || outputs >= 4 * nt) {
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
      for (int64_t o = 0; o < outputs; ++o) {
        int64_t oo, xo;
        kept.offsets(o, oo, xo);
        *reinterpret_cast<T*>(out_data + oo) = static_cast<T>(reduce_part(x_data + xo, 0, per_output));
      }
    } else {
      std::vector<A> partial(static_cast<size_t>(nt));
      for (int64_t o = 0; o < outputs; ++o) {
        int64_t oo, xo;
        kept.offsets(o, oo, xo);
        // Slots of threads the runtime did not start stay at init, which combines as a no-op.
        std::fill(partial.begin(), partial.end(), R::init());
#pragma omp parallel num_threads(nt)
        {
          const int64_t t = thread_index(), nteam = team_size();
          partial[static_cast<size_t>(t)] =
              reduce_part(x_data + xo, per_output * t / nteam, per_output * (t + 1) / nteam);
        }
        A acc = R::init();
        for (const A& p : partial) acc = R::step(acc, p);
        *reinterpret_cast<T*>(out_data + oo) = static_cast<T>(acc);
      }
    }
    return;
  }

  // The innermost dim is kept: chunks of it accumulate whole reduced rows.
  const int last = kept.ndim - 1;
  const int64_t cols = kept.shape[last];
  const int64_t xs = kept.x_stride[last] / static_cast<int64_t>(sizeof(T));
  const int64_t os = kept.out_stride[last] / static_cast<int64_t>(sizeof(T));
  DimSet outer = kept;
  outer.ndim = last;
  const int64_t outer_n = outer.numel();
  constexpr int64_t kChunk = 256;
  int64_t chunk = std::min(kChunk, cols);
  if (outer_n * ((cols + chunk - 1) / chunk) < nt) chunk = std::max<int64_t>(16, (cols + nt - 1) / nt);
  const int64_t chunks = (cols + chunk - 1) / chunk;
  const int64_t tasks = outer_n * chunks;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    int64_t oo, xo;
    outer.offsets(task / chunks, oo, xo);
    const int64_t j0 = (task % chunks) * chunk, len = std::min(chunk, cols - j0);
    A acc[kChunk];
    std::fill(acc, acc + len, R::init());
    char* const base[1] = {x_data + xo + j0 * xs * static_cast<int64_t>(sizeof(T))};
    auto rows = [&](char* const* p, const int64_t* s, int64_t n) {
      for (int64_t r = 0; r < n; ++r) {
        const T* row = reinterpret_cast<const T*>(p[0] + r * s[0]);
        const auto add = [&](auto st) {
          for (int64_t j = 0; j < len; ++j) acc[j] = R::step(acc[j], static_cast<A>(row[j * st()]));
        };
        if (xs == 1)
          add([] { return int64_t{1}; });
        else
          add([xs] { return xs; });
      }
    };
    run_range(red_it, base, 0, per_output, rows);
    T* o = reinterpret_cast<T*>(out_data + oo) + j0 * os;
    for (int64_t j = 0; j < len; ++j) o[j * os] = static_cast<T>(acc[j]);
  }
}

// ArgMax / ArgMin over the one reduced dim: first occurrence on ties; NaN counts as the extreme,
// as in PyTorch.
template <bool IsMax, typename T>
void arg_reduce_typed(const View& out, const View& x, int dim) {
  const int64_t len = x.shape[dim], stride = x.strides[dim];
  View xb = x, ob = out;
  xb.shape[dim] = 1;
  ob.dtype = DType::Int64;
  const StridedIter<2> it = make_iter(std::array<View, 2>{ob, xb});
  for_each_row(it, [len, stride](char* const* p, const int64_t* s, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      const T* row = reinterpret_cast<const T*>(p[1] + k * s[1]);
      T best = row[0];
      int64_t best_i = 0;
      for (int64_t i = 1; i < len && best == best; ++i) {
        const T v = row[i * stride];
        if ((IsMax ? v > best : v < best) || v != v) {
          best = v;
          best_i = i;
        }
      }
      *reinterpret_cast<int64_t*>(p[0] + k * s[0]) = best_i;
    }
  });
}

void reduce_impl(ReduceOp op, const View& out, const View& x) {
  EF_ASSERT(out.ndim == x.ndim, "reduce: output rank ", out.ndim, " differs from input rank ", x.ndim);
  for (int d = 0; d < x.ndim; ++d)
    EF_ASSERT(out.shape[d] == x.shape[d] || out.shape[d] == 1, "reduce: output dim ", d, " is ", out.shape[d],
              ", input ", x.shape[d]);
  if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) {
    EF_ASSERT(out.dtype == DType::Int64, "reduce: arg reductions write int64");
    int dim = -1;
    for (int d = 0; d < x.ndim; ++d) {
      if (out.shape[d] == x.shape[d]) continue;
      EF_ASSERT(dim < 0, "reduce: argmax/argmin reduce exactly one dim");
      dim = d;
    }
    if (dim < 0) {  // the reduced dim has size 1: every index is 0
      fill_impl(out, 0.0);
      return;
    }
    EF_DISPATCH_ALL(x.dtype, "argmax", [&] {
      if (op == ReduceOp::ArgMax)
        arg_reduce_typed<true, scalar_t>(out, x, dim);
      else
        arg_reduce_typed<false, scalar_t>(out, x, dim);
    });
    return;
  }
  EF_ASSERT(out.dtype == x.dtype, "reduce: output and input dtypes differ");
  EF_DISPATCH_ALL(x.dtype, "reduce", [&] {
    switch (op) {
      case ReduceOp::Sum:
        return reduce_typed<ReduceOp::Sum, scalar_t>(out, x);
      case ReduceOp::Max:
        return reduce_typed<ReduceOp::Max, scalar_t>(out, x);
      case ReduceOp::Min:
        return reduce_typed<ReduceOp::Min, scalar_t>(out, x);
      default:
        EF_ERROR("reduce: unknown op");
    }
  });
}

// ------------------------------------------------------------------------------------------------
// Softmax and pooling.

template <typename T>
void softmax_typed(T* out, const T* x, int64_t rows, int64_t cols, bool log) {
  [[maybe_unused]] const int nt = threads_for(rows * cols);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = out + r * cols;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, xr[c]);
    acc_t<T> sum = 0;
    if (log) {
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(xr[c] - mx);
      const T lse = mx + static_cast<T>(std::log(sum));
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] - lse;
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        yr[c] = std::exp(xr[c] - mx);
        sum += yr[c];
      }
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
  }
}

// Normalization (NormArgs in backend.h). Groups are independent, so threads take whole groups; a
// group's outer x inner elements are read three times (mean, variance, output), each pass over
// rows of `inner` contiguous elements.
//
// A group's sums go into lanes (for_lanes), as reduce_row's do: with one accumulator each element
// waits for the previous addition, and layer_norm's forward ran at 1.75 Gelem/s instead of 4.6
// (8192x1024, 2 threads, Sapphire Rapids; bench_engine --only norm). The lanes are added up in a
// fixed order, so a group's statistics depend on its elements alone, not on threads or devices.

// One element a row and a group (batch_norm of [N, C]: a group is a column of x): the general loop
// walks each column alone, one element a row, and ran 9x slower than layer_norm over as many
// elements (64x3136, 2 threads, Sapphire Rapids: 316 us against 35). Here a block of columns is
// summed side by side along each row, which vectorizes. Every column's sums are added in row order,
// from 0, as the general loop's lane 0 takes them, so the results are the same bit for bit.
constexpr int64_t kColumnBlock = 128;

bool columns_layout(const NormArgs& a, bool per_feature_affine) {
  return a.inner == 1 && a.outer > 1 && !per_feature_affine;
}

template <typename T>
void normalize_columns(const NormArgs& a, T* y, T* mean_out, T* var_out, const T* x, const T* w, const T* b) {
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
void normalize_typed(const NormArgs& a, T* y, T* mean_out, T* var_out, const T* x, const T* w, const T* b) {
  if (columns_layout(a, !a.affine_per_group && (w != nullptr || b != nullptr)))
    return normalize_columns(a, y, mean_out, var_out, x, w, b);
  using A = acc_t<T>;
  const int64_t n = a.outer * a.inner, stride = a.groups * a.inner;
  [[maybe_unused]] const int nt = threads_for(a.groups * n);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
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
    // y = x̂·w + b with w and b per feature (varying along i) or one number for the group; a
    // missing weight is 1 and a missing bias -0, which leave x̂ as it is (x + -0 is x for every x,
    // -0 included). The loop is written once per kind, so that each compiles to plain vector code.
    const auto write = [&](auto weight_at, auto bias_at) {
      for (int64_t o = 0; o < a.outer; ++o) {
        const T* xr = xg + o * stride;
        T* yr = yg + o * stride;
        for (int64_t i = 0; i < a.inner; ++i) yr[i] = static_cast<T>(xr[i] - mean) * rstd * weight_at(i) + bias_at(i);
      }
    };
    const T gw = w != nullptr && a.affine_per_group ? w[g] : T(1),
            gb = b != nullptr && a.affine_per_group ? b[g] : T(-0.0);
    const auto group_w = [gw](int64_t) { return gw; };
    const auto group_b = [gb](int64_t) { return gb; };
    const auto feature_w = [w](int64_t i) { return w[i]; };
    const auto feature_b = [b](int64_t i) { return b[i]; };
    const bool per_feature_w = w != nullptr && !a.affine_per_group, per_feature_b = b != nullptr && !a.affine_per_group;
    if (per_feature_w && per_feature_b)
      write(feature_w, feature_b);
    else if (per_feature_w)
      write(feature_w, group_b);
    else if (per_feature_b)
      write(group_w, feature_b);
    else
      write(group_w, group_b);
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

// Backend::normalize_backward. Two passes over a group: the sums, then gx. Per-feature gw and gb
// (layer norm) add up over groups, so each thread keeps its own row of them, summed at the end.
template <typename T>
void normalize_backward_typed(const NormArgs& a, T* gx, T* gw, T* gb, const T* gy, const T* x, const T* mean,
                              const T* rstd, const T* w) {
  if (columns_layout(a, !a.affine_per_group && (w != nullptr || gw != nullptr || gb != nullptr)))
    return normalize_backward_columns(a, gx, gw, gb, gy, x, mean, rstd, w);
  const int64_t n = a.outer * a.inner, stride = a.groups * a.inner;
  const bool feature_sums = !a.affine_per_group && (gw != nullptr || gb != nullptr);
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
      // Σĝ, Σĝ·x̂ (per group: Σgy, Σgy·x̂), in lanes as the forward's sums.
      acc_t<T> lanes_g[kLanes] = {}, lanes_g_x_hat[kLanes] = {};
      for (int64_t o = 0; o < a.outer; ++o) {
        const T* xr = xg + o * stride;
        const T* gyr = gyg + o * stride;
        const auto add = [&](auto weight_at) {
          for_lanes(a.inner, [&](int64_t i, int l) {
            const T x_hat = (xr[i] - m) * r, g_hat = gyr[i] * weight_at(i);
            lanes_g[l] += g_hat;
            lanes_g_x_hat[l] += g_hat * x_hat;
          });
        };
        if (fw != nullptr)
          add([fw](int64_t i) { return fw[i]; });
        else
          add([](int64_t) { return T(1); });
        // A loop of their own, which reads the row again: inside the lanes' loop they made layer
        // norm's forward+backward 6% slower (8192x1024, 2 threads).
        if (feature_sums) {
          for (int64_t i = 0; i < a.inner; ++i) {
            const T x_hat = (xr[i] - m) * r;
            part_w[i] += gyr[i] * x_hat;
            part_b[i] += gyr[i];
          }
        }
      }
      const acc_t<T> sum_g = lanes_total(lanes_g), sum_g_x_hat = lanes_total(lanes_g_x_hat);
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
      for (int64_t o = 0; o < a.outer; ++o) {
        for (int64_t i = 0; i < a.inner; ++i) {
          const T x_hat = (xg[o * stride + i] - m) * r, dy = gyg[o * stride + i];
          const T g_hat = dy * (fw != nullptr ? fw[i] : group_w);
          gxg[o * stride + i] = r * (g_hat - mean_g - x_hat * mean_g_x_hat);
        }
      }
    }
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
// mean(G·x̂) follow from them), then the outputs. ops_nn.cpp's normalize_double_backward_ops is the
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
  // call so the inner loops carry no bounds tests (they took 10% of a classify step inline).
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

// ------------------------------------------------------------------------------------------------
// The fused Adam step (AdamArgs): one pass over the four tensors instead of ten kernels and five
// temporaries, which on classify's 3.2M-parameter layer were a fifth of the step.

// One thread's share of the Adam step. The scalars are a by-value copy and the arrays do not
// overlap, so the loops vectorize: inside the OpenMP region GCC reloaded the scalars from memory
// each element (the stores might change them) and ran the step one element at a time. Two loops,
// so that the common one has no amsgrad test.
template <typename T>
void adam_range(const scalar::AdamScalars<T> s, int64_t n, T* __restrict p, const T* __restrict grad, T* __restrict m,
                T* __restrict v, T* __restrict v_max) {
  if (v_max != nullptr) {
    for (int64_t i = 0; i < n; ++i) scalar::adam_element(s, p[i], grad[i], m[i], v[i], v_max + i);
  } else {
    for (int64_t i = 0; i < n; ++i) scalar::adam_element<T>(s, p[i], grad[i], m[i], v[i], nullptr);
  }
}

// Every parameter's elements as one range split evenly over the threads: a model of many small
// tensors wakes the team once, not once per tensor.
template <typename T>
void adam_typed(const AdamArgs& args, const std::vector<AdamOperands>& params) {
  const AdamArgs& a = args.in_device ? *args.in_device : args;  // a recorded step's (Note [Step scalars])
  const auto scalars = scalar::adam_scalars<T>(a);
  std::vector<int64_t> begin{0};  // params[k] holds elements [begin[k], begin[k + 1]) of the range
  for (const AdamOperands& o : params) begin.push_back(begin.back() + o.param.numel());
  const int64_t total = begin.back();
  [[maybe_unused]] const int nt = threads_for(total * 8);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int64_t t = thread_index(), team = team_size(), lo = total * t / team, hi = total * (t + 1) / team;
    for (size_t k = 0; k < params.size(); ++k) {
      const int64_t from = std::max(lo, begin[k]) - begin[k], to = std::min(hi, begin[k + 1]) - begin[k];
      if (from >= to) continue;
      const AdamOperands& o = params[k];
      adam_range<T>(scalars, to - from, static_cast<T*>(o.param.data) + from, static_cast<const T*>(o.grad.data) + from,
                    static_cast<T*>(o.exp_avg.data) + from, static_cast<T*>(o.exp_avg_sq.data) + from,
                    a.amsgrad ? static_cast<T*>(o.max_exp_avg_sq.data) + from : nullptr);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Indexing. Indices are checked before any parallel loop: an exception must not leave an OpenMP
// region.

// The first element of idx[0, n) outside [0, size) and other than `allowed`, if any. The common
// case, none, takes one parallel pass.
std::optional<int64_t> first_out_of_range(const int64_t* idx, int64_t n, int64_t size,
                                          std::optional<int64_t> allowed = std::nullopt) {
  const auto bad = [&](int64_t v) { return (v < 0 || v >= size) && v != allowed; };
  int64_t count = 0;
  [[maybe_unused]] const int nt = threads_for(n);
#pragma omp parallel for num_threads(nt) if (nt > 1) reduction(+ : count)
  for (int64_t i = 0; i < n; ++i) count += bad(idx[i]);
  if (count == 0) return std::nullopt;
  return *std::find_if(idx, idx + n, bad);
}

void check_indices(const char* op, const int64_t* idx, int64_t n, int dim, int64_t size) {
  const std::optional<int64_t> bad = first_out_of_range(idx, n, size);
  EF_CHECK(!bad, op, ": index ", *bad, " is out of range for dim ", dim, " of size ", size, " (valid range [0, ",
           size - 1, "])");
}

// The 1-D index of index_select / index_add as an index view shaped like `like`: stride 1 along
// dim, 0 elsewhere. Both kernels then run as gather / scatter_add.
View broadcast_index(const View& index, const View& like, int dim) {
  View v = like;
  v.data = index.data;
  v.dtype = DType::Int64;
  for (int d = 0; d < v.ndim; ++d) v.strides[d] = d == dim ? index.strides[0] : 0;
  return v;
}

// out[i..., j, k...] = x[i..., index[i..., j, k...], k...] along dim; index shaped like out.
void gather_impl(const char* op, const View& out, const View& x, int dim, const View& index) {
  EF_ASSERT(index.dtype == DType::Int64 && out.dtype == x.dtype, op, ": bad dtypes");
  View xb = x;
  for (int d = 0; d < x.ndim; ++d) xb.shape[d] = out.shape[d];
  xb.strides[dim] = 0;  // the row's base; the index supplies the position along dim
  const int64_t xs = x.strides[dim];
  EF_DISPATCH_ALL(out.dtype, op, [&] {
    const StridedIter<3> it = make_iter(std::array<View, 3>{out, index, xb});
    for_each_row(it, [xs](char* const* p, const int64_t* s, int64_t n) {
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = *reinterpret_cast<const int64_t*>(p[1] + k * s[1]);
        *reinterpret_cast<scalar_t*>(p[0] + k * s[0]) = reinterpret_cast<const scalar_t*>(p[2] + k * s[2])[i * xs];
      }
    });
  });
}

// out[i..., index[i..., j, k...], k...] += src[i..., j, k...] along dim; index shaped like src.
// Dim is made the innermost and rows are never split between threads: two src elements can only
// hit the same output when they lie in the same row, so no two threads write one output.
void scatter_add_impl(const char* op, const View& out, int dim, const View& index, const View& src) {
  EF_ASSERT(index.dtype == DType::Int64 && out.dtype == src.dtype, op, ": bad dtypes");
  View ob = out;
  for (int d = 0; d < src.ndim; ++d) ob.shape[d] = src.shape[d];
  ob.strides[dim] = 0;
  const int64_t os = out.strides[dim];
  std::array<View, 3> views{src, index, ob};
  for (View& v : views) {
    std::rotate(v.shape + dim, v.shape + dim + 1, v.shape + v.ndim);
    std::rotate(v.strides + dim, v.strides + dim + 1, v.strides + v.ndim);
  }
  EF_DISPATCH_ALL(out.dtype, op, [&] {
    const StridedIter<3> it = make_iter(views);
    for_each_row(
        it,
        [os](char* const* p, const int64_t* s, int64_t n) {
          for (int64_t k = 0; k < n; ++k) {
            const int64_t i = *reinterpret_cast<const int64_t*>(p[1] + k * s[1]);
            reinterpret_cast<scalar_t*>(p[2] + k * s[2])[i * os] += *reinterpret_cast<const scalar_t*>(p[0] + k * s[0]);
          }
        },
        /*whole_rows=*/true);
  });
}

// Note [Vectorized draws]
// Philox's rounds are integer multiplies and xors, which the compiler vectorizes (8 draws at once
// with AVX-512) in a loop of its own per kind, but not in one loop over every kind inside an OpenMP
// region's outlined body: a uniform 64x1x28x28 batch took 449 us on one Zen 4 thread that way, 174
// this way (`bench_engine --only random --threads 1`). So each thread fills its range through
// random_range, one loop per kind. A normal draw runs its Philox rounds for a block of values
// first, then Box-Muller's log and cosine, ours (Note [Vectorized log and cos] in vector_math.h):
// glibc's scalar calls kept a 64x128 draw at 220 us (334 before). Uniform and Bernoulli draws are
// random::sample's to the last bit; normal ones a + b·R·cos θ within 2^-52·(|a| + 8·|b|·R) of it
// (test_engine's "random draws").
template <typename T>
void random_range(T* o, int64_t begin, int64_t end, RandomKind kind, double a, double b, uint64_t seed,
                  uint64_t offset) {
  using random::philox;
  switch (kind) {
    case RandomKind::Uniform:
      for (int64_t i = begin; i < end; ++i)
        o[i] = static_cast<T>(random::uniform_from(a, b, philox(seed, offset + static_cast<uint64_t>(i))));
      return;
    case RandomKind::Bernoulli:
      for (int64_t i = begin; i < end; ++i)
        o[i] = static_cast<T>(random::bernoulli_from(a, philox(seed, offset + static_cast<uint64_t>(i))));
      return;
    case RandomKind::Normal: {
      constexpr int64_t kBlock = 256;
      double u[kBlock], u2[kBlock];
      for (int64_t i0 = begin; i0 < end; i0 += kBlock) {
        const int64_t m = std::min(kBlock, end - i0);
        for (int64_t i = 0; i < m; ++i) {
          const random::Philox4 r = philox(seed, offset + static_cast<uint64_t>(i0 + i));
          u[i] = random::uniform01(r.v[0], r.v[1]);
          u2[i] = random::uniform01(r.v[2], r.v[3]);
        }
        for (int64_t i = 0; i < m; ++i)
          o[i0 + i] = static_cast<T>(random::normal_from(a, b, log_vectorizable(u[i]), cos_two_pi_vectorizable(u2[i])));
      }
      return;
    }
  }
}

template <typename T>
void random_typed(T* o, int64_t n, RandomKind kind, double a, double b, uint64_t seed, uint64_t offset) {
  // A Philox draw costs as much as dozens of simple elementwise ops: parallelize at a smaller size.
  [[maybe_unused]] const int nt = threads_for(n * 32);
  if (nt <= 1) return random_range(o, 0, n, kind, a, b, seed, offset);
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = thread_index(), team = team_size();
    random_range(o, n * t / team, n * (t + 1) / team, kind, a, b, seed, offset);
  }
}

// ------------------------------------------------------------------------------------------------

// Bytes of physical memory (half the address space when the system does not say).
size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return std::numeric_limits<size_t>::max() / 2;
  return static_cast<size_t>(pages) * static_cast<size_t>(page_size);
}

class CpuBackend final : public Backend {
 public:
  void* raw_alloc(size_t nbytes) override {
    // More than the machine's memory is refused up front: such a request can only fail or thrash,
    // and sanitizer allocators abort on absurd sizes instead of returning nullptr.
    static const size_t physical = physical_memory();
    if (nbytes > physical) return nullptr;
    // aligned_alloc wants a multiple of the alignment.
    constexpr size_t kAlign = 64;
    const size_t rounded = std::max(kAlign, (nbytes + kAlign - 1) / kAlign * kAlign);
    return std::aligned_alloc(kAlign, rounded);
  }
  void raw_free(void* ptr) override { std::free(ptr); }
  void copy_from_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  void copy_to_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  std::function<void()> copy_to_host_later(void* dst, const void* src, size_t nbytes) override {
    copy_to_host(dst, src, nbytes);
    return [] {};
  }
  void synchronize() override {}

  void fill(const View& out, double value) override { fill_impl(out, value); }
  void arange(const View& out, double start, double step) override { arange_impl(out, start, step); }
  void copy(const View& out, const View& x) override { copy_impl(out, x); }
  void unary(UnaryOp op, const View& out, const View& x, double a, double b) override { unary_impl(op, out, x, a, b); }
  void binary(BinaryOp op, const View& out, const View& x, const View& y, double a) override {
    binary_impl(op, out, x, y, a);
  }
  void where(const View& out, const View& cond, const View& x, const View& y) override { where_impl(out, cond, x, y); }
  void reduce(ReduceOp op, const View& out, const View& x) override { reduce_impl(op, out, x); }

  void gemm(const GemmArgs& args) override { cpu_backend::gemm(args); }
  bool bf16_gemm(const GemmArgs& args) const override {
#if EF_ONEDNN
    return onednn_takes_bf16_gemm(args);
#else
    (void)args;
    return false;
#endif
  }
  void conv2d(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias) override {
    conv2d_forward(args, y, x, w, bias);
  }
  void conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) override {
    cpu_backend::conv2d_input_grad(args, gx, gy, w);
  }
  void conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) override {
    cpu_backend::conv2d_weight_grad(args, gw, x, gy);
  }
  bool bf16_conv(const ConvArgs& args, ConvPass pass) override {
#if EF_ONEDNN
    return onednn_takes_bf16(args, pass);
#else
    (void)args;
    (void)pass;
    return false;
#endif
  }
  bool channels_last_conv(const ConvArgs& args, ConvPass pass, DType dtype) override {
    return conv_takes_channels_last(args, pass, dtype);
  }

  void softmax(const View& out, const View& x, bool log) override {
    EF_ASSERT(out.ndim == 2 && out.is_contiguous() && x.is_contiguous() && out.dtype == x.dtype,
              "softmax: expects contiguous [rows, cols] views");
    EF_DISPATCH_FLOAT(x.dtype, "softmax", [&] {
      softmax_typed(static_cast<scalar_t*>(out.data), static_cast<const scalar_t*>(x.data), out.shape[0], out.shape[1],
                    log);
    });
  }

  void normalize(const NormArgs& args, const View& y, const View& mean, const View& var, const View& x,
                 const View& weight, const View& bias) override {
    EF_ASSERT(x.is_contiguous() && y.is_contiguous() && mean.is_contiguous() && var.is_contiguous(),
              "normalize: expects contiguous views");
    EF_DISPATCH_FLOAT(x.dtype, "normalize", [&] {
      normalize_typed<scalar_t>(args, static_cast<scalar_t*>(y.data), static_cast<scalar_t*>(mean.data),
                                static_cast<scalar_t*>(var.data), static_cast<const scalar_t*>(x.data),
                                static_cast<const scalar_t*>(weight.data), static_cast<const scalar_t*>(bias.data));
    });
  }

  void normalize_backward(const NormArgs& args, const View& gx, const View& gw, const View& gb, const View& gy,
                          const View& x, const View& mean, const View& rstd, const View& weight) override {
    EF_ASSERT(x.is_contiguous() && gy.is_contiguous() && mean.is_contiguous() && rstd.is_contiguous(),
              "normalize_backward: expects contiguous views");
    EF_DISPATCH_FLOAT(x.dtype, "normalize_backward", [&] {
      using T = scalar_t;
      normalize_backward_typed<T>(args, static_cast<T*>(gx.data), static_cast<T*>(gw.data), static_cast<T*>(gb.data),
                                  static_cast<const T*>(gy.data), static_cast<const T*>(x.data),
                                  static_cast<const T*>(mean.data), static_cast<const T*>(rstd.data),
                                  static_cast<const T*>(weight.data));
    });
  }

  bool normalize_double_backward(const NormArgs& args, const View& dgy, const View& dx, const View& dw, const View& ggx,
                                 const View& ggw, const View& ggb, const View& gy, const View& x, const View& mean,
                                 const View& rstd, const View& weight) override {
    EF_ASSERT(x.is_contiguous() && gy.is_contiguous() && mean.is_contiguous() && rstd.is_contiguous(),
              "normalize_double_backward: expects contiguous views");
    EF_DISPATCH_FLOAT(x.dtype, "normalize_double_backward", [&] {
      using T = scalar_t;
      normalize_double_backward_typed<T>(
          args, static_cast<T*>(dgy.data), static_cast<T*>(dx.data), static_cast<T*>(dw.data),
          static_cast<const T*>(ggx.data), static_cast<const T*>(ggw.data), static_cast<const T*>(ggb.data),
          static_cast<const T*>(gy.data), static_cast<const T*>(x.data), static_cast<const T*>(mean.data),
          static_cast<const T*>(rstd.data), static_cast<const T*>(weight.data));
    });
    return true;
  }

  void max_pool2d(const PoolArgs& args, const View& out, const View& indices, const View& x) override {
    EF_ASSERT(out.is_contiguous() && indices.is_contiguous() && x.is_contiguous() && indices.dtype == DType::Int64,
              "max_pool2d: expects contiguous views and int64 indices");
    EF_DISPATCH_FLOAT(x.dtype, "max_pool2d", [&] {
      max_pool2d_typed(args, static_cast<scalar_t*>(out.data), static_cast<int64_t*>(indices.data),
                       static_cast<const scalar_t*>(x.data));
    });
  }
  void max_pool2d_backward(const PoolArgs& args, const View& gx, const View& gy, const View& indices) override {
    EF_ASSERT(gx.is_contiguous() && gy.is_contiguous() && indices.is_contiguous() && gx.dtype == gy.dtype &&
                  indices.dtype == DType::Int64,
              "max_pool2d_backward: expects contiguous views and int64 indices");
    EF_DISPATCH_FLOAT(gx.dtype, "max_pool2d_backward", [&] {
      max_pool2d_backward_typed(args, static_cast<scalar_t*>(gx.data), static_cast<const scalar_t*>(gy.data),
                                static_cast<const int64_t*>(indices.data));
    });
  }

  void adam(const AdamArgs& args, const std::vector<AdamOperands>& params) override {
    if (params.empty()) return;
    EF_DISPATCH_FLOAT(params[0].param.dtype, "adam", [&] { adam_typed<scalar_t>(args, params); });
  }

  void check_index_range(const View& index, int64_t size, int64_t allowed,
                         std::function<std::string(int64_t)> describe) override {
    EF_ASSERT(index.is_contiguous() && index.dtype == DType::Int64, "check_index_range: expects contiguous int64");
    const std::optional<int64_t> bad =
        first_out_of_range(static_cast<const int64_t*>(index.data), index.numel(), size, allowed);
    EF_CHECK(!bad, describe(*bad));
  }

  void gather(const View& out, const View& x, int dim, const View& index) override {
    EF_ASSERT(index.is_contiguous(), "gather: index must be contiguous");
    check_indices("gather", static_cast<const int64_t*>(index.data), index.numel(), dim, x.shape[dim]);
    gather_impl("gather", out, x, dim, index);
  }
  void scatter_add(const View& out, int dim, const View& index, const View& src) override {
    EF_ASSERT(index.is_contiguous(), "scatter_add: index must be contiguous");
    check_indices("scatter_add", static_cast<const int64_t*>(index.data), index.numel(), dim, out.shape[dim]);
    scatter_add_impl("scatter_add", out, dim, index, src);
  }
  void index_select(const View& out, const View& x, int dim, const View& index) override {
    EF_ASSERT(index.ndim == 1 && index.is_contiguous(), "index_select: index must be contiguous 1-D");
    check_indices("index_select", static_cast<const int64_t*>(index.data), index.numel(), dim, x.shape[dim]);
    gather_impl("index_select", out, x, dim, broadcast_index(index, out, dim));
  }
  void index_add(const View& out, int dim, const View& index, const View& src) override {
    EF_ASSERT(index.ndim == 1 && index.is_contiguous(), "index_add: index must be contiguous 1-D");
    check_indices("index_add", static_cast<const int64_t*>(index.data), index.numel(), dim, out.shape[dim]);
    scatter_add_impl("index_add", out, dim, broadcast_index(index, src, dim), src);
  }

  void random(const View& out, RandomKind kind, double a, double b, const RandomKey& key) override {
    EF_ASSERT(out.is_contiguous(), "random: output must be contiguous");
    // A recorded step's key is read when the call runs (Note [Step scalars]).
    const uint64_t seed = key.in_device ? key.in_device[0] : key.seed;
    const uint64_t offset = key.in_device ? key.in_device[1] : key.offset;
    EF_DISPATCH_ALL(out.dtype, "random",
                    [&] { random_typed(static_cast<scalar_t*>(out.data), out.numel(), kind, a, b, seed, offset); });
  }
};

}  // namespace

std::unique_ptr<Backend> make_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
