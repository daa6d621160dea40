// The CPU backend's unary ops (every UnaryOp of scalar_ops.h, float32 and float64; AddScalar also int64): a loop per op
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
  // Other ops on int64 reach the dispatch below, which names the dtype it does not support.
  if (out.dtype == DType::Int64 && op == UnaryOp::AddScalar)
    return map_elements<int64_t, int64_t>(out, {x}, scalar::AddInteger(a));
  if (out.dtype == DType::Float32) {
    // Our own functions where glibc's are calls that keep a loop scalar: Note [Vectorized tanh],
    // Note [Vectorized float32 exp, log, sigmoid, softplus and elu].
    const auto map = [&](auto fn) { map_elements<float, float>(out, {x}, fn); };
    const auto fa = static_cast<float>(a), fb = static_cast<float>(b);
    switch (op) {
      case UnaryOp::Tanh:
        return map([](float v) { return tanh_vectorizable(v); });
      case UnaryOp::Exp:
        return map([](float v) { return exp_vectorizable(v); });
      case UnaryOp::Log:
        return map([](float v) { return log_vectorizable(v); });
      case UnaryOp::Sigmoid:
        return map([](float v) { return sigmoid_vectorizable(v); });
      case UnaryOp::Softplus:
        // beta 1 (PyTorch's default) in float32 where the copy has FMA, 1.5x the float64 path's speed;
        // other betas keep the float64 path, whose e^(a·x) / a reaches past float32's range.
        if (fa == 1.0f) return map([fb](float v) { return softplus_beta_one_vectorizable(v, fb); });
        return map([fa, fb](float v) { return softplus_vectorizable(v, fa, fb); });
      case UnaryOp::Elu:
        return map([fa](float v) { return elu_vectorizable(v, fa); });
      case UnaryOp::Erf:
        return map([](float v) { return erf_vectorizable(v); });
      default:
        break;
    }
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
