// The one place that knows whether the CUDA backend was built (EF_CUDA is always 0 or 1, so
// -Wundef catches a misspelling). Everything else asks a Device's context for its Backend.
#include <cstring>

#include "evenflow/engine/context.h"
#include "evenflow/engine/cpu/cpu_backend.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/error.h"

#if EF_CUDA
#include "evenflow/engine/cuda/cuda_backend.h"
#endif

namespace evenflow {

// Note [CPU kernels per instruction set] (engine/CMakeLists.txt): a portable build holds three
// copies of the CPU kernels; the widest one this CPU runs is taken.
#if EF_CPU_DISPATCH
namespace cpu_backend::baseline {
std::unique_ptr<Backend> make_backend();
}
namespace cpu_backend::avx2 {
std::unique_ptr<Backend> make_backend();
}
namespace cpu_backend::avx512 {
std::unique_ptr<Backend> make_backend();
}

namespace {

struct CpuKernels {
  const char* isa;
  std::unique_ptr<Backend> (*make_backend)();
};

// The copy this CPU runs, found once.
const CpuKernels& cpu_kernels() {
  static const CpuKernels chosen = [] {
    __builtin_cpu_init();
    // x86-64-v4 and x86-64-v3, as GCC's -march levels define them.
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
      return CpuKernels{"avx512", cpu_backend::avx512::make_backend};
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
        __builtin_cpu_supports("f16c") && __builtin_cpu_supports("movbe"))
      return CpuKernels{"avx2", cpu_backend::avx2::make_backend};
    return CpuKernels{"baseline", cpu_backend::baseline::make_backend};
  }();
  return chosen;
}

}  // namespace

const char* cpu_kernels_isa() {
  return cpu_kernels().isa;
}

std::unique_ptr<Backend> make_cpu_backend() {
  return cpu_kernels().make_backend();
}
#else
const char* cpu_kernels_isa() {
  return "native";
}

std::unique_ptr<Backend> make_cpu_backend() {
  return cpu_backend::make_backend();
}
#endif

#if EF_CUDA
std::unique_ptr<Backend> make_cuda_backend(int logical_index, int physical_id) {
  return cuda_backend::make_backend(logical_index, physical_id);
}
int cuda_physical_device_count(std::string* why_none) {
  return cuda_backend::physical_device_count(why_none);
}
#else
std::unique_ptr<Backend> make_cuda_backend(int, int) {
  EF_ERROR("CUDA device requested, but evenflow was built without CUDA");
}
int cuda_physical_device_count(std::string* why_none) {
  *why_none = "evenflow was built without CUDA";
  return 0;
}
#endif

void copy_between_devices(const Device& dst_device, void* dst, const Device& src_device, const void* src,
                          size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
  } else if (src_device.is_cpu()) {
    context(dst_device).backend().copy_from_host(dst, src, nbytes);
  } else if (dst_device.is_cpu()) {
    context(src_device).backend().copy_to_host(dst, src, nbytes);
  } else {
#if EF_CUDA
    cuda_backend::copy_peer(context(dst_device).backend(), dst, context(src_device).backend(), src, nbytes);
#else
    EF_ERROR("internal error: CUDA tensors in a build without CUDA");
#endif
  }
}

}  // namespace evenflow
