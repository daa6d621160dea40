// The NCCL communicator's internals, shared by its two files: nccl_communicator.cu (handles,
// collectives, abort and reset) and nccl_watchdog.cu (the thread that watches queued collectives,
// Note [NCCL watchdog]). Only those include it (nvcc, NCCL); the rest sees nccl_communicator_internal.h.
#pragma once

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/cuda/cuda_internal.h"
#include "evenflow/parallel/nccl_communicator_internal.h"

namespace evenflow::cuda_backend::detail {
// NCCL's status for EF_CUDA_CHECK (engine/cuda/cuda_check.h).
template <>
struct StatusTraits<ncclResult_t> {
  static constexpr const char* kLibrary = "NCCL";
  static bool ok(ncclResult_t s) { return s == ncclSuccess; }
  static const char* message(ncclResult_t s) { return ncclGetErrorString(s); }
  static void clear() {}
  static bool ignorable(ncclResult_t) { return false; }
};
}  // namespace evenflow::cuda_backend::detail

// ncclCommGetAsyncError's ncclInProgress, ncclGetLastError and ncclCommSplit.
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0), "NcclCommunicator needs NCCL 2.18 or later");

namespace evenflow::parallel {

using cuda_backend::CudaBackend;

// How long abort() waits for a GPU's mutex before aborting without it (Note [Aborting NCCL]), and
// how long a communicator being destroyed waits, past the timeout, for its collectives to end.
inline constexpr std::chrono::milliseconds kAbortLockWait{500};
inline constexpr std::chrono::seconds kDrainGrace{10};

// How often the watchdog looks at the collectives in flight: often enough that an error or a
// timeout is noticed promptly, rarely enough to cost nothing (a few event queries).
inline constexpr std::chrono::milliseconds kWatchInterval{1};

// The mutex of Note [One thread per GPU at a time] for GPU `physical_id`, one per GPU for the whole
// process (a communicator split from another shares its GPUs). Never destroyed: communicators may
// outlive static destruction.
inline std::timed_mutex& gpu_mutex(int physical_id) {
  static std::mutex registry_mu;
  static auto* registry = new std::map<int, std::unique_ptr<std::timed_mutex>>();
  std::lock_guard<std::mutex> lock(registry_mu);
  std::unique_ptr<std::timed_mutex>& m = (*registry)[physical_id];
  if (!m) m = std::make_unique<std::timed_mutex>();
  return *m;
}

struct Rank {
  CudaBackend* backend = nullptr;  // contexts are never destroyed
  // Held while anything is issued on this GPU (Note [One thread per GPU at a time]); guards
  // `sequence` and the use of the handles. The handles are atomic because abort() may null them
  // without the mutex (Note [Aborting NCCL]).
  std::timed_mutex* mu = nullptr;
  std::atomic<ncclComm_t> collectives = nullptr;  // per-rank collectives, on the backend's stream
  std::atomic<ncclComm_t> buckets = nullptr;      // all_reduce_in_place, on side_stream
  uint64_t sequence = 0;                          // per-rank collectives since the last reset
  cudaStream_t side_stream = nullptr;
  cudaEvent_t ready = nullptr;           // the compute stream when all_reduce_in_place was called
  cudaEvent_t bucket_done = nullptr;     // recorded after the latest bucket reduce on side_stream
  std::vector<cudaEvent_t> free_events;  // for the watchdog, made on this GPU; guarded by watch_mu_
};
// Rank::collectives or Rank::buckets.
using HandleSet = std::atomic<ncclComm_t> Rank::*;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::vector<Device> devices, const std::vector<CudaBackend*>& backends,
                   std::shared_ptr<ProcessGroup> processes, std::shared_ptr<NcclCommunicator> parent);
  ~NcclCommunicator() override { release(); }
  const char* kind() const override { return "nccl"; }

  Tensor all_reduce(int rank, const Tensor& x) override;
  Tensor broadcast(int rank, const Tensor& x, int root) override;
  Tensor reduce(int rank, const Tensor& x, int root) override;
  Tensor all_gather(int rank, const Tensor& x) override;
  Tensor reduce_scatter(int rank, const Tensor& x) override;
  void all_reduce_in_place(const std::vector<std::vector<Tensor>>& per_rank) override;
  void join_in_place() override;
  void abort(const std::string& why) override;
  void reset() override;
  bool aborted() const override;

 private:
  uint64_t generation() const {
    std::lock_guard<std::mutex> lock(state_mu_);
    return generation_;
  }
  // A queued collective the watchdog watches (Note [NCCL watchdog]).
  struct Watched {
    std::string what;
    HandleSet set;
    std::vector<std::pair<Rank*, cudaEvent_t>> done;  // per rank: an event recorded after it
    std::vector<Tensor> keep_alive;                   // until it completes
    std::chrono::milliseconds timeout;                // timeout() when it was queued
    std::chrono::steady_clock::time_point deadline;   // queued + timeout
    uint64_t generation;                              // generation() when it was queued
  };

  // Makes one per-rank collective: enqueue(comm, stream) is the NCCL call, made for `rank` on its
  // device's stream; x is the (contiguous) input, named in messages.
  template <typename Enqueue>
  void run(const char* op, int rank, const Tensor& x, Enqueue enqueue);
  // An event of r's GPU (r's backend active) for the watchdog, and its hand-over.
  cudaEvent_t take_event(Rank& r);
  void watch(Watched w);
  // The watchdog thread's loop, and one round of it over `batch`, whose completed entries it
  // removes.
  void watchdog();
  void poll(std::deque<Watched>& batch);
  // Reports `why` to this process's devices and aborts (Note [NCCL watchdog]).
  void fail_watched(const std::string& what, const std::string& why);
  // NCCL's asynchronous error on r's handle of `set`, as a message; empty if none (or if r's GPU is
  // busy: the watchdog asks again).
  static std::string async_error(Rank& r, HandleSet set);
  [[noreturn]] void fail(const std::string& what, const std::string& why);
  void throw_if_aborted(const std::string& what);
  // Every GPU's mutex, in rank order.
  // The mutex of every GPU this communicator's handles were split from or are (its parent's, which
  // include its own), in rank order.
  std::vector<std::unique_lock<std::timed_mutex>> lock_all();
  // Both sets of handles: the collectives set from ncclCommInitAll in one process, from
  // ncclCommInitRank on an id shared through processes() across several; the bucket set split from
  // it. The caller holds every GPU's mutex.
  void create_handles();
  // A new NCCL unique id, made by process 0 and sent to every process on processes().
  ncclUniqueId shared_unique_id();
  // Handles split from the collectives set: rank r's joins new communicator colors[r]
  // (NCCL_SPLIT_NOCOLOR: none, a null handle), the ranks keeping their order. Every local rank takes
  // part, in one group (each call waits for the others), closed even when a call fails; on a
  // failure the handles made are destroyed. The caller holds every GPU's mutex. Throws ef::Error if
  // the communicator is aborted or NCCL fails.
  std::vector<ncclComm_t> split(const std::vector<int>& colors);
  void release() noexcept;
  // Throws ef::Error unless every GPU can be made current: checked before a group whose calls wait
  // for each other, where a rank skipped would leave the others waiting.
  void check_devices() const;

  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<int> physical_ids_;
  // The communicator this one's collectives set is split from, if any (make_nccl_communicator).
  std::shared_ptr<NcclCommunicator> parent_;
  std::mutex in_place_mu_;          // one all_reduce_in_place at a time: they share the ranks' events
  uint64_t in_place_sequence_ = 0;  // guarded by in_place_mu_
  mutable std::mutex state_mu_;
  bool aborted_ = false;  // guarded by state_mu_, like abort_reason_ and generation_
  std::string abort_reason_;
  uint64_t generation_ = 0;  // aborts so far: collectives queued before the latest are only waited for
  // The watchdog. Lock order: a handle's mutex before watch_mu_, never the reverse.
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::deque<Watched> watched_;         // queued, not yet taken by the watchdog; guarded by watch_mu_
  size_t in_flight_ = 0;                // watched collectives not yet complete; guarded by watch_mu_
  std::condition_variable drained_cv_;  // in_flight_ reached 0
  bool stop_watching_ = false;          // guarded by watch_mu_
  std::thread watchdog_;
};

}  // namespace evenflow::parallel
