// The engine's side of recording a step (Note [A step that can be replayed] in step_graph.h): what
// a capture in progress holds, and the calls through which the rest of the library keeps the step's
// contract -- host work that must happen at every replay (each_step), per-step scalars the kernels
// read from device memory (step_scalars), host code that touches CPU devices' memory
// (on_device_memory), and the checks that refuse what cannot be replayed (check_not_recording).
// Internal: the public face is step_graph.h (StepGraph, each_step).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/tensor.h"

namespace evenflow::detail {

// A CPU device's recorded kernel call, with the OpenMP team size its caller would have used (Note
// [Recording CPU devices] in cpu_recording.cpp).
struct RecordedCall {
  std::function<void()> run;
  int kernel_threads = 1;
};

// One capture: made by StepGraph::capture, kept by the StepGraph for its replays.
struct Capture {
  std::vector<Device> devices;
  uint64_t pool = 0;  // the allocator pool its tensors come from (CachingAllocator::begin_pool)

  std::mutex mu;  // guards everything below while the step is being recorded (several threads)
  // Host work of the step, in the order the step did it, applied at each replay before the device
  // work runs (each_step, step_scalars).
  std::vector<std::function<void()>> effects;
  // The step's scalars (Note [Step scalars]): their host image, written by the effects at each
  // replay and then copied to `scalars_device` on devices[0] in one copy.
  std::vector<unsigned char> scalars_host;
  void* scalars_device = nullptr;
  size_t scalars_capacity = 0;
  // CPU devices: the recorded kernel calls, in the order they were made.
  std::vector<RecordedCall> calls;
  // What broke the step's contract, if anything did (the first), reported when capture() ends.
  std::string violation;

  // Keeps `message` as the violation (the first one) and throws it as an ef::Error: the step may
  // catch it, and capture() reports it all the same.
  [[noreturn]] void refuse(const std::string& message);
};

// The number of captures in progress in the process: checks on hot paths test it first.
extern std::atomic<int> g_recording;

// Note [The step's threads]
// What a step does runs on the thread that calls StepGraph::capture or warm_up and on the threads
// that run the tasks it posts (the devices' workers: DeviceGroup::run, the backward passes), while
// other threads may work on the same devices meanwhile -- a data loader filling the next batch on
// cpu:0. So a recording, and the pool a step allocates from, belong to the step's threads: each
// thread carries whether it works for a step, and Worker::post hands the poster's state to its task.
// Only the step's allocations come from its pool, only its calls are recorded, only its host reads
// are refused. (A CUDA stream cannot tell threads apart: while a step is recorded, other threads'
// work waits at the CUDA backend's gate, Note [Work beside a recording] in cuda/recording_gate.h.)
class StepConversions;
struct StepThread {
  Capture* capture = nullptr;              // the recording this thread works for
  bool in_step = false;                    // allocations on a device with a pool in use come from it
  StepConversions* conversions = nullptr;  // the step's kept conversions (Note [Conversions kept for a step])
};
StepThread step_thread();            // the calling thread's
void set_step_thread(StepThread s);  // sets the calling thread's

// Note [Conversions kept for a step]
// Under bfloat16 compute a convolution's weight is converted for each pass that multiplies it, and
// a training step multiplies the same weight many times: a critic's on the real, generated and
// interpolated batches of each critic step, a generator's in every critic step and in its own. A
// ConvOperand (ops/conv.cpp) shares a copy within one op and its backward only. So one call of a
// step (StepGraph::warm_up and capture, ReplayedStep's eager calls) keeps each weight's conversion
// until it ends: a later pass over the same view of the same storage at the same version uses the
// copy, and an optimizer's update (which bumps the version) makes the next pass convert again. The
// values are the same either way (a conversion is a function of the bits); what changes is the
// number of kernel calls, the nodes of a recorded step (docs/benchmarks.md, "A weight converted once
// a step"). Nothing is kept past the call: a replay changes weights without advancing the host's
// version counters, and the host may write a tensor through data() without bumping its version.
// Only leaves are kept -- the parameters -- as a computed weight is used by one op and its backward,
// and keeping it would hold its memory to the step's end.
class StepConversions {
 public:
  // What a conversion makes: `kind` tells conversions of one tensor apart (the caller's enum),
  // `format` the copy's layout.
  struct Key {
    int kind = 0;
    MemoryFormat format = MemoryFormat::Contiguous;
    bool operator==(const Key&) const = default;
  };
  // The copy `convert` makes of `t`, made now or kept from an earlier call with the same view of
  // t's storage at t's version and the same key. Thread-safe: a step's threads share it.
  Tensor get(const Tensor& t, Key key, const std::function<Tensor()>& convert);

