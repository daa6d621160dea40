// The CUDA backend's convolutions on cuDNN's graph API (cudnnBackend* descriptors): the operation
// graph of one pass, the engine configurations cuDNN offers and what their notes allow, plans
// finalized and executed. Bfloat16 compute runs on them (Note [bfloat16 convolutions on cuDNN]),
// taken where bf16_conv timed them faster (their result bfloat16 where
// CudaMath::allow_bf16_conv_results allows it); a float32 shape's timed choice in cuda_conv.cu times
// them beside the legacy algorithms (graph_algos; Note [float32 convolutions on cuDNN's graph API]).
#include <algorithm>
#include <cstdio>
#include <vector>

#include "evenflow/engine/cuda/cuda_internal.h"
#include "evenflow/engine/device.h"

namespace evenflow::cuda_backend {
namespace {

// --- bfloat16 compute: cuDNN's graph API ----------------------------------------------------------------

// Note [bfloat16 convolutions on cuDNN]
// Bfloat16 compute (Note [bfloat16 compute] in engine/ops.h) multiplies bfloat16 operands and sums
// in float32 into a float32 result. cuDNN's legacy API computes a convolution in one data type (its
// bfloat16 configuration rounds the result to bfloat16 as well), so a bfloat16 convolution of our
// own is a graph of cuDNN's graph API (cudnnBackend* descriptors): one convolution whose two
// operands are bfloat16 and whose result is float32, computing in float32. The operands, given in
// bfloat16 (Note [bfloat16 operands converted once] in ops/conv.cpp), are copied into the scratch
// buffer channels-last (NHWC; the weight KRSC), the layout of cuDNN's bfloat16 kernels, by the copy
// kernel every cast uses (where it casts: round to nearest even, as in Note [bfloat16 products on
// cuBLAS]); the workspace follows them. The result goes straight into the output, NCHW (the
// first GPU run also offered the engines a channels-last result: none needed it). The plan, per
// pass, shape and math setting: the first engine configuration that finalizes and runs (once, on
// the scratch buffer's contents), from cuDNN's heuristics (mode A) and then its fallback list, less
// those the settings exclude (nondeterministic ones under cuda_math().deterministic; any that
// down-converts its inputs or sums in less than float32).
// Where CudaMath::allow_bf16_conv_results allows it, the plan is first sought with a bfloat16 result
// (channels-last, in the scratch buffer after the operands, widened into the float32 output by the
// same copy kernel): cuDNN's common kernels, which its heuristics rank where they rank nothing for a
// float32 result; the sums are the same, rounded once more (to 2^-8 relative, autocast's rounding of
// a convolution). It is timed, widening included, against the float32 kernels as the other plans are.
// On an H200 with cuDNN 9.19 (docs/gpu.md, 2026-11-27) mode A ranks nothing for this mix of types;
// the fallback list holds one runtime-compiled engine per pass, and none for a strided input
// gradient or one input channel. Timed against the rounded operands on the float32 (TF32) kernels,
// casts included, it ran a 5x5 convolution's forward and input gradient faster but its weight
// gradient and every pass of a 3x3 one slower. So the plan is taken only where it was timed faster:
// under cuda_math().benchmark, at a shape's first ask, bf16_conv times both ways on zeros of the shape
// (the casts and copies each way included, a cast per pass: the op's operands, converted once for
// several passes, make the plan's side cheaper than timed) and keeps the answer; without it bf16_conv says no and
// the op rounds the operands for the float32 kernels (the same products). EF_CUDNN_VERBOSE=1 prints
// each shape's plan, times and choice to stderr.

// The operands' unique ids in the graph and in each call's variant pack, in run's order.
constexpr std::array<int64_t, 3> kUids = {1, 2, 3};  // out, a, b

size_t aligned_256(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}
size_t elements(const Dims& d) {
  return static_cast<size_t>(d[0] * d[1] * d[2] * d[3]);
}

// Strides of an NCHW-indexed tensor stored NCHW or channels-last (NHWC).
Dims strides_of(const Dims& d, bool channels_last) {
  if (channels_last) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// A View of `data` with dims `d` stored as strides_of says.
View view_of(void* data, DType dtype, const Dims& d, bool channels_last) {
  View v = contiguous_view(data, dtype, {d[0], d[1], d[2], d[3]});
  const Dims strides = strides_of(d, channels_last);
  std::copy(strides.begin(), strides.end(), v.strides);
  return v;
}

// Where a call's pieces lie in the scratch buffer: the bfloat16 operands a (at 0) and b, the
// bfloat16 result where the plan has one (ConvPlan::bf16_result), then the workspace.
struct ScratchLayout {
  size_t b = 0, result = 0, workspace = 0;
};
ScratchLayout scratch_layout(const std::array<Dims, 3>& dims, bool bf16_result) {
  ScratchLayout l;
  l.b = aligned_256(elements(dims[1]) * 2);
  l.result = l.b + aligned_256(elements(dims[2]) * 2);
  l.workspace = l.result + (bf16_result ? aligned_256(elements(dims[0]) * 2) : 0);
  return l;
}

void set_attribute(const GraphDescriptor& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                   int64_t count, const void* values) {
  EF_CUDA_CHECK(cudnnBackendSetAttribute(d.get(), name, type, count, values));
}
void set_descriptor(const GraphDescriptor& d, cudnnBackendAttributeName_t name, const GraphDescriptor& value) {
  const cudnnBackendDescriptor_t raw = value.get();
  set_attribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

GraphDescriptor graph_tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, bool channels_last) {
  GraphDescriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const Dims strides = strides_of(dims, channels_last);
  const int64_t alignment = 16;  // the scratch buffer's offsets are multiples of 256, our allocations of 512
  set_attribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  set_attribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  set_attribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  set_attribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  set_attribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  EF_CUDA_CHECK(cudnnBackendFinalize(t.get()));
  return t;
}

// The graph API's handle attributes are deprecated in favour of device-property descriptors (made
// for building plans without a GPU); a handle still works and is what we have.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#pragma nv_diag_suppress 1215
void set_handle(const GraphDescriptor& d, bool is_plan, cudnnHandle_t h) {
  set_attribute(d, is_plan ? CUDNN_ATTR_EXECUTION_PLAN_HANDLE : CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1,
                &h);
}
#pragma nv_diag_default 1215
#pragma GCC diagnostic pop

// An engine configuration's name ("engine 12, runtime compiled") and whether its numerical notes
// allow it under `settings`: never one that down-converts its inputs or sums in less than float32,
// nor a nondeterministic one under cuda_math().deterministic; for float32 operands
// (`float32_operands`), no tensor-core engine (TF32) unless allow_tf32_conv.
struct EngineInfo {
  std::string name;
  bool allowed = true;
};
EngineInfo engine_info(const GraphDescriptor& config, const CudaMath& settings, bool float32_operands) {
  const GraphDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t count = 0;
  EF_CUDA_CHECK(cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                         &count, &raw));
  int64_t index = -1;
  EF_CUDA_CHECK(
      cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index));
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> numerical{};
  int64_t numerical_count = 0;
  EF_CUDA_CHECK(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                         numerical.size(), &numerical_count, numerical.data()));
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behavior{};
  int64_t behavior_count = 0;
  EF_CUDA_CHECK(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                         behavior.size(), &behavior_count, behavior.data()));
  EngineInfo info{::evenflow::detail::str_cat("engine ", index)};
  for (int64_t i = 0; i < numerical_count; ++i) {
    switch (numerical[static_cast<size_t>(i)]) {
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
        info.allowed = false;
        break;
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
        info.name += ", nondeterministic";
        if (settings.deterministic) info.allowed = false;
        break;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
        if (float32_operands) {
          info.name += ", TF32";
          if (!settings.allow_tf32_conv) info.allowed = false;
        }
        break;
      default:
        break;
    }
  }
  for (int64_t i = 0; i < behavior_count; ++i) {
    if (behavior[static_cast<size_t>(i)] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) info.name += ", runtime compiled";
  }
  return info;
}

