// The CUDA backend's device side: one CudaBackend per logical CUDA device, owning a non-blocking
// stream on its GPU, lazily created cuBLAS/cuDNN handles bound to that stream, and a scratch buffer
// for library workspaces. Here: construction, memory, host and peer copies, library state, and the
// entry points of cuda_backend.h. The kernels are in cuda_<family>.cu, convolutions in cuda_conv.cu
// and cuda_conv_plans.cu.
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <utility>

#include "evenflow/engine/cuda/cuda_backend.h"
#include "evenflow/engine/cuda/cuda_internal.h"

namespace evenflow::cuda_backend {

// The flags of Note [Index checks]: page-locked host memory, mapped into the device's address space,
// made on the first indexing kernel (with the device current).
static std::pair<int64_t*, int64_t*> allocate_index_flags() {
  void* flags = nullptr;
  constexpr size_t kBytes = (DeferredErrors::kSlots + DeferredErrors::kRecordedSlots) * 2 * sizeof(int64_t);
  EF_CUDA_CHECK(cudaHostAlloc(&flags, kBytes, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(flags, 0, kBytes);
  void* device_flags = nullptr;
  const cudaError_t map_status = cudaHostGetDevicePointer(&device_flags, flags, 0);
  if (map_status != cudaSuccess) EF_CUDA_CHECK_PRINT(cudaFreeHost(flags));
  EF_CUDA_CHECK(map_status);
  return {static_cast<int64_t*>(flags), static_cast<int64_t*>(device_flags)};
}

CudaBackend::CudaBackend(int logical_index, int physical_id)
    : logical_index_(logical_index), physical_id_(physical_id), deferred_errors_(allocate_index_flags) {
  make_current();  // no work queued: a stream made, an attribute read
  EF_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, physical_id_));
  EF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaBackend::~CudaBackend() {
  // At process exit the CUDA runtime may already be gone, and with it everything we own.
  const cudaError_t set_device_status = cudaSetDevice(physical_id_);
  if (set_device_status == cudaErrorCudartUnloading) return;
  EF_CUDA_CHECK_PRINT(set_device_status);
  EF_CUDA_CHECK_PRINT(cudaStreamSynchronize(stream_));
  bf16_conv_plans_.clear();  // plans made on the handle go first
  if (cudnn_ != nullptr) EF_CUDA_CHECK_PRINT(cudnnDestroy(cudnn_));
  if (cublas_ != nullptr) EF_CUDA_CHECK_PRINT(cublasDestroy(cublas_));
  if (cublas_workspace_ != nullptr) EF_CUDA_CHECK_PRINT(cudaFree(cublas_workspace_));
  scratch_.reset();  // freed here unless a recording still holds it
  for (auto& [size_class, buffers] : staging_free_) {
    for (void* buffer : buffers) EF_CUDA_CHECK_PRINT(cudaFreeHost(buffer));
  }
  if (deferred_errors_.flags() != nullptr) EF_CUDA_CHECK_PRINT(cudaFreeHost(deferred_errors_.flags()));
  EF_CUDA_CHECK_PRINT(cudaStreamDestroy(stream_));
}

std::string CudaBackend::name() const {
  return ::evenflow::detail::str_cat("cuda:", logical_index_, " (GPU ", physical_id_, ")");
}

RecordingGate& recording_gate() {
  static RecordingGate gate;
  return gate;
}

void CudaBackend::make_current() const {
  EF_CUDA_CHECK(cudaSetDevice(physical_id_));
}

RecordingGate::Pass CudaBackend::activate() const {
  make_current();
  // A thread working for a step being recorded queues into it (Note [Work beside a recording]) --
  // on the recording's devices only: on another it would pass a gate its own recording closed, or
  // (closed by another recording) queue into that one.
  if (::evenflow::detail::step_thread().capture != nullptr) {
    EF_CHECK(::evenflow::detail::capture_of(device()) != nullptr, name(),
             ": a step being recorded on other devices queues work here; record every device the step uses");
    return {};
  }
  return recording_gate().enter([this] { return name(); }, RecordingGate::kWaitLimit);
}

// --- Memory and copies ---------------------------------------------------------------------------

void* CudaBackend::raw_alloc(size_t nbytes) {
  // No gate: the caching allocator calls this holding its lock, which a recording's own threads
  // need, and a cudaMalloc queues no work (a relaxed capture allows it; Note [Work beside a recording]).
  make_current();
  void* ptr = nullptr;
  const cudaError_t cudaMalloc_status = cudaMalloc(&ptr, nbytes == 0 ? 1 : nbytes);
  if (cudaMalloc_status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it so later checks do not report it
    return nullptr;
  }
  EF_CUDA_CHECK(cudaMalloc_status);
  return ptr;
}

void CudaBackend::raw_free(void* ptr) {
  if (ptr == nullptr) return;
  EF_CUDA_CHECK_PRINT(cudaSetDevice(physical_id_));
  EF_CUDA_CHECK_PRINT(cudaFree(ptr));
}

// Note [Host-to-device copies]
// copy_from_host lets the caller reuse its buffer as soon as it returns, and never makes it wait
// for the device: a data-loader thread uploading the next batch must not wait for the training step
// queued before it (a cudaMemcpy from pageable memory would, and would stall the stream while the
// driver stages the bytes). So the bytes go first into a page-locked staging buffer; the staging
// buffer is copied to the device with cudaMemcpyAsync on the device's stream (a DMA, ordered before
// the kernels that will read dst); and a host function queued behind the copy hands the staging
// buffer back to a free list. Staging buffers are recycled by size class (powers of two from 64 KiB)
// and freed with the backend. Copies above kMaxStagedBytes are rare (weights loaded once) and are
// made synchronously from pageable memory instead, so the pool stays small.
namespace {
constexpr size_t kMinStagedBytes = size_t{64} << 10;
constexpr size_t kMaxStagedBytes = size_t{64} << 20;

size_t staging_class(size_t nbytes) {
  size_t c = kMinStagedBytes;
  while (c < nbytes) c *= 2;
  return c;
}

struct StagingReturn {
  CudaBackend* backend;
  size_t size_class;
  void* buffer;
};
}  // namespace

void* CudaBackend::acquire_staging(size_t size_class) {
  {
    std::lock_guard<std::mutex> lock(staging_mu_);
    auto& free_list = staging_free_[size_class];
    if (!free_list.empty()) {
      void* buffer = free_list.back();
      free_list.pop_back();
      return buffer;
    }
  }
  void* buffer = nullptr;
  EF_CUDA_CHECK(cudaHostAlloc(&buffer, size_class, cudaHostAllocPortable));
  return buffer;
}

// Runs on a CUDA driver thread once the copy out of the buffer is done; it must not call CUDA.
void CUDART_CB CudaBackend::release_staging(void* user_data) {
  std::unique_ptr<StagingReturn> r(static_cast<StagingReturn*>(user_data));
  std::lock_guard<std::mutex> lock(r->backend->staging_mu_);
  r->backend->staging_free_[r->size_class].push_back(r->buffer);
}

void CudaBackend::copy_from_host(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  const auto gate_pass = activate();
  if (nbytes > kMaxStagedBytes) {
    EF_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream_));
    EF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  const size_t size_class = staging_class(nbytes);
  void* staging = acquire_staging(size_class);
  std::memcpy(staging, src, nbytes);
  auto give_back = std::make_unique<StagingReturn>(StagingReturn{this, size_class, staging});
  const cudaError_t copy_status = cudaMemcpyAsync(dst, staging, nbytes, cudaMemcpyHostToDevice, stream_);
  const cudaError_t enqueue_status = copy_status == cudaSuccess
                                         ? cudaLaunchHostFunc(stream_, &CudaBackend::release_staging, give_back.get())
                                         : copy_status;
  if (enqueue_status != cudaSuccess) {
    // Nothing will give the buffer back: wait for whatever was queued, then return it ourselves.
    EF_CUDA_CHECK_PRINT(cudaStreamSynchronize(stream_));
    release_staging(give_back.release());
    EF_CUDA_CHECK(enqueue_status);
  }
  (void)give_back.release();  // the host function owns it now
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  const auto gate_pass = activate();
  EF_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream_));
  synchronize_and_check();
}

