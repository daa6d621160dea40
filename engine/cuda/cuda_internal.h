// The CudaBackend class, shared by the files that implement it: cuda_backend.cu (device, stream,
// memory, copies, library handles, index checks), one file per kernel family (cuda_elementwise.cu,
// cuda_unary.cu, cuda_reduce.cu, cuda_normalization.cu, cuda_indexing.cu, cuda_pooling.cu,
// cuda_adam.cu, cuda_gemm.cu), and cuda_conv.cu and cuda_conv_plans.cu (cuDNN convolutions: the
// legacy API and the entry points; the graph API's plans), which also share the convolution passes
// at the end. Only .cu files include this header; the rest of the engine sees cuda_backend.h.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cuda/cuda_check.h"
#include "evenflow/engine/cuda/deferred_errors.h"
#include "evenflow/engine/cuda/recording_gate.h"
#include "evenflow/engine/device.h"

namespace evenflow::cuda_backend {

// Note [Library handles and threads]
// Any thread may call a backend: its device's worker thread, user threads, another device's worker
// copying across. Kernel launches and stream operations are thread-safe, but a cuBLAS or cuDNN
// handle must not be used by two threads at once, and the scratch buffer (library workspace) must
// not be regrown while another thread has queued work that uses it. So each backend owns one handle
// of each, bound to its stream, and `library_mu_`, held while a handle or the scratch buffer is in
// use. The calls made under the lock only enqueue work on the stream, so it is held briefly; the
// stream then runs the work in order, which is what makes one scratch buffer enough. Functions that
// need the lock take the held lock as a parameter, so a caller cannot forget it.
// A recorded step's kernels keep the scratch buffer's address from the recording, and eager work
// between replays may need a larger buffer (classify's evaluation batches are ten times its training
// batches): so each recording holds the buffer its kernels were given (hold_scratch, a shared owner),
// and a buffer regrown after it is freed once the last recording holding it is dropped, not before.

// An owned descriptor of cuDNN's graph API (cudnnBackend*; cuda_conv_plans.cu); default-constructed: none.
class GraphDescriptor {
 public:
  GraphDescriptor() = default;
  explicit GraphDescriptor(cudnnBackendDescriptorType_t type);
  ~GraphDescriptor();
  GraphDescriptor(GraphDescriptor&& other) noexcept : desc_(std::exchange(other.desc_, nullptr)) {}
  GraphDescriptor& operator=(GraphDescriptor&& other) noexcept {
    std::swap(desc_, other.desc_);
    return *this;
  }
  cudnnBackendDescriptor_t get() const { return desc_; }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

// An execution plan of cuDNN's graph API for one pass and shape of a convolution (Note [bfloat16
// convolutions on cuDNN] in cuda_conv_plans.cu, Note [float32 convolutions on cuDNN's graph API] in
// cuda_conv.cu).
struct ConvPlan {
  // The tensors, convolution, operation and graph the plan was made from, shared by the plans of
  // one graph.
  std::shared_ptr<const std::vector<GraphDescriptor>> graph;
  GraphDescriptor config;  // the engine configuration
  GraphDescriptor plan;    // none: cuDNN has no plan for the shape
  size_t workspace = 0;
  std::string engine;  // "engine 71, runtime compiled", for EF_CUDNN_VERBOSE
  // bfloat16, timed under cuda_math().benchmark (at the first ask): whether the plan beats the
  // rounded operands on the float32 kernels.
  std::optional<bool> faster;
  // bfloat16: the plan's result is bfloat16, widened into the float32 output after it
  // (CudaMath::allow_bf16_conv_results); otherwise float32, written into the output.
  bool bf16_result = false;
};

// A cuDNN algorithm chosen for one convolution shape (see cuda_conv.cu): a legacy algorithm, or
// a graph-API plan.
struct ConvAlgo {
  int algo = 0;       // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  int math_type = 0;  // the cudnnMathType_t the algorithm runs with
  size_t workspace = 0;
  std::shared_ptr<const ConvPlan> plan;  // set: the plan runs instead of the legacy algorithm
};
// Pass, dtype, the 16 ConvArgs fields and the math settings: what a choice of algorithm depends on.
using ConvKey = std::array<int64_t, 22>;  // pass, dtype, shape (16), TF32, deterministic, benchmark, bf16 results

// The process's gate between recorded steps and other threads' work (Note [Work beside a recording]).
RecordingGate& recording_gate();

class CudaBackend final : public Backend {
 public:
  CudaBackend(int logical_index, int physical_id);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // Memory and copies (cuda_backend.cu).
  void* raw_alloc(size_t nbytes) override;
  void raw_free(void* ptr) override;
  void copy_from_host(void* dst, const void* src, size_t nbytes) override;
  void copy_to_host(void* dst, const void* src, size_t nbytes) override;
  std::function<void()> copy_to_host_later(void* dst, const void* src, size_t nbytes) override;
  void synchronize() override;