// The data types and layouts of one pass's graph: its result's (out) and operands' (a, b), in run's
// order.
struct GraphTypes {
  std::array<cudnnDataType_t, 3> types;
  std::array<bool, 3> channels_last;
};

// The operation graph of one pass of a convolution, with the tensors, convolution and operation it
// was made from (in parts, the graph last); empty parts, with `why_none`, where cuDNN refuses the
// operation or the graph (an answer, not an error).
template <typename Pass>
std::vector<GraphDescriptor> conv_graph(cudnnHandle_t h, const ConvArgs& a, const GraphTypes& g,
                                        std::string& why_none) {
  std::vector<GraphDescriptor> parts;
  const std::array<Dims, 3> dims = Pass::dims(a);
  for (size_t i = 0; i < 3; ++i) parts.push_back(graph_tensor(kUids[i], g.types[i], dims[i], g.channels_last[i]));
  GraphDescriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const std::array<int64_t, 2> dilation = {a.dil_h, a.dil_w}, stride = {a.stride_h, a.stride_w},
                               padding = {a.pad_h, a.pad_w};
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation.data());
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride.data());
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, padding.data());
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, padding.data());
  EF_CUDA_CHECK(cudnnBackendFinalize(conv.get()));

  GraphDescriptor op(Pass::kGraphOp);
  for (size_t i = 0; i < 3; ++i) set_descriptor(op, Pass::kGraphAttrs[i], parts[i]);
  set_descriptor(op, Pass::kGraphAttrs[3], conv);
  const float alpha = 1.0f, beta = 0.0f;
  set_attribute(op, Pass::kGraphAttrs[4], CUDNN_TYPE_FLOAT, 1, &alpha);
  set_attribute(op, Pass::kGraphAttrs[5], CUDNN_TYPE_FLOAT, 1, &beta);
  GraphDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnStatus_t s = cudnnBackendFinalize(op.get());
  if (s == CUDNN_STATUS_SUCCESS) {
    set_handle(graph, false, h);
    set_descriptor(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
    s = cudnnBackendFinalize(graph.get());
  }
  if (s != CUDNN_STATUS_SUCCESS) {
    why_none = ::evenflow::detail::str_cat("the operation graph: ", cudnnGetErrorString(s));
    return {};
  }
  parts.push_back(std::move(conv));
  parts.push_back(std::move(op));
  parts.push_back(std::move(graph));
  return parts;
}

