// The CPU backend's elementwise kernels but the unary ops (cpu_unary.cpp): fill, arange, copy (with
// dtype casts), binary ops and where, all through map_elements (cpu_internal.h), and random numbers.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "evenflow/engine/cpu/cpu_internal.h"
#include "evenflow/engine/cpu/threads.h"
#include "evenflow/engine/cpu/vector_math.h"
#include "evenflow/engine/error.h"
#include "evenflow/engine/random_internal.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

void fill_impl(const View& out, double value) {
  EF_DISPATCH_STORAGE(out.dtype, "fill", [&] {
    const auto v = dtype_cast<scalar_t>(value);
    map_elements<scalar_t>(out, {}, [v]() { return v; });
  });
}

namespace {

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

// Note [Transposing copies]
// A layout change (contiguous <-> channels-last) is a copy whose two operands run along different
// dims: after make_iter, [outer..., P, Q] with one operand of unit stride along P and the other along
// Q. map_elements walks it element by element, one side strided: a scalar loop, which ran at one
// speed or 1.3-1.7x slower by where the linker placed it (docs/benchmarks.md, "The engine on
// AVX-512"). Such copies of one dtype go by tiles of 8 x 8 instead: eight rows loaded along the
// source's unit stride, transposed in registers (three rounds of shuffles), stored along the
// destination's (as unsigned integers of the element's size: a copy moves bits).

// The unsigned integer of T's size.
template <typename T>
using bits_of = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;

// dst[i * ld_dst + j] = src[j * ld_src + i] for i < rows, j < cols.
template <typename T>
void transpose_plane(T* dst, const T* src, int64_t rows, int64_t cols, int64_t ld_dst, int64_t ld_src) {
  typedef bits_of<T> V __attribute__((vector_size(8 * sizeof(T))));
  int64_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) {
      V r[8], t[8], u[8];
      for (int k = 0; k < 8; ++k) load_lanes(r[k], src + (j + k) * ld_src + i);
      for (int k = 0; k < 8; k += 2) {
        t[k] = __builtin_shufflevector(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[k + 1] = __builtin_shufflevector(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
      }
      for (int k = 0; k < 8; k += 4) {
        u[k] = __builtin_shufflevector(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[k + 1] = __builtin_shufflevector(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[k + 2] = __builtin_shufflevector(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[k + 3] = __builtin_shufflevector(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
      }
      for (int k = 0; k < 4; ++k) {
        const V low = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        const V high = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        store_lanes(dst + (i + k) * ld_dst + j, low);
        store_lanes(dst + (i + k + 4) * ld_dst + j, high);
      }
    }
    for (; j < cols; ++j)
      for (int64_t k = i; k < i + 8; ++k) dst[k * ld_dst + j] = src[j * ld_src + k];
  }
  for (; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * ld_dst + j] = src[j * ld_src + i];
}

// The copy of Note [Transposing copies], if the walk `it` of a copy between two views of dtype T is
// one; false otherwise.
template <typename T>
bool copy_transposing(const StridedIter<2>& it) {
  if (it.ndim < 2) return false;
  const int p = it.ndim - 2, q = it.ndim - 1;
  const int64_t unit = sizeof(T);
  // The plane as dst[i][j] = src[j][i]: dst of unit stride along j, src along i.
  int64_t rows, cols, ld_dst, ld_src;
  if (it.strides[0][q] == unit && it.strides[1][p] == unit) {  // out along Q, x along P: i = P, j = Q
    rows = it.shape[p], cols = it.shape[q], ld_dst = it.strides[0][p], ld_src = it.strides[1][q];
  } else if (it.strides[0][p] == unit && it.strides[1][q] == unit) {  // i = Q, j = P
    rows = it.shape[q], cols = it.shape[p], ld_dst = it.strides[0][q], ld_src = it.strides[1][p];
  } else {
    return false;
  }
  if (rows < 8 || cols < 8 || ld_dst % unit != 0 || ld_src % unit != 0) return false;
  // The outer dims alone (one plane, of no dims, when there are none): run_range over one of their
  // elements finds a plane's origin.
  StridedIter<2> planes = it;
  planes.ndim = std::max(p, 1);
  if (p == 0) planes.shape[0] = 1;
  // Threads take blocks of 64 rows of the planes.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  [[maybe_unused]] const int nt = threads_for(planes.numel() * rows * cols);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t task = 0; task < planes.numel() * blocks; ++task) {
    const int64_t plane = task / blocks, i0 = task % blocks * kBlock;
    auto block = [&](char* const* origin, const int64_t*, int64_t) {
      transpose_plane(reinterpret_cast<T*>(origin[0]) + i0 * (ld_dst / unit),
                      reinterpret_cast<const T*>(origin[1]) + i0, std::min(kBlock, rows - i0), cols, ld_dst / unit,
                      ld_src / unit);
    };
    run_range(planes, planes.data, plane, plane + 1, block);
  }
  return true;
}

// The copy of one dtype between rows of unit stride, if the walk `it` is one (false otherwise): the
// bytes moved as they are, a large output streamed (Note [Streaming stores]) straight from the
// source rather than through write_row's buffer, as map_iter would. (copy_ has already copied a
// source overlapping its destination other than element for element.)
template <typename T>
bool copy_rows(const StridedIter<2>& it) {
  const int last = it.ndim - 1;
  if (it.strides[0][last] != sizeof(T) || it.strides[1][last] != sizeof(T)) return false;
  const bool streaming = streams(it.numel() * static_cast<int64_t>(sizeof(T))) && it.data[0] != it.data[1];
  for_each_row(it, [streaming](char* const* p, const int64_t*, int64_t n) {
    if (p[0] == p[1]) return;
    if (streaming) {
      stream_copy(p[0], p[1], static_cast<size_t>(n) * sizeof(T));
      stream_fence();
    } else {
      std::memcpy(p[0], p[1], static_cast<size_t>(n) * sizeof(T));
    }
  });
  return true;
}

// Between any two dtypes (dtype_cast).
template <typename Out>
void copy_to(const View& out, const View& x) {
  const StridedIter<2> it = make_iter(std::array<View, 2>{out, x}, 0);
  EF_DISPATCH_STORAGE(x.dtype, "copy", [&] {
    if constexpr (std::is_same_v<Out, scalar_t>)
      if (copy_rows<Out>(it) || copy_transposing<Out>(it)) return;
    map_iter<Out, scalar_t>(it, [](scalar_t v) { return dtype_cast<Out>(v); });
  });
}

void copy_impl(const View& out, const View& x) {
  EF_DISPATCH_STORAGE(out.dtype, "copy", [&] { copy_to<scalar_t>(out, x); });
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

// Note [Vectorized draws]
// Philox's rounds are integer multiplies and xors, which the compiler vectorizes (8 draws at once
// with AVX-512) in a loop of its own per kind, but not in one loop over every kind inside an OpenMP
// region's outlined body, which drew far slower (docs/benchmarks.md, "The program's host work"). So
// each thread fills its range through random_range, one loop per kind. A normal draw runs its Philox
// rounds for a block of values first, then Box-Muller's log and cosine, ours
// (Note [Vectorized log and cos] in vector_math.h): glibc's scalar calls were most of a normal
// draw's time (same section). Uniform and Bernoulli draws are random::sample's to the last bit;
// normal ones a + b·R·cos θ within 2^-52·(|a| + 8·|b|·R) of it (test_engine's "random draws").
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

}  // namespace

void CpuBackend::fill(const View& out, double value) {
  fill_impl(out, value);
}

void CpuBackend::arange(const View& out, double start, double step) {
  arange_impl(out, start, step);
}

void CpuBackend::copy(const View& out, const View& x) {
  copy_impl(out, x);
}

void CpuBackend::binary(BinaryOp op, const View& out, const View& x, const View& y, double a) {
  binary_impl(op, out, x, y, a);
}

void CpuBackend::where(const View& out, const View& cond, const View& x, const View& y) {
  where_impl(out, cond, x, y);
}

namespace {

// Backend::add_n: in blocks that stay in the first-level cache, each element added left to right
// (this file compiles without contraction; adds alone would not contract anyway).
template <typename T>
void add_n_typed(T* o, const std::vector<const T*>& p, int64_t n) {
  constexpr int64_t kBlock = 2048;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  [[maybe_unused]] const int nt = threads_for(n);
#pragma omp parallel for num_threads(nt) if (nt > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
    for (int64_t i = begin; i < end; ++i) o[i] = p[0][i] + p[1][i];
    for (size_t k = 2; k < p.size(); ++k) {
      const T* q = p[k];
      for (int64_t i = begin; i < end; ++i) o[i] = o[i] + q[i];
    }
  }
}

}  // namespace

void CpuBackend::add_n(const View& out, const std::vector<View>& xs) {
  const int64_t n = out.numel();
  EF_ASSERT(xs.size() >= 2 && out.is_contiguous(), "add_n: at least two operands into a contiguous output");
  for (const View& x : xs) {
    EF_ASSERT(x.dtype == out.dtype && x.numel() == n && x.is_contiguous() && x.data != out.data,
              "add_n: contiguous operands of the output's size and dtype, apart from it");
  }
  EF_DISPATCH_FLOAT(out.dtype, "add_n", [&] {
    std::vector<const scalar_t*> p;
    for (const View& x : xs) p.push_back(static_cast<const scalar_t*>(x.data));
    add_n_typed(static_cast<scalar_t*>(out.data), p, n);
  });
}

void CpuBackend::random(const View& out, RandomKind kind, double a, double b, const RandomKey& key) {
  EF_ASSERT(out.is_contiguous(), "random: output must be contiguous");
  // A recorded step's key is read when the call runs (Note [Step scalars]).
  const uint64_t seed = key.in_device ? key.in_device[0] : key.seed;
  const uint64_t offset = key.in_device ? key.in_device[1] : key.offset;
  EF_DISPATCH_ALL(out.dtype, "random",
                  [&] { random_typed(static_cast<scalar_t*>(out.data), out.numel(), kind, a, b, seed, offset); });
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
