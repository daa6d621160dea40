// The CPU GEMM: float32 products (oneDNN's sgemm where the build has it, Eigen otherwise) against the
// float64 products (always Eigen) over the layouts matmul hands the backend: transposed operands,
// batches with broadcast strides, one row or column, empty inner dimension; and BLAS's beta == 0
// rule, which must overwrite a C holding NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cpu/cpu_conv.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using evenflow::testing::compare;

namespace {

// float32 result against the float64 one, at a tolerance for float32 sums of k terms.
void check_against_float64(const Tensor& a64, const Tensor& b64, const std::string& what) {
  const Tensor want = matmul(a64, b64);
  const Tensor got = matmul(a64.to(kFloat32), b64.to(kFloat32)).to(kFloat64);
  const int64_t k = a64.size(-1);
  const double tol = 1e-6 * std::sqrt(static_cast<double>(k) + 1.0) * 4.0;
  const std::string bad = compare(got, want, tol, 1e-5);
  CHECK_MESSAGE(bad.empty(), what << ": " << bad);
}

}  // namespace

TEST_CASE("matmul float32 equals float64 over transposes, batches and edge shapes") {
  manual_seed(11);
  const TensorOptions f64{.dtype = kFloat64};
  struct Case {
    int64_t m, k, n;
  };
  for (const Case c : std::vector<Case>{
           {1, 1, 1}, {1, 7, 1}, {5, 1, 3}, {1, 64, 33}, {33, 64, 1}, {17, 31, 29}, {100, 784, 128}, {64, 256, 512}}) {
    const std::string shape = std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n);
    const Tensor a = randn({c.m, c.k}, f64), b = randn({c.k, c.n}, f64);
    check_against_float64(a, b, shape);
    // Transposed views reach the backend as trans_a / trans_b with the original leading dimension.
    const Tensor at = randn({c.k, c.m}, f64), bt = randn({c.n, c.k}, f64);
    check_against_float64(transpose(at, 0, 1), b, shape + " Aᵀ");
    check_against_float64(a, transpose(bt, 0, 1), shape + " Bᵀ");
    check_against_float64(transpose(at, 0, 1), transpose(bt, 0, 1), shape + " AᵀBᵀ");
    // Batched, and batched against one broadcast matrix (stride 0 between B's matrices).
    const Tensor ab = randn({3, c.m, c.k}, f64), bb = randn({3, c.k, c.n}, f64);
    check_against_float64(ab, bb, shape + " batch 3");
    check_against_float64(ab, b, shape + " batch 3, B broadcast");
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