  // Kernels (one file per family: cuda_<family>.cu).
  void fill(const View& out, double value) override;
  void arange(const View& out, double start, double step) override;
  void copy(const View& out, const View& x) override;
  void unary(UnaryOp op, const View& out, const View& x, double a, double b) override;
  void binary(BinaryOp op, const View& out, const View& x, const View& y, double a) override;
  void where(const View& out, const View& cond, const View& x, const View& y) override;
  void add_n(const View& out, const std::vector<View>& xs) override;
  void check_index_range(const View& index, int64_t size, int64_t allowed,
                         std::function<std::string(int64_t)> describe) override;
  void adam(const AdamArgs& args, const std::vector<AdamOperands>& params) override;
  void reduce(ReduceOp op, const View& out, const View& x) override;
  void gemm(const GemmArgs& args) override;
  // cuBLAS multiplies bfloat16 operands itself (cuda_gemm.cu: Note [bfloat16 products on cuBLAS]).
  bool bf16_gemm(const GemmArgs& args) const override {
    return args.dtype == DType::Float32 && args.k > 0 && args.alpha == 1.0 && args.beta == 0.0;
  }
  void normalize(const NormArgs& args, const View& y, const View& mean, const View& var, const View& rstd,
                 const View& x, const View& weight, const View& bias, const RunningStats& running) override;
  void normalize_backward(const NormArgs& args, const View& gx, const View& gw, const View& gb, const View& gy,
                          const View& x, const View& mean, const View& rstd, const View& weight) override;
  bool normalize_double_backward(const NormArgs& args, const View& dgy, const View& dx, const View& dw, const View& ggx,
                                 const View& ggw, const View& ggb, const View& gy, const View& x, const View& mean,
                                 const View& rstd, const View& weight) override;
  void softmax(const View& out, const View& x, bool log) override;
  void max_pool2d(const PoolArgs& args, const View& out, const View& indices, const View& x) override;
  void gather(const View& out, const View& x, int dim, const View& index) override;
  void scatter_add(const View& out, int dim, const View& index, const View& src) override;
  void index_select(const View& out, const View& x, int dim, const View& index) override;
  void index_add(const View& out, int dim, const View& index, const View& src) override;
  void random(const View& out, RandomKind kind, double a, double b, const RandomKey& key) override;

  void max_pool2d_backward(const PoolArgs& args, const View& gx, const View& gy, const View& indices) override;

  // Convolutions (cuda_conv.cu).
  void conv2d(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias) override;
  void conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) override;
  void conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) override;
  // Under cuda_math().benchmark, whether cuDNN's graph-API plan for this pass and shape ran faster
  // than the rounded operands on the float32 kernels (Note [bfloat16 convolutions on cuDNN];
  // cuda_conv_plans.cu).
  bool bf16_conv(const ConvArgs& args, ConvPass pass) override;

