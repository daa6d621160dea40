// Internal to the CPU backend: the packed, register-blocked GEMM that the convolutions of
// cpu_conv.cpp run on (Note [Packed GEMM for convolution]), and the packing of its operands.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "evenflow/engine/cpu/isa.h"
#include "evenflow/engine/cpu/threads.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

// Note [Packed GEMM for convolution]
// Eigen's GEMM falls short of the machine's peak on convolution-shaped products
// (docs/benchmarks.md, "Packed GEMM for convolution"), and its packing pass re-reads the whole
// im2col matrix. The convolutions therefore use a small GEMM of their own, in the usual BLIS
// structure: a register-blocked micro-kernel computes an MR x NR tile of C from A, read one
// broadcast element per row, and B, packed into NR-column panels stored k-major (one contiguous
// NR-vector per k). A is either packed too (MR-row panels, k-major) or read in place from a
// row-major matrix: broadcasts need no contiguity. im2col writes its matrix straight into the
// layout the GEMM reads, so nothing is packed twice. Two tile shapes:
//   Wide: 3 vectors per C row (NR = 48 floats with AVX-512), MR = 8, for C with many columns;
//   Tall: 2 vectors per C row (NR = 32), MR = 12, for C with few columns (the weight gradient's
//         Og), where a 48-wide tile would waste lanes.
// Both keep MR·vectors accumulators plus the B vectors and a broadcast in registers (32 vector
// registers with AVX-512, 16 otherwise, where the vectors are 8 floats and MR is halved). The
// kernel uses GCC vector extensions, so it compiles for any target.

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#else
constexpr int kVecBytes = 32;
#endif
typedef float VecF __attribute__((vector_size(kVecBytes)));
typedef double VecD __attribute__((vector_size(kVecBytes)));

enum class TileShape { Wide, Tall };

template <typename T, TileShape S>
struct Micro {
  using V = std::conditional_t<std::is_same_v<T, float>, VecF, VecD>;
  static constexpr int64_t kLanes = kVecBytes / static_cast<int64_t>(sizeof(T));
  static constexpr int64_t kVecs = S == TileShape::Wide ? 3 : 2;  // vectors per row of a C tile
  static constexpr int64_t MR = (S == TileShape::Wide ? 8 : 12) / (kVecBytes == 64 ? 1 : 2);
  static constexpr int64_t NR = kVecs * kLanes;
};

// One full MR x NR tile: C (row stride ldc) = A·B over kc, plus C's old values when accumulate.
// A is a packed panel (element (r, k) at a[k·MR + r]) or, when !PackedA, rows of a row-major
// matrix (a[r·lda + k]); b is a packed panel (b[k·NR + j]). Kept free of edge handling: any other
// use of `acc` makes GCC keep the accumulators in memory instead of registers.
template <typename T, TileShape S, bool PackedA>
void micro_tile(int64_t kc, const T* a, int64_t lda, const T* b, T* c, int64_t ldc, bool accumulate) {
  using M = Micro<T, S>;
  using V = typename M::V;
  V acc[M::MR][M::kVecs];
  for (int64_t r = 0; r < M::MR; ++r)
    for (int64_t v = 0; v < M::kVecs; ++v) acc[r][v] = V{};
  for (int64_t k = 0; k < kc; ++k) {
    V bv[M::kVecs];
    for (int64_t v = 0; v < M::kVecs; ++v) std::memcpy(&bv[v], b + v * M::kLanes, sizeof(V));
    for (int64_t r = 0; r < M::MR; ++r) {
      // Adding -0.0 is exact, so GCC folds it and broadcasts straight from memory.
      const V av = -V{} + (PackedA ? a[r] : a[r * lda]);
      for (int64_t v = 0; v < M::kVecs; ++v) acc[r][v] += av * bv[v];
    }
    a += PackedA ? M::MR : 1;
    b += M::NR;
  }
  for (int64_t r = 0; r < M::MR; ++r) {
    for (int64_t v = 0; v < M::kVecs; ++v) {
      T* p = c + r * ldc + v * M::kLanes;
      V out = acc[r][v];
      if (accumulate) {
        V old;
        std::memcpy(&old, p, sizeof(V));
        out += old;
      }
      std::memcpy(p, &out, sizeof(V));
    }
  }
}

