// float32 and bfloat16-compute convolution through oneDNN (Note [oneDNN convolution]): one
// primitive per geometry, pass and team size, created once and kept, with the reorders between our
// plain NCHW (or NHWC) / OIHW layout and the blocked layouts the primitive runs on.
#include "evenflow/engine/cpu/onednn_conv.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "evenflow/engine/cpu/onednn_plan.h"
#include "evenflow/engine/cpu/threads.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

// Note [oneDNN convolution]
// - Threads. oneDNN's OpenMP runtime runs a primitive on omp_get_max_threads() of the calling
//   thread, which run() sets to kernel_threads(); a device thread with a team of one runs oneDNN
//   serially. Some of its kernels choose their blocking for the team size at creation, so the team
//   size is part of the cache key.
// - Concurrency. Each CPU device is its own thread, and devices convolve at once. Primitives and
//   the engine may be shared between threads; streams may not (one per thread). oneDNN's own
//   scratchpad is shared between primitives unless the library was built for concurrent execution
//   (a build option its headers need not show), so every primitive takes a user scratchpad: this
//   thread's workspace (thread_workspace, shared with the im2col kernels), which also holds the
//   reordered operands.
// - Layouts. Each primitive is created with format_tag::any, so it picks the layouts its fastest
//   kernel wants (nChw16c, OIhw16i16o, ... on AVX-512); operands whose layout differs from ours
//   go through a reorder into or out of the workspace. Primitives on our plain layouts were
//   measured too: oneDNN then mostly runs im2col + GEMM, slower on every pass of the benchmark and
//   training shapes but one (docs/benchmarks.md, "oneDNN convolution dispatch"): the input
//   gradient of a 1-channel input, too small a share of classify's and wgan_gp's work to keep a
//   second layout for; it stays on our kernels (Note [oneDNN convolution dispatch]).
// - Weights change every step, so their reorder runs on every call, like the data's.