// Note [Reading values later]: through a page-locked staging buffer (the DMA needs one to run
// asynchronously), an event behind the copy, and the bytes moved to dst by the waiting function.
std::function<void()> CudaBackend::copy_to_host_later(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return [] {};
  const auto gate_pass = activate();
  const size_t size_class = staging_class(nbytes);
  void* staging = acquire_staging(size_class);
  cudaEvent_t done = nullptr;
  const cudaError_t copy_status = cudaMemcpyAsync(staging, src, nbytes, cudaMemcpyDeviceToHost, stream_);
  cudaError_t status =
      copy_status == cudaSuccess ? cudaEventCreateWithFlags(&done, cudaEventDisableTiming) : copy_status;
  if (status == cudaSuccess) status = cudaEventRecord(done, stream_);
  const uint64_t mark = deferred_errors_.mark();
  // The staging buffer and the event go back once the copy is done, whether or not anyone waited
  // for the values (a run stopped by an error drops what it had queued).
  const std::shared_ptr<void> resources(nullptr, [this, size_class, staging, done](void*) {
    if (done != nullptr) {
      EF_CUDA_CHECK_PRINT(cudaEventSynchronize(done));
      EF_CUDA_CHECK_PRINT(cudaEventDestroy(done));
    }
    release_staging(new StagingReturn{this, size_class, staging});
  });
  if (status != cudaSuccess) {
    EF_CUDA_CHECK_PRINT(cudaStreamSynchronize(stream_));
    EF_CUDA_CHECK(status);
  }
  return [this, dst, nbytes, staging, done, mark, resources] {
    EF_CUDA_CHECK(cudaEventSynchronize(done));
    std::memcpy(dst, staging, nbytes);
    const std::string error = deferred_errors_.take_errors(
        mark, ::evenflow::detail::str_cat(" (found on ", name(), " when a value was read)"));
    EF_CHECK(error.empty(), error);
  };
}

