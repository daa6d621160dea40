// The CPU GEMM: float32 products (oneDNN's sgemm where the build has it, its matmul primitive for a
// transposed B or a long inner dimension on AVX-512, Eigen otherwise) against the float64 products
// (always Eigen) over the layouts matmul hands the backend: transposed operands, batches with
// broadcast strides, one row or column, empty inner dimension; and BLAS's beta == 0 rule, which
// must overwrite a C holding NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cpu/cpu_conv.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using evenflow::testing::compare;

namespace {

// The float32 product of two float32 views (as they are: a transposed view reaches the backend as
// trans_a / trans_b with its leading dimension) against the float64 product of the same values, at
// a tolerance for float32 sums of k terms.
void check_against_float64(const Tensor& a32, const Tensor& b32, const std::string& what) {
  const Tensor want = matmul(a32.to(kFloat64), b32.to(kFloat64));
  const Tensor got = matmul(a32, b32).to(kFloat64);
  const int64_t k = a32.size(-1);
  const double tol = 1e-6 * std::sqrt(static_cast<double>(k) + 1.0) * 4.0;
  const std::string bad = compare(got, want, tol, 1e-5);
  CHECK_MESSAGE(bad.empty(), what << ": " << bad);
}

}  // namespace

TEST_CASE("matmul float32 equals float64 over transposes, batches and edge shapes") {
  manual_seed(11);
  const TensorOptions f32{.dtype = kFloat32};
  struct Case {
    int64_t m, k, n;
  };
  for (const Case c :
       std::vector<Case>{{1, 1, 1},
                         {1, 7, 1},
                         {5, 1, 3},
                         {1, 64, 33},
                         {33, 64, 1},
                         {17, 31, 29},
                         {100, 784, 128},
                         {64, 256, 512},
                         // Products packed_matmul takes on AVX2 (rows of B 2 KB apart): Note [Packed GEMM for matmul].
                         {100, 300, 1024},
                         {70, 64, 512},
                         // Bᵀ of these through oneDNN's matmul primitive on AVX-512, at the rule's edges and past
                         // them (Note [float32 products with B transposed] in engine/cpu/onednn_matmul.cpp).
                         {16, 512, 16},
                         {15, 512, 40},
                         {768, 520, 17},
                         {769, 512, 16},
                         {16, 511, 16},
                         {16, 512, 15},
                         // Plain A and B through the primitive on AVX-512 from an inner dimension of 2048 with
                         // 64 to 512 rows of C: the rule's edges and past them.
                         {64, 2048, 16},
                         {512, 2048, 17},
                         {63, 2048, 16},
                         {513, 2048, 16},
                         {64, 2047, 16}}) {
    const std::string shape = std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n);
    const Tensor a = randn({c.m, c.k}, f32), b = randn({c.k, c.n}, f32);
    check_against_float64(a, b, shape);
    // Transposed views reach the backend as trans_a / trans_b with the original leading dimension.
    const Tensor at = randn({c.k, c.m}, f32), bt = randn({c.n, c.k}, f32);
    check_against_float64(transpose(at, 0, 1), b, shape + " Aᵀ");
    check_against_float64(a, transpose(bt, 0, 1), shape + " Bᵀ");
    check_against_float64(transpose(at, 0, 1), transpose(bt, 0, 1), shape + " AᵀBᵀ");
    // Batched; against one 2-D matrix (folded into M: one product); B transposed, of three matrices or of
    // one broadcast (stride 0 between B's matrices). With two threads or more, a batch of small products
    // is split over the threads (gemm_typed), each on sgemm; the larger ones, a batch of three, reach the
    // matmul primitive's loop over the batch.
    const Tensor ab = randn({3, c.m, c.k}, f32), bb = randn({3, c.k, c.n}, f32);
    check_against_float64(ab, bb, shape + " batch 3");
    check_against_float64(ab, b, shape + " batch 3 against one matrix");
    check_against_float64(ab, transpose(randn({3, c.n, c.k}, f32), 1, 2), shape + " batch 3, Bᵀ");
    check_against_float64(ab, transpose(randn({1, c.n, c.k}, f32), 1, 2), shape + " batch 3, one Bᵀ broadcast");
    // Leading dimensions past the row: slices of wider matrices.
    const Tensor wide_a = randn({c.m, c.k + 3}, f32), wide_bt = randn({c.n, c.k + 5}, f32);
    check_against_float64(slice(wide_a, 1, 0, c.k), transpose(slice(wide_bt, 1, 0, c.k), 0, 1),
                          shape + " Bᵀ, leading dimensions past the row");
  }
}

