// The CUDA backend's convolutions: conv2d, conv2d_input_grad and conv2d_weight_grad with cuDNN's
// legacy convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter, still part of
// cuDNN 9), NCHW input, OIHW weight, groups, float32 and float64. One template runs all three
// passes; a traits struct per pass names its cuDNN calls.
#include <algorithm>
#include <climits>
#include <limits>
#include <vector>

#include "evenflow/engine/cuda/cuda_internal.h"
#include "evenflow/engine/device.h"

namespace evenflow::cuda_backend {
namespace {

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

int as_int(int64_t v, const char* op) {
  EF_CHECK(v >= 0 && v <= INT_MAX, op, ": size ", v, " is too large for cuDNN");
  return static_cast<int>(v);
}

// Note [cuDNN math for float32]
// cuDNN's default math mode lets float32 convolutions run on TF32 tensor cores on Ampere and later
// (10-bit mantissa inputs). That is allowed or not by cuda_math().allow_tf32_conv (Note [CUDA math
// settings] in engine/device.h; PyTorch's default allows it): when not, float32 uses CUDNN_FMA_MATH
// (plain fp32 FMA kernels) and algorithms reporting tensor-op math are skipped, so the backends agree
// within float rounding. float64 keeps the default: its tensor-core path (DMMA) is full IEEE double.
void set_descriptors(ConvDescs& d, const ConvArgs& a, DType dtype, const CudaMath& settings, const char* op) {
  // The legacy API indexes each tensor with 32-bit integers.
  for (const int64_t elements : {a.n * a.c_in * a.h * a.w, a.n * a.c_out * a.oh * a.ow}) {
    EF_CHECK(elements <= INT_MAX, op, ": a tensor of ", elements,
             " elements is too large for cuDNN (at most 2^31 - 1)");
  }
  const cudnnDataType_t type = dtype == DType::Float32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
  EF_CUDA_CHECK(cudnnSetTensor4dDescriptor(d.x.get(), CUDNN_TENSOR_NCHW, type, as_int(a.n, op), as_int(a.c_in, op),
                                           as_int(a.h, op), as_int(a.w, op)));
  EF_CUDA_CHECK(cudnnSetTensor4dDescriptor(d.y.get(), CUDNN_TENSOR_NCHW, type, as_int(a.n, op), as_int(a.c_out, op),
                                           as_int(a.oh, op), as_int(a.ow, op)));
  EF_CUDA_CHECK(cudnnSetFilter4dDescriptor(d.w.get(), type, CUDNN_TENSOR_NCHW, as_int(a.c_out, op),
                                           as_int(a.c_in / a.groups, op), as_int(a.kh, op), as_int(a.kw, op)));
  EF_CUDA_CHECK(cudnnSetConvolution2dDescriptor(d.conv.get(), as_int(a.pad_h, op), as_int(a.pad_w, op),
                                                as_int(a.stride_h, op), as_int(a.stride_w, op), as_int(a.dil_h, op),
                                                as_int(a.dil_w, op), CUDNN_CROSS_CORRELATION, type));
  EF_CUDA_CHECK(cudnnSetConvolutionGroupCount(d.conv.get(), as_int(a.groups, op)));
  const bool fma_only = dtype == DType::Float32 && !settings.allow_tf32_conv;
  EF_CUDA_CHECK(cudnnSetConvolutionMathType(d.conv.get(), fma_only ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH));
  int dims[4] = {};
  EF_CUDA_CHECK(cudnnGetConvolutionNdForwardOutputDim(d.conv.get(), d.x.get(), d.w.get(), 4, dims));
  EF_ASSERT(dims[0] == a.n && dims[1] == a.c_out && dims[2] == a.oh && dims[3] == a.ow, op, ": cuDNN computes output ",
            dims[0], "x", dims[1], "x", dims[2], "x", dims[3], ", the caller ", a.n, "x", a.c_out, "x", a.oh, "x",
            a.ow);
}

// --- The three passes ------------------------------------------------------------------------------------
// run(out, in_a, in_b): forward y = conv(x, w); backward data gx = conv_input_grad(w, gy);
// backward filter gw = conv_weight_grad(x, gy). All overwrite their output (beta = 0).

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
};

ConvKey conv_key(int pass, DType dtype, const ConvArgs& a, const CudaMath& math) {
  // clang-format off
  return {pass, static_cast<int64_t>(dtype),
          a.n, a.c_in, a.h, a.w, a.c_out, a.kh, a.kw, a.oh, a.ow,
          a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups,
          math.allow_tf32_conv, math.deterministic, math.benchmark};
  // clang-format on
}

// Note [cuDNN algorithm choice]
// Per shape and math setting, once (cached in the backend): cuDNN's heuristics rank the algorithms
// by expected speed (no benchmarking, so the first call is cheap). The candidates are those cuDNN
// supports that use tensor-op math on float32 only where TF32 is allowed (Note [cuDNN math for
// float32]; never CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, which may compute in float16); with
// cuda_math().deterministic (PyTorch's cudnn.deterministic) only algorithms that repeat bit for bit,
// and if none does that is an error; without it (the default) the fastest wins, atomics in the
// backward passes included. The first candidate whose workspace we can allocate and that runs is
// cached; one that fails at its call (a heuristic's choice may still be refused for the actual
// operands: PyTorch tries the next one too) gives way to the next. With cuda_math().benchmark every
// candidate runs once to warm up and is then timed (the least of two runs, CUDA events on the
// stream, the host waiting), and the fastest is cached: on an H200 the heuristics' first choice ran
// wgan_gp's and the FashionMNIST network's forward convolutions 1.5-2.3x slower than PyTorch's
// timed choice.
template <typename Pass>
std::vector<ConvAlgo> candidate_algos(cudnnHandle_t h, const ConvDescs& d, DType dtype, const CudaMath& settings) {
  int max_count = 0;
  EF_CUDA_CHECK(Pass::max_count(h, &max_count));
  std::vector<typename Pass::Perf> perf(static_cast<size_t>(std::max(max_count, 1)));
  int returned = 0;
  EF_CUDA_CHECK(Pass::heuristics(h, d, static_cast<int>(perf.size()), &returned, perf.data()));
  const bool f32 = dtype == DType::Float32, fma_only = f32 && !settings.allow_tf32_conv;
  std::vector<ConvAlgo> out;
  for (int i = 0; i < returned; ++i) {
    const auto& p = perf[static_cast<size_t>(i)];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (settings.deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (f32 && p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    if (fma_only && p.mathType == CUDNN_TENSOR_OP_MATH) continue;
    // Without TF32, float32 runs with FMA math: cuDNN's "default" would permit TF32.
    const cudnnMathType_t math = fma_only ? CUDNN_FMA_MATH : p.mathType;
    EF_CUDA_CHECK(cudnnSetConvolutionMathType(d.conv.get(), math));
    size_t workspace = 0;
    if (Pass::workspace(h, d, p.algo, &workspace) != CUDNN_STATUS_SUCCESS) continue;
    out.push_back({static_cast<int>(p.algo), static_cast<int>(math), workspace});
  }
  return out;
}

// Runs one algorithm; the status of cuDNN's call (our own failures throw).
template <typename Pass>
cudnnStatus_t run_algo(CudaBackend& be, const CudaBackend::Lock& lock, cudnnHandle_t h, const ConvDescs& d,
                       const ConvAlgo& algo, DType dtype, const View& out, const View& in_a, const View& in_b) {
  EF_CUDA_CHECK(cudnnSetConvolutionMathType(d.conv.get(), static_cast<cudnnMathType_t>(algo.math_type)));
  void* workspace = be.scratch(lock, algo.workspace);
  EF_CHECK(algo.workspace == 0 || workspace != nullptr, Pass::kName, ": out of memory on ", be.name(),
           " for a cuDNN workspace of ", algo.workspace, " bytes");
  const float one_f = 1.0f, zero_f = 0.0f;  // alpha and beta: float for float data, double for double
  const double one_d = 1.0, zero_d = 0.0;
  const bool f32 = dtype == DType::Float32;
  const void* alpha = f32 ? static_cast<const void*>(&one_f) : static_cast<const void*>(&one_d);
  const void* beta = f32 ? static_cast<const void*>(&zero_f) : static_cast<const void*>(&zero_d);
  return Pass::run(h, d, static_cast<typename Pass::Algo>(algo.algo), workspace, algo.workspace, alpha, beta, out.data,
                   in_a.data, in_b.data);
}

// Milliseconds one run of `algo` takes: the least of two, timed on the stream (the host waits).
template <typename Pass>
float time_algo(CudaBackend& be, const CudaBackend::Lock& lock, cudnnHandle_t h, const ConvDescs& d,
                const ConvAlgo& algo, DType dtype, const View& out, const View& in_a, const View& in_b) {
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
    EF_CUDA_CHECK(run_algo<Pass>(be, lock, h, d, algo, dtype, out, in_a, in_b));
    EF_CUDA_CHECK(cudaEventRecord(stop.e, be.stream()));
    EF_CUDA_CHECK(cudaEventSynchronize(stop.e));
    float ms = 0;
    EF_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
    best = std::min(best, ms);
  }
  return best;
}

template <typename Pass>
void run_conv(CudaBackend& be, const ConvArgs& a, DType dtype, const View& out, const View& in_a, const View& in_b) {
  be.activate();
  EF_CHECK(is_floating(dtype), Pass::kName, ": dtype ", dtype_name(dtype),
           " is not supported (float32 or float64 expected)");
  EF_ASSERT(out.dtype == dtype && in_a.dtype == dtype && in_b.dtype == dtype && out.is_contiguous() &&
                in_a.is_contiguous() && in_b.is_contiguous(),
            Pass::kName, ": operands must be contiguous and of one dtype");
  EF_ASSERT(a.groups > 0 && a.c_in % a.groups == 0 && a.c_out % a.groups == 0, Pass::kName, ": bad groups");
  if (out.numel() == 0) return;
  if (in_a.numel() == 0 || in_b.numel() == 0) {  // an empty sum; cuDNN rejects zero-sized tensors
    EF_CUDA_CHECK(cudaMemsetAsync(out.data, 0, static_cast<size_t>(out.numel()) * dtype_size(dtype), be.stream()));
    return;
  }
  const CudaMath settings = cuda_math();
  ConvDescs d;
  set_descriptors(d, a, dtype, settings, Pass::kName);
  const ConvKey key = conv_key(Pass::kId, dtype, a, settings);

  const CudaBackend::Lock lock = be.lock_libraries();
  const cudnnHandle_t h = be.cudnn(lock);
  auto& cache = be.conv_algos(lock);
  if (const auto it = cache.find(key); it != cache.end()) {
    EF_CUDA_CHECK(run_algo<Pass>(be, lock, h, d, it->second, dtype, out, in_a, in_b));
    return;
  }
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  bool workspace_too_large = false;
  const ConvAlgo* fastest = nullptr;
  float fastest_ms = 0;
  const std::vector<ConvAlgo> candidates = candidate_algos<Pass>(h, d, dtype, settings);
  for (const ConvAlgo& algo : candidates) {
    if (algo.workspace > 0 && be.scratch(lock, algo.workspace) == nullptr) {
      workspace_too_large = true;
      continue;
    }
    last = run_algo<Pass>(be, lock, h, d, algo, dtype, out, in_a, in_b);
    if (last != CUDNN_STATUS_SUCCESS) continue;
    if (!settings.benchmark) {
      cache.emplace(key, algo);
      return;
    }
    const float ms = time_algo<Pass>(be, lock, h, d, algo, dtype, out, in_a, in_b);
    if (fastest == nullptr || ms < fastest_ms) {
      fastest = &algo;
      fastest_ms = ms;
    }
  }
  if (fastest != nullptr) {
    cache.emplace(key, *fastest);
    EF_CUDA_CHECK(run_algo<Pass>(be, lock, h, d, *fastest, dtype, out, in_a, in_b));  // its result, not the last's
    return;
  }
  EF_ERROR(Pass::kName, ": cuDNN has no usable ", settings.deterministic ? "deterministic " : "",
           "algorithm for this shape on ", be.name(),
           workspace_too_large ? " (some need more workspace memory than is free)" : "", "; the last one tried said '",
           cudnnGetErrorString(last), "'");
}

}  // namespace

void CudaBackend::conv2d(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias) {
  run_conv<ForwardPass>(*this, args, x.dtype, y, x, w);
  // In place on the stream, with the elementwise kernel every other bias add uses.
  if (bias.data != nullptr) binary(BinaryOp::Add, y, y, channel_broadcast(bias, y));
}

void CudaBackend::conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) {
  run_conv<BackwardDataPass>(*this, args, gy.dtype, gx, w, gy);
}

void CudaBackend::conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) {
  run_conv<BackwardFilterPass>(*this, args, x.dtype, gw, x, gy);
}

}  // namespace evenflow::cuda_backend