namespace {

using Tag = dnnl::memory::format_tag;
using Dims = dnnl::memory::dims;

// Every field of ConvArgs (its compute dtype first), the pass, the team size and whether a forward
// pass adds a bias.
using Key = OnednnPlanCache<21>::Key;

Key make_key(const ConvArgs& a, ConvPass pass, int threads, bool bias) {
  return {static_cast<int64_t>(a.compute),
          a.n,
          a.c_in,
          a.h,
          a.w,
          a.c_out,
          a.kh,
          a.kw,
          a.oh,
          a.ow,
          a.stride_h,
          a.stride_w,
          a.pad_h,
          a.pad_w,
          a.dil_h,
          a.dil_w,
          a.groups,
          static_cast<int64_t>(pass),
          threads,
          bias,
          a.channels_last};
}

using Plan = OnednnPlan;

dnnl::memory::desc plain_desc(const Dims& dims, dnnl::memory::data_type type = dnnl::memory::data_type::f32) {
  return dnnl::memory::desc(dims, type,
                            dims.size() == 5 ? Tag::goihw : Tag::nchw);  // nchw and oihw are one tag
}

// The weight as the op gives it: OIHW, or OHWI for bfloat16 compute beside channels-last
// activations (ConvArgs::channels_last).
dnnl::memory::desc weight_desc(const ConvArgs& a, const Dims& dims, dnnl::memory::data_type type) {
  if (!(a.channels_last && a.compute == DType::BFloat16)) return plain_desc(dims, type);
  return dnnl::memory::desc(dims, type, dims.size() == 5 ? Tag::gohwi : Tag::ohwi);
}

dnnl::memory::desc any_desc(const Dims& dims, dnnl::memory::data_type type = dnnl::memory::data_type::f32) {
  return dnnl::memory::desc(dims, type, Tag::any);
}

// Activations: ours (plain: NCHW, or NHWC when channels-last) and the primitive's (any, or NHWC when
// channels-last: the primitive then runs on ours, no reorder).
struct ActivationDescs {
  bool channels_last;
  dnnl::memory::desc plain(const Dims& dims, dnnl::memory::data_type type = dnnl::memory::data_type::f32) const {
    return channels_last ? dnnl::memory::desc(dims, type, Tag::nhwc) : plain_desc(dims, type);
  }
  dnnl::memory::desc used(const Dims& dims, dnnl::memory::data_type type = dnnl::memory::data_type::f32) const {
    return dnnl::memory::desc(dims, type, channels_last ? Tag::nhwc : Tag::any);
  }
};

Plan make_plan(const ConvArgs& a, ConvPass pass, bool bias) {
  const Dims src{a.n, a.c_in, a.h, a.w}, dst{a.n, a.c_out, a.oh, a.ow};
  const Dims wei = a.groups == 1 ? Dims{a.c_out, a.c_in, a.kh, a.kw}
                                 : Dims{a.groups, a.c_out / a.groups, a.c_in / a.groups, a.kh, a.kw};
  // oneDNN counts dilation from 0 and wants the right padding that makes the output size exact.
  const Dims strides{a.stride_h, a.stride_w}, dilates{a.dil_h - 1, a.dil_w - 1}, pad_l{a.pad_h, a.pad_w};
  const Dims pad_r{(a.oh - 1) * a.stride_h + (a.kh - 1) * a.dil_h + 1 - a.h - a.pad_h,
                   (a.ow - 1) * a.stride_w + (a.kw - 1) * a.dil_w + 1 - a.w - a.pad_w};
  const ActivationDescs act{a.channels_last};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::engine& eng = onednn_engine();
  const auto algo = dnnl::algorithm::convolution_direct;
  Plan plan;
  if (bias) plan.bias = dnnl::memory::desc({a.c_out}, dnnl::memory::data_type::f32, Tag::a);
  // bfloat16 compute: the pass's two inputs in bfloat16, ours and the primitive's (Note [bfloat16
  // operands converted once] in ops/conv.cpp: the op converts them), its output float32. The forward
  // descriptor, the backward passes' hint, is then the all-bfloat16 one.
  using dt = dnnl::memory::data_type;
  const bool bf16 = a.compute == DType::BFloat16;
  const dt in = bf16 ? dt::bf16 : dt::f32;
  const dt fwd_dst = bf16 && pass != ConvPass::Forward ? dt::bf16 : dt::f32;
  const dt fwd_src = bf16 ? dt::bf16 : dt::f32;
  const dnnl::convolution_forward::primitive_desc fwd =
      bias ? dnnl::convolution_forward::primitive_desc(eng, dnnl::prop_kind::forward_training, algo,
                                                       act.used(src, fwd_src), any_desc(wei, in), plan.bias,
                                                       act.used(dst, fwd_dst), strides, dilates, pad_l, pad_r, attr)
           : dnnl::convolution_forward::primitive_desc(eng, dnnl::prop_kind::forward_training, algo,
                                                       act.used(src, fwd_src), any_desc(wei, in),
                                                       act.used(dst, fwd_dst), strides, dilates, pad_l, pad_r, attr);

  dnnl::memory::desc scratch;
  switch (pass) {
    case ConvPass::Forward:
      plan.primitive = dnnl::convolution_forward(fwd);
      scratch = fwd.scratchpad_desc();
      plan.in0 = {DNNL_ARG_SRC, act.plain(src, in), fwd.src_desc(), {}, 0};
      plan.in1 = {DNNL_ARG_WEIGHTS, weight_desc(a, wei, in), fwd.weights_desc(), {}, 0};
      plan.out = {DNNL_ARG_DST, act.plain(dst), fwd.dst_desc(), {}, 0};
      break;
    case ConvPass::InputGrad: {
      const dnnl::convolution_backward_data::primitive_desc pd(
          eng, algo, act.used(src), any_desc(wei, in), act.used(dst, in), strides, dilates, pad_l, pad_r, fwd, attr);
      plan.primitive = dnnl::convolution_backward_data(pd);
      scratch = pd.scratchpad_desc();
      plan.in0 = {DNNL_ARG_DIFF_DST, act.plain(dst, in), pd.diff_dst_desc(), {}, 0};
      plan.in1 = {DNNL_ARG_WEIGHTS, weight_desc(a, wei, in), pd.weights_desc(), {}, 0};
      plan.out = {DNNL_ARG_DIFF_SRC, act.plain(src), pd.diff_src_desc(), {}, 0};
      break;
    }
    case ConvPass::WeightGrad: {
      const dnnl::convolution_backward_weights::primitive_desc pd(
          eng, algo, act.used(src, in), any_desc(wei), act.used(dst, in), strides, dilates, pad_l, pad_r, fwd, attr);
      plan.primitive = dnnl::convolution_backward_weights(pd);
      scratch = pd.scratchpad_desc();
      plan.in0 = {DNNL_ARG_SRC, act.plain(src, in), pd.src_desc(), {}, 0};
      plan.in1 = {DNNL_ARG_DIFF_DST, act.plain(dst, in), pd.diff_dst_desc(), {}, 0};
      plan.out = {DNNL_ARG_DIFF_WEIGHTS, plain_desc(wei), pd.diff_weights_desc(), {}, 0};
      break;
    }
  }
  finish_plan(plan, scratch, attr);
  return plan;
}

const Plan& plan_for(const ConvArgs& a, ConvPass pass, int threads, bool bias) {
  static OnednnPlanCache<21> plans;
  return plans.get(make_key(a, pass, threads, bias), [&] { return make_plan(a, pass, bias); });
}

const char* pass_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::Forward:
      return "conv2d";
    case ConvPass::InputGrad:
      return "conv2d_input_grad";
    case ConvPass::WeightGrad:
      return "conv2d_weight_grad";
  }
  return "conv2d";
}

