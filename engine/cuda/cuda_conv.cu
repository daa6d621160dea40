// The CUDA backend's convolutions: conv2d, conv2d_input_grad and conv2d_weight_grad with cuDNN's
// legacy convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter, still part of
// cuDNN 9), NCHW input, OIHW weight, groups, float32 and float64, and the choice of algorithm per
// shape (Note [cuDNN algorithm choice]; timed under cuda_math().benchmark beside cuDNN's graph-API
// plans: Note [float32 convolutions on cuDNN's graph API]). The graph API and bfloat16 compute are
// in cuda_conv_plans.cu; the traits struct per pass, naming its cuDNN calls and graph operation, is
// in cuda_internal.h.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "evenflow/engine/cuda/cuda_internal.h"
#include "evenflow/engine/device.h"

namespace evenflow::cuda_backend {

ConvKey conv_key(int pass, DType dtype, const ConvArgs& a, const CudaMath& math) {
  // clang-format off
  return {pass, static_cast<int64_t>(dtype),
          a.n, a.c_in, a.h, a.w, a.c_out, a.kh, a.kw, a.oh, a.ow,
          a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups,
          math.allow_tf32_conv, math.deterministic, math.benchmark,
          dtype == DType::BFloat16 && math.allow_bf16_conv_results};  // float32 shapes do not depend on it
  // clang-format on
}

bool cudnn_verbose() {
  static const bool verbose = [] {
    const char* env = std::getenv("EF_CUDNN_VERBOSE");
    return env != nullptr && *env != '\0' && std::string(env) != "0";
  }();
  return verbose;
}

std::string shape_text(const ConvArgs& a) {
  return ::evenflow::detail::str_cat("x ", a.n, "x", a.c_in, "x", a.h, "x", a.w, ", w ", a.c_out, "x",
                                     a.c_in / a.groups, "x", a.kh, "x", a.kw, " (stride ", a.stride_h, ", padding ",
                                     a.pad_h, ", dilation ", a.dil_h, ", groups ", a.groups, ")");
}

namespace {

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
// wgan_gp's and the FashionMNIST network's forward convolutions well behind PyTorch's timed choice
// (docs/gpu.md, "2026-11-26, NVIDIA H200", run 1).
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

// Whether a plan can take these operands: the graph's tensors promise 16-byte alignment.
bool plan_aligned(const View& out, const View& in_a, const View& in_b) {
  for (const void* p : {out.data, in_a.data, in_b.data}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Runs one algorithm; the status of cuDNN's call (our own failures throw).
template <typename Pass>
cudnnStatus_t run_algo(CudaBackend& be, const CudaBackend::Lock& lock, cudnnHandle_t h, const ConvDescs& d,
                       const ConvAlgo& algo, DType dtype, const View& out, const View& in_a, const View& in_b) {
  if (algo.plan && (algo.algo < 0 || plan_aligned(out, in_a, in_b))) {
    void* workspace = be.scratch(lock, algo.plan->workspace);
    EF_CHECK(algo.plan->workspace == 0 || workspace != nullptr, Pass::kName, ": out of memory on ", be.name(),
             " for a cuDNN workspace of ", algo.plan->workspace, " bytes");
    EF_CHECK(plan_aligned(out, in_a, in_b), Pass::kName, ": operands not 16-byte aligned for cuDNN's plan on ",
             be.name());
    return execute_plan(h, *algo.plan, out.data, in_a.data, in_b.data, workspace);
  }
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

// Note [float32 convolutions on cuDNN's graph API]
// PyTorch runs its convolutions on cuDNN's graph API, which offers engines the legacy calls do not
// (runtime-compiled and specialized kernels): with TORCH_CUDNN_V8_API_DISABLED=1 the same PyTorch
// ran the three benchmark forwards far slower, below ours (docs/gpu.md, "What stays to do on a GPU").
// So under cuda_math().benchmark a float32 shape's first call times, beside the legacy
// algorithms, the engine configurations the graph API offers for the same convolution -- its
// heuristics' ranking (mode A), then its fallback list, at most kGraphEngines of them (PyTorch's
// cudnn.benchmark_limit is 10), those the settings allow (Note [cuDNN math for float32]: TF32
// tensor-core engines only with allow_tf32_conv; nondeterministic ones not under deterministic) --
// on the call's own operands, and keeps the fastest of all. A plan promises cuDNN 16-byte aligned
// operands (our blocks are, views into them need not be): where they are not, the fastest legacy
// algorithm, kept beside the plan, runs. EF_CUDNN_LEGACY=1 times the legacy algorithms alone (to
// measure what the plans bring); EF_CUDNN_VERBOSE=1 prints each shape's choice.
bool legacy_only() {
  static const bool legacy = [] {
    const char* env = std::getenv("EF_CUDNN_LEGACY");
    return env != nullptr && *env != '\0' && std::string(env) != "0";
  }();
  return legacy;
}

}  // namespace

template <typename Pass>
void run_conv(CudaBackend& be, const ConvArgs& a, DType dtype, const View& out, const View& in_a, const View& in_b) {
  const auto gate_pass = be.activate();
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
  const ConvAlgo* fastest = nullptr;         // of every candidate
  const ConvAlgo* fastest_legacy = nullptr;  // of the legacy algorithms: where a plan cannot take the operands
  float fastest_ms = 0, fastest_legacy_ms = 0;
  std::vector<ConvAlgo> candidates = candidate_algos<Pass>(h, d, dtype, settings);
  const size_t legacy = candidates.size();
  // Note [float32 convolutions on cuDNN's graph API]: timed beside the legacy algorithms.
  if (settings.benchmark && dtype == DType::Float32 && plan_aligned(out, in_a, in_b) && !legacy_only()) {
    for (ConvAlgo& algo : graph_algos<Pass>(h, a, settings)) candidates.push_back(std::move(algo));
  }
  for (const ConvAlgo& algo : candidates) {
    const size_t workspace_bytes = algo.plan ? algo.plan->workspace : algo.workspace;
    if (workspace_bytes > 0 && be.scratch(lock, workspace_bytes) == nullptr) {
      workspace_too_large = true;
      continue;
    }
    last = run_algo<Pass>(be, lock, h, d, algo, dtype, out, in_a, in_b);
    if (last != CUDNN_STATUS_SUCCESS) continue;
    if (!settings.benchmark) {
      cache.emplace(key, algo);
      return;
    }
    const float ms = time_on_stream(be, [&] { return run_algo<Pass>(be, lock, h, d, algo, dtype, out, in_a, in_b); });
    if (fastest == nullptr || ms < fastest_ms) {
      fastest = &algo;
      fastest_ms = ms;
    }
    if (static_cast<size_t>(&algo - candidates.data()) < legacy &&
        (fastest_legacy == nullptr || ms < fastest_legacy_ms)) {
      fastest_legacy = &algo;
      fastest_legacy_ms = ms;
    }
  }
  if (fastest != nullptr) {
    ConvAlgo chosen = *fastest;
    if (chosen.plan) {
      // A plan keeps the fastest legacy algorithm beside it, for operands it cannot take.
      chosen.algo = fastest_legacy ? fastest_legacy->algo : -1;
      chosen.math_type = fastest_legacy ? fastest_legacy->math_type : 0;
      chosen.workspace = fastest_legacy ? fastest_legacy->workspace : 0;
    }
    if (cudnn_verbose() && dtype == DType::Float32) {
      std::fprintf(stderr, "evenflow cuDNN: %s float32 %s: %s %.4f ms, fastest legacy algorithm %s: %s\n", Pass::kName,
                   shape_text(a).c_str(),
                   chosen.plan ? ("plan " + chosen.plan->engine).c_str()
                               : ::evenflow::detail::str_cat("algorithm ", chosen.algo).c_str(),
                   fastest_ms,
                   fastest_legacy
                       ? ::evenflow::detail::str_cat(fastest_legacy->algo, " ", fastest_legacy_ms, " ms").c_str()
                       : "none",
                   chosen.plan ? "the plan" : "the legacy algorithm");
    }
    const auto [it, inserted] = cache.emplace(key, std::move(chosen));
    EF_CUDA_CHECK(run_algo<Pass>(be, lock, h, d, it->second, dtype, out, in_a, in_b));  // its result, not the last's
    return;
  }
  EF_ERROR(Pass::kName, ": cuDNN has no usable ", settings.deterministic ? "deterministic " : "",
           "algorithm for this shape on ", be.name(),
           workspace_too_large ? " (some need more workspace memory than is free)" : "", "; the last one tried said '",
           cudnnGetErrorString(last), "'");
}

// Instantiated for the three passes: bf16_plan_faster in cuda_conv_plans.cu times them too.
template void run_conv<ForwardPass>(CudaBackend&, const ConvArgs&, DType, const View&, const View&, const View&);
template void run_conv<BackwardDataPass>(CudaBackend&, const ConvArgs&, DType, const View&, const View&, const View&);
template void run_conv<BackwardFilterPass>(CudaBackend&, const ConvArgs&, DType, const View&, const View&, const View&);

void CudaBackend::conv2d(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias) {
  if (args.compute == DType::BFloat16)
    run_bf16_conv<ForwardPass>(*this, args, y, x, w);
  else
    run_conv<ForwardPass>(*this, args, x.dtype, y, x, w);
  // In place on the stream, with the elementwise kernel every other bias add uses.
  if (bias.data != nullptr) binary(BinaryOp::Add, y, y, channel_broadcast(bias, y), 0.0);
}

void CudaBackend::conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) {
  if (args.compute == DType::BFloat16)
    run_bf16_conv<BackwardDataPass>(*this, args, gx, w, gy);
  else
    run_conv<BackwardDataPass>(*this, args, gy.dtype, gx, w, gy);
}

void CudaBackend::conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) {
  if (args.compute == DType::BFloat16)
    run_bf16_conv<BackwardFilterPass>(*this, args, gw, x, gy);
  else
    run_conv<BackwardFilterPass>(*this, args, x.dtype, gw, x, gy);
}

}  // namespace evenflow::cuda_backend
