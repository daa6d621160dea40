// NcclCommunicator: the Communicator for CUDA devices on distinct GPUs. Each rank's per-rank
// collectives are NCCL calls made by that rank's thread on its device's stream, so they are ordered
// with the engine's kernels; all_reduce_in_place is one NCCL group over a second set of NCCL
// communicators, on a side stream per device. No call waits for its collective: a watchdog thread
// watches them (Note [NCCL watchdog]). Across processes (Note [Processes] in process_group.h) each
// process holds the NCCL ranks of its own devices, global ranks first_rank() .. first_rank() +
// local_size() - 1 of one NCCL communicator per set.
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

#include "evenflow/engine/context.h"
#include "evenflow/engine/cuda/cuda_internal.h"
#include "evenflow/parallel/nccl_communicator.h"

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
namespace {

using cuda_backend::CudaBackend;

// Note [NCCL watchdog]
// A call queues its collective on a stream and returns: nothing waits on the host, so collectives
// overlap with the host's work and with the kernels queued after them, as every other op does.
// What notices a rank that never arrives (its peers' kernels spin on their GPUs and nothing fails on
// the host) is the communicator's watchdog thread. It watches every queued collective through an
// event recorded after it, polling NCCL's asynchronous errors meanwhile, until the event fires.
// When a collective has not completed timeout() after it was queued (time spent queued behind other
// work counts, as in PyTorch's watchdog), or NCCL reports an error, the watchdog reports the error
// to this process's devices (CudaBackend::report_error: the next synchronization on each throws it,
// so a loss read with item() fails instead of returning what an aborted collective left), then
// aborts the communicator (Note [Aborting NCCL]); that ends the kernels still waiting for absent
// peers, so blocked synchronizations return, and makes later calls throw. The watchdog also holds
// the tensors a bucket reduce on a side stream reads and writes until it completes: the caching
// allocator would otherwise hand their memory to the compute stream while the side stream still
// uses it. Collectives on a device's own stream need no such care: the allocator reuses memory in
// stream order.
//
// Note [Aborting NCCL]
// NCCL has no timeout of its own. When the watchdog finds a collective late or failed, abort() calls
// ncclCommAbort on every handle of both sets: that stops kernels still waiting for absent peers,
// and marks the communicator aborted, so that later calls throw. reset() re-creates both sets, and
// clears the errors the watchdog reported to the devices. The collectives queued before an abort
// are still watched until they end (their memory stays held), but no longer judged: a generation
// number, raised by every abort, tells them apart from those queued after a reset. A thread
// issuing on a GPU holds its mutex (Note [One thread per GPU at a time]) and may be stuck there
// behind a GPU that waits for an absent peer (a full launch queue); abort() waits for the mutex
// only kAbortLockWait, then aborts regardless, since only ncclCommAbort frees such a GPU. The
// handles are atomics, read once per call, so nulling them then is no data race; NCCL may still
// see the stuck call return an error.
//
// Note [One thread per GPU at a time]
// NCCL's rule: operations must not be issued in parallel, from several threads, to communicators
// on the same device. Here rank r's thread issues per-rank collectives on GPU r while the thread
// that completes a bucket issues the bucket reduce on every GPU, so each GPU has a mutex (Rank::mu)
// held while anything is issued there, or a handle is queried, aborted or replaced: ncclCommAbort
// frees the handle, which must not then be in use on another thread, and an aborted handle is null.
// Issuing does not wait for peers (NCCL_RUNTIME_CONNECT=0 connects every pair at init), so holding
// the mutex is brief. The bucket set is made from the collectives set with ncclCommSplit (no second
// bootstrap, no second unique id across processes), without splitShare: a split that shares its
// parent's resources may not run its kernels beside the parent's, which Note [NCCL bucket reduce]
// needs. A communicator over fewer of a group's GPUs (a last batch smaller than the group) splits its
// collectives set from the group's communicator (split) rather than bootstrapping a new one.
// Not yet seen on a GPU, so a risk to watch: NCCL warns that a CUDA call which synchronizes a device
// (cudaFree: the caching allocator makes it when an allocation fails and it empties its cache)
// waits for the NCCL kernels there; a rank's thread doing so while its GPU's collective waits for a
// rank whose thread waits on it would hang until the watchdog's timeout aborts the communicator.
//
// Note [NCCL bucket reduce]
// all_reduce_in_place is called from one thread for every rank, during backward, while the other
// ranks' threads go on and may queue per-rank collectives (a SyncBatchNorm backward) on their
// compute streams, so on each GPU the bucket reduce and those collectives come in a different order.
// An NCCL kernel blocks until its peers arrive: if the bucket reduce shared a stream or a handle with
// those collectives, GPU 0 could wait in the bucket reduce for GPU 1 while GPU 1 waits in a
// SyncBatchNorm reduce for GPU 0. So the buckets get their own handles (a second set) and a side
// stream per device. The side stream first waits for an event recorded on the compute stream when
// the call is made, so the reduce reads finished gradients (that event also covers later work
// already queued there, which only delays the reduce). Nothing on a compute stream waits for a side
// stream until join_in_place(), which GradientSync calls when backward has ended (Note [Gradient
// buckets]): a compute stream that waited for a bucket during backward could hold back a
// SyncBatchNorm collective that another GPU's bucket reduce waits behind. Two handles of one GPU
// need their kernels to run concurrently, which CUDA allows and NCCL's few-SM kernels get.

// NCCL connects every pair at init rather than at a first collective (NCCL 2.22+ connects lazily,
// inside a call that blocks on the host without a timeout until the peer makes it too); a user's
// setting wins. Set while the program starts, one thread alone: setenv races with any getenv on
// another thread, and NCCL reads its settings once.
[[maybe_unused]] const bool kConnectAtInit = setenv("NCCL_RUNTIME_CONNECT", "0", 0) == 0;

// How long abort() waits for a GPU's mutex before aborting without it (Note [Aborting NCCL]), and
// how long a communicator being destroyed waits, past the timeout, for its collectives to end.
constexpr std::chrono::milliseconds kAbortLockWait{500};
constexpr std::chrono::seconds kDrainGrace{10};

// How often the watchdog looks at the collectives in flight: often enough that an error or a
// timeout is noticed promptly, rarely enough to cost nothing (a few event queries).
constexpr std::chrono::milliseconds kWatchInterval{1};

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::Int64:
      return ncclInt64;
  }
  EF_ERROR("internal error: nccl_type: unknown dtype ", static_cast<int>(t));
}

