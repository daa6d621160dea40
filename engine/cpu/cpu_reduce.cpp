// The CPU backend's reductions (sum, max, min over any set of dims; argmax, argmin over one):
// Note [CPU reductions].
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "evenflow/engine/cpu/cpu_internal.h"
#include "evenflow/engine/cpu/threads.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

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

// Note [CPU argmax]
// ArgMax / ArgMin over the one reduced dim: the first occurrence on ties; NaN counts as the extreme
// (the first NaN wins), as in PyTorch. Every path takes an element exactly where a walk from the
// start would: "better" is v beyond the best so far, or v the first NaN.
// - Contiguous float32/float64 (argmax_contiguous), as [outer, len, inner]:
//   - inner 1 (the last dim): a row in a register's lanes, each its own best and index, combined by
//     value, then by the smaller index (the earlier element); when rows are fewer than threads (or
//     longer than 2^30), each is split into parts, combined the same way in order.
//   - inner > 1 (dim 1 of NCHW, dim 0 of a matrix): blocks of positions side by side, each
//     element of a block's row compared with its position's best: loops along inner.
//   Indices are held as integers of T's width (int32 for float32: parts of at most 2^30), so that
//   a compare selects values and indices in vectors of one width.
// - Otherwise (strided, integer or bfloat16 x): one position at a time, a walk along the dim.
template <bool IsMax, typename T>
bool better(T v, T best) {
  return (IsMax ? v > best : v < best) || (v != v && best == best);
}

template <typename T>
using ArgIndex = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;

constexpr int64_t kArgPart = int64_t{1} << 30;  // fits ArgIndex<float>

// The best of n contiguous elements at p, as (value, index from p): a register of lanes, each its
// own best and index, then the lanes combined, then the tail.
template <bool IsMax, typename T>
std::pair<T, int64_t> arg_best_row(const T* p, int64_t n) {
  using I = ArgIndex<T>;
  constexpr int kWidth = kRegisterBytes / static_cast<int>(sizeof(T));
  typedef T Values __attribute__((vector_size(kRegisterBytes)));
  typedef I Indices __attribute__((vector_size(kRegisterBytes)));
  T b = p[0];
  int64_t bi = 0, k = 1;
  if (n >= 2 * kWidth) {
    Values best, v;
    Indices index, at;
    load_lanes(best, p);
    for (int l = 0; l < kWidth; ++l) index[l] = static_cast<I>(l);
    at = index;
    for (k = kWidth; k + kWidth <= n; k += kWidth) {
      load_lanes(v, p + k);
      at += static_cast<I>(kWidth);
      const auto take = (IsMax ? v > best : v < best) | ((v != v) & (best == best));  // better()'s
      best = take ? v : best;
      index = take ? at : index;
    }
    b = best[0];
    bi = index[0];
    for (int l = 1; l < kWidth; ++l)
      if (better<IsMax>(best[l], b) || (!better<IsMax>(b, best[l]) && index[l] < bi)) {  // or as good, earlier
        b = best[l];
        bi = index[l];
      }
  }
  for (; k < n; ++k)  // the tail, after every lane's elements
    if (better<IsMax>(p[k], b)) {
      b = p[k];
      bi = k;
    }
  return {b, bi};
}

// The largest (smallest) of n contiguous elements, NaN if one is: four registers of lanes (one
// would make each compare wait for the last), a NaN noted on the side.
template <bool IsMax, typename T>
T extreme_row(const T* p, int64_t n) {
  constexpr int kWidth = kRegisterBytes / static_cast<int>(sizeof(T));
  typedef T Values __attribute__((vector_size(kRegisterBytes)));
  T b = p[0];
  int64_t k = 1;
  if (n >= 4 * kWidth) {
    Values best[4], v;
    for (int j = 0; j < 4; ++j) load_lanes(best[j], p + j * kWidth);
    auto nan = best[0] != best[0];
    for (k = 4 * kWidth; k + 4 * kWidth <= n; k += 4 * kWidth)
      for (int j = 0; j < 4; ++j) {
        load_lanes(v, p + k + j * kWidth);
        best[j] = (IsMax ? v > best[j] : v < best[j]) ? v : best[j];
        nan |= v != v;
      }
    for (int j = 0; j < 4; ++j) nan |= best[j] != best[j];
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < kWidth; ++l) b = better<IsMax>(best[j][l], b) ? best[j][l] : b;
    for (int l = 0; l < kWidth; ++l)
      if (nan[l]) b = std::numeric_limits<T>::quiet_NaN();
  }
  for (; k < n; ++k) b = better<IsMax>(p[k], b) ? p[k] : b;
  return b;
}

template <bool IsMax, typename T>
T extreme_contiguous(const T* x, int64_t n) {
  const int nt = threads_for(n);
  std::vector<T> found(static_cast<size_t>(nt), x[0]);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int t = 0; t < nt; ++t) {
    const int64_t b = n * t / nt, e = n * (t + 1) / nt;
    if (e > b) found[static_cast<size_t>(t)] = extreme_row<IsMax>(x + b, e - b);
  }
  T best = found[0];
  for (const T f : found) best = better<IsMax>(f, best) ? f : best;
  // Equal zeros and NaNs differ in their bits (±0, payloads), and the lanes and parts keep whichever
  // they met first: the first such element, as a walk from the start would take, whatever the layout.
  if (best == T(0) || best != best)
    for (int64_t i = 0;; ++i)
      if (best != best ? x[i] != x[i] : x[i] == T(0)) return x[i];
  return best;
}