// The engine configurations cuDNN offers for `graph`: its heuristics' ranking (mode A), then its
// fallback list; each with whether it came from the fallback list.
std::vector<std::pair<GraphDescriptor, bool>> engine_configs(const GraphDescriptor& graph) {
  std::vector<std::pair<GraphDescriptor, bool>> out;
  for (const cudnnBackendHeurMode_t heur_mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    GraphDescriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_descriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    set_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heur_mode);
    if (cudnnBackendFinalize(heuristics.get()) != CUDNN_STATUS_SUCCESS) continue;
    int64_t count = 0;
    EF_CUDA_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<GraphDescriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    EF_CUDA_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data()));
    for (int64_t i = 0; i < count && i < static_cast<int64_t>(configs.size()); ++i)
      out.emplace_back(std::move(configs[static_cast<size_t>(i)]), heur_mode == CUDNN_HEUR_MODE_FALLBACK);
  }
  return out;
}

// The plan of `config` on `graph`, finalized (its workspace size read), with its engine's name; an
// empty plan, with `failure`, where cuDNN refuses it.
ConvPlan finalize_plan(cudnnHandle_t h, std::shared_ptr<const std::vector<GraphDescriptor>> graph,
                       GraphDescriptor config, const EngineInfo& info, bool fallback, std::string& failure) {
  ConvPlan p;
  p.graph = std::move(graph);
  p.engine = info.name + (fallback ? ", fallback list" : "");
  GraphDescriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set_handle(plan, true, h);
  set_descriptor(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  if (const cudnnStatus_t fs = cudnnBackendFinalize(plan.get()); fs != CUDNN_STATUS_SUCCESS) {
    failure = cudnnGetErrorString(fs);
    return p;
  }
  int64_t workspace = 0, n = 0;
  EF_CUDA_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                         &workspace));
  p.workspace = static_cast<size_t>(workspace);
  p.config = std::move(config);
  p.plan = std::move(plan);
  return p;
}

