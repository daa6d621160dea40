// The errors a CUDA device finds while the host has moved on, kept until the next synchronization
// throws them (Note [Index checks]): the flags of queued indexing kernels, and errors about queued
// work that another thread found (a failed NCCL collective: Note [NCCL watchdog]). Host code only --
// no CUDA in this header -- so that its ordering rules are tested on machines without a GPU
// (tests/engine/test_deferred_errors.cpp); CudaBackend owns one per logical device.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

#include "evenflow/engine/error.h"

namespace evenflow::cuda_backend {

// Note [Index checks]
// An indexing kernel (gather, scatter_add, index_select, index_add: cross-entropy, max-pool
// backward, nearest upsampling) that meets an index out of range sets a flag instead of writing out
// of bounds, and so does check_index_range (a loss's targets, checked before they index). Waiting
// for every such kernel to read its flag would stop the host at every one; instead each queued
// kernel gets its own flag (a ring of kSlots in page-locked host memory, mapped into the device's
// address space, written by the device only on a bad index), and the flags are read at the next
// natural synchronization: synchronize() and copy_to_host(), the ways values reach the host (item(),
// .to(cpu()), a loss read for printing). The first bad index queued before that synchronization
// throws ef::Error there, naming the op, the index, the dim and its size: an error reported where
// the program next looks at the device, not lost, and no cost otherwise. A kernel queued when all
// flags are pending first waits for the stream (and so may throw an earlier kernel's error).
//
// Several threads may queue work on one logical device. A flag is therefore reserved and its kernel
// queued under one lock (Slot), and a synchronization notes what was reserved (mark()) under the
// same lock before it waits for the stream: every kernel it then checks was in the stream before the
// wait began. (With the flag handed out before the launch, a synchronization on another thread could
// read a flag whose kernel was not queued yet, find it clear, drop it, and miss the bad index, which
// would then be blamed on whichever launch reused the flag 1024 launches later.)
//
// Note [Index checks in a recorded step]
// A recorded kernel is replayed with the arguments it was recorded with (Note [A step that can be
// replayed] in engine/step_graph.h): it writes the same flag at every replay, and a replay reserves
// nothing. So the checks of a recorded step get flags of their own, outside the ring, held for the
// recording's life (reserve_recorded, release_recorded). Every take_errors reads them too, after the
// device ran past what it waited for, and clears the one it reports with an atomic exchange: a
// replay queued meanwhile may be writing it, and its error is then found by this synchronization or
// the next, never cleared unseen (a kernel writes the index, fences, then sets the flag). So a bad
// index in a replayed step is thrown at the next synchronization, as an eager kernel's is -- the
// loss read after the step, typically -- naming the op, the index and the dim; only which replay
// met it is not known. A recording of several logical devices of one GPU keeps every device's flags
// in the first device's DeferredErrors: its stream runs the whole graph at each replay, so waiting
// for it waits for every kernel of the step, and the host reads the step's results there.
class DeferredErrors {
 public:
  static constexpr uint64_t kSlots = 1024;         // the ring's flags
  static constexpr uint64_t kRecordedSlots = 256;  // recorded steps' flags, over every recording of the device

  // Makes the flag memory on first use: (kSlots + kRecordedSlots) x {flag, index} int64, the ring's
  // then the recordings', as the host reads it and as kernels address it (the same memory, mapped).
  // Its owner frees it (flags()).
  using AllocateFlags = std::function<std::pair<int64_t*, int64_t*>()>;
  explicit DeferredErrors(AllocateFlags allocate) : allocate_(std::move(allocate)) {}

  // One reserved flag, held while its kernel is queued: a mark() on another thread waits for it.
  class Slot {
   public:
    Slot(std::unique_lock<std::mutex> lock, int64_t* device_flag) : lock_(std::move(lock)), device_flag_(device_flag) {}
    // {flag, index}, for the kernel to write on a bad index.
    int64_t* device_flag() const { return device_flag_; }

   private:
    std::unique_lock<std::mutex> lock_;
    int64_t* device_flag_;
  };

  // Reserves the next flag for a kernel about to be queued, `describe` making the error's message
  // from the bad index. When every flag is pending, first calls `drain` without the lock: it must
  // wait for the device and take_errors(), which frees them.
  Slot reserve(std::function<std::string(int64_t)> describe, const std::function<void()>& drain) {
    std::unique_lock<std::mutex> lock(mu_);
    while (pending_.size() == kSlots) {
      lock.unlock();
      drain();
      lock.lock();
    }
    if (host_flags_ == nullptr) std::tie(host_flags_, device_flags_) = allocate_();
    const uint64_t sequence = next_++;
    int64_t* flag = host_flags_ + 2 * (sequence % kSlots);
    flag[0] = flag[1] = 0;  // its last kernel was checked: the stream ran past it before take_errors
    pending_.push_back({sequence, std::move(describe)});
    return Slot(std::move(lock), device_flags_ + 2 * (sequence % kSlots));
  }

