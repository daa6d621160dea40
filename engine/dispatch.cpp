// The one place that knows whether the CUDA backend was built (EF_CUDA is always 0 or 1, so
// -Wundef catches a misspelling). Everything else asks a Device's context for its Backend.
#include <cstring>

#include "evenflow/engine/context.h"
#include "evenflow/engine/cpu/cpu_backend.h"
#include "evenflow/engine/error.h"

#if EF_CUDA
#include "evenflow/engine/cuda/cuda_backend.h"
#endif

namespace evenflow {

std::unique_ptr<Backend> make_cpu_backend() {
  return cpu_backend::make_backend();
}

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