// The plan of one pass and shape, its result float32 (NCHW, into the output) or bfloat16
// (channels-last, as the operands, into the scratch buffer): the first engine configuration allowed
// by its notes that finalizes and passes `trial` (which returns why a plan failed, or "" if it
// ran). Why there is none: `why_none`.
template <typename Pass, typename Trial>
ConvPlan make_bf16_plan(cudnnHandle_t h, const ConvArgs& a, const CudaMath& settings, bool bf16_result,
                        const Trial& trial, std::string& why_none) {
  const GraphTypes types{
      {bf16_result ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT, CUDNN_DATA_BFLOAT16, CUDNN_DATA_BFLOAT16},
      {bf16_result, true, true}};
  auto graph = std::make_shared<const std::vector<GraphDescriptor>>(conv_graph<Pass>(h, a, types, why_none));
  if (graph->empty()) return {};
  std::vector<std::pair<GraphDescriptor, bool>> configs = engine_configs(graph->back());
  std::string refused;
  for (auto& [config, fallback] : configs) {
    const EngineInfo info = engine_info(config, settings, false);
    if (!info.allowed) continue;
    std::string failure;
    ConvPlan p = finalize_plan(h, graph, std::move(config), info, fallback, failure);
    p.bf16_result = bf16_result;
    if (p.plan.get() != nullptr) failure = trial(p);
    if (failure.empty()) return p;
    refused += ::evenflow::detail::str_cat("; ", info.name, ": ", failure);
  }
  why_none = ::evenflow::detail::str_cat(configs.size(), " engine configurations", refused);
  return {};
}

// Queues one pass on `p`'s plan: the operands cast into the scratch buffer (grown first: growing
// replaces it), the plan, and a bfloat16 result widened into the output. The plan's status; our
// own failures throw.
template <typename Pass>
cudnnStatus_t queue_bf16_conv(CudaBackend& be, const CudaBackend::Lock& lock, const ConvPlan& p, const ConvArgs& a,
                              const View& out, const View& in_a, const View& in_b) {
  const std::array<Dims, 3> dims = Pass::dims(a);
  const ScratchLayout l = scratch_layout(dims, p.bf16_result);
  std::byte* buf = static_cast<std::byte*>(be.scratch(lock, l.workspace + p.workspace));
  EF_CHECK(buf != nullptr, Pass::kName, ": out of memory on ", be.name(),
           " for bfloat16 operands and a cuDNN workspace (", l.workspace + p.workspace, " bytes)");
  be.copy(view_of(buf, DType::BFloat16, dims[1], true), in_a);
  be.copy(view_of(buf + l.b, DType::BFloat16, dims[2], true), in_b);
  void* result = p.bf16_result ? static_cast<void*>(buf + l.result) : out.data;
  const cudnnStatus_t s = execute_plan(be.cudnn(lock), p, result, buf, buf + l.b, buf + l.workspace);
  if (s == CUDNN_STATUS_SUCCESS && p.bf16_result) be.copy(out, view_of(result, DType::BFloat16, dims[0], true));
  return s;
}