size_t count_of(const Tensor& x) {
  return static_cast<size_t>(x.numel());
}

// The mutex of Note [One thread per GPU at a time] for GPU `physical_id`, one per GPU for the whole
// process (a communicator split from another shares its GPUs). Never destroyed: communicators may
// outlive static destruction.
std::timed_mutex& gpu_mutex(int physical_id) {
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

NcclCommunicator::NcclCommunicator(std::vector<Device> devices, const std::vector<CudaBackend*>& backends,
                                   std::shared_ptr<ProcessGroup> processes, std::shared_ptr<NcclCommunicator> parent)
    : Communicator(std::move(devices), std::move(processes)), parent_(std::move(parent)) {
  try {
    for (CudaBackend* backend : backends) {
      ranks_.push_back(std::make_unique<Rank>());
      Rank& r = *ranks_.back();
      r.backend = backend;
      r.mu = &gpu_mutex(backend->physical_id());
      physical_ids_.push_back(backend->physical_id());
      backend->activate();
      EF_CUDA_CHECK(cudaStreamCreateWithFlags(&r.side_stream, cudaStreamNonBlocking));
      for (cudaEvent_t* e : {&r.ready, &r.bucket_done})
        EF_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
    {
      auto locks = lock_all();
      create_handles();
    }
    watchdog_ = std::thread([this] { watchdog(); });
  } catch (...) {
    release();
    throw;
  }
}

void NcclCommunicator::create_handles() {
  for (auto& r : ranks_) {
    for (std::atomic<ncclComm_t>* h : {&r->collectives, &r->buckets}) {
      const ncclComm_t c = h->exchange(nullptr);
      if (c != nullptr) EF_CUDA_CHECK_PRINT(ncclCommDestroy(c));  // left by a failed reset
    }
  }
  {
    std::vector<ncclComm_t> comms(ranks_.size(), nullptr);
    if (parent_ != nullptr && !parent_->aborted()) {
      // The parent's first local_size() GPUs are this one's; the others take no part.
      std::vector<int> colors(parent_->ranks_.size(), NCCL_SPLIT_NOCOLOR);
      std::fill_n(colors.begin(), local_size(), 0);
      comms = parent_->split(colors);
      comms.resize(ranks_.size());
    } else if (processes()->size() == 1) {
      EF_CUDA_CHECK(ncclCommInitAll(comms.data(), local_size(), physical_ids_.data()));
    } else {
      const ncclUniqueId id = shared_unique_id();
      // One thread initializes several ranks of one communicator, and each ncclCommInitRank blocks
      // until every rank has joined: outside a group the first call would wait for the others
      // forever. In a group NCCL initializes them together at ncclGroupEnd. As in
      // all_reduce_in_place, the group is closed even when a call in it fails, and every rank that
      // can is initialized, so that the other processes' ranks are not left waiting for it.
      int failed_device = -1;
      cudaError_t set_device_error = cudaSuccess;
      ncclResult_t first_error = ncclSuccess;
      EF_CUDA_CHECK(ncclGroupStart());
      for (size_t r = 0; r < ranks_.size(); ++r) {
        const cudaError_t set_device_status = cudaSetDevice(physical_ids_[r]);
        if (set_device_status != cudaSuccess) {
          if (set_device_error == cudaSuccess) {
            set_device_error = set_device_status;
            failed_device = physical_ids_[r];
          }
          (void)cudaGetLastError();
          continue;
        }
        const ncclResult_t status = ncclCommInitRank(&comms[r], size(), id, first_rank() + static_cast<int>(r));
        if (first_error == ncclSuccess) first_error = status;
      }
      const ncclResult_t end_status = ncclGroupEnd();
      EF_CHECK(set_device_error == cudaSuccess, "nccl: cudaSetDevice(", failed_device, ") failed: CUDA error '",
               cudaGetErrorString(set_device_error), "' (", static_cast<int>(set_device_error), ")");
      EF_CUDA_CHECK(first_error);
      EF_CUDA_CHECK(end_status);
    }
    for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->collectives = comms[r];
  }
  // The bucket set: one split of the collectives set.
  const std::vector<ncclComm_t> buckets = split(std::vector<int>(ranks_.size(), 0));
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->buckets = buckets[r];
}

ncclUniqueId NcclCommunicator::shared_unique_id() {
  ncclUniqueId id{};
  ncclResult_t status = ncclSuccess;
  std::string bytes;
  if (processes()->rank() == 0) {
    status = ncclGetUniqueId(&id);
    // On a failure process 0 still sends (nothing), so that the others fail at once with it rather
    // than at the timeout.
    if (status == ncclSuccess) bytes = std::string(reinterpret_cast<const char*>(&id), sizeof id);
  }
  const std::string received = processes()->broadcast_bytes(bytes, 0);
  EF_CUDA_CHECK(status);
  EF_CHECK(received.size() == sizeof(ncclUniqueId), "nccl: process ", processes()->rank(), " received ",
           received.size(), " bytes for the NCCL unique id from process 0, expected ", sizeof(ncclUniqueId),
           received.empty() ? " (process 0 could not create one)" : "");
  std::memcpy(&id, received.data(), sizeof id);
  return id;
}

std::vector<ncclComm_t> NcclCommunicator::split(const std::vector<int>& colors) {
  throw_if_aborted("nccl split");
  check_devices();
  std::vector<ncclComm_t> out(ranks_.size(), nullptr);
  ncclResult_t first_error = ncclSuccess;
  EF_CUDA_CHECK(ncclGroupStart());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    (void)cudaSetDevice(physical_ids_[r]);  // checked above
    const ncclResult_t status =
        ncclCommSplit(ranks_[r]->collectives, colors[r], first_rank() + static_cast<int>(r), &out[r], nullptr);
    if (first_error == ncclSuccess) first_error = status;
  }
  const ncclResult_t end_status = ncclGroupEnd();
  if (first_error != ncclSuccess || end_status != ncclSuccess) {
    for (ncclComm_t c : out)
      if (c != nullptr) EF_CUDA_CHECK_PRINT(ncclCommDestroy(c));
  }
  EF_CUDA_CHECK(first_error);
  EF_CUDA_CHECK(end_status);
  return out;
}

void NcclCommunicator::check_devices() const {
  for (int id : physical_ids_) {
    const cudaError_t status = cudaSetDevice(id);
    if (status != cudaSuccess) (void)cudaGetLastError();
    EF_CHECK(status == cudaSuccess, "nccl: cudaSetDevice(", id, ") failed: CUDA error '", cudaGetErrorString(status),
             "' (", static_cast<int>(status), ")");
  }
}

void NcclCommunicator::release() noexcept {
  if (watchdog_.joinable()) {
    {
      // Collectives still queued complete first, or fail through the watchdog at their deadline.
      std::unique_lock<std::mutex> lock(watch_mu_);
      drained_cv_.wait_for(lock, timeout() + kDrainGrace, [&] { return in_flight_ == 0; });
      stop_watching_ = true;
    }
    watch_cv_.notify_all();
    watchdog_.join();
    // A collective still waiting for a peer would keep the streams from draining below.
    bool in_flight = false;
    for (const Watched& w : watched_)
      for (const auto& [rank, e] : w.done) in_flight = in_flight || cudaEventQuery(e) == cudaErrorNotReady;
    (void)cudaGetLastError();
    if (in_flight) {
      try {
        abort("the communicator was destroyed while collectives were in flight");
      } catch (...) {  // only std::bad_alloc; the handles are destroyed below either way
      }
    }
  }
  for (auto& r : ranks_) {
    // At process exit the CUDA runtime may already be gone, and with it everything we own.
    const cudaError_t set_device_status = cudaSetDevice(r->backend->physical_id());
    if (set_device_status == cudaErrorCudartUnloading) return;
    EF_CUDA_CHECK_PRINT(set_device_status);
    // Collectives still queued read and write memory the caching allocator may hand out again.
    for (cudaStream_t stream : {r->backend->stream(), r->side_stream})
      if (stream != nullptr) EF_CUDA_CHECK_PRINT(cudaStreamSynchronize(stream));
    for (std::atomic<ncclComm_t>* h : {&r->collectives, &r->buckets}) {
      const ncclComm_t c = h->exchange(nullptr);
      if (c != nullptr) EF_CUDA_CHECK_PRINT(ncclCommDestroy(c));
    }
    for (const Watched& w : watched_)
      for (const auto& [rank, e] : w.done)
        if (rank == r.get()) r->free_events.push_back(e);
    for (cudaEvent_t e : r->free_events) EF_CUDA_CHECK_PRINT(cudaEventDestroy(e));
    for (cudaEvent_t e : {r->ready, r->bucket_done}) {
      if (e != nullptr) EF_CUDA_CHECK_PRINT(cudaEventDestroy(e));
    }
    if (r->side_stream != nullptr) EF_CUDA_CHECK_PRINT(cudaStreamDestroy(r->side_stream));
  }
}

std::vector<std::unique_lock<std::timed_mutex>> NcclCommunicator::lock_all() {
  std::vector<std::unique_lock<std::timed_mutex>> locks;
  for (int id : parent_ != nullptr ? parent_->physical_ids_ : physical_ids_) locks.emplace_back(gpu_mutex(id));
  return locks;
}

void NcclCommunicator::throw_if_aborted(const std::string& what) {
  std::lock_guard<std::mutex> lock(state_mu_);
  EF_CHECK(!aborted_, what, ": the communicator was aborted: ", abort_reason_);
}

void NcclCommunicator::fail(const std::string& what, const std::string& why) {
  const std::string message = detail::str_cat(what, ": ", why);
  abort(message);
  EF_ERROR(message);
}

std::string NcclCommunicator::async_error(Rank& r, HandleSet set) {
  // A thread issuing there holds the GPU's mutex, and may be stuck behind the GPU: then the next
  // round asks again, and the deadline, checked without the mutex, still fires.
  std::unique_lock<std::timed_mutex> lock(*r.mu, std::try_to_lock);
  if (!lock.owns_lock()) return "";
  const ncclComm_t comm = r.*set;
  if (comm == nullptr) return "";  // aborted: throw_if_aborted reports why
  ncclResult_t async = ncclSuccess;
  const ncclResult_t status = ncclCommGetAsyncError(comm, &async);
  if (status != ncclSuccess) {
    return detail::str_cat("ncclCommGetAsyncError failed: ", ncclGetErrorString(status));
  }
  if (async == ncclSuccess || async == ncclInProgress) return "";
  const char* last = ncclGetLastError(comm);
  return detail::str_cat("NCCL error '", ncclGetErrorString(async), "' (", static_cast<int>(async), ")",
                         last != nullptr && *last != '\0' ? detail::str_cat(": ", last) : "");
}

cudaEvent_t NcclCommunicator::take_event(Rank& r) {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    if (!r.free_events.empty()) {
      const cudaEvent_t e = r.free_events.back();
      r.free_events.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  EF_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void NcclCommunicator::watch(Watched w) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  watched_.push_back(std::move(w));
  ++in_flight_;
}

// Note [NCCL watchdog]. The entries are polled outside watch_mu_: polling takes handle mutexes, which
// callers hold while they queue (the lock order).
void NcclCommunicator::watchdog() {
  // Its CUDA calls (event queries) would otherwise make GPU 0 current, and create a context there.
  if (cudaSetDevice(physical_ids_[0]) != cudaSuccess) (void)cudaGetLastError();
  std::deque<Watched> batch;
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (true) {
    watch_cv_.wait_for(lock, kWatchInterval, [&] { return stop_watching_; });
    if (stop_watching_) {
      // release() frees what is left, after waiting for the streams.
      for (Watched& w : batch) watched_.push_back(std::move(w));
      return;
    }
    // Entries queued since the last round go behind the ones still running.
    for (Watched& w : watched_) batch.push_back(std::move(w));
    watched_.clear();
    if (batch.empty()) continue;
    lock.unlock();
    poll(batch);
    lock.lock();
  }
}

void NcclCommunicator::poll(std::deque<Watched>& batch) {
  std::string failed_what, failure;
  const auto now = std::chrono::steady_clock::now();
  for (auto it = batch.begin(); it != batch.end();) {
    bool complete = true;
    for (const auto& [rank, event] : it->done) {
      const cudaError_t status = cudaEventQuery(event);
      if (status == cudaSuccess) continue;
      if (status == cudaErrorNotReady) {
        complete = false;
        break;
      }
      // A CUDA error is sticky: the device is lost, its queue will not run. Reported, then dropped.
      (void)cudaGetLastError();
      if (failure.empty()) {
        failed_what = it->what;
        failure = detail::str_cat("CUDA error '", cudaGetErrorString(status), "' (", static_cast<int>(status),
                                  ") while the collective ran");
      }
    }
    if (complete) {
      {
        std::lock_guard<std::mutex> lock(watch_mu_);
        for (const auto& [rank, event] : it->done) rank->free_events.push_back(event);
        if (--in_flight_ == 0) drained_cv_.notify_all();
      }
      it = batch.erase(it);  // drops keep_alive: its memory is free for any stream now
      continue;
    }
    // Collectives queued before an abort are cut short: they are only waited for, so that their
    // memory is not handed out while they run.
    if (failure.empty() && !aborted() && it->generation == generation()) {
      for (const auto& [rank, event] : it->done) {
        const std::string error = async_error(*rank, it->set);
        if (!error.empty()) {
          failed_what = it->what;
          failure = error;
          break;
        }
      }
      if (failure.empty() && now >= it->deadline) {
        failed_what = it->what;
        failure = detail::str_cat("timed out after ", it->timeout.count(), " ms (counted from when it was queued)");
      }
    }
    ++it;
  }
  if (!failure.empty()) fail_watched(failed_what, failure);
}

void NcclCommunicator::fail_watched(const std::string& what, const std::string& why) {
  if (aborted()) return;
  const std::string message = detail::str_cat(what, ": ", why);
  for (auto& r : ranks_) r->backend->report_error(message);
  abort(message);
}

template <typename Enqueue>
void NcclCommunicator::run(const char* op, int rank, const Tensor& x, Enqueue enqueue) {
  Rank& r = *ranks_[static_cast<size_t>(rank)];
  r.backend->activate();
  std::string what;
  std::string failure;
  cudaEvent_t done = nullptr;
  {
    std::lock_guard<std::timed_mutex> lock(*r.mu);
    // NCCL cannot compare the ranks' calls cheaply, so a message names this rank's side of a stuck
    // one by its sequence number instead (the calls of one collective share it on every rank).
    what = detail::str_cat("nccl ", op, " (call ", r.sequence++, " of ", shape_str(x.shape()), " ",
                           dtype_name(x.dtype()), ") on ", r.backend->name());
    throw_if_aborted(what);
    // Every rank passes the same shape, so every rank skips an empty collective.
    if (x.numel() == 0) return;
    try {
      done = take_event(r);
      EF_CUDA_CHECK(enqueue(r.collectives, r.backend->stream()));
      EF_CUDA_CHECK(cudaEventRecord(done, r.backend->stream()));
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  if (!failure.empty()) {
    if (done != nullptr) EF_CUDA_CHECK_PRINT(cudaEventDestroy(done));
    // The peers may already be waiting for this rank: abort rather than leave them to time out.
    fail(what, failure);
  }
  watch({std::move(what),
         &Rank::collectives,
         {{&r, done}},
         {},
         timeout(),
         std::chrono::steady_clock::now() + timeout(),
         generation()});
}

Tensor NcclCommunicator::all_reduce(int rank, const Tensor& x) {
  check_rank("all_reduce", rank, x);
  const Tensor in = x.detach().contiguous();
  const ncclDataType_t type = nccl_type(in.dtype());
  Tensor out = empty(in.shape(), {.dtype = in.dtype(), .device = in.device()});
  run("all_reduce", rank, in, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(in.data_ptr(), out.data_ptr(), count_of(in), type, ncclSum, comm, stream);
  });
  return out;
}

Tensor NcclCommunicator::broadcast(int rank, const Tensor& x, int root) {
  check_rank("broadcast", rank, x);
  EF_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is out of range for ", size(), " ranks");
  const Tensor in = x.detach().contiguous();
  const ncclDataType_t type = nccl_type(in.dtype());
  Tensor out = empty(in.shape(), {.dtype = in.dtype(), .device = in.device()});
  run("broadcast", rank, in, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(in.data_ptr(), out.data_ptr(), count_of(in), type, root, comm, stream);
  });
  return out;
}

Tensor NcclCommunicator::reduce(int rank, const Tensor& x, int root) {
  check_rank("reduce", rank, x);
  EF_CHECK(root >= 0 && root < size(), "reduce: root ", root, " is out of range for ", size(), " ranks");
  const Tensor in = x.detach().contiguous();
  const ncclDataType_t type = nccl_type(in.dtype());
  // NCCL ignores the receive buffer off the root; a real one costs little and relies on nothing.
  Tensor out = empty(in.shape(), {.dtype = in.dtype(), .device = in.device()});
  run("reduce", rank, in, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclReduce(in.data_ptr(), out.data_ptr(), count_of(in), type, ncclSum, root, comm, stream);
  });
  // root is a global rank (NCCL's ranks are); only the local rank holding it gets the sum.
  return first_rank() + rank == root ? out : Tensor();
}

Tensor NcclCommunicator::all_gather(int rank, const Tensor& x) {
  check_rank("all_gather", rank, x);
  EF_CHECK(x.dim() >= 1, "all_gather: needs at least one dim, got a scalar on rank ", rank);
  const Tensor in = x.detach().contiguous();
  const ncclDataType_t type = nccl_type(in.dtype());
  Shape shape = in.shape();
  shape[0] *= size();
  Tensor out = empty(shape, {.dtype = in.dtype(), .device = in.device()});
  run("all_gather", rank, in, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllGather(in.data_ptr(), out.data_ptr(), count_of(in), type, comm, stream);
  });
  return out;
}

