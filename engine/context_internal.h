// The per-device state behind a Device: its backend, allocator, generator and worker thread.
// Contexts are created on first use and never destroyed (see registry() in device.cpp).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "evenflow/engine/allocator.h"
#include "evenflow/engine/backend.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/worker_internal.h"

namespace evenflow {

namespace detail {
struct Capture;
}

class Generator {
 public:
  explicit Generator(uint64_t seed) : state_{seed, 0} {}
  // Reserves n consecutive samples; returns the state to draw them from.
  GeneratorState reserve(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    GeneratorState s = state_;
    state_.offset += n;
    return s;
  }
  GeneratorState state() {
    std::lock_guard<std::mutex> lock(mu_);
    return state_;
  }
  void set_state(const GeneratorState& s) {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = s;
  }

 private:
  std::mutex mu_;
  GeneratorState state_;
};

class DeviceContext {
 public:
  DeviceContext(Device device, std::unique_ptr<Backend> backend, uint64_t seed);

  Device device() const { return device_; }
  Backend& backend() { return *backend_; }
  CachingAllocator& allocator() { return *allocator_; }
  Generator& generator() { return generator_; }
  Worker& worker();
  // The StepGraph capture recording this device's work, or nullptr (engine/capture_internal.h).
  detail::Capture* capture() const { return capture_.load(std::memory_order_acquire); }
  void set_capture(detail::Capture* c) { capture_.store(c, std::memory_order_release); }

 private:
  Device device_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CachingAllocator> allocator_;
  Generator generator_;
  std::once_flag worker_once_;
  std::unique_ptr<Worker> worker_;
  std::atomic<detail::Capture*> capture_{nullptr};
};

// The context of a device, created on first use. Throws ef::Error for a device that does not exist.
DeviceContext& context(const Device& d);

// Backends, made in dispatch.cpp (the one place that knows whether CUDA was built).
std::unique_ptr<Backend> make_cpu_backend();
std::unique_ptr<Backend> make_cuda_backend(int logical_index, int physical_id);
int cuda_physical_device_count(std::string* why_none);
// Copies nbytes between contiguous buffers on two different devices (either may be CPU or CUDA).
void copy_between_devices(const Device& dst_device, void* dst, const Device& src_device, const void* src,
                          size_t nbytes);

}  // namespace evenflow
