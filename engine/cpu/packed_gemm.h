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

// One MR x NR tile of C, of which `rows` x `cols` lie inside C: a whole tile is computed straight
// into C; an edge tile into a local tile and copied, so that the padding lanes of the panels never
// reach C. `accumulate` adds to C instead of overwriting it. Both packed GEMMs below use it.
template <typename T, TileShape S, bool PackedA>
inline void tile_of_c(int64_t kb, const T* a, int64_t lda, const T* b, T* c, int64_t ldc, int64_t rows, int64_t cols,
                      bool accumulate) {
  using M = Micro<T, S>;
  if (rows == M::MR && cols == M::NR) {
    micro_tile<T, S, PackedA>(kb, a, lda, b, c, ldc, accumulate);
    return;
  }
  T tile[M::MR][M::NR];
  micro_tile<T, S, PackedA>(kb, a, lda, b, &tile[0][0], M::NR, false);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t q = 0; q < cols; ++q) c[r * ldc + q] = accumulate ? c[r * ldc + q] + tile[r][q] : tile[r][q];
}

// C [m, n] (row stride ldc) = A·B (+ C when accumulate); A packed into MR-row panels or, when
// !PackedA, row-major with row stride lda and readable up to a whole number of MR-row panels; B
// packed into NR-column panels. Blocks of k keep a B panel in cache while the rows of A stream
// past it (edge tiles: tile_of_c). With threads > 1 the column panels are split between threads (for
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
            tile_of_c<T, S, PackedA>(kb, ai, lda, bj, c + i * M::MR * ldc + j * M::NR, ldc,
                                     std::min(M::MR, m - i * M::MR), std::min(M::NR, n - j * M::NR), acc);
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

// Note [Packed GEMM for matmul]
// oneDNN's sgemm multiplies a C with few rows (fewer than ~260) by reading B in place, without
// packing it ("no-copy"). When B's or C's rows lie a multiple of 2 KB apart (512 floats: the
// classify network's 1024-wide layers), those reads and C's stores fall into the same cache sets,
// and on an AVX2 machine (Zen 2) the product runs at ~60% of its speed with other row strides:
// 100x3136x1024 at 70 GFLOP/s against 119-129 for 768 or 1000 columns (docs/benchmarks.md,
// "Matrix products on AVX2"). packed_matmul computes such products in the BLIS loop order
// instead: A packed whole into MR-row panels, then per thread, for its share of C's column panels,
// blocks of B packed (contiguous: 768 KB in float32, held in L2 and L3) and every row panel of A run
// against them with the Tall micro-kernel. Packing costs one pass over A and B, which is why
// oneDNN skips it for C with few rows; below 64 rows B is reused too little for it to pay
// (16x3136x1024 ran at half oneDNN's speed), so the caller keeps those for oneDNN.

// Blocks of B: kMatmulKc rows by kMatmulNc columns (a whole number of panels). Measured on the Zen 2
// (100x3136x1024, 15 paired rounds in one process): 512 columns ran 1.14x the rate of 256 (each
// row of the block read is 2 KB of contiguous memory), and the prefetch below 1.23x.
constexpr int64_t kMatmulKc = 384, kMatmulNc = 512;

// Scratch elements packed_matmul needs for an m x k A on `threads` threads.
template <typename T>
int64_t packed_matmul_scratch(int64_t m, int64_t k, int threads) {
  return packed_a_elems<T, TileShape::Tall>(m, k) + threads * packed_b_elems<T, TileShape::Tall>(kMatmulKc, kMatmulNc);
}