 private:
  struct Entry {
    Tensor source;  // keeps its storage, so no other tensor can take its address while kept
    uint64_t version = 0;
    Key key;
    Tensor copy;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
};
// The conversions of the step the calling thread works for, or nullptr outside a step.
StepConversions* step_conversions();

// The capture in progress on `d` that the calling thread works for, or nullptr.
Capture* capture_of(const Device& d);

// Scalars that change from step to step (a random draw's seed and offset, Adam's step size and bias
// corrections; Note [Step scalars]): `bytes` of device memory, 16-byte aligned, that `fill` writes at
// each replay (in the order of each_step) and the captured kernels read when they run. Returns
// their device address; nullptr outside a capture (then pass the values themselves).
const void* step_scalars(const Device& d, size_t bytes, std::function<void(void* host)> fill);

// Host code that reads or writes the memory of CPU devices directly (not through a backend): run
// now, or, inside a capture of those devices, recorded and run at each replay in its place among the
// kernel calls. `devices` are the devices whose memory fn touches.
void on_device_memory(const std::vector<Device>& devices, std::function<void()> fn);

// ef::Error when `d` is being recorded: `what` ("copy_to_host", "item()") cannot be part of a step
// that is replayed; `why` says what to do instead.
void check_not_recording(const Device& d, const char* what, const char* why);

// A recording of a step's device work as a backend keeps it: for CUDA devices one CUDA graph of
// their streams (cuda/cuda_graph.cu); for CPU devices the Capture's calls (cpu_recording.cpp).
class DeviceRecording {
 public:
  virtual ~DeviceRecording() = default;
  // Ends the recording; ef::Error when the devices refused the work (the runtime's reason).
  virtual void end() = 0;
  // Ends it after the step failed, keeping nothing. Never throws.
  virtual void abandon() noexcept = 0;
  // Runs the recorded work (queued on CUDA devices).
  virtual void replay() = 0;
  // Kernel calls or graph nodes recorded.
  virtual int64_t size() const = 0;
};
// The CPU kernels behind a backend that records their calls while a capture is active (Note
// [Recording CPU devices] in cpu_recording.cpp): what make_cpu_backend gives every CPU device.
std::unique_ptr<Backend> make_recording_backend(std::unique_ptr<Backend> kernels);

// Starts recording the calls of CPU devices into `capture` (cpu_recording.cpp).
std::unique_ptr<DeviceRecording> begin_cpu_recording(const std::vector<Device>& devices, Capture* capture);

// Starts recording the work of CUDA logical devices of one GPU (dispatch.cpp: ef::Error in a build
// without CUDA).
std::unique_ptr<DeviceRecording> begin_cuda_recording(const std::vector<Device>& devices);

// Tags the calling thread's kernel calls with a team size (replays restore the recorded one).
class KernelThreadsGuard {
 public:
  explicit KernelThreadsGuard(int n);
  ~KernelThreadsGuard();
  KernelThreadsGuard(const KernelThreadsGuard&) = delete;
  KernelThreadsGuard& operator=(const KernelThreadsGuard&) = delete;

 private:
  int previous_;
};

}  // namespace evenflow::detail
