// The CPU backend's Backend::gemm: Eigen's GEMM, or where the build has oneDNN its sgemm for
// float32, its matmul primitive for float32 products with B transposed on AVX-512 and for bfloat16
// products (onednn_matmul.h). This is the one file of the CPU backend that includes Eigen,
// whose GEMM templates dominate build time.
#include "evenflow/engine/cpu/cpu_conv.h"

#include "evenflow/engine/cpu/onednn_matmul.h"
#include "evenflow/engine/cpu/packed_gemm.h"
#include "evenflow/engine/cpu/threads.h"

// GCC 12 reports false (maybe-)uninitialized uses inside its own AVX-512 intrinsics (the
// _mm512_undefined_ps() idiom) when it inlines Eigen's packing code with -march=native.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <type_traits>

#if EF_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include "evenflow/engine/device.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {
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
void eigen_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  MatMap<T> cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (beta == T(0))
      cm.setZero();
    else
      cm *= beta;
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
  if (!trans_a && !trans_b)
    run(am, bm);
  else if (trans_a && !trans_b)
    run(am.transpose(), bm);
  else if (!trans_a && trans_b)
    run(am, bm.transpose());
  else
    run(am.transpose(), bm.transpose());
}

// Whether packed_matmul runs this float32 product instead of oneDNN's sgemm: on AVX2 (without
// AVX-512, where it was measured), a C of 64 to 256 rows whose B is not transposed and whose B or C
// rows lie a multiple of 2 KB apart (Note [Packed GEMM for matmul]). alpha 1 and beta 0 or 1 only,
// which is all matmul asks.
[[maybe_unused]] bool packed_takes(bool trans_b, int64_t m, int64_t n, int64_t k, int64_t ldb, int64_t ldc, float alpha,
                                   float beta) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  return !trans_b && m >= 64 && m <= 256 && n >= 256 && k >= 64 && (ldb % 512 == 0 || ldc % 512 == 0) &&
         alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
#else
  (void)trans_b, (void)m, (void)n, (void)k, (void)ldb, (void)ldc, (void)alpha, (void)beta;
  return false;
#endif
}

// One float32 product through packed_matmul, in this thread's workspace (beta 0 or 1).
void packed_one(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads) {
  const auto bytes = static_cast<size_t>(packed_matmul_scratch<float>(m, k, threads)) * sizeof(float);
  packed_matmul(m, n, k, a, trans_a ? 1 : lda, trans_a ? lda : 1, b, trans_b ? 1 : ldb, trans_b ? ldb : 1, c, ldc,
                beta != 0.0f, threads, static_cast<float*>(thread_workspace(bytes)));
}

// The same for one matrix, through oneDNN's sgemm for float32 where the build has it: faster than
// Eigen's and close to MKL's (docs/benchmarks.md, "Engine"), or packed_matmul where sgemm is slow
// (gemm_typed sends some products to oneDNN's matmul primitive before they get here).
// Like Eigen they run on `threads` threads, 1 inside a parallel region. beta == 0 overwrites C (NaN
// included), as BLAS specifies; tests/engine check it.
template <typename T>
void gemm_one(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
              int64_t ldb, T beta, T* c, int64_t ldc, [[maybe_unused]] int threads) {
#if EF_ONEDNN
  // sgemm insists on leading dimensions of at least a row (BLAS's rule); views of empty or
  // one-row operands can have smaller ones, which Eigen takes.
  if constexpr (std::is_same_v<T, float>) {
    if (packed_takes(trans_b, m, n, k, ldb, ldc, alpha, beta))
      return packed_one(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc, threads);
    if (k > 0 && lda >= std::max<int64_t>(1, trans_a ? m : k) && ldb >= std::max<int64_t>(1, trans_b ? k : n) &&
        ldc >= std::max<int64_t>(1, n)) {
      const dnnl_status_t status =
          dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      EF_CHECK(status == dnnl_success, "matmul: oneDNN sgemm failed with status ", static_cast<int>(status), " (m=", m,
               ", n=", n, ", k=", k, ")");
      return;
    }
  }
#endif
  eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void gemm_typed(const GemmArgs& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  const T alpha = static_cast<T>(g.alpha), beta = static_cast<T>(g.beta);
  [[maybe_unused]] const int nt = std::max(1, kernel_threads());
  const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  // Threads take whole matrices when that splits evenly, when there are many, or when each is too
  // small for Eigen to parallelize well; otherwise Eigen parallelizes each product.
  const bool over_batch = g.batch > 1 && nt > 1 && (g.batch % nt == 0 || g.batch >= 4 * nt || flops < 4e6);
  if (over_batch) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < g.batch; ++i)
      gemm_one(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, a + i * g.stride_a, g.lda, b + i * g.stride_b, g.ldb, beta,
               c + i * g.stride_c, g.ldc, 1);
    return;
  }
#if EF_ONEDNN
  if constexpr (std::is_same_v<T, float>)
    if (onednn_takes_f32_gemm(g)) return onednn_gemm(g);
#endif
  // Eigen sizes its team with omp_get_max_threads() of this thread; Eigen::setNbThreads would be a
  // process-wide setting, racing between the devices' threads.
  set_team_size(nt);
  for (int64_t i = 0; i < g.batch; ++i)
    gemm_one(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, a + i * g.stride_a, g.lda, b + i * g.stride_b, g.ldb, beta,
             c + i * g.stride_c, g.ldc, nt);
}

}  // namespace

void packed_sgemm(const GemmArgs& g, int threads) {
  EF_ASSERT(
      g.dtype == DType::Float32 && g.compute == DType::Float32 && g.alpha == 1.0 && (g.beta == 0.0 || g.beta == 1.0),
      "packed_sgemm: float32 with alpha 1 and beta 0 or 1 only");
  const float* a = static_cast<const float*>(g.a);
  const float* b = static_cast<const float*>(g.b);
  float* c = static_cast<float*>(g.c);
  for (int64_t i = 0; i < g.batch; ++i)
    packed_one(g.trans_a, g.trans_b, g.m, g.n, g.k, a + i * g.stride_a, g.lda, b + i * g.stride_b, g.ldb,
               static_cast<float>(g.beta), c + i * g.stride_c, g.ldc, threads);
}

void gemm(const GemmArgs& args) {
  if (args.m <= 0 || args.n <= 0 || args.batch <= 0) return;
#if EF_ONEDNN
  if (args.compute == DType::BFloat16) return onednn_gemm(args);
#endif
  EF_ASSERT(args.compute != DType::BFloat16, "matmul: bfloat16 compute asked of a build without oneDNN");
  EF_DISPATCH_FLOAT(args.dtype, "matmul", [&] { gemm_typed<scalar_t>(args); });
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