void CudaBackend::synchronize() {
  const auto gate_pass = activate();
  synchronize_and_check();
}

// --- Deferred errors (Note [Index checks] in deferred_errors.h) -----------------------------------

// Whether this backend's stream is being recorded (Note [Recording CUDA devices] in cuda_graph.cu).
bool CudaBackend::recording() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EF_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
  return status != cudaStreamCaptureStatusNone;
}

DeferredErrors::Slot CudaBackend::index_check(std::function<std::string(int64_t)> describe) const {
  if (recording()) {
    // A replayed kernel writes the flag it was recorded with (Note [Index checks in a recorded step]).
    const uint64_t owner = recorded_checks_owner_.load(std::memory_order_acquire);
    EF_CHECK(owner != 0, name(),
             ": an indexing kernel with a bad-index check (a loss's class targets, gather, scatter_add, "
             "index_select, index_add) in a stream capture that is not a StepGraph's: its flag would never be read");
    return recorded_checks_origin_->deferred_errors_.reserve_recorded(owner, std::move(describe));
  }
  return deferred_errors_.reserve(std::move(describe), [this] { synchronize_and_check(); });
}

void CudaBackend::synchronize_and_check() const {
  const uint64_t mark = deferred_errors_.mark();
  EF_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::string error = deferred_errors_.take_errors(
      mark, ::evenflow::detail::str_cat(" (found on ", name(), " at the next synchronization)"));
  EF_CHECK(error.empty(), error);
}

// --- Library state (Note [Library handles and threads]) ------------------------------------------

void CudaBackend::check_held(const Lock& held) const {
  EF_ASSERT(held.owns_lock() && held.mutex() == &library_mu_, "library state used without its lock");
}

cublasHandle_t CudaBackend::cublas(const Lock& held) {
  check_held(held);
  if (cublas_ == nullptr) {
    cublasHandle_t handle = nullptr;
    EF_CUDA_CHECK(cublasCreate(&handle));
    cublasStatus_t status = cublasSetStream(handle, stream_);
    // cuBLAS's workspace of our own, made here: a recorded step may not allocate it (Note
    // [Recording CUDA devices]). 32 MiB is what cuBLAS's guide asks for Hopper's kernels.
    if (status == CUBLAS_STATUS_SUCCESS && cublas_workspace_ == nullptr) {
      constexpr size_t kWorkspace = size_t{32} << 20;
      if (cudaMalloc(&cublas_workspace_, kWorkspace) == cudaSuccess) {
        status = cublasSetWorkspace(handle, cublas_workspace_, kWorkspace);
      } else {
        (void)cudaGetLastError();
        cublas_workspace_ = nullptr;  // cuBLAS then takes its own
      }
    }
    if (status != CUBLAS_STATUS_SUCCESS) EF_CUDA_CHECK_PRINT(cublasDestroy(handle));
    EF_CUDA_CHECK(status);
    cublas_ = handle;
  }
  return cublas_;
}

