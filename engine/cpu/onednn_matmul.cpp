// Matrix products through oneDNN's matmul primitive (onednn_matmul.h): one primitive per shape,
// layout, compute type and team size, created once and kept (onednn_plan.h), like the
// convolutions'.
#include "evenflow/engine/cpu/onednn_matmul.h"

#include <algorithm>

#include "evenflow/engine/cpu/onednn_plan.h"
#include "evenflow/engine/cpu/threads.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

using Dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

// A [rows, cols] matrix of `type` as stored: row-major with leading dimension ld, or its transpose.
dnnl::memory::desc matrix(int64_t rows, int64_t cols, bool trans, int64_t ld, dt type) {
  return dnnl::memory::desc({rows, cols}, type, trans ? Dims{1, ld} : Dims{ld, 1});
}

OnednnPlan make_plan(const GemmArgs& g) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // Our operands as they are stored, and those the primitive runs on: with float32 compute the same
  // (no reorders).
  const dnnl::memory::desc a = matrix(g.m, g.k, g.trans_a, g.lda, dt::f32),
                           b = matrix(g.k, g.n, g.trans_b, g.ldb, dt::f32), c = matrix(g.m, g.n, false, g.ldc, dt::f32);
  dnnl::memory::desc a_used = a, b_used = b;
  if (g.compute == DType::BFloat16) {
    using Tag = dnnl::memory::format_tag;
    // Both operands in bfloat16 (the reorders round them), C written in place in float32, each
    // operand in the layout the primitive picks -- but the B of a product with few rows and a long
    // inner dimension, which stays dense in its own layout, transposed or not (the reorder then only
    // converts). Rounding it into the primitive's blocked layout moves every element of B, a cost
    // against the product's that grows as C's rows shrink, and the blocked layout bought nothing on
    // those shapes: the backward's transposed B of classify's fully connected layer ([100, 1024] x
    // [1024, 3136]ᵀ, Zen 4, 2 threads) took 2.1 ms to reorder for a 1.5 ms product; the forward of
    // matmul_100x3136x1024 1.0 ms to reorder for a 1.69 ms product, 0.37 ms to convert dense for a
    // 1.68 ms one. Dense B, against blocked, on m <= 256, k >= 1024: forwards 1.05-2.0x the rate,
    // forward+backward the same to 1.3x (six shapes, docs/benchmarks.md, "Small products' B left
    // dense"). With an inner dimension of 128 (wgan_gp's generator's Linear, [64, 128] x [128,
    // 3136]ᵀ) dense took 1.37x the time, and on 1024 x 1024 x 1024 1.03x, so the blocked layout stays
    // there (docs/benchmarks.md, "The engine on AVX-512").
    const bool b_stays_dense = g.m <= 256 && g.k >= 1024;
    a_used = dnnl::memory::desc({g.m, g.k}, dt::bf16, Tag::any);
    b_used = b_stays_dense ? matrix(g.k, g.n, g.trans_b, g.trans_b ? g.k : g.n, dt::bf16)
                           : dnnl::memory::desc({g.k, g.n}, dt::bf16, Tag::any);
  }
  const dnnl::matmul::primitive_desc pd(onednn_engine(), a_used, b_used, c, attr);
  OnednnPlan plan;
  plan.primitive = dnnl::matmul(pd);
  plan.in0 = {DNNL_ARG_SRC, a, pd.src_desc(), {}, 0};
  plan.in1 = {DNNL_ARG_WEIGHTS, b, pd.weights_desc(), {}, 0};
  plan.out = {DNNL_ARG_DST, c, pd.dst_desc(), {}, 0};
  finish_plan(plan, pd.scratchpad_desc(), attr);
  return plan;
}

// Keyed by m, n, k, the transposes, the leading dimensions, the compute type and the team size.
const OnednnPlan& plan_for(const GemmArgs& g, int threads) {
  static OnednnPlanCache<10> plans;
  return plans.get({g.m, g.n, g.k, g.trans_a, g.trans_b, g.lda, g.ldb, g.ldc, static_cast<int64_t>(g.compute), threads},
                   [&] { return make_plan(g); });
}

}  // namespace

