// The CUDA backend's fused multi-tensor Adam / AdamW step.
#include "evenflow/engine/cuda/cuda_launch.cuh"

namespace evenflow::cuda_backend {
namespace {

// The fused Adam step of AdamArgs (see engine/backend.h) on up to kAdamTensorsPerLaunch
// parameters per launch, passed by value in the kernel's parameters (no table to copy to the
// device first). Parameter k gets blocks [block_begin[k], block_begin[k + 1]) of the grid, one
// thread per element in a grid-stride loop over its own blocks.
constexpr int kAdamTensorsPerLaunch = 32;

template <typename T>
struct AdamLaunch {
  int count = 0;
  int block_begin[kAdamTensorsPerLaunch + 1] = {};
  int64_t n[kAdamTensorsPerLaunch] = {};
  T* p[kAdamTensorsPerLaunch] = {};
  const T* grad[kAdamTensorsPerLaunch] = {};
  T* m[kAdamTensorsPerLaunch] = {};
  T* v[kAdamTensorsPerLaunch] = {};
  T* v_max[kAdamTensorsPerLaunch] = {};  // null without amsgrad
};
static_assert(sizeof(AdamLaunch<double>) + 64 <= 4096, "kernel parameters are limited to 4 KiB");

template <typename T>
__global__ void adam_kernel(scalar::AdamScalars<T> given, const AdamArgs* in_device, AdamLaunch<T> l) {
  // A recorded step's scalars are read when the kernel runs (Note [Step scalars]).
  const scalar::AdamScalars<T> s = in_device ? scalar::adam_scalars<T>(*in_device) : given;
  int k = 0;
  while (k + 1 < l.count && static_cast<int>(blockIdx.x) >= l.block_begin[k + 1]) ++k;
  const int64_t blocks = l.block_begin[k + 1] - l.block_begin[k];
  const int64_t stride = blocks * blockDim.x;
  T* v_max = l.v_max[k];
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) - l.block_begin[k]) * blockDim.x + threadIdx.x; i < l.n[k];
       i += stride)
    scalar::adam_element(s, l.p[k][i], l.grad[k][i], l.m[k][i], l.v[k][i], v_max ? v_max + i : nullptr);
}

}  // namespace

void CudaBackend::adam(const AdamArgs& args, const std::vector<AdamOperands>& params) {
  const auto gate_pass = activate();
  if (params.empty()) return;
  EF_DISPATCH_FLOAT(params[0].param.dtype, "adam", [&] {
    using T = scalar_t;
    const auto scalars = scalar::adam_scalars<T>(args);
    AdamLaunch<T> l;
    const auto launch = [&] {
      if (l.count == 0) return;
      adam_kernel<T><<<l.block_begin[l.count], kThreads, 0, stream()>>>(scalars, args.in_device, l);
      EF_CUDA_CHECK_LAUNCH();
      l = AdamLaunch<T>{};
    };
    for (const AdamOperands& o : params) {
      const int64_t n = o.param.numel();
      if (n == 0) continue;
      const int k = l.count++;
      l.n[k] = n;
      l.p[k] = static_cast<T*>(o.param.data);
      l.grad[k] = static_cast<const T*>(o.grad.data);
      l.m[k] = static_cast<T*>(o.exp_avg.data);
      l.v[k] = static_cast<T*>(o.exp_avg_sq.data);
      l.v_max[k] = args.amsgrad ? static_cast<T*>(o.max_exp_avg_sq.data) : nullptr;
      l.block_begin[k + 1] = l.block_begin[k] + grid_for(*this, n);
      if (l.count == kAdamTensorsPerLaunch) launch();
    }
    launch();
  });
}

}  // namespace evenflow::cuda_backend