Tensor NcclCommunicator::reduce_scatter(int rank, const Tensor& x) {
  check_rank("reduce_scatter", rank, x);
  EF_CHECK(x.dim() >= 1 && x.size(0) % size() == 0, "reduce_scatter: dim 0 of ", shape_str(x.shape()),
           " is not divisible by the ", size(), " ranks");
  const Tensor in = x.detach().contiguous();
  const ncclDataType_t type = nccl_type(in.dtype());
  Shape shape = in.shape();
  shape[0] /= size();
  Tensor out = empty(shape, {.dtype = in.dtype(), .device = in.device()});
  run("reduce_scatter", rank, in, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclReduceScatter(in.data_ptr(), out.data_ptr(), count_of(out), type, ncclSum, comm, stream);
  });
  return out;
}

// Note [NCCL bucket reduce].
void NcclCommunicator::all_reduce_in_place(const std::vector<std::vector<Tensor>>& per_rank) {
  check_in_place(per_rank);
  const std::vector<Tensor>& first = per_rank[0];
  const ncclDataType_t type = nccl_type(first[0].dtype());
  size_t count = 0;
  for (const Tensor& x : first) count += count_of(x);

  std::lock_guard<std::mutex> in_place_lock(in_place_mu_);
  std::string what =
      detail::str_cat("nccl all_reduce_in_place (call ", in_place_sequence_++, " of ", first.size(), " tensors, ",
                      count, " ", dtype_name(first[0].dtype()), " values) on ", local_size(), " GPUs",
                      processes()->size() > 1 ? detail::str_cat(" of process ", processes()->rank()) : "");
  if (count == 0) {
    throw_if_aborted(what);
    return;
  }
  std::string failure;
  std::vector<std::pair<Rank*, cudaEvent_t>> done;
  {
    auto locks = lock_all();
    throw_if_aborted(what);
    try {
      for (auto& r : ranks_) {
        r->backend->activate();
        done.emplace_back(r.get(), take_event(*r));
        EF_CUDA_CHECK(cudaEventRecord(r->ready, r->backend->stream()));
        EF_CUDA_CHECK(cudaStreamWaitEvent(r->side_stream, r->ready, 0));
      }
      EF_CUDA_CHECK(ncclGroupStart());
      // The group must be closed even when a call in it fails, or this thread's later NCCL calls
      // would join it.
      ncclResult_t first_error = ncclSuccess;
      // Every rank's calls in one order (the list's); NCCL runs a group's calls together.
      for (size_t i = 0; i < first.size() && first_error == ncclSuccess; ++i) {
        for (size_t r = 0; r < ranks_.size() && first_error == ncclSuccess; ++r) {
          const Tensor& x = per_rank[r][i];
          if (x.numel() == 0) continue;
          first_error = ncclAllReduce(x.data_ptr(), x.data_ptr(), count_of(x), type, ncclSum, ranks_[r]->buckets,
                                      ranks_[r]->side_stream);
        }
      }
      const ncclResult_t end_status = ncclGroupEnd();
      EF_CUDA_CHECK(first_error);
      EF_CUDA_CHECK(end_status);
      for (auto& [r, event] : done) {
        EF_CUDA_CHECK(cudaEventRecord(r->bucket_done, r->side_stream));
        EF_CUDA_CHECK(cudaEventRecord(event, r->side_stream));
      }
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  if (!failure.empty()) {
    // The tensors go back to the caller, who may reuse them on the compute streams while a reduce
    // still runs on the side streams: order the compute streams after whatever was queued.
    for (auto& r : ranks_) EF_CUDA_CHECK_PRINT(cudaStreamWaitEvent(r->backend->stream(), r->bucket_done, 0));
    for (const auto& [r, event] : done) EF_CUDA_CHECK_PRINT(cudaEventDestroy(event));
    fail(what, failure);
  }
  std::vector<Tensor> keep_alive;
  for (const auto& list : per_rank) keep_alive.insert(keep_alive.end(), list.begin(), list.end());
  watch({std::move(what), &Rank::buckets, std::move(done), std::move(keep_alive), timeout(),
         std::chrono::steady_clock::now() + timeout(), generation()});
}

void NcclCommunicator::join_in_place() {
  std::lock_guard<std::mutex> in_place_lock(in_place_mu_);
  for (auto& r : ranks_) {
    r->backend->activate();
    EF_CUDA_CHECK(cudaStreamWaitEvent(r->backend->stream(), r->bucket_done, 0));
  }
  throw_if_aborted("nccl join_in_place");
}

// Note [Aborting NCCL].
void NcclCommunicator::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (aborted_) return;
    aborted_ = true;
    ++generation_;
    abort_reason_ = why.empty() ? "no reason given" : why;
  }
  for (auto& r : ranks_) {
    std::unique_lock<std::timed_mutex> lock(*r->mu, std::defer_lock);
    (void)lock.try_lock_for(kAbortLockWait);
    for (std::atomic<ncclComm_t>* h : {&r->collectives, &r->buckets}) {
      const ncclComm_t c = h->exchange(nullptr);
      if (c != nullptr) EF_CUDA_CHECK_PRINT(ncclCommAbort(c));
    }
  }
}