// This pass and shape's plan, made at the first ask. A plan is kept only after it ran once on the
// scratch buffer's contents (whatever they are: the result, written into the scratch buffer too, is
// not used).
template <typename Pass>
ConvPlan& bf16_plan(CudaBackend& be, const CudaBackend::Lock& lock, const ConvArgs& a) {
  const CudaMath settings = cuda_math();
  auto& cache = be.bf16_conv_plans(lock);
  const ConvKey key = conv_key(Pass::kId, DType::BFloat16, a, settings);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  const cudnnHandle_t h = be.cudnn(lock);
  const std::array<Dims, 3> dims = Pass::dims(a);
  const size_t result_bytes = aligned_256(elements(dims[0]) * sizeof(float));  // after the workspace
  const auto trial = [&](const ConvPlan& plan) -> std::string {
    const ScratchLayout l = scratch_layout(dims, plan.bf16_result);
    const size_t result = l.workspace + aligned_256(plan.workspace);
    std::byte* buf = static_cast<std::byte*>(be.scratch(lock, result + result_bytes));
    if (buf == nullptr) return ::evenflow::detail::str_cat("no memory for its workspace of ", plan.workspace, " bytes");
    const cudnnStatus_t s = execute_plan(h, plan, buf + result, buf, buf + l.b, buf + l.workspace);
    return s == CUDNN_STATUS_SUCCESS ? "" : cudnnGetErrorString(s);
  };
  // A bfloat16 result where allowed (CudaMath::allow_bf16_conv_results): cuDNN's heuristics rank
  // engines for it where they rank none for a float32 result (the Note); else, or where it has no
  // plan, a float32 result.
  std::string why_none;
  ConvPlan p;
  for (const bool bf16_result : {true, false}) {
    if (bf16_result && !settings.allow_bf16_conv_results) continue;
    std::string why;
    p = make_bf16_plan<Pass>(h, a, settings, bf16_result, trial, why);
    const char* result_type = bf16_result ? "bfloat16" : "float32";
    if (p.plan.get() != nullptr) {
      if (cudnn_verbose()) {
        std::fprintf(stderr, "evenflow cuDNN: %s bfloat16 %s: plan %s, %s result\n", Pass::kName, shape_text(a).c_str(),
                     p.engine.c_str(), result_type);
      }
      break;
    }
    why_none += ::evenflow::detail::str_cat(why_none.empty() ? "" : "; ", result_type, " result: ", why);
  }
  if (p.plan.get() == nullptr && cudnn_verbose()) {
    std::fprintf(stderr, "evenflow cuDNN: %s bfloat16 %s: no plan (%s)\n", Pass::kName, shape_text(a).c_str(),
                 why_none.c_str());
  }
  return cache.emplace(key, std::move(p)).first->second;
}

