/// @file
/// Devices. `cpu:i` and `cuda:i` name logical devices. CPU devices are real, separate devices: each
/// has its own worker thread, allocator statistics and generator, so the whole multi-device engine
/// runs on a machine without a GPU. A CUDA logical device is a physical GPU plus a stream, library
/// handles and a worker thread; several logical devices may share one GPU (see Note [Logical CUDA
/// devices] in device.cpp).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace evenflow {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  Device() = default;
  Device(DeviceType t, int i) : type(t), index(i) {}
  /// Parses "cpu", "cpu:2", "cuda", "cuda:1"; throws ef::Error on anything else.
  explicit Device(const std::string& spec);
  Device(const char* spec) : Device(std::string(spec)) {}  // NOLINT: "cuda:0" reads naturally

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  bool operator<(const Device& o) const { return type != o.type ? type < o.type : index < o.index; }
};

inline Device cpu(int index = 0) {
  return {DeviceType::CPU, index};
}
inline Device cuda(int index = 0) {
  return {DeviceType::CUDA, index};
}

inline constexpr int kMaxCpuDevices = 64;

/// Number of CUDA logical devices (0 without a GPU or a CUDA build; never throws).
int cuda_device_count();
/// Why there are no CUDA devices ("built without CUDA", the driver's message, ...); empty if any.
std::string cuda_unavailable_reason();
/// Maps logical CUDA devices to physical GPUs, e.g. {0, 0, 0, 0}: four logical devices on GPU 0.
/// Must be called before any CUDA device is used. Also read from EF_CUDA_DEVICES="0,0,0,0".
void set_cuda_logical_devices(const std::vector<int>& physical_ids);
/// The physical GPU behind a logical CUDA device (ef::Error for a CPU or unknown device).
int cuda_physical_id(const Device& d);

/// Note [CUDA math settings]
/// How float32 matrix products and convolutions run on CUDA devices, process-wide, with PyTorch's
/// defaults: convolutions may use TF32 tensor cores (torch.backends.cudnn.allow_tf32 = True: inputs
/// rounded to a 10-bit mantissa, about 1e-3 relative), matrix products may not
/// (torch.backends.cuda.matmul.allow_tf32 = False), and cuDNN takes its fastest algorithm even where
/// it sums with atomics (torch.backends.cudnn.deterministic = False: float sums may differ in the
/// last bits from run to run). float64 is never affected. The CPU backend ignores them. Set them
/// before the work they should govern; each convolution shape chooses its algorithm once per setting.
struct CudaMath {
  bool allow_tf32_conv = true;
  bool allow_tf32_matmul = false;
  bool deterministic = false;
};
CudaMath cuda_math();
void set_cuda_math(const CudaMath& settings);

/// Throws ef::Error naming the device when it does not exist here.
void check_device(const Device& d);

/// Blocks until all queued work on `d` is done.
void synchronize(const Device& d);

/// Seeds every device's generator (and the default for devices created later).
void manual_seed(uint64_t seed);
void manual_seed(const Device& d, uint64_t seed);

/// A device's generator state: draws are a pure function of (seed, offset), see engine/random.h.
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};
GeneratorState generator_state(const Device& d);
void set_generator_state(const Device& d, const GeneratorState& state);

/// Intra-op threads a CPU device's kernels use (default: hardware threads). Applies to every CPU
/// device; N CPU devices running concurrently share the machine's cores.
void set_num_threads(int n);
int num_threads();
/// The team the CPU kernels called on this thread use: num_threads(), or 1 on a thread that is not a
/// device's worker once a CPU device has one (Note [One OpenMP team per core], device.cpp).
int kernel_threads();
/// Whether some CPU device has started its worker thread (from then on kernel_threads() is 1 off
/// the workers).
bool cpu_workers_started();
/// Which copy of the CPU kernels this build runs: "native" (built with -march=native for the
/// building machine), or in a portable build (EF_NATIVE=OFF) the widest this CPU supports:
/// "avx512", "avx2" or "baseline" (Note [CPU kernels per instruction set], engine/CMakeLists.txt).
const char* cpu_kernels_isa();

}  // namespace evenflow
