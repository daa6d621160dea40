// The CPU backend's Backend::gemm: Eigen's GEMM, or oneDNN's sgemm for float32 and its bfloat16
// products where the build has oneDNN. This is the one file of the CPU backend that includes Eigen,
// whose GEMM templates dominate build time.
#include "evenflow/engine/cpu/cpu_conv.h"

#include "evenflow/engine/cpu/onednn_matmul.h"
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

// The same for one matrix, through oneDNN's sgemm for float32 where the build has it: faster than
// Eigen's and close to MKL's (docs/benchmarks.md, "Engine"). Like
// Eigen it threads over omp_get_max_threads() and runs serially inside a parallel region. beta == 0
// overwrites C (NaN included), as BLAS specifies; tests/engine check it.
template <typename T>
void gemm_one(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
              int64_t ldb, T beta, T* c, int64_t ldc) {
#if EF_ONEDNN
  // sgemm insists on leading dimensions of at least a row (BLAS's rule); views of empty or
  // one-row operands can have smaller ones, which Eigen takes.
  if constexpr (std::is_same_v<T, float>) {
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
               c + i * g.stride_c, g.ldc);
    return;
  }
  // Eigen sizes its team with omp_get_max_threads() of this thread; Eigen::setNbThreads would be a
  // process-wide setting, racing between the devices' threads.
  set_team_size(nt);
  for (int64_t i = 0; i < g.batch; ++i)
    gemm_one(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, a + i * g.stride_a, g.lda, b + i * g.stride_b, g.ldb, beta,
             c + i * g.stride_c, g.ldc);
}

}  // namespace

void gemm(const GemmArgs& args) {
  if (args.m <= 0 || args.n <= 0 || args.batch <= 0) return;
#if EF_ONEDNN
  if (args.compute == DType::BFloat16) return onednn_gemm_bf16(args);
#endif
  EF_ASSERT(args.compute != DType::BFloat16, "matmul: bfloat16 compute asked of a build without oneDNN");
  EF_DISPATCH_FLOAT(args.dtype, "matmul", [&] { gemm_typed<scalar_t>(args); });
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
