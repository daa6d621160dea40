// The CPU backend's unary ops (every UnaryOp of scalar_ops.h, float32 and float64): a loop per op
// and dtype, in a file of its own as on CUDA (cuda_unary.cu), so that they compile beside the other
// families.
#include "evenflow/engine/cpu/cpu_internal.h"
#include "evenflow/engine/cpu/vector_math.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

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

}  // namespace

void CpuBackend::unary(UnaryOp op, const View& out, const View& x, double a, double b) {
  unary_impl(op, out, x, a, b);
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