// C [m, n] (row stride ldc) = A·B (+ C when accumulate; otherwise C is overwritten, NaN or not),
// with A's element (i, kk) at a[i·a_rs + kk·a_cs] and B's (kk, j) at b[kk·b_rs + j·b_cs]: any
// transposition. Runs on `threads` threads (1 inside a parallel region), in `scratch`
// (packed_matmul_scratch elements).
template <typename T>
void packed_matmul(int64_t m, int64_t n, int64_t k, const T* a, int64_t a_rs, int64_t a_cs, const T* b, int64_t b_rs,
                   int64_t b_cs, T* c, int64_t ldc, bool accumulate, int threads, T* scratch) {
  using M = Micro<T, TileShape::Tall>;
  constexpr int64_t kKc = kMatmulKc, kNcPanels = kMatmulNc / M::NR;
  const int64_t mp = (m + M::MR - 1) / M::MR, np = (n + M::NR - 1) / M::NR;
  if (k == 0) {
    for (int64_t i = 0; i < m && !accumulate; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
    return;
  }
  T* ap = scratch;
  const auto pack_a_panels = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      pack_a<T, TileShape::Tall>(std::min(M::MR, m - i * M::MR), k, a + i * M::MR * a_rs, a_rs, a_cs,
                                 ap + i * M::MR * k);
  };
  const auto columns = [&](int64_t p0, int64_t p1, int64_t t) {
    T* bp = scratch + packed_a_elems<T, TileShape::Tall>(m, k) + t * packed_b_elems<T, TileShape::Tall>(kKc, kMatmulNc);
    for (int64_t jc = p0; jc < p1; jc += kNcPanels) {
      const int64_t panels = std::min(kNcPanels, p1 - jc), j0 = jc * M::NR, cols = std::min(panels * M::NR, n - j0);
      for (int64_t pc = 0; pc < k; pc += kKc) {
        const int64_t kb = std::min(kKc, k - pc);
        // Row by row, so that B is read along its rows when b_cs == 1 (panel by panel, the reads
        // would step a whole row of B each: twice the time of the whole product's packing).
        for (int64_t kk = 0; kk < kb; ++kk) {
          const T* row = b + (pc + kk) * b_rs + j0 * b_cs;
          for (int64_t q = 0; q < panels; ++q) {
            T* dst = bp + (q * kb + kk) * M::NR;
            const int64_t cq = std::min(M::NR, cols - q * M::NR);
            if (b_cs == 1 && cq == M::NR) {
              std::memcpy(dst, row + q * M::NR, sizeof(T) * M::NR);
              continue;
            }
            for (int64_t x = 0; x < M::NR; ++x) dst[x] = x < cq ? row[(q * M::NR + x) * b_cs] : T(0);
          }
        }
        const bool acc = accumulate || pc > 0;
        // The next block's rows of B are fetched into the cache while this block is multiplied
        // (packing would otherwise wait on memory for each row: B is read once, from memory):
        // panel q's part of them while panel q runs, a share before each row panel of A.
        const bool next_in_k = pc + kKc < k, next_exists = next_in_k || jc + kNcPanels < p1;
        const int64_t next_pc = next_in_k ? pc + kKc : 0, next_j0 = next_in_k ? j0 : j0 + kMatmulNc;
        const int64_t next_kb = std::min(kKc, k - next_pc), next_cols = std::min(kMatmulNc, n - next_j0);
        const int64_t rows_per_panel = (next_kb + mp - 1) / mp;
        for (int64_t q = 0; q < panels; ++q) {
          const int64_t jq = j0 + q * M::NR, cq = std::min(M::NR, n - jq);
          const T* bq = bp + q * kb * M::NR;
          const bool fetch = next_exists && b_cs == 1 && q * M::NR < next_cols;
          for (int64_t i = 0; i < mp; ++i) {
            if (fetch) {
              const T* next = b + next_pc * b_rs + next_j0 + q * M::NR;
              for (int64_t kk = i * rows_per_panel; kk < std::min(next_kb, (i + 1) * rows_per_panel); ++kk)
                for (int64_t x = 0; x < M::NR; x += 64 / static_cast<int64_t>(sizeof(T)))
                  __builtin_prefetch(next + kk * b_rs + x);
            }
            const T* ai = ap + (i * k + pc) * M::MR;
            tile_of_c<T, TileShape::Tall, true>(kb, ai, 0, bq, c + i * M::MR * ldc + jq, ldc,
                                                std::min(M::MR, m - i * M::MR), cq, acc);
          }
        }
      }
    }
  };
  [[maybe_unused]] const int nt = static_cast<int>(std::min<int64_t>(threads, np));
  if (nt <= 1) {
    pack_a_panels(0, mp);
    columns(0, np, 0);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = thread_index(), team = team_size();
    pack_a_panels(mp * t / team, mp * (t + 1) / team);
#pragma omp barrier
    columns(np * t / team, np * (t + 1) / team, t);
  }
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
