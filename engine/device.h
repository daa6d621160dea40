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

/// The kind of a device: CPU (a host device with its own worker thread, allocator statistics and
/// generator) or CUDA (a logical device on a GPU).
enum class DeviceType : uint8_t { CPU, CUDA };

/// A device name: a type and an index, e.g. cpu:0 or cuda:1. A plain value: whether the device exists
/// is checked where it is used (check_device). A string such as "cuda:1" converts to it implicitly.
struct Device {
  DeviceType type = DeviceType::CPU;  ///< CPU or CUDA.
  int index = 0;                      ///< The index among the devices of its type, from 0.

  Device() = default;  ///< cpu:0.
  /// Device `i` of type `t` (not checked).
  Device(DeviceType t, int i) : type(t), index(i) {}
  /// Parses "cpu", "cpu:2", "cuda", "cuda:1"; throws ef::Error on anything else.
  explicit Device(const std::string& spec);
  /// As Device(const std::string&), but implicit, so that a literal such as "cuda:0" is a Device.
  Device(const char* spec) : Device(std::string(spec)) {}  // NOLINT: "cuda:0" reads naturally

  bool is_cpu() const { return type == DeviceType::CPU; }    ///< Whether it is a CPU device.
  bool is_cuda() const { return type == DeviceType::CUDA; }  ///< Whether it is a CUDA device.
  std::string str() const;                                   ///< "cpu:0", "cuda:1": the form the constructor parses.
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }  ///< Same type and index.
  bool operator!=(const Device& o) const { return !(*this == o); }                       ///< Not the same device.
  /// CPU devices before CUDA devices, then by index (so that a Device can key a std::map).
  bool operator<(const Device& o) const { return type != o.type ? type < o.type : index < o.index; }
};

/// CPU device `index`: cpu:0 by default (not checked; see kMaxCpuDevices).
inline Device cpu(int index = 0) {
  return {DeviceType::CPU, index};
}
/// CUDA logical device `index`: cuda:0 by default (not checked; see cuda_device_count()).
inline Device cuda(int index = 0) {
  return {DeviceType::CUDA, index};
}

/// The number of CPU devices: cpu:0 to cpu:63 exist; another index is an ef::Error where it is used.
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
/// last bits from run to run), chosen by cuDNN's heuristics (torch.backends.cudnn.benchmark = False).
/// float64 is never affected. The CPU backend ignores them. Set them before the work they should
/// govern; each convolution shape chooses its algorithm once per setting.
struct CudaMath {
  bool allow_tf32_conv = true;     ///< float32 convolutions may use TF32 tensor cores.
  bool allow_tf32_matmul = false;  ///< float32 matrix products may use TF32 tensor cores.
  /// cuDNN convolutions use only algorithms that repeat bit for bit (an ef::Error names a
  /// convolution for which cuDNN has none).
  bool deterministic = false;
  /// A convolution shape's first call times every candidate algorithm on its operands and keeps
  /// the fastest, where the heuristics' first choice can be much slower (PyTorch's cudnn.benchmark;
  /// docs/gpu.md, "2026-11-26, NVIDIA H200", run 1): for training, whose shapes repeat. The choice
  /// may differ from run to run.
  /// With bfloat16 compute it also chooses between cuDNN's bfloat16 kernels and the float32 ones
  /// (Note [bfloat16 convolutions on cuDNN] in engine/cuda/cuda_conv_plans.cu).
  bool benchmark = false;
  /// Convolutions with bfloat16 compute (Note [bfloat16 compute] in engine/ops.h) may round their
  /// result to bfloat16 before it is widened into the float32 output (about 4e-3 relative, as
  /// autocast's bfloat16 convolutions give it), where cuDNN's kernels with a bfloat16 result run
  /// faster than the float32-result ones: taken by the timed choice alone (with `benchmark`). Off:
  /// a bfloat16 convolution's result is its float32 sum, on CUDA as on the CPU.
  bool allow_bf16_conv_results = false;
};
CudaMath cuda_math();  ///< The current settings.
/// Replaces the settings, for every CUDA device (thread-safe: one atomic word).
void set_cuda_math(const CudaMath& settings);

/// Throws ef::Error naming the device when it does not exist here.
void check_device(const Device& d);

/// Blocks until all queued work on `d` is done.
void synchronize(const Device& d);

/// Seeds every device's generator (and the default for devices created later).
void manual_seed(uint64_t seed);
/// Seeds device `d`'s generator: its state becomes {seed, 0}. ef::Error for a device that does not
/// exist.
void manual_seed(const Device& d, uint64_t seed);

/// A device's generator state: draws are a pure function of (seed, offset), see engine/random_internal.h.
struct GeneratorState {
  uint64_t seed = 0;    ///< The key of the draws (manual_seed sets it).
  uint64_t offset = 0;  ///< The counter of the next draw; each random element drawn advances it by one.
};
/// Device `d`'s generator state now, e.g. to save it in a checkpoint.
GeneratorState generator_state(const Device& d);
/// Restores a state taken with generator_state(): the draws that follow repeat those that followed
/// it.
void set_generator_state(const Device& d, const GeneratorState& state);

/// Intra-op threads a CPU device's kernels use (default: hardware threads). Applies to every CPU
/// device; N CPU devices running concurrently share the machine's cores. ef::Error when n < 1.
void set_num_threads(int n);
/// The intra-op thread count: set_num_threads()'s, or the hardware thread count if it was not called.
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
