// The recording of a step's work on CUDA logical devices as one CUDA graph (StepGraph,
// engine/step_graph.h; Note [Recording CUDA devices]).
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "evenflow/engine/cuda/cuda_backend.h"
#include "evenflow/engine/cuda/cuda_internal.h"

namespace evenflow::cuda_backend {

// Note [Recording CUDA devices]
// A step's kernels are recorded by stream capture: the first device's stream is put in capture
// mode, and every other device's stream joins the capture by waiting on an event recorded in it, so
// whatever the step's threads queue on any of those streams -- kernels, library calls, the copies
// and event waits that order one logical device's work after another's -- becomes a node of one
// graph, with the edges the events made. Before the capture ends each stream is joined back into
// the first (an event recorded on it, waited on by the first), since a capture must end where it
// began. Replaying orders the graph after the work already queued on every stream (the inputs
// copied in, the step scalars) and the streams' later work after the graph, with the same events.
//
// The capture is in relaxed mode: the step's threads are the caller's and the devices' workers, and
// a block the step's pool obtains from the device while recording (cudaMalloc) must not fail the
// capture. Other threads' work stays out of it: the recording closes the process's RecordingGate
// before it begins and opens it when it ends (Note [Work beside a recording] in recording_gate.h). What cannot be
// recorded fails it: a synchronization (a host read, which the engine refuses before the runtime does), a workspace
// that has to grow (CudaBackend::scratch). An indexing kernel's bad-index flag is one the recording holds (Note [Index
// checks in a recorded step]), freed with it. Logical devices of one GPU only: on GPUs of their own each would need its
// own graph, and NCCL's collectives inside it.
class CudaRecording final : public ::evenflow::detail::DeviceRecording {
 public:
  explicit CudaRecording(std::vector<CudaBackend*> backends) : backends_(std::move(backends)) {
    CudaBackend& origin = *backends_[0];
    for (CudaBackend* b : backends_) b->begin_recorded_checks(&origin, id_);
    try {
      // This thread is the recording: it passes no gate (Note [Work beside a recording]).
      origin.make_current();
      for (size_t i = 0; i < backends_.size(); ++i) {
        cudaEvent_t e = nullptr;
        EF_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        events_.push_back(e);
      }
      recording_gate().close([&] { return "recording the step on " + origin.name(); }, RecordingGate::kWaitLimit);
      gate_closed_ = true;
      EF_CUDA_CHECK(cudaStreamBeginCapture(origin.stream(), cudaStreamCaptureModeRelaxed));
      capturing_ = true;
      // The other streams join the capture.
      EF_CUDA_CHECK(cudaEventRecord(events_[0], origin.stream()));
      for (size_t i = 1; i < backends_.size(); ++i) {
        backends_[i]->make_current();
        EF_CUDA_CHECK(cudaStreamWaitEvent(backends_[i]->stream(), events_[0], 0));
      }
      // The scratch buffers the step's kernels will be given: fixed from here (no regrowth while
      // recording, no other thread's work while the gate is closed), and kept for the replays
      // however later eager work regrows them (Note [Library handles and threads]).
      for (CudaBackend* b : backends_) scratch_held_.push_back(b->hold_scratch(b->lock_libraries()));
    } catch (...) {
      abandon();
      release_checks();
      for (cudaEvent_t e : events_) EF_CUDA_CHECK_PRINT(cudaEventDestroy(e));
      throw;
    }
  }

  // After the devices ran the replays (StepGraph waits for them first).
  ~CudaRecording() override {
    abandon();
    release_checks();
    if (exec_ != nullptr) EF_CUDA_CHECK_PRINT(cudaGraphExecDestroy(exec_));
    if (graph_ != nullptr) EF_CUDA_CHECK_PRINT(cudaGraphDestroy(graph_));
    for (cudaEvent_t e : events_) EF_CUDA_CHECK_PRINT(cudaEventDestroy(e));
  }

