// The CUDA backend's max pooling: forward with the argmax of each window, backward as a
// scatter_add of the gradient at those indices.
#include "evenflow/engine/cuda/cuda_launch.cuh"

namespace evenflow::cuda_backend {
namespace {

// --- Max pooling --------------------------------------------------------------------------------------

// One thread per output. Positions in the padding are skipped (padding never wins); among real
// positions the first maximum wins, and the first NaN wins over numbers (NaN propagates, as in PyTorch).
template <typename T>
__global__ void max_pool2d_kernel(PoolArgs a, T* out, int64_t* indices, const T* x, int64_t total) {
  for (int64_t i = thread_index(); i < total; i += grid_stride()) {
    const int64_t ow = i % a.ow, oh = (i / a.ow) % a.oh, plane = i / (a.ow * a.oh);
    const T* xp = x + plane * a.h * a.w;
    T best = -std::numeric_limits<T>::infinity();
    int64_t best_index = -1;
    for (int64_t ky = 0; ky < a.kh; ++ky) {
      const int64_t iy = oh * a.stride_h - a.pad_h + ky * a.dil_h;
      if (iy < 0 || iy >= a.h) continue;
      for (int64_t kx = 0; kx < a.kw; ++kx) {
        const int64_t ix = ow * a.stride_w - a.pad_w + kx * a.dil_w;
        if (ix < 0 || ix >= a.w) continue;
        const T v = xp[iy * a.w + ix];
        if (best_index < 0 || v > best || (scalar::isnan_(v) && !scalar::isnan_(best))) {
          best = v;
          best_index = iy * a.w + ix;
        }
      }
    }
    out[i] = best;
    indices[i] = best_index;
  }
}

}  // namespace

void CudaBackend::max_pool2d(const PoolArgs& args, const View& out, const View& indices, const View& x) {
  const auto gate_pass = activate();
  EF_ASSERT(out.dtype == x.dtype && indices.dtype == DType::Int64 && out.is_contiguous() && indices.is_contiguous() &&
                x.is_contiguous(),
            "max_pool2d: bad operands");
  const int64_t total = args.n * args.c * args.oh * args.ow;
  if (total == 0) return;
  EF_DISPATCH_FLOAT(x.dtype, "max_pool2d", [&] {
    max_pool2d_kernel<scalar_t><<<grid_for(*this, total), kThreads, 0, stream_>>>(
        args, static_cast<scalar_t*>(out.data), static_cast<int64_t*>(indices.data),
        static_cast<const scalar_t*>(x.data), total);
    EF_CUDA_CHECK_LAUNCH();
  });
}

// Zeros, then the scatter_add of every plane's gradient at its indices (the kernels the general
// scatter_add op runs).
void CudaBackend::max_pool2d_backward(const PoolArgs& args, const View& gx, const View& gy, const View& indices) {
  EF_ASSERT(gx.is_contiguous() && gy.is_contiguous() && indices.is_contiguous() && gx.dtype == gy.dtype &&
                indices.dtype == DType::Int64,
            "max_pool2d_backward: bad operands");
  fill(gx, 0.0);
  const int64_t n = args.n, c = args.c;
  scatter_add(contiguous_view(gx.data, gx.dtype, {n, c, args.h * args.w}), 2,
              contiguous_view(indices.data, DType::Int64, {n, c, args.oh * args.ow}),
              contiguous_view(gy.data, gy.dtype, {n, c, args.oh * args.ow}));
}

}  // namespace evenflow::cuda_backend