// `bias` (forward only) is null or c_out floats.
void run(const ConvArgs& a, ConvPass pass, const void* in0, const void* in1, void* out, const float* bias = nullptr) {
  try {
    const int threads = std::max(1, kernel_threads());
    set_team_size(threads);  // before the plan is made: onednn_plan.h
    execute_plan(plan_for(a, pass, threads, bias != nullptr), threads, in0, in1, out, bias);
  } catch (const dnnl::error& e) {
    EF_ERROR(pass_name(pass), ": oneDNN failed (", e.what(), ", status ", static_cast<int>(e.status), ") on input [",
             a.n, ", ", a.c_in, ", ", a.h, ", ", a.w, "], weight [", a.c_out, ", ", a.c_in / a.groups, ", ", a.kh, ", ",
             a.kw, "], output ", a.oh, "x", a.ow, ", stride ", a.stride_h, "x", a.stride_w, ", padding ", a.pad_h, "x",
             a.pad_w, ", dilation ", a.dil_h, "x", a.dil_w, ", groups ", a.groups);
  }
}

// Note [Weight gradients split by images]
// oneDNN parallelizes a weight gradient inside the primitive and sums the threads' partial
// gradients behind spin barriers. On wgan_gp's critic (32 -> 64 channels, 4x4, stride 2, 14x14
// to 7x7, batch 64) its bfloat16 kernel without AMX (jit_bf16:avx512_core_bf16) on two threads
// takes longer than one thread on half the batch (two such at once the same), and far longer in
// streaks where the VM's other tenants intrude; on a CPU device whose threads outnumber the cores
// it waited out whole time slices at its barriers, and the step ran many times slower
// (docs/benchmarks.md, "On an AMD Zen 4"). So a weight gradient with a batch to share out runs as
// one single-threaded primitive per thread, each on its own slice of the images into its own
// partial gradient, and the partials are summed here, in thread order: the same result for the
// same team size, whatever the timing. Where the partials would cost more to sum than the images
// cost to read (a weight as large as the batch's input), oneDNN's own threading stays: classify's
// 5x5 stride-1 layer measured the same either way (same section).
bool split_by_images(const ConvArgs& a, int threads) {
  const int64_t weight = a.c_out * (a.c_in / a.groups) * a.kh * a.kw;
  return threads > 1 && a.n >= threads && threads * weight <= a.n * a.c_in * a.h * a.w;
}

void weight_grad_split_by_images(const ConvArgs& a, int threads, float* gw, const void* x, const void* gy) {
  const int64_t weight = a.c_out * (a.c_in / a.groups) * a.kh * a.kw;
  // An image's bytes, of the input and of the output's gradient.
  const int64_t operand_size = a.compute == DType::BFloat16 ? 2 : 4;
  const int64_t x_image = a.c_in * a.h * a.w * operand_size, gy_image = a.c_out * a.oh * a.ow * operand_size;
  std::vector<float> partials(static_cast<size_t>(threads - 1) * static_cast<size_t>(weight));  // thread 0: gw
  std::string failure;  // nothing may leave an OpenMP region by exception
#pragma omp parallel num_threads(threads)
  {
    const int t = thread_index();
    const int team = team_size();
    const int64_t begin = a.n * t / team, end = a.n * (t + 1) / team;
    ConvArgs slice = a;
    slice.n = end - begin;
    float* out = t == 0 ? gw : partials.data() + static_cast<size_t>(t - 1) * static_cast<size_t>(weight);
    try {
      set_team_size(1);  // before the plan is made: onednn_plan.h
      execute_plan(plan_for(slice, ConvPass::WeightGrad, 1, false), 1,
                   static_cast<const std::byte*>(x) + begin * x_image,
                   static_cast<const std::byte*>(gy) + begin * gy_image, out);
    } catch (const dnnl::error& e) {
#pragma omp critical(ef_weight_grad_split)
      if (failure.empty()) failure = "oneDNN failed (" + std::string(e.what()) + ")";
    } catch (const std::exception& e) {
#pragma omp critical(ef_weight_grad_split)
      if (failure.empty()) failure = e.what();
    }
  }
  if (!failure.empty())
    EF_ERROR("conv2d_weight_grad: a thread's share of the images failed: ", failure, " (input [", a.n, ", ", a.c_in,
             ", ", a.h, ", ", a.w, "], weight [", a.c_out, ", ", a.c_in / a.groups, ", ", a.kh, ", ", a.kw, "])");
  // The partials start at zero: a team smaller than asked for (OpenMP may give fewer threads) adds
  // nothing for the threads it lacked.
  for (int t = 1; t < threads; ++t) {
    const float* p = partials.data() + static_cast<size_t>(t - 1) * static_cast<size_t>(weight);
    for (int64_t i = 0; i < weight; ++i) gw[i] += p[i];
  }
}

