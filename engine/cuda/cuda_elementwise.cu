// The CUDA backend's elementwise entry points but the unary ops (cuda_unary.cu): fill, arange, copy
// (with dtype casts), binary ops, where, random numbers.
#include "evenflow/engine/cuda/cuda_elementwise.cuh"

namespace evenflow::cuda_backend {

void CudaBackend::fill(const View& out, double value) {
  const auto gate_pass = activate();
  EF_DISPATCH_STORAGE(out.dtype, "fill",
                      [&] { map<scalar_t>(*this, Constant<scalar_t>{CastTo<scalar_t>{}(value)}, out); });
}

void CudaBackend::arange(const View& out, double start, double step) {
  const auto gate_pass = activate();
  EF_DISPATCH_ALL(out.dtype, "arange", [&] { generate<scalar_t>(*this, out, Arange<scalar_t>{start, step}); });
}

void CudaBackend::copy(const View& out, const View& x) {
  const auto gate_pass = activate();
  check_same_shape(out, x);
  const auto ix = make_indexer<2>(out.ndim, out.shape, {out.strides, x.strides});
  if (out.dtype == x.dtype && ix.contiguous()) {
    const size_t nbytes = static_cast<size_t>(out.numel()) * dtype_size(out.dtype);
    if (nbytes > 0) EF_CUDA_CHECK(cudaMemcpyAsync(out.data, x.data, nbytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  EF_DISPATCH_STORAGE(out.dtype, "copy", [&] { copy_cast<scalar_t>(*this, out, x); });
}

void CudaBackend::binary(BinaryOp op, const View& out, const View& x, const View& y, double a) {
  const auto gate_pass = activate();
  EF_ASSERT(out.dtype == x.dtype && out.dtype == y.dtype, "binary: mixed dtypes");
  EF_DISPATCH_ALL(out.dtype, "binary op", [&] {
    visit_binary(op, a, [&](auto fn) { map<scalar_t, scalar_t, scalar_t>(*this, fn, out, x, y); });
  });
}

void CudaBackend::where(const View& out, const View& cond, const View& x, const View& y) {
  const auto gate_pass = activate();
  EF_ASSERT(out.dtype == x.dtype && out.dtype == y.dtype, "where: mixed dtypes");
  EF_DISPATCH_ALL(out.dtype, "where", [&] { select<scalar_t>(*this, out, cond, x, y); });
}

void CudaBackend::random(const View& out, RandomKind kind, double a, double b, const RandomKey& key) {
  const auto gate_pass = activate();
  EF_DISPATCH_ALL(out.dtype, "random", [&] {
    generate<scalar_t>(*this, out,
                       RandomDraw<scalar_t>{static_cast<int>(kind), a, b, key.seed, key.offset, key.in_device});
  });
}

}  // namespace evenflow::cuda_backend