cudnnHandle_t CudaBackend::cudnn(const Lock& held) {
  check_held(held);
  if (cudnn_ == nullptr) {
    cudnnHandle_t handle = nullptr;
    EF_CUDA_CHECK(cudnnCreate(&handle));
    const cudnnStatus_t stream_status = cudnnSetStream(handle, stream_);
    if (stream_status != CUDNN_STATUS_SUCCESS) EF_CUDA_CHECK_PRINT(cudnnDestroy(handle));
    EF_CUDA_CHECK(stream_status);
    cudnn_ = handle;
  }
  return cudnn_;
}

// A block from cudaMalloc on GPU `physical_id`, freed there by the last owner, from any thread
// (nothing is freed at process exit once the CUDA runtime is unloading).
static std::shared_ptr<void> owned_device_block(void* block, int physical_id) {
  return std::shared_ptr<void>(block, [physical_id](void* p) {
    int current = 0;
    const cudaError_t status = cudaGetDevice(&current);
    if (status == cudaErrorCudartUnloading) return;
    EF_CUDA_CHECK_PRINT(status);
    EF_CUDA_CHECK_PRINT(cudaSetDevice(physical_id));
    EF_CUDA_CHECK_PRINT(cudaFree(p));
    EF_CUDA_CHECK_PRINT(cudaSetDevice(current));
  });
}

void* CudaBackend::scratch(const Lock& held, size_t nbytes) {
  check_held(held);
  if (nbytes <= scratch_bytes_) return scratch_.get();
  EF_CHECK(!recording(), name(), ": a library workspace of ", nbytes, " bytes is needed inside a recorded step, ",
           scratch_bytes_,
           " were made before; warm the step up (StepGraph::warm_up) before recording it, so that every "
           "workspace is sized");
  // Work already queued on the stream may still use the old buffer; a recording holding it keeps it.
  EF_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const size_t old_bytes = scratch_bytes_;
  scratch_.reset();
  scratch_bytes_ = 0;
  constexpr size_t kGranule = static_cast<size_t>(1) << 20;  // grow in whole MiB to avoid regrowing by a little
  const size_t rounded = (nbytes + kGranule - 1) / kGranule * kGranule;
  for (const size_t size : {rounded, old_bytes}) {
    if (size == 0) break;
    void* block = nullptr;
    const cudaError_t cudaMalloc_status = cudaMalloc(&block, size);
    if (cudaMalloc_status == cudaSuccess) {
      scratch_ = owned_device_block(block, physical_id_);
      scratch_bytes_ = size;
      break;
    }
    if (cudaMalloc_status != cudaErrorMemoryAllocation) EF_CUDA_CHECK(cudaMalloc_status);
    (void)cudaGetLastError();  // out of memory: try to get the old buffer back, then report failure
  }
  return nbytes <= scratch_bytes_ ? scratch_.get() : nullptr;
}

std::shared_ptr<void> CudaBackend::hold_scratch(const Lock& held) {
  check_held(held);
  return scratch_;
}

std::map<ConvKey, ConvAlgo>& CudaBackend::conv_algos(const Lock& held) {
  check_held(held);
  return conv_algos_;
}

std::map<ConvKey, ConvPlan>& CudaBackend::bf16_conv_plans(const Lock& held) {
  check_held(held);
  return bf16_conv_plans_;
}

// --- Entry points of cuda_backend.h ----------------------------------------------------------------

int physical_device_count(std::string* why_none) {
  try {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      if (why_none != nullptr) {
        *why_none = ::evenflow::detail::str_cat("CUDA is not available: ", cudaGetErrorString(status), " (",
                                                static_cast<int>(status), ")");
      }
      return 0;
    }
    if (count == 0 && why_none != nullptr) *why_none = "no CUDA GPU found";
    return count;
  } catch (...) {  // only std::bad_alloc from building the message; this function never throws
    return 0;
  }
}