  int physical_id() const { return physical_id_; }
  Device device() const { return evenflow::cuda(logical_index_); }  // this backend's logical device
  cudaStream_t stream() const { return stream_; }
  int sm_count() const { return sm_count_; }
  // "cuda:1 (GPU 0)", for messages.
  std::string name() const;
  // Makes this backend's GPU current on the calling thread, and lets it queue work: every entry
  // point starts with it and holds the Pass until its work is queued. A thread that does not work
  // for a step being recorded waits until the recording ends (Note [Work beside a recording]).
  RecordingGate::Pass activate() const;
  // Makes this backend's GPU current on the calling thread, passing no gate: for calls that queue no
  // work on its stream (making streams and events, cudaMalloc: they may be made holding a lock a
  // recording's threads need), and for a recording's own work or a caller that holds a Pass already.
  void make_current() const;
  // Whether the stream is being recorded into a CUDA graph (cuda_graph.cu).
  bool recording() const;

  // Library state, see Note [Library handles and threads]. Handles are created on first use.
  using Lock = std::unique_lock<std::mutex>;
  Lock lock_libraries() { return Lock{library_mu_}; }
  cublasHandle_t cublas(const Lock& held);
  cudnnHandle_t cudnn(const Lock& held);
  // A device buffer of at least nbytes, valid until the next call; nullptr when out of memory.
  void* scratch(const Lock& held, size_t nbytes);
  // The scratch buffer as it is (empty if none), kept alive by the returned owner however it is
  // regrown: what a recording holds for its kernels (Note [Library handles and threads]).
  std::shared_ptr<void> hold_scratch(const Lock& held);
  std::map<ConvKey, ConvAlgo>& conv_algos(const Lock& held);
  std::map<ConvKey, ConvPlan>& bf16_conv_plans(const Lock& held);

  // Note [Index checks]: reserves the flag of an indexing kernel about to be queued, with `describe`,
  // which makes the message of the error the next synchronization throws from the bad index. Queue
  // the kernel while the slot is alive.
  DeferredErrors::Slot index_check(std::function<std::string(int64_t)> describe) const;
  // Note [Index checks in a recorded step]: while recording `owner` (a non-zero id) records this
  // device, index_check hands out flags held for it by `origin`, the recording's first device (whose
  // stream runs the whole graph). Set before the recording starts, by the recording.
  void begin_recorded_checks(const CudaBackend* origin, uint64_t owner) const {
    recorded_checks_origin_ = origin;
    recorded_checks_owner_.store(owner, std::memory_order_release);
  }
  // Stops handing out `owner`'s flags (no effect when another recording's are handed out).
  void end_recorded_checks(uint64_t owner) const {
    recorded_checks_owner_.compare_exchange_strong(owner, 0, std::memory_order_acq_rel);
  }
  // On a recording's first device: frees the flags held for recording `owner`, once the device ran
  // its replays.
  void release_recorded_checks(uint64_t owner) const { deferred_errors_.release_recorded(owner); }
  // An error about work queued on this device found by another thread (an NCCL collective that
  // failed or timed out: Note [NCCL watchdog]); the next synchronization throws it, once.
  void report_error(const std::string& message) const { deferred_errors_.report(message); }
  // Forgets a reported error not yet thrown (its communicator was reset: Note [Aborting NCCL]).
  void clear_reported_error() const { deferred_errors_.clear_reported(); }

 private:
  // Waits for the stream, then throws ef::Error for a reported error (report_error) or else the
  // first bad index of the indexing kernels queued before (Note [Index checks]).
  void synchronize_and_check() const;
  void check_held(const Lock& held) const;
  // Page-locked staging buffers for copy_from_host (Note [Host-to-device copies]).
  void* acquire_staging(size_t size_class);
  static void CUDART_CB release_staging(void* user_data);

  int logical_index_;
  int physical_id_;
  int sm_count_ = 1;
  cudaStream_t stream_ = nullptr;

  std::mutex library_mu_;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::shared_ptr<void> scratch_;  // shared with the recordings whose kernels use it
  size_t scratch_bytes_ = 0;
  std::map<ConvKey, ConvAlgo> conv_algos_;
  std::map<ConvKey, ConvPlan> bf16_conv_plans_;  // destroyed before the cuDNN handle

  std::mutex staging_mu_;
  std::map<size_t, std::vector<void*>> staging_free_;  // by size class

  // Mutable: bookkeeping of queued work, kept by const kernel launchers.
  mutable DeferredErrors deferred_errors_;
  // begin_recorded_checks: the origin is written before the owner is published, and read after it.
  mutable const CudaBackend* recorded_checks_origin_ = nullptr;
  mutable std::atomic<uint64_t> recorded_checks_owner_{0};
};