template <bool IsMax, typename T>
void argmax_contiguous(int64_t* out, const T* x, int64_t outer, int64_t len, int64_t inner) {
  using I = ArgIndex<T>;
  const int nt = threads_for(outer * len * inner);
  if (inner == 1) {
    // Parts of rows: a row split among the threads when there are fewer rows than threads.
    const int64_t parts =
        std::max<int64_t>((len + kArgPart - 1) / kArgPart, outer >= nt ? 1 : (nt + outer - 1) / outer);
    const int64_t part_len = (len + parts - 1) / parts;
    if (parts == 1) {  // whole rows, each its own output
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
      for (int64_t r = 0; r < outer; ++r) out[r] = arg_best_row<IsMax>(x + r * len, len).second;
      return;
    }
    std::vector<std::pair<T, int64_t>> found(static_cast<size_t>(outer * parts));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t task = 0; task < outer * parts; ++task) {
      const int64_t r = task / parts, b = (task % parts) * part_len, n = std::min(part_len, len - b);
      auto best = n > 0 ? arg_best_row<IsMax>(x + r * len + b, n) : std::pair<T, int64_t>{x[r * len], -1};
      best.second = n > 0 ? best.second + b : -1;
      found[static_cast<size_t>(task)] = best;
    }
    for (int64_t r = 0; r < outer; ++r) {
      std::pair<T, int64_t> best = found[static_cast<size_t>(r * parts)];
      for (int64_t q = 1; q < parts; ++q) {
        const auto& f = found[static_cast<size_t>(r * parts + q)];
        if (f.second >= 0 && better<IsMax>(f.first, best.first)) best = f;  // a later part wins only if better
      }
      out[r] = best.second;
    }
    return;
  }
  constexpr int64_t kPositions = 256;
  int64_t block = std::min(kPositions, inner);
  if (outer * ((inner + block - 1) / block) < nt) block = std::max<int64_t>(16, (inner + nt - 1) / nt);
  const int64_t blocks = (inner + block - 1) / block;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t task = 0; task < outer * blocks; ++task) {
    const int64_t o = task / blocks, i0 = (task % blocks) * block, m = std::min(block, inner - i0);
    const T* xb = x + o * len * inner + i0;
    T best[kPositions];
    I index[kPositions];
    for (int64_t i = 0; i < m; ++i) {
      best[i] = xb[i];
      index[i] = 0;
    }
    for (int64_t c = 1; c < len; ++c) {
      const T* row = xb + c * inner;
      for (int64_t i = 0; i < m; ++i) {
        const bool take = better<IsMax>(row[i], best[i]);
        best[i] = take ? row[i] : best[i];
        index[i] = take ? static_cast<I>(c) : index[i];
      }
    }
    int64_t* ob = out + o * inner + i0;
    for (int64_t i = 0; i < m; ++i) ob[i] = index[i];
  }
}

template <bool IsMax, typename T>
void arg_reduce_typed(const View& out, const View& x, int dim) {
  const int64_t len = x.shape[dim], stride = x.strides[dim];
  if constexpr (std::is_floating_point_v<T>) {
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; ++d) outer *= x.shape[d];
    for (int d = dim + 1; d < x.ndim; ++d) inner *= x.shape[d];
    if (x.is_contiguous() && out.is_contiguous() && outer * inner > 0 && (inner == 1 || len <= kArgPart)) {
      argmax_contiguous<IsMax>(static_cast<int64_t*>(out.data), static_cast<const T*>(x.data), outer, len, inner);
      return;
    }
  }
  View xb = x, ob = out;
  xb.shape[dim] = 1;
  ob.dtype = DType::Int64;
  const StridedIter<2> it = make_iter(std::array<View, 2>{ob, xb});
  for_each_row(it, [len, stride](char* const* p, const int64_t* s, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      const T* row = reinterpret_cast<const T*>(p[1] + k * s[1]);
      T best = row[0];
      int64_t best_i = 0;
      for (int64_t i = 1; i < len; ++i)
        if (better<IsMax>(row[i * stride], best)) {
          best = row[i * stride];
          best_i = i;
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
  const int64_t n = x.numel();
  if ((op == ReduceOp::Max || op == ReduceOp::Min) && out.numel() == 1 && n > 0 && x.is_contiguous() &&
      (x.dtype == DType::Float32 || x.dtype == DType::Float64)) {  // a whole tensor's: amax
    EF_DISPATCH_FLOAT(x.dtype, "reduce", [&] {
      if constexpr (std::is_floating_point_v<scalar_t>) {
        const auto* p = static_cast<const scalar_t*>(x.data);
        *static_cast<scalar_t*>(out.data) =
            op == ReduceOp::Max ? extreme_contiguous<true>(p, n) : extreme_contiguous<false>(p, n);
      }
    });
    return;
  }
  EF_DISPATCH_ALL(x.dtype, "reduce", [&] {
    switch (op) {
      case ReduceOp::Sum:
        return reduce_typed<ReduceOp::Sum, scalar_t>(out, x);
      case ReduceOp::Mean:
        if constexpr (std::is_floating_point_v<scalar_t>) {
          EF_CHECK(x.numel() > 0, "reduce: mean over an empty dimension");
          reduce_typed<ReduceOp::Sum, scalar_t>(out, x);
          const auto scale = static_cast<scalar_t>(1.0 / static_cast<double>(x.numel() / out.numel()));
          map_elements<scalar_t, scalar_t>(out, {out}, [scale](scalar_t s) { return s * scale; });
          return;
        }
        EF_ERROR("reduce: mean of an integer tensor");
      case ReduceOp::Max:
        return reduce_typed<ReduceOp::Max, scalar_t>(out, x);
      case ReduceOp::Min:
        return reduce_typed<ReduceOp::Min, scalar_t>(out, x);
      default:
        EF_ERROR("reduce: unknown op");
    }
  });
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const View& out, const View& x) {
  reduce_impl(op, out, x);
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
