// The CUDA backend's softmax and log-softmax along the last dim.
#include "evenflow/engine/cuda/cuda_launch.cuh"

namespace evenflow::cuda_backend {
namespace {

// NaN wins from either side, so that every thread of a group reduces to the same maximum (the
// plain a > b ? a : b is not symmetric in NaN); a row holding a NaN then gives NaN, as in PyTorch.
struct MaxOf {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b || scalar::isnan_(a) ? a : b;
  }
};
// One group of K threads per row (K = 32 for rows of up to 1024 columns, else one block per row).
// Numerically stable: exp(x - max). Groups are whole warps or the whole block, so the row loop's
// condition is uniform where the group synchronizes.
template <int K, typename T>
__global__ void softmax_kernel(T* out, const T* x, int64_t rows, int64_t cols, bool log) {
  __shared__ T shared[K / 32];
  const int rows_per_block = static_cast<int>(blockDim.x) / K;
  const int lane = static_cast<int>(threadIdx.x) % K;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / K; row < rows;
       row += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const T* xr = x + row * cols;
    T* yr = out + row * cols;
    T max = -std::numeric_limits<T>::infinity();
    for (int64_t c = lane; c < cols; c += K) max = MaxOf{}(max, xr[c]);
    max = group_all_reduce<K>(max, MaxOf{}, shared);
    T sum = 0;
    for (int64_t c = lane; c < cols; c += K) sum += scalar::exp_(xr[c] - max);
    sum = group_all_reduce<K>(sum, SumOf{}, shared);
    if (log) {
      const T log_sum = scalar::log_(sum);
      for (int64_t c = lane; c < cols; c += K) yr[c] = xr[c] - max - log_sum;
    } else {
      for (int64_t c = lane; c < cols; c += K) yr[c] = scalar::exp_(xr[c] - max) / sum;
    }
  }
}

}  // namespace

void CudaBackend::softmax(const View& out, const View& x, bool log) {
  const auto gate_pass = activate();
  EF_ASSERT(out.dtype == x.dtype && x.ndim >= 1 && out.is_contiguous() && x.is_contiguous(),
            "softmax: operands must be contiguous and of one dtype");
  const int64_t cols = x.shape[x.ndim - 1];
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / cols;
  EF_DISPATCH_FLOAT(x.dtype, "softmax", [&] {
    auto* y = static_cast<scalar_t*>(out.data);
    const auto* xp = static_cast<const scalar_t*>(x.data);
    if (cols <= 1024) {
      constexpr int kRowsPerBlock = kThreads / 32;
      const int grid = static_cast<int>(std::min<int64_t>(ceil_div(rows, kRowsPerBlock), INT32_MAX));
      softmax_kernel<32, scalar_t><<<grid, kThreads, 0, stream_>>>(y, xp, rows, cols, log);
    } else {
      const int grid = static_cast<int>(std::min<int64_t>(rows, INT32_MAX));
      softmax_kernel<kBlockGroupThreads, scalar_t><<<grid, kBlockGroupThreads, 0, stream_>>>(y, xp, rows, cols, log);
    }
    EF_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace evenflow::cuda_backend