// --- Convolutions: what cuda_conv.cu (the legacy API, the entry points) and cuda_conv_plans.cu -------
// (the graph API, bfloat16 compute) share. The templates are instantiated for the three passes.

// Owners of cuDNN descriptors (created per call: they are cheap host objects).
template <typename Desc, cudnnStatus_t (*kCreate)(Desc*), cudnnStatus_t (*kDestroy)(Desc)>
class Descriptor {
 public:
  Descriptor() { EF_CUDA_CHECK(kCreate(&desc_)); }
  ~Descriptor() { EF_CUDA_CHECK_PRINT(kDestroy(desc_)); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Desc get() const { return desc_; }

 private:
  Desc desc_ = nullptr;
};
using TensorDesc = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc =
    Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;

// The descriptors of one convolution: x [n, c_in, h, w], w [c_out, c_in / groups, kh, kw],
// y [n, c_out, oh, ow].
struct ConvDescs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
};

// --- The three passes ------------------------------------------------------------------------------------
// run(out, in_a, in_b): forward y = conv(x, w); backward data gx = conv_input_grad(w, gy);
// backward filter gw = conv_weight_grad(x, gy). All overwrite their output (beta = 0).

// A tensor's dims in NCHW order (the weight's: c_out, c_in / groups, kh, kw).
using Dims = std::array<int64_t, 4>;
inline Dims x_dims(const ConvArgs& a) {
  return {a.n, a.c_in, a.h, a.w};
}
inline Dims w_dims(const ConvArgs& a) {
  return {a.c_out, a.c_in / a.groups, a.kh, a.kw};
}
inline Dims y_dims(const ConvArgs& a) {
  return {a.n, a.c_out, a.oh, a.ow};
}

struct ForwardPass {
  using Algo = cudnnConvolutionFwdAlgo_t;
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static constexpr int kId = 0;
  static constexpr const char* kName = "conv2d";
  static cudnnStatus_t max_count(cudnnHandle_t h, int* count) {
    return cudnnGetConvolutionForwardAlgorithmMaxCount(h, count);
  }
  static cudnnStatus_t heuristics(cudnnHandle_t h, const ConvDescs& d, int requested, int* returned, Perf* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), requested, returned,
                                                  perf);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, Algo algo, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), algo, bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const ConvDescs& d, Algo algo, void* ws, size_t ws_bytes, const void* alpha,
                           const void* beta, void* y, const void* x, const void* w) {
    return cudnnConvolutionForward(h, alpha, d.x.get(), x, d.w.get(), w, d.conv.get(), algo, ws, ws_bytes, beta,
                                   d.y.get(), y);
  }
  // The graph API's operation: its attributes for the operands (in run's order: out, a, b), the
  // convolution, alpha and beta.
  static constexpr cudnnBackendDescriptorType_t kGraphOp = CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR;
  static constexpr std::array<cudnnBackendAttributeName_t, 6> kGraphAttrs = {
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  static std::array<Dims, 3> dims(const ConvArgs& a) { return {y_dims(a), x_dims(a), w_dims(a)}; }
};

struct BackwardDataPass {
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static constexpr int kId = 1;
  static constexpr const char* kName = "conv2d_input_grad";
  static cudnnStatus_t max_count(cudnnHandle_t h, int* count) {
    return cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, count);
  }
  static cudnnStatus_t heuristics(cudnnHandle_t h, const ConvDescs& d, int requested, int* returned, Perf* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), requested,
                                                       returned, perf);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, Algo algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), algo, bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const ConvDescs& d, Algo algo, void* ws, size_t ws_bytes, const void* alpha,
                           const void* beta, void* gx, const void* w, const void* gy) {
    return cudnnConvolutionBackwardData(h, alpha, d.w.get(), w, d.y.get(), gy, d.conv.get(), algo, ws, ws_bytes, beta,
                                        d.x.get(), gx);
  }
  static constexpr cudnnBackendDescriptorType_t kGraphOp = CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR;
  static constexpr std::array<cudnnBackendAttributeName_t, 6> kGraphAttrs = {
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
  static std::array<Dims, 3> dims(const ConvArgs& a) { return {x_dims(a), w_dims(a), y_dims(a)}; }
};