// C [m, n] (row stride ldc) = A·B (+ C when accumulate); A packed into MR-row panels or, when
// !PackedA, row-major with row stride lda and readable up to a whole number of MR-row panels; B
// packed into NR-column panels. Blocks of k keep a B panel in cache while the rows of A stream
// past it. Edge tiles are computed into a local tile and copied, so the padding lanes of the
// panels never reach C. With threads > 1 the column panels are split between threads (for
// convolutions with fewer samples than threads).
template <typename T, TileShape S, bool PackedA>
void packed_gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* bp, T* c, int64_t ldc,
                 bool accumulate, int threads) {
  using M = Micro<T, S>;
  constexpr int64_t kKc = 512, kMcPanels = 32;
  const int64_t mp = (m + M::MR - 1) / M::MR, np = (n + M::NR - 1) / M::NR;
  const auto columns = [&](int64_t j0, int64_t j1) {
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kb = std::min(kKc, k - pc);
      const bool acc = accumulate || pc > 0;
      for (int64_t i0 = 0; i0 < mp; i0 += kMcPanels) {
        for (int64_t j = j0; j < j1; ++j) {
          for (int64_t i = i0; i < std::min(mp, i0 + kMcPanels); ++i) {
            const T* ai = PackedA ? a + (i * k + pc) * M::MR : a + i * M::MR * lda + pc;
            const T* bj = bp + (j * k + pc) * M::NR;
            T* cij = c + i * M::MR * ldc + j * M::NR;
            const int64_t rows = std::min(M::MR, m - i * M::MR), cols = std::min(M::NR, n - j * M::NR);
            if (rows == M::MR && cols == M::NR) {
              micro_tile<T, S, PackedA>(kb, ai, lda, bj, cij, ldc, acc);
              continue;
            }
            T tile[M::MR][M::NR];
            micro_tile<T, S, PackedA>(kb, ai, lda, bj, &tile[0][0], M::NR, false);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t q = 0; q < cols; ++q) cij[r * ldc + q] = acc ? cij[r * ldc + q] + tile[r][q] : tile[r][q];
          }
        }
      }
    }
  };
  [[maybe_unused]] const int nt = static_cast<int>(std::min<int64_t>(threads, np));
  if (nt <= 1) {
    columns(0, np);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = thread_index(), team = team_size();
    columns(np * t / team, np * (t + 1) / team);
  }
}

// Elements of a packed operand, rounded to whole cache lines.
template <typename T, TileShape S>
int64_t packed_a_elems(int64_t m, int64_t k) {
  using M = Micro<T, S>;
  return ((m + M::MR - 1) / M::MR * M::MR * k + 15) / 16 * 16;
}
template <typename T, TileShape S>
int64_t packed_b_elems(int64_t k, int64_t n) {
  using M = Micro<T, S>;
  return ((n + M::NR - 1) / M::NR * M::NR * k + 15) / 16 * 16;
}

// Packs the m x k matrix with element (i, kk) at s[i·rs + kk·cs] into A panels (zero padded).
template <typename T, TileShape S>
void pack_a(int64_t m, int64_t k, const T* s, int64_t rs, int64_t cs, T* dst) {
  constexpr int64_t mr = Micro<T, S>::MR;
  for (int64_t i0 = 0; i0 < m; i0 += mr, dst += mr * k)
    for (int64_t r = 0; r < mr; ++r)
      for (int64_t kk = 0; kk < k; ++kk) dst[kk * mr + r] = i0 + r < m ? s[(i0 + r) * rs + kk * cs] : T(0);
}

// Packs the k x n matrix with element (kk, j) at s[kk·rs + j·cs] into B panels (zero padded).
template <typename T, TileShape S>
void pack_b(int64_t k, int64_t n, const T* s, int64_t rs, int64_t cs, T* dst) {
  constexpr int64_t nr = Micro<T, S>::NR;
  for (int64_t j0 = 0; j0 < n; j0 += nr, dst += nr * k)
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t q = 0; q < nr; ++q) dst[kk * nr + q] = j0 + q < n ? s[kk * rs + (j0 + q) * cs] : T(0);
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