// Whether oneDNN runs its AVX-512 kernels here (at most what ONEDNN_MAX_CPU_ISA allows).
bool onednn_runs_avx512() {
  static const bool avx512 = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
  return avx512;
}

}  // namespace

// Note [oneDNN convolution dispatch]
// Measured per pass against the im2col kernels on the convolutions of bench_engine, classify,
// segment and wgan_gp (forward, and both gradients: wgan_gp's transposed convolutions are input
// gradients) and the ResNet's, on inputs of 1..16 channels: oneDNN runs faster (depthwise and
// grouped too) except where its kernels compute an ungrouped convolution's input channels in blocks
// of the vector width (16 floats with AVX-512, 8 with AVX2), padding the rest. With AVX-512 (oneDNN
// 3.2, Zen 4), the input gradient of 1-8 input channels: oneDNN's takes the same time for 1 and 16,
// ours 0.1-0.25 of it for 1 channel (the register kernel, Note [One-channel input gradient]), 0.6-0.9
// for 4-6, 0.8-1.0 for 8, 1.1-1.6 for 12-15 (measured on contiguous activations; on channels-last
// ones, which ours would copy, 5-8 stay oneDNN's as before). Every weight gradient is oneDNN's
// there: 1.2-7x as fast as ours from 1 to 15 channels, but for classify's 5x5 layer at batch 100
// (ours 0.67-0.97 of its time at 4-6 and 12 channels, 1.19-1.25 at 8 and 15: no rule by shape).
// With AVX2 only (no AVX-512; oneDNN 3.2, Zen 2), where oneDNN runs other kernels:
// - the input gradient of 1 input channel (its 2-4 channel kernels are 1.3-2.5x faster than ours);
// - the weight gradient of 1-2 and 4-15 input channels, 1-2 on contiguous (NCHW) activations only:
//   there its first-layer kernel takes 1.2-4x our time, while on channels-last ones it is 3x faster.
// Figures: docs/benchmarks.md, "First layers' convolutions on AVX2" and "The engine on AVX-512".

bool onednn_takes(const ConvArgs& a, ConvPass pass) {
  if (a.n == 0 || a.c_in == 0 || a.c_out == 0) return false;
  if (a.groups != 1) return true;
  if (onednn_runs_avx512()) return pass != ConvPass::InputGrad || a.c_in > (a.channels_last ? 4 : 8);
  if (pass == ConvPass::InputGrad) return a.c_in > 1;
  if (pass == ConvPass::WeightGrad) {
    if (a.c_in >= 4 && a.c_in < 16) return false;
    if (a.c_in <= 2 && !a.channels_last) return false;
  }
  return true;
}

bool onednn_takes_bf16(const ConvArgs& a, ConvPass pass) {
  // oneDNN's bfloat16 convolutions need AVX-512 (AVX512-BF16 and AMX run them natively); below
  // that the op rounds the operands for the float32 kernels. Same exclusions as float32's.
  // A first layer (fewer than 16 input channels a group) runs slower in bfloat16 than in float32
  // (docs/benchmarks.md, "oneDNN convolution dispatch"): rounded operands on the float32 kernels instead.
  return onednn_runs_avx512() && a.c_in / a.groups >= 16 && onednn_takes(a, pass);
}

void onednn_conv2d_forward(const ConvArgs& args, float* y, const void* x, const void* w, const float* bias) {
  run(args, ConvPass::Forward, x, w, y, bias);
}

void onednn_conv2d_input_grad(const ConvArgs& args, float* gx, const void* gy, const void* w) {
  run(args, ConvPass::InputGrad, gy, w, gx);
}

void onednn_conv2d_weight_grad(const ConvArgs& args, float* gw, const void* x, const void* gy) {
  const int threads = std::max(1, kernel_threads());
  if (split_by_images(args, threads)) {
    weight_grad_split_by_images(args, threads, gw, x, gy);
    return;
  }
  run(args, ConvPass::WeightGrad, x, gy, gw);
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