struct BackwardFilterPass {
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static constexpr int kId = 2;
  static constexpr const char* kName = "conv2d_weight_grad";
  static cudnnStatus_t max_count(cudnnHandle_t h, int* count) {
    return cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, count);
  }
  static cudnnStatus_t heuristics(cudnnHandle_t h, const ConvDescs& d, int requested, int* returned, Perf* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), requested,
                                                         returned, perf);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, Algo algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), algo,
                                                          bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const ConvDescs& d, Algo algo, void* ws, size_t ws_bytes, const void* alpha,
                           const void* beta, void* gw, const void* x, const void* gy) {
    return cudnnConvolutionBackwardFilter(h, alpha, d.x.get(), x, d.y.get(), gy, d.conv.get(), algo, ws, ws_bytes, beta,
                                          d.w.get(), gw);
  }
  static constexpr cudnnBackendDescriptorType_t kGraphOp =
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
  static constexpr std::array<cudnnBackendAttributeName_t, 6> kGraphAttrs = {
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  static std::array<Dims, 3> dims(const ConvArgs& a) { return {w_dims(a), x_dims(a), y_dims(a)}; }
};

// The key of a pass and shape in the backend's caches of choices (cuda_conv.cu).
ConvKey conv_key(int pass, DType dtype, const ConvArgs& a, const CudaMath& math);
// EF_CUDNN_VERBOSE=1: print each shape's choice to stderr (cuda_conv.cu).
bool cudnn_verbose();
// A shape for those messages: "x 32x64x56x56, w 64x64x3x3 (stride 1, ...)" (cuda_conv.cu).
std::string shape_text(const ConvArgs& a);

// Milliseconds one call of `run` (which queues work on the stream and returns its cuDNN status)
// takes: the least of two, timed on the stream (the host waits).
template <typename Run>
float time_on_stream(CudaBackend& be, const Run& run) {
  struct Event {
    cudaEvent_t e = nullptr;
    Event() { EF_CUDA_CHECK(cudaEventCreate(&e)); }
    ~Event() { EF_CUDA_CHECK_PRINT(cudaEventDestroy(e)); }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
  };
  const Event start, stop;
  float best = std::numeric_limits<float>::infinity();
  for (int i = 0; i < 2; ++i) {
    EF_CUDA_CHECK(cudaEventRecord(start.e, be.stream()));
    EF_CUDA_CHECK(run());
    EF_CUDA_CHECK(cudaEventRecord(stop.e, be.stream()));
    EF_CUDA_CHECK(cudaEventSynchronize(stop.e));
    float ms = 0;
    EF_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
    best = std::min(best, ms);
  }
  return best;
}

// Runs one pass in float32 or float64 with the algorithm chosen for the shape, legacy or a graph-API
// plan (cuda_conv.cu: Note [cuDNN algorithm choice]).
template <typename Pass>
void run_conv(CudaBackend& be, const ConvArgs& a, DType dtype, const View& out, const View& in_a, const View& in_b);

// The graph API's side of a timed float32 choice (Note [float32 convolutions on cuDNN's graph API]),
// defined with the graph API's helpers (cuda_conv_plans.cu).
template <typename Pass>
std::vector<ConvAlgo> graph_algos(cudnnHandle_t h, const ConvArgs& a, const CudaMath& settings);
// Runs a plan: result, a, b in run's order (cuda_conv_plans.cu).
cudnnStatus_t execute_plan(cudnnHandle_t h, const ConvPlan& p, void* result, const void* a, const void* b,
                           void* workspace);
// Runs one pass of bfloat16 compute on the shape's plan (cuda_conv_plans.cu: Note [bfloat16
// convolutions on cuDNN]).
template <typename Pass>
void run_bf16_conv(CudaBackend& be, const ConvArgs& a, const View& out, const View& in_a, const View& in_b);

}  // namespace evenflow::cuda_backend
