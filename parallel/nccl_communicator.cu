// NcclCommunicator: the Communicator for CUDA devices on distinct GPUs. Each rank's per-rank
// collectives are NCCL calls made by that rank's thread on its device's stream, so they are ordered
// with the engine's kernels; all_reduce_in_place is one NCCL group over a second set of NCCL
// communicators, on a side stream per device. No call waits for its collective: a watchdog thread
// watches them (Note [NCCL watchdog], nccl_watchdog.cu). Across processes (Note [Processes] in process_group.h) each
// process holds the NCCL ranks of its own devices, global ranks first_rank() .. first_rank() +
// local_size() - 1 of one NCCL communicator per set.
#include "evenflow/parallel/nccl_internal.h"

namespace evenflow::parallel {
namespace {

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

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::Int64:
      return ncclInt64;
    case DType::BFloat16:
      break;  // as on the CPU path: gradients and statistics are float32 or float64
  }
  EF_ERROR("NCCL: collectives of ", dtype_name(t), " are not supported (float32, float64, int64)");
}

size_t count_of(const Tensor& x) {
  return static_cast<size_t>(x.numel());
}

}  // namespace

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
      backend->make_current();  // streams and events made, no work queued
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

template <typename Enqueue>
void NcclCommunicator::run(const char* op, int rank, const Tensor& x, Enqueue enqueue) {
  Rank& r = *ranks_[static_cast<size_t>(rank)];
  const auto gate_pass = r.backend->activate();
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

  // Held until every rank's work is queued, and taken before any lock (in_place_mu_, the GPUs'): a
  // thread waiting at the gate must not hold what a thread inside waits for (Note [Work beside a
  // recording]). The ranks' own activate() below then only switch devices.
  const auto gate_pass = ranks_[0]->backend->activate();
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
        const auto rank_pass = r->backend->activate();
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
  const auto gate_pass = ranks_[0]->backend->activate();  // before the lock, as in all_reduce_in_place
  std::lock_guard<std::mutex> in_place_lock(in_place_mu_);
  for (auto& r : ranks_) {
    const auto rank_pass = r->backend->activate();
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
