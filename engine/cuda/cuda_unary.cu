// The CUDA backend's unary ops (every UnaryOp of scalar_ops.h, float32 and float64; AddScalar also int64): the largest
// family of kernel instantiations, in a file of its own so that it compiles beside the others.
#include "evenflow/engine/cuda/cuda_elementwise.cuh"

namespace evenflow::cuda_backend {

void CudaBackend::unary(UnaryOp op, const View& out, const View& x, double a, double b) {
  const auto gate_pass = activate();
  EF_ASSERT(out.dtype == x.dtype, "unary: output ", dtype_name(out.dtype), ", input ", dtype_name(x.dtype));
  if (out.dtype == DType::Int64 && op == UnaryOp::AddScalar)
    return map<int64_t, int64_t>(*this, scalar::AddInteger(a), out, x);
  EF_DISPATCH_FLOAT(out.dtype, "unary op", [&] {
    visit_unary(op, [&](auto fn) { map<scalar_t, scalar_t>(*this, BoundUnary<decltype(fn)>{fn, a, b}, out, x); });
  });
}

}  // namespace evenflow::cuda_backend