  // Everything reserved so far, for take_errors after the device has run it (waits while a Slot on
  // another thread is being queued).
  uint64_t mark() const {
    std::lock_guard<std::mutex> lock(mu_);
    return next_;
  }

  // After the device ran past everything reserved before `mark`: the reported error if any, else
  // the first bad index among those kernels, described and followed by `where`; "" if none. Their
  // flags are free again, and a reported error is returned once.
  std::string take_errors(uint64_t mark, const std::string& where) {
    std::lock_guard<std::mutex> lock(mu_);
    // A failed collective first: the values after it, indices included, may be garbage.
    std::string error = std::exchange(reported_, std::string());
    while (!pending_.empty() && pending_.front().sequence < mark) {
      const Pending& p = pending_.front();
      const int64_t* flag = host_flags_ + 2 * (p.sequence % kSlots);
      if (flag[0] != 0 && error.empty()) error = ::evenflow::detail::str_cat(p.describe(flag[1]), where);
      pending_.pop_front();
    }
    // The recorded steps' checks (Note [Index checks in a recorded step]): every set flag cleared,
    // as the ring's are, the first reported. (One bad target sets several: its check, then the
    // gather and the scatter_add that use it.)
    for (uint64_t i = 0; i < kRecordedSlots; ++i) {
      if (recorded_[i].owner == 0) continue;
      int64_t* flag = host_flags_ + 2 * (kSlots + i);
      if (std::atomic_ref<int64_t>(flag[0]).exchange(0, std::memory_order_acq_rel) == 0 || !error.empty()) continue;
      const int64_t index = std::atomic_ref<int64_t>(flag[1]).load(std::memory_order_acquire);
      error = ::evenflow::detail::str_cat(recorded_[i].describe(index), " in a replayed step", where);
    }
    return error;
  }

  // A flag for a check of a step being recorded by `owner` (a non-zero id), clear, held until
  // release_recorded(owner) (Note [Index checks in a recorded step]); no lock is held while the
  // kernel is queued. ef::Error when the recordings of this device hold every recorded flag.
  Slot reserve_recorded(uint64_t owner, std::function<std::string(int64_t)> describe) {
    EF_ASSERT(owner != 0, "a recorded check needs its recording's id");
    std::lock_guard<std::mutex> lock(mu_);
    if (host_flags_ == nullptr) std::tie(host_flags_, device_flags_) = allocate_();
    for (uint64_t i = 0; i < kRecordedSlots; ++i) {
      if (recorded_[i].owner != 0) continue;
      recorded_[i] = {owner, std::move(describe)};
      int64_t* flag = host_flags_ + 2 * (kSlots + i);
      flag[0] = flag[1] = 0;
      return Slot(std::unique_lock<std::mutex>(), device_flags_ + 2 * (kSlots + i));
    }
    EF_ERROR("the recorded steps on this device hold all ", kRecordedSlots,
             " flags of their index checks (a loss's targets, gather, scatter_add, index_select, index_add); "
             "record fewer indexing ops in a step, or drop a recording");
  }
  // Frees `owner`'s recorded flags, once the device ran its replays (an error they hold is lost).
  void release_recorded(uint64_t owner) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Recorded& r : recorded_)
      if (r.owner == owner) r = {};
  }
  // The recorded flags held (for tests).
  size_t recorded_in_use() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const Recorded& r : recorded_) n += r.owner != 0 ? 1 : 0;
    return n;
  }

  // An error about queued work found by another thread; the next take_errors returns it (the first
  // one reported, once).
  void report(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reported_.empty()) reported_ = message;
  }
  // Forgets a reported error not yet taken (its communicator was reset: Note [Aborting NCCL]).
  void clear_reported() {
    std::lock_guard<std::mutex> lock(mu_);
    reported_.clear();
  }

  // The flag memory (host side), nullptr before the first reserve: for its owner to free.
  int64_t* flags() const { return host_flags_; }

 private:
  struct Pending {
    uint64_t sequence;  // its flag is slot sequence % kSlots
    std::function<std::string(int64_t)> describe;
  };
  struct Recorded {
    uint64_t owner = 0;  // the recording holding the flag; 0: free
    std::function<std::string(int64_t)> describe;
  };
  AllocateFlags allocate_;
  mutable std::mutex mu_;
  int64_t* host_flags_ = nullptr;
  int64_t* device_flags_ = nullptr;
  std::deque<Pending> pending_;  // reserved, not yet checked, in queue order
  uint64_t next_ = 0;
  std::string reported_;
  std::array<Recorded, kRecordedSlots> recorded_{};  // flag kSlots + i of the memory
};

}  // namespace evenflow::cuda_backend