bool NcclCommunicator::aborted() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return aborted_;
}

// Across processes every process must reset at the same time: the handles are re-created
// collectively (a new unique id from process 0, then every rank's ncclCommInitRank), and a process
// that does not take part (one that was not aborted, or that has ended) makes the others' reset time
// out or hang in NCCL's bootstrap. So after an abort across processes the job should end rather than
// reset; in one process reset() re-creates the handles on its own.
void NcclCommunicator::reset() {
  std::lock_guard<std::mutex> in_place_lock(in_place_mu_);
  auto locks = lock_all();
  bool aborted = false;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    aborted = aborted_;
    reason = abort_reason_;
  }
  if (aborted) {
    try {
      create_handles();
    } catch (const Error& e) {
      // Still aborted: later calls throw too.
      EF_ERROR("nccl reset: re-creating the NCCL communicators failed: ", e.what(),
               "; they had been aborted because: ", reason);
    }
    std::lock_guard<std::mutex> lock(state_mu_);
    aborted_ = false;
    abort_reason_.clear();
  }
  for (auto& r : ranks_) {
    r->sequence = 0;
    r->backend->clear_reported_error();
  }
  in_place_sequence_ = 0;
}

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const std::vector<Device>& devices,
                                                     std::shared_ptr<ProcessGroup> processes,
                                                     std::shared_ptr<Communicator> parent) {
  EF_CHECK(!devices.empty(), "make_nccl_communicator: no devices given");
  auto nccl_parent = std::dynamic_pointer_cast<NcclCommunicator>(parent);
  if (parent != nullptr) {
    EF_CHECK(nccl_parent != nullptr, "make_nccl_communicator: the parent is a ", parent->kind(),
             " communicator, not an NCCL one");
    EF_CHECK(parent->processes()->size() == 1 && (processes == nullptr || processes->size() == 1),
             "make_nccl_communicator: a communicator across processes cannot be split from a parent");
    EF_CHECK(parent->devices().size() >= devices.size() &&
                 std::equal(devices.begin(), devices.end(), parent->devices().begin()),
             "make_nccl_communicator: the parent's devices do not start with ", devices.front().str(), ", ...");
  }
  std::vector<CudaBackend*> backends;
  std::set<int> gpus;
  for (const Device& d : devices) {
    EF_CHECK(d.is_cuda(), "make_nccl_communicator: ", d.str(),
             " is not a CUDA device; NCCL serves distinct GPUs, use the local communicator");
    auto* backend = dynamic_cast<CudaBackend*>(&context(d).backend());
    EF_ASSERT(backend != nullptr, "make_nccl_communicator: ", d.str(), " has no CUDA backend");
    EF_CHECK(gpus.insert(backend->physical_id()).second, "make_nccl_communicator: ", backend->name(),
             " shares its GPU with another device of the group; NCCL needs distinct GPUs, use the local "
             "communicator");
    backends.push_back(backend);
  }
  return std::make_shared<NcclCommunicator>(devices, backends, std::move(processes), std::move(nccl_parent));
}

}  // namespace evenflow::parallel