TEST_CASE("matmul with an empty inner dimension is zeros, in float32 and float64") {
  for (const DType dt : {kFloat32, kFloat64}) {
    const Tensor c = matmul(zeros({3, 0}, {.dtype = dt}), zeros({0, 4}, {.dtype = dt}));
    CHECK(c.shape() == Shape{3, 4});
    CHECK(compare(c, zeros({3, 4}, {.dtype = dt}), 0, 0).empty());
  }
}

TEST_CASE("gemm with beta 0 overwrites a C that holds NaN; beta 1 accumulates") {
  for (const bool trans_b : {false, true}) {
    const int64_t m = 4, n = 40, k = 24;
    std::vector<float> a(m * k, 0.5f), b(k * n, 2.0f);
    std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());
    GemmArgs g;
    g.dtype = DType::Float32;
    g.trans_b = trans_b;
    g.m = m, g.n = n, g.k = k;
    g.a = a.data(), g.lda = k;
    g.b = b.data(), g.ldb = trans_b ? k : n;
    g.c = c.data(), g.ldc = n;
    cpu_backend::gemm(g);
    for (const float v : c) REQUIRE(v == doctest::Approx(k * 1.0));
    g.beta = 1.0;
    cpu_backend::gemm(g);
    for (const float v : c) REQUIRE(v == doctest::Approx(k * 2.0));
  }
}

// The packed GEMM on its own, on every CPU (matmul reaches it only on AVX2 machines): edge tiles in
// both directions, more than one block of k and of column panels, A read transposed, B read
// transposed (strided), beta 0 over NaN and accumulation, one thread and two.
TEST_CASE("the packed GEMM equals a float64 product over edges, blocks, transposes and accumulation") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  struct Case {
    int64_t m, k, n;
  };
  for (const Case s : std::vector<Case>{{1, 1, 1}, {13, 5, 37}, {64, 400, 300}, {100, 777, 1024}})
    for (const bool trans_a : {false, true})
      for (const bool trans_b : {false, true})
        for (const int threads : {1, 2}) {
          std::vector<float> a(s.m * s.k), b(s.k * s.n);
          for (float& v : a) v = normal(rng);
          for (float& v : b) v = normal(rng);
          const auto at = [&](int64_t i, int64_t kk) { return trans_a ? a[kk * s.m + i] : a[i * s.k + kk]; };
          const auto bt = [&](int64_t kk, int64_t j) { return trans_b ? b[j * s.k + kk] : b[kk * s.n + j]; };
          const int64_t ldc = s.n + 3;  // a C with a row stride of its own
          std::vector<float> c(s.m * ldc, std::numeric_limits<float>::quiet_NaN());
          GemmArgs g;
          g.dtype = DType::Float32;
          g.trans_a = trans_a, g.trans_b = trans_b;
          g.m = s.m, g.n = s.n, g.k = s.k;
          g.a = a.data(), g.lda = trans_a ? s.m : s.k;
          g.b = b.data(), g.ldb = trans_b ? s.k : s.n;
          g.c = c.data(), g.ldc = ldc;
          const auto run = [&](bool accumulate) {
            g.beta = accumulate ? 1.0 : 0.0;
            cpu_backend::packed_sgemm(g, threads);
          };
          run(false);
          run(true);  // C = 2·A·B
          double worst = 0;
          for (int64_t i = 0; i < s.m; ++i)
            for (int64_t j = 0; j < s.n; ++j) {
              double want = 0, scale = 0;
              for (int64_t kk = 0; kk < s.k; ++kk) {
                want += static_cast<double>(at(i, kk)) * bt(kk, j);
                scale += std::abs(static_cast<double>(at(i, kk)) * bt(kk, j));
              }
              // float32 sums of k products: error within k·2⁻²⁴ of the sum of magnitudes (twice: C = 2·A·B).
              worst = std::max(worst, std::abs(c[i * ldc + j] - 2 * want) / (2 * scale * s.k * 0x1p-24 + 1e-30));
            }
          CHECK_MESSAGE(worst <= 1.0, s.m << "x" << s.k << "x" << s.n << (trans_a ? " Aᵀ" : "")
                                          << (trans_b ? " Bᵀ" : "") << ", " << threads << " threads: error " << worst
                                          << " of the bound");
        }
}
