// Keeps the work of threads that do not take part in a recorded step out of its CUDA graph (Note
// [Work beside a recording]). Host code only -- no CUDA in this header -- so that its ordering is
// tested on machines without a GPU (tests/engine/test_recording_gate.cpp); the CUDA backend has one
// for the process (recording_gate() in cuda_backend.cu).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "evenflow/engine/error.h"

namespace evenflow::cuda_backend {

// Note [Work beside a recording]
// A stream being recorded (stream capture) takes whatever any thread queues on it. A data loader's
// thread that uploads the next batch while the training thread records its step would have its copy
// -- and the host function behind it that returns the staging buffer to its free list -- recorded
// into the step, then run at every replay: the same staging buffer returned again and again, its
// bookkeeping freed twice, the process crashed a few replays later (classify --cuda-graph on an
// H200, 2026-11-30). Checking "is the stream being recorded?" before queuing is not enough: the
// recording may begin between the check and the queuing. So the two exclude each other here. Every
// entry point of the CUDA backend that queues work on a stream or waits for one
// (CudaBackend::activate) passes the gate, unless its thread works for a recording (it is the
// recording then), and holds the Pass until its work is queued; a recording closes the gate before
// it begins and opens it when it ends. Calls that queue nothing -- cudaMalloc, making streams and
// events (CudaBackend::make_current) -- pass no gate: the caching allocator calls cudaMalloc holding
// the lock that the recording's own threads take to allocate, and waiting there would stop both.
//
// Closing waits for the threads inside to leave: each is queuing one call's work (microseconds), or
// waiting for the work its stream already holds (a synchronization: the GPU's backlog). A thread
// that arrives while the gate is closed waits until it opens: a few milliseconds of host work (the
// recording queues nothing that runs). One gate for the process: a recording keeps every other
// thread's CUDA work waiting while it is made, once per recorded step. Passing costs two atomic
// additions and a read while no recording is made (a thread's first Pass; the ones it takes inside
// that one only count). A thread must take its Pass before any lock a Pass holder may wait for (NCCL
// takes it before its own locks). Both waits are bounded (ef::Error after the timeout, naming what
// waited): a cycle through the gate -- a thread holding a Pass waits for one that waits at the gate
// -- ends in errors instead of a hang. One such cycle is left to the timeout: eager CUDA work of
// another thread that runs on the recorded devices' worker threads (a backward pass, a
// DeviceGroup::run) waits at the gate there, and the recording's own tasks queue behind it; the
// programs record with nothing else running on those devices.
class RecordingGate {
 public:
  // How long the CUDA backend waits at the gate, either side, before its ef::Error.
  static constexpr std::chrono::milliseconds kWaitLimit{60'000};

  // A thread's permission to queue work while it lives (movable within its thread, not copyable).
  class [[nodiscard]] Pass {
   public:
    Pass() = default;
    Pass(Pass&& o) noexcept : gate_(std::exchange(o.gate_, nullptr)) {}
    Pass& operator=(Pass&& o) noexcept {
      if (this != &o) {
        release();
        gate_ = std::exchange(o.gate_, nullptr);
      }
      return *this;
    }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    ~Pass() { release(); }
    // Whether this Pass holds the gate open (false for a recording's own thread).
    bool holds() const { return gate_ != nullptr; }

   private:
    friend class RecordingGate;
    explicit Pass(RecordingGate* gate) : gate_(gate) {}
    void release() noexcept {
      if (gate_ != nullptr) std::exchange(gate_, nullptr)->leave();
    }
    RecordingGate* gate_ = nullptr;
  };

  // For a thread that does not work for a recording: waits while one is being made (at most
  // `timeout`, then ef::Error naming who() -- called only then), then holds the gate open until the
  // Pass is dropped. A thread that holds a Pass of this gate already passes at once, closed or not:
  // it is inside.
  template <typename Who>
  Pass enter(const Who& who, std::chrono::milliseconds timeout) {
    if (depth() > 0) {
      ++depth();
      return Pass(this);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      // In this order, against close()'s: either it sees this thread inside, or this thread sees it closed.
      inside_.fetch_add(1, std::memory_order_seq_cst);
      if (closed_.load(std::memory_order_seq_cst) == 0) break;
      leave_outer();
      std::unique_lock<std::mutex> lock(mu_);
      const bool opened =
          changed_.wait_until(lock, deadline, [&] { return closed_.load(std::memory_order_seq_cst) == 0; });
      EF_CHECK(opened, who(), ": waited ", timeout.count(), " ms for a step being recorded to end; a thread that ",
               "does not work for the step cannot queue CUDA work meanwhile");
    }
    depth() = 1;
    return Pass(this);
  }

  // A recording begins: threads arriving now wait, and this waits (at most `timeout`, then
  // ef::Error naming `who`, the gate open again) for the threads inside to drop their Passes.
  // Recordings may overlap (on several GPUs): the gate opens when the last one ends.
  template <typename Who>
  void close(const Who& who, std::chrono::milliseconds timeout) {
    closed_.fetch_add(1, std::memory_order_seq_cst);
    std::unique_lock<std::mutex> lock(mu_);
    if (!changed_.wait_for(lock, timeout, [&] { return inside_.load(std::memory_order_seq_cst) == 0; })) {
      lock.unlock();
      open();
      EF_ERROR(who(), ": waited ", timeout.count(),
               " ms for other threads to finish queuing CUDA work before recording ",
               "the step; one holds a device while it waits for something this thread does");
    }
  }
  // The recording ended (or was abandoned): once per close().
  void open() {
    closed_.fetch_sub(1, std::memory_order_seq_cst);
    std::lock_guard<std::mutex> lock(mu_);
    changed_.notify_all();
  }

  // The threads holding the gate open now, and whether a recording holds it closed (for tests).
  int64_t inside() const { return inside_.load(); }
  bool closed() const { return closed_.load() > 0; }

 private:
  void leave() noexcept {
    if (--depth() == 0) leave_outer();
  }
  void leave_outer() noexcept {
    inside_.fetch_sub(1, std::memory_order_seq_cst);
    if (closed_.load(std::memory_order_seq_cst) > 0) {  // a recording may be waiting for this thread
      std::lock_guard<std::mutex> lock(mu_);
      changed_.notify_all();
    }
  }
  // This thread's Passes: only its first waits and counts as inside. One count for every gate, as
  // the process has one (the tests make theirs one at a time, a thread holding Passes of one only).
  static int& depth() {
    thread_local int passes = 0;
    return passes;
  }

  std::atomic<int64_t> inside_{0};  // threads holding a Pass
  std::atomic<int> closed_{0};      // recordings being made
  std::mutex mu_;
  std::condition_variable changed_;
};

}  // namespace evenflow::cuda_backend