// Device memory of our own, for timing on a shape's operands outside the scratch buffer.
class DeviceBuffer {
 public:
  DeviceBuffer(CudaBackend& be, size_t bytes) : be_(be), data_(be.raw_alloc(bytes)) {
    EF_CHECK(data_ != nullptr, "out of memory on ", be.name(), " timing a convolution (", bytes, " bytes)");
    EF_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes, be.stream()));
  }
  ~DeviceBuffer() { be_.raw_free(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  View view(const Dims& d) const { return view_of(data_, DType::Float32, d, false); }

 private:
  CudaBackend& be_;
  void* data_;
};

// Under cuda_math().benchmark: whether the shape's plan runs faster than the rounded operands on
// the float32 kernels, timed once on zeros (Note [bfloat16 convolutions on cuDNN]).
template <typename Pass>
bool bf16_plan_faster(CudaBackend& be, const ConvArgs& a) {
  ConvPlan* plan = nullptr;  // in the backend's cache, whose entries stay where they are
  {
    const CudaBackend::Lock lock = be.lock_libraries();
    plan = &bf16_plan<Pass>(be, lock, a);
    if (plan->plan.get() == nullptr) return false;
    if (plan->faster) return *plan->faster;
  }
  const std::array<Dims, 3> dims = Pass::dims(a);
  const DeviceBuffer out(be, elements(dims[0]) * sizeof(float)), in_a(be, elements(dims[1]) * sizeof(float)),
      in_b(be, elements(dims[2]) * sizeof(float)), rounded_a(be, elements(dims[1]) * sizeof(float)),
      rounded_b(be, elements(dims[2]) * sizeof(float));
  const auto run_plan = [&] {
    const CudaBackend::Lock lock = be.lock_libraries();
    return queue_bf16_conv<Pass>(be, lock, *plan, a, out.view(dims[0]), in_a.view(dims[1]), in_b.view(dims[2]));
  };
  ConvArgs f32 = a;
  f32.compute = DType::Float32;
  const auto run_rounded = [&] {  // what the op does when bf16_conv says no
    be.unary(UnaryOp::RoundBfloat16, rounded_a.view(dims[1]), in_a.view(dims[1]), 0.0, 0.0);
    be.unary(UnaryOp::RoundBfloat16, rounded_b.view(dims[2]), in_b.view(dims[2]), 0.0, 0.0);
    run_conv<Pass>(be, f32, DType::Float32, out.view(dims[0]), rounded_a.view(dims[1]), rounded_b.view(dims[2]));
    return CUDNN_STATUS_SUCCESS;
  };
  EF_CUDA_CHECK(run_plan());  // warm-ups: the float32 kernels' own timed choice happens here
  run_rounded();
  const float plan_ms = time_on_stream(be, run_plan), rounded_ms = time_on_stream(be, run_rounded);
  const CudaBackend::Lock lock = be.lock_libraries();
  plan->faster = plan_ms < rounded_ms;
  if (cudnn_verbose()) {
    std::fprintf(stderr,
                 "evenflow cuDNN: %s bfloat16 %s: plan (%s result) %.4f ms, rounded operands on the float32 kernels "
                 "%.4f ms: %s\n",
                 Pass::kName, shape_text(a).c_str(), plan->bf16_result ? "bfloat16" : "float32", plan_ms, rounded_ms,
                 *plan->faster ? "the plan" : "the float32 kernels");
  }
  return *plan->faster;
}

}  // namespace

// Runs a plan: result, a, b in run's order.
cudnnStatus_t execute_plan(cudnnHandle_t h, const ConvPlan& p, void* result, const void* a, const void* b,
                           void* workspace) {
  GraphDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const std::array<const void*, 3> pointers = {result, a, b};
  set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers.data());
  set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, kUids.data());
  set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  EF_CUDA_CHECK(cudnnBackendFinalize(pack.get()));
  return cudnnBackendExecute(h, p.plan.get(), pack.get());
}

// At most this many graph-API engine configurations are timed per float32 shape (Note [float32
// convolutions on cuDNN's graph API] in cuda_conv.cu; PyTorch's cudnn.benchmark_limit is 10).
constexpr size_t kGraphEngines = 8;

template <typename Pass>
std::vector<ConvAlgo> graph_algos(cudnnHandle_t h, const ConvArgs& a, const CudaMath& settings) {
  std::vector<ConvAlgo> out;
  std::string why_none;
  const GraphTypes types{{CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT}, {false, false, false}};
  auto graph = std::make_shared<const std::vector<GraphDescriptor>>(conv_graph<Pass>(h, a, types, why_none));
  if (graph->empty()) return out;
  for (auto& [config, fallback] : engine_configs(graph->back())) {
    if (out.size() == kGraphEngines) break;
    const EngineInfo info = engine_info(config, settings, true);
    if (!info.allowed) continue;
    std::string failure;
    ConvPlan p = finalize_plan(h, graph, std::move(config), info, fallback, failure);
    if (p.plan.get() == nullptr) continue;
    ConvAlgo algo;
    algo.algo = -1;  // until the choice: a plan alone
    algo.plan = std::make_shared<const ConvPlan>(std::move(p));
    out.push_back(std::move(algo));
  }
  return out;
}

