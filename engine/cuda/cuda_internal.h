// The CudaBackend class, shared by the files that implement it: cuda_backend.cu (device, stream,
// memory, copies, library handles, index checks), one file per kernel family (cuda_elementwise.cu,
// cuda_unary.cu, cuda_reduce.cu, cuda_normalization.cu, cuda_indexing.cu, cuda_pooling.cu,
// cuda_adam.cu, cuda_gemm.cu) and cuda_conv.cu (cuDNN convolutions). Only .cu files include this
// header; the rest of the engine sees cuda_backend.h.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
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

// An owned descriptor of cuDNN's graph API (cudnnBackend*; cuda_conv.cu); default-constructed: none.
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
// convolutions on cuDNN], Note [float32 convolutions on cuDNN's graph API] in cuda_conv.cu).
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
using ConvKey = std::array<int64_t, 21>;  // pass, dtype, shape (16), TF32, deterministic, benchmark

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
  void check_index_range(const View& index, int64_t size, int64_t allowed,
                         std::function<std::string(int64_t)> describe) override;
  void adam(const AdamArgs& args, const std::vector<AdamOperands>& params) override;
  void reduce(ReduceOp op, const View& out, const View& x) override;
  void gemm(const GemmArgs& args) override;
  // cuBLAS multiplies bfloat16 operands itself (cuda_gemm.cu: Note [bfloat16 products on cuBLAS]).
  bool bf16_gemm(const GemmArgs& args) const override {
    return args.dtype == DType::Float32 && args.k > 0 && args.alpha == 1.0 && args.beta == 0.0;
  }
  void normalize(const NormArgs& args, const View& y, const View& mean, const View& var, const View& x,
                 const View& weight, const View& bias) override;
  void normalize_backward(const NormArgs& args, const View& gx, const View& gw, const View& gb, const View& gy,
                          const View& x, const View& mean, const View& rstd, const View& weight) override;
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
  // than the rounded operands on the float32 kernels (Note [bfloat16 convolutions on cuDNN]).
  bool bf16_conv(const ConvArgs& args, ConvPass pass) override;

  int physical_id() const { return physical_id_; }
  Device device() const { return evenflow::cuda(logical_index_); }  // this backend's logical device
  cudaStream_t stream() const { return stream_; }
  int sm_count() const { return sm_count_; }
  // "cuda:1 (GPU 0)", for messages.
  std::string name() const;
  // Makes this backend's GPU current on the calling thread; every entry point starts with it.
  void activate() const;
  // Whether the stream is being recorded into a CUDA graph (cuda_graph.cu).
  bool recording() const;
  // Waits while another thread's step is recorded on this stream (activate's; Note [Recording CUDA
  // devices] in cuda_graph.cu).
  void wait_for_recording() const;

  // Library state, see Note [Library handles and threads]. Handles are created on first use.
  using Lock = std::unique_lock<std::mutex>;
  Lock lock_libraries() { return Lock{library_mu_}; }
  cublasHandle_t cublas(const Lock& held);
  cudnnHandle_t cudnn(const Lock& held);
  // A device buffer of at least nbytes, valid until the next call; nullptr when out of memory.
  void* scratch(const Lock& held, size_t nbytes);
  std::map<ConvKey, ConvAlgo>& conv_algos(const Lock& held);
  std::map<ConvKey, ConvPlan>& bf16_conv_plans(const Lock& held);

  // Note [Index checks]: reserves the flag of an indexing kernel about to be queued, with `describe`,
  // which makes the message of the error the next synchronization throws from the bad index. Queue
  // the kernel while the slot is alive.
  DeferredErrors::Slot index_check(std::function<std::string(int64_t)> describe) const;
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
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::map<ConvKey, ConvAlgo> conv_algos_;
  std::map<ConvKey, ConvPlan> bf16_conv_plans_;  // destroyed before the cuDNN handle

  std::mutex staging_mu_;
  std::map<size_t, std::vector<void*>> staging_free_;  // by size class

  // Mutable: bookkeeping of queued work, kept by const kernel launchers.
  mutable DeferredErrors deferred_errors_;
};

}  // namespace evenflow::cuda_backend