  void end() override {
    CudaBackend& origin = *backends_[0];
    for (CudaBackend* b : backends_) b->end_recorded_checks(id_);
    join_into_origin();
    origin.make_current();
    capturing_ = false;
    const cudaError_t status = cudaStreamEndCapture(origin.stream(), &graph_);
    open_gate();
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      EF_ERROR("the CUDA runtime refused the recorded step on ", origin.name(), ": ", cudaGetErrorString(status), " (",
               static_cast<int>(status), "); something in the step synchronized or could not be captured");
    }
    EF_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &nodes_));
    EF_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    EF_CUDA_CHECK(cudaGraphUpload(exec_, origin.stream()));
  }

  void abandon() noexcept override {
    for (CudaBackend* b : backends_) b->end_recorded_checks(id_);
    if (capturing_) {
      capturing_ = false;
      CudaBackend& origin = *backends_[0];
      // The joins may fail once the runtime has invalidated the capture; ending it is what matters.
      try {
        join_into_origin();
      } catch (const std::exception&) {
      }
      (void)cudaSetDevice(origin.physical_id());
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(origin.stream(), &partial) == cudaSuccess && partial != nullptr)
        EF_CUDA_CHECK_PRINT(cudaGraphDestroy(partial));
      (void)cudaGetLastError();
    }
    open_gate();  // once no capture is left for other threads' work to join
  }

  void replay() override {
    CudaBackend& origin = *backends_[0];
    EF_ASSERT(exec_ != nullptr, "replay of a CUDA recording that did not end");
    const auto gate_pass = origin.activate();  // held to the end, for every stream's work below
    join_into_origin();                        // the inputs and scalars the other streams' copies wrote
    origin.make_current();
    EF_CUDA_CHECK(cudaGraphLaunch(exec_, origin.stream()));
    EF_CUDA_CHECK(cudaEventRecord(events_[0], origin.stream()));
    for (size_t i = 1; i < backends_.size(); ++i) {
      backends_[i]->make_current();
      EF_CUDA_CHECK(cudaStreamWaitEvent(backends_[i]->stream(), events_[0], 0));
    }
  }

  int64_t size() const override { return static_cast<int64_t>(nodes_); }

 private:
  // The first stream waits for the work queued on the others. The caller is the recording, or holds
  // a Pass (replay).
  void join_into_origin() {
    CudaBackend& origin = *backends_[0];
    for (size_t i = 1; i < backends_.size(); ++i) {
      backends_[i]->make_current();
      EF_CUDA_CHECK(cudaEventRecord(events_[i], backends_[i]->stream()));
      origin.make_current();
      EF_CUDA_CHECK(cudaStreamWaitEvent(origin.stream(), events_[i], 0));
    }
  }

  void release_checks() noexcept { backends_[0]->release_recorded_checks(id_); }
  void open_gate() noexcept {
    if (std::exchange(gate_closed_, false)) recording_gate().open();
  }

  // Which recording holds a flag of Note [Index checks in a recorded step].
  static uint64_t next_id() {
    static std::atomic<uint64_t> last{0};
    return ++last;
  }

  const uint64_t id_ = next_id();
  std::vector<CudaBackend*> backends_;
  std::vector<cudaEvent_t> events_;  // one per stream, for the joins
  bool capturing_ = false;
  bool gate_closed_ = false;  // by this recording, from before its capture to its end
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
  std::vector<std::shared_ptr<void>> scratch_held_;  // each device's scratch buffer, as recorded
};

std::unique_ptr<::evenflow::detail::DeviceRecording> begin_recording(const std::vector<Backend*>& backends) {
  std::vector<CudaBackend*> cuda;
  for (Backend* b : backends) {
    auto* c = dynamic_cast<CudaBackend*>(b);
    EF_ASSERT(c != nullptr, "begin_recording called with a backend that is not CUDA");
    cuda.push_back(c);
  }
  return std::make_unique<CudaRecording>(std::move(cuda));
}

}  // namespace evenflow::cuda_backend
