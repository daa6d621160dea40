// The one place that knows whether the CUDA backend was built (EF_CUDA is always 0 or 1, so
// -Wundef catches a misspelling). Everything else asks a Device's context for its Backend.
#include <cstdlib>
#include <cstring>
#include <string>

#include "evenflow/engine/capture_internal.h"
#include "evenflow/engine/context_internal.h"
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

bool cpu_runs(const std::string& isa) {
  __builtin_cpu_init();
  // x86-64-v4 and x86-64-v3, as GCC's -march levels define them.
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
  if (isa == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("movbe");
  return isa == "baseline";
}

// The copy to run, chosen once: the widest this CPU runs, or the one EF_CPU_KERNELS names (so that
// tests can run the narrower copies on a wide CPU).
const CpuKernels& cpu_kernels() {
  static const CpuKernels chosen = [] {
    const CpuKernels copies[] = {{"avx512", cpu_backend::avx512::make_backend},
                                 {"avx2", cpu_backend::avx2::make_backend},
                                 {"baseline", cpu_backend::baseline::make_backend}};
    if (const char* forced = std::getenv("EF_CPU_KERNELS"); forced && *forced) {
      for (const CpuKernels& copy : copies) {
        if (copy.isa != std::string(forced)) continue;
        if (!cpu_runs(forced)) EF_ERROR("EF_CPU_KERNELS=", forced, ": this CPU cannot run the ", forced, " kernels");
        return copy;
      }
      EF_ERROR("EF_CPU_KERNELS=", forced, ": expected avx512, avx2 or baseline");
    }
    for (const CpuKernels& copy : copies)
      if (cpu_runs(copy.isa)) return copy;
    EF_ERROR("internal error: no CPU kernel copy for this CPU");
  }();
  return chosen;
}

}  // namespace

const char* cpu_kernels_isa() {
  return cpu_kernels().isa;
}

std::unique_ptr<Backend> make_cpu_backend() {
  return detail::make_recording_backend(cpu_kernels().make_backend());
}
#else
const char* cpu_kernels_isa() {
  // One copy, for the building machine: a request for another cannot be met.
  if (const char* forced = std::getenv("EF_CPU_KERNELS"); forced && *forced && std::string(forced) != "native")
    EF_ERROR("EF_CPU_KERNELS=", forced, ": this build has only the native kernels (built with EF_NATIVE=ON)");
  return "native";
}

std::unique_ptr<Backend> make_cpu_backend() {
  cpu_kernels_isa();  // refuses an EF_CPU_KERNELS it cannot honor
  return detail::make_recording_backend(cpu_backend::make_backend());
}
#endif

#if EF_CUDA
std::unique_ptr<Backend> make_cuda_backend(int logical_index, int physical_id) {
  return cuda_backend::make_backend(logical_index, physical_id);
}
int cuda_physical_device_count(std::string* why_none) {
  return cuda_backend::physical_device_count(why_none);
}
std::unique_ptr<detail::DeviceRecording> detail::begin_cuda_recording(const std::vector<Device>& devices) {
  std::vector<Backend*> backends;
  for (const Device& d : devices) backends.push_back(&context(d).backend());
  return cuda_backend::begin_recording(backends);
}
#else
std::unique_ptr<Backend> make_cuda_backend(int, int) {
  EF_ERROR("CUDA device requested, but evenflow was built without CUDA");
}
int cuda_physical_device_count(std::string* why_none) {
  *why_none = "evenflow was built without CUDA";
  return 0;
}
std::unique_ptr<detail::DeviceRecording> detail::begin_cuda_recording(const std::vector<Device>&) {
  EF_ERROR("internal error: CUDA devices in a build without CUDA");
}
#endif

void copy_between_devices(const Device& dst_device, void* dst, const Device& src_device, const void* src,
                          size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    detail::on_device_memory({dst_device, src_device}, [=] { std::memcpy(dst, src, nbytes); });
  } else if (src_device.is_cpu()) {
    detail::check_not_recording(dst_device, "a copy from host memory",
                                "the host's bytes would be read once, when the step is recorded; copy inputs "
                                "into the step's own buffers before replay() (Note [A step that can be replayed])");
    context(dst_device).backend().copy_from_host(dst, src, nbytes);
  } else if (dst_device.is_cpu()) {
    detail::check_not_recording(src_device, "a copy to host memory (item(), to(cpu()))",
                                "nothing has run while a step is recorded; read results after replay() "
                                "(read_later)");
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