std::unique_ptr<Backend> make_backend(int logical_index, int physical_id) {
  std::string why_none;
  const int count = physical_device_count(&why_none);
  EF_CHECK(count > 0, "cuda:", logical_index, ": ", why_none);
  EF_CHECK(physical_id >= 0 && physical_id < count, "cuda:", logical_index, " maps to GPU ", physical_id,
           ", but this machine has ", count, " GPU", count == 1 ? "" : "s");
  return std::make_unique<CudaBackend>(logical_index, physical_id);
}

namespace {

// Lets `dst_gpu` reach `src_gpu`'s memory directly (NVLink / PCIe) where the hardware allows it,
// once per pair. Without it cudaMemcpyPeerAsync still works, staged through the host. Called with
// dst_gpu current.
void enable_peer_access(int dst_gpu, int src_gpu) {
  static std::mutex mu;
  static std::set<std::pair<int, int>> tried;
  std::lock_guard<std::mutex> lock(mu);
  if (!tried.insert({dst_gpu, src_gpu}).second) return;
  int can_access = 0;
  if (cudaDeviceCanAccessPeer(&can_access, dst_gpu, src_gpu) != cudaSuccess || can_access == 0) {
    (void)cudaGetLastError();
    return;
  }
  // Already enabled (by someone else) or not possible after all: either way the copy still works.
  if (cudaDeviceEnablePeerAccess(src_gpu, 0) != cudaSuccess) (void)cudaGetLastError();
}

// An event that records `stream`'s queued work, destroyed on scope exit.
class StreamMark {
 public:
  explicit StreamMark(cudaStream_t stream) {
    EF_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    const cudaError_t record_status = cudaEventRecord(event_, stream);
    if (record_status != cudaSuccess) EF_CUDA_CHECK_PRINT(cudaEventDestroy(event_));
    EF_CUDA_CHECK(record_status);
  }
  ~StreamMark() { EF_CUDA_CHECK_PRINT(cudaEventDestroy(event_)); }
  StreamMark(const StreamMark&) = delete;
  StreamMark& operator=(const StreamMark&) = delete;
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

// Note [Peer copies and collectives]
// A copy between devices orders itself on both streams: after the source's queued work (which may
// still be writing src) and before the source's later work (which may overwrite src or reuse its
// memory), and before the destination's later work. So the source's stream waits for the copy, and
// the copy runs behind whatever the destination's stream had queued. If that includes an NCCL
// collective still waiting for the source's rank, whose thread issues its part only after this
// copy, the two GPUs wait on each other: a hang that only the NCCL watchdog's timeout ends (as an
// ef::Error, Note [NCCL watchdog]). PyTorch's device-to-device copy orders the two streams the same
// way. The rule that keeps it from happening: copies between the GPUs of an NCCL communicator are
// made outside the ranks' tasks (DataParallelModel's scatter of the inputs and broadcast of the
// buffers run on the caller before the ranks start), or by data dependence after the collectives the
// destination queued (a loss reduced to the first device depends on every rank's forward). Logical
// devices of one GPU (EF_CUDA_DEVICES=0,0) use the local communicator, never NCCL. Not yet exercised
// on two GPUs.
void copy_peer(Backend& dst_backend, void* dst, Backend& src_backend, const void* src, size_t nbytes) {
  auto* to = dynamic_cast<CudaBackend*>(&dst_backend);
  auto* from = dynamic_cast<CudaBackend*>(&src_backend);
  EF_ASSERT(to != nullptr && from != nullptr, "copy_peer called with a backend that is not CUDA");
  if (nbytes == 0) return;
  // The copy runs on the destination's stream, after the source's queued work (which may still be
  // writing src), and the source's stream waits for it before its later work (which may reuse
  // src): see cuda_backend.h. No host wait.
  const auto from_pass = from->activate();
  const StreamMark src_ready(from->stream());
  const auto to_pass = to->activate();
  EF_CUDA_CHECK(cudaStreamWaitEvent(to->stream(), src_ready.event(), 0));
  if (to->physical_id() == from->physical_id()) {
    EF_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, to->stream()));
  } else {
    enable_peer_access(to->physical_id(), from->physical_id());
    EF_CUDA_CHECK(cudaMemcpyPeerAsync(dst, to->physical_id(), src, from->physical_id(), nbytes, to->stream()));
  }
  const StreamMark copied(to->stream());
  EF_CUDA_CHECK(cudaStreamWaitEvent(from->stream(), copied.event(), 0));
}

}  // namespace evenflow::cuda_backend