// Instantiated for the three passes, which run_conv in cuda_conv.cu calls.
template std::vector<ConvAlgo> graph_algos<ForwardPass>(cudnnHandle_t, const ConvArgs&, const CudaMath&);
template std::vector<ConvAlgo> graph_algos<BackwardDataPass>(cudnnHandle_t, const ConvArgs&, const CudaMath&);
template std::vector<ConvAlgo> graph_algos<BackwardFilterPass>(cudnnHandle_t, const ConvArgs&, const CudaMath&);

// Runs `pass` of bfloat16 compute on the shape's plan (Note [bfloat16 convolutions on cuDNN]).
template <typename Pass>
void run_bf16_conv(CudaBackend& be, const ConvArgs& a, const View& out, const View& in_a, const View& in_b) {
  const auto gate_pass = be.activate();
  // The op gives bfloat16 operands (Note [bfloat16 operands converted once] in ops/conv.cpp).
  EF_ASSERT(out.dtype == DType::Float32 && in_a.dtype == DType::BFloat16 && in_b.dtype == DType::BFloat16 &&
                out.is_contiguous() && in_a.is_contiguous() && in_b.is_contiguous(),
            Pass::kName, ": bfloat16 compute takes contiguous bfloat16 operands");
  EF_ASSERT(reinterpret_cast<uintptr_t>(out.data) % 16 == 0, Pass::kName, ": the output is not 16-byte aligned");
  const CudaBackend::Lock lock = be.lock_libraries();
  const ConvPlan& p = bf16_plan<Pass>(be, lock, a);
  EF_CHECK(p.plan.get() != nullptr, Pass::kName, ": cuDNN has no bfloat16 plan for ", shape_text(a), " on ", be.name());
  EF_CUDA_CHECK(queue_bf16_conv<Pass>(be, lock, p, a, out, in_a, in_b));
}

// Instantiated for the three passes, which the entry points in cuda_conv.cu call.
template void run_bf16_conv<ForwardPass>(CudaBackend&, const ConvArgs&, const View&, const View&, const View&);
template void run_bf16_conv<BackwardDataPass>(CudaBackend&, const ConvArgs&, const View&, const View&, const View&);
template void run_bf16_conv<BackwardFilterPass>(CudaBackend&, const ConvArgs&, const View&, const View&, const View&);

GraphDescriptor::GraphDescriptor(cudnnBackendDescriptorType_t type) {
  EF_CUDA_CHECK(cudnnBackendCreateDescriptor(type, &desc_));
}

GraphDescriptor::~GraphDescriptor() {
  if (desc_ != nullptr) EF_CUDA_CHECK_PRINT(cudnnBackendDestroyDescriptor(desc_));
}

bool CudaBackend::bf16_conv(const ConvArgs& args, ConvPass pass) {
  // Only a timed choice takes cuDNN's bfloat16 plan (Note [bfloat16 convolutions on cuDNN]); empty
  // operands stay on the float32 path, which writes the empty sum itself.
  if (!cuda_math().benchmark) return false;
  for (const int64_t size : {args.n, args.c_in, args.h, args.w, args.c_out, args.oh, args.ow}) {
    if (size == 0) return false;
  }
  const auto gate_pass = activate();
  switch (pass) {
    case ConvPass::Forward:
      return bf16_plan_faster<ForwardPass>(*this, args);
    case ConvPass::InputGrad:
      return bf16_plan_faster<BackwardDataPass>(*this, args);
    case ConvPass::WeightGrad:
      return bf16_plan_faster<BackwardFilterPass>(*this, args);
  }
  return false;
}

}  // namespace evenflow::cuda_backend
