// The NCCL communicator's watchdog (Note [NCCL watchdog]): the thread that watches every queued
// collective until it completes, fails or outlives its timeout, and what it holds meanwhile.
#include <string>

#include "evenflow/parallel/nccl_internal.h"

namespace evenflow::parallel {

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

}  // namespace evenflow::parallel