bool onednn_takes_bf16_gemm(const GemmArgs& g) {
  // Without bfloat16 instructions oneDNN would convert back to float32 for every product: the
  // rounded operands on the float32 GEMM are then the faster way to the same products.
  static const bool bf16_isa = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_bf16;
  // A product with a side under 16 (a vector times a matrix, an outer product) is bound by memory,
  // not arithmetic, and the reorders that round its float32 operands into the primitive's blocked
  // layouts cost more than the product, many times more for the wgan_gp critic's last layer's
  // weight gradient, [1, 64] x [64, 3136] (docs/benchmarks.md, "Small products off oneDNN"). Those
  // take the rounded operands on the float32 GEMM.
  constexpr int64_t kMinSide = 16;
  return bf16_isa && g.dtype == DType::Float32 && g.alpha == 1.0 && g.beta == 0.0 && g.m >= kMinSide &&
         g.n >= kMinSide && g.k >= kMinSide && g.ldc >= g.n;
}

// Note [float32 products with B transposed]
// oneDNN's sgemm (3.2, AVX-512) multiplies by a transposed B far slower than by a plain one when C
// has few rows: the backward's g·Bᵀ of matmul_100x3136x1024 ([100, 1024] x [3136, 1024]ᵀ) ran at
// 86-91 GFLOP/s against 215-222 for the same product with B plain, and PyTorch's MKL at 128-153.
// The matmul primitive (brgemm), given the operands as they are stored, ran the transposed
// products in 0.17-0.89 of sgemm's time with 16 to 768 rows of C and an inner dimension of 512 and
// more (0.49 on that one), and the same to 1.08x its time elsewhere: 1024 and 4096 rows, fewer than
// 16 rows, an inner dimension of 128 (1.4x), or a plain B (docs/benchmarks.md, "float32 products
// with B transposed"). A linear layer's forward, x·Wᵀ, is such a product too. With both operands
// plain the primitive also won where the inner dimension is long and C has 64 to 512 rows: on an
// Intel Xeon with AMX (2 threads) 100 x 3136 x 1024 at 304-319 GFLOP/s against sgemm's 254-260,
// 100 x 2048 x 1024 1.15x, 64 x 3136 x 128 1.07x, 256 x 3136 x 1024 1.03x, on the Zen 4 0.87 and
// 0.86 of sgemm's time on the first and third; with 16 or 32 rows it lost (0.72-0.87x sgemm's rate
// on the Xeon, as on the Zen 4 with an inner dimension of 1024), and with 768 it tied
// (docs/benchmarks.md, "The whole table on an Intel Xeon with AMX"). Measured on AVX-512 only;
// AVX2 builds keep sgemm (and packed_matmul, cpu_gemm.cpp).
bool onednn_takes_f32_gemm(const GemmArgs& g) {
#if defined(__AVX512F__)
  // The Note's two rules: a transposed B, or plain A and B with a long inner dimension.
  const bool shape_fits =
      g.trans_b ? g.m >= 16 && g.m <= 768 && g.k >= 512 : !g.trans_a && g.m >= 64 && g.m <= 512 && g.k >= 2048;
  return g.dtype == DType::Float32 && g.compute == DType::Float32 && g.alpha == 1.0 && g.beta == 0.0 && shape_fits &&
         g.n >= 16 && g.ldc >= g.n;
#else
  (void)g;
  return false;
#endif
}

void onednn_gemm(const GemmArgs& g) {
  EF_ASSERT(g.compute == DType::BFloat16 ? onednn_takes_bf16_gemm(g) : onednn_takes_f32_gemm(g),
            "onednn_gemm: a case it does not take");
  try {
    const int threads = std::max(1, kernel_threads());
    set_team_size(threads);  // before the plan is made: onednn_plan.h
    const OnednnPlan& plan = plan_for(g, threads);
    const float* a = static_cast<const float*>(g.a);
    const float* b = static_cast<const float*>(g.b);
    float* c = static_cast<float*>(g.c);
    for (int64_t i = 0; i < g.batch; ++i)
      execute_plan(plan, threads, a + i * g.stride_a, b + i * g.stride_b, c + i * g.stride_c);
  } catch (const dnnl::error& e) {
    EF_ERROR("matmul: oneDNN's ", g.compute == DType::BFloat16 ? "bfloat16" : "float32", " matmul failed (", e.what(),
             ", status ", static_cast<int>(e.status), ") on [", g.m, ", ", g.k, "] x [", g.k, ", ", g.n, "]");
  }
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
