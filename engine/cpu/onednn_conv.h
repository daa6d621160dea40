// Internal to the CPU backend: 2-D convolution (forward, input gradient, weight gradient) through
// oneDNN, on our contiguous NCHW (or channels-last) data and OIHW weights. cpu_conv.cpp routes a
// float32 case here when `onednn_takes` says so (Note [oneDNN convolution dispatch]), and every
// pass of bfloat16 compute (bfloat16 operands: `onednn_takes_bf16`); float64 and builds without
// oneDNN (EF_ONEDNN == 0) keep the im2col kernels.
#pragma once

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cpu/isa.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

// Whether oneDNN runs this float32 case faster than the im2col kernels.
bool onednn_takes(const ConvArgs& args, ConvPass pass);
// Whether oneDNN runs this case with bfloat16 operands (args.compute: AVX-512 or newer, natively
// with AVX512-BF16 or AMX, else emulated by oneDNN) -- the kernels below then take bfloat16
// operands and accumulate in float32.
bool onednn_takes_bf16(const ConvArgs& args, ConvPass pass);

// The three kernels of Backend (outputs are overwritten): float32 results of float32 operands, or
// of bfloat16 ones for bfloat16 compute. They run on this thread's OpenMP team
// (omp_get_max_threads()), and may be called from several threads at once. The forward adds `bias`
// (c_out floats; null for none) to every output channel.
void onednn_conv2d_forward(const ConvArgs& args, float* y, const void* x, const void* w, const float* bias);
void onednn_conv2d_input_grad(const ConvArgs& args, float* gx, const void* gy, const void* w);
void onednn_conv2d_weight_grad(const ConvArgs& args, float* gw, const void* x, const void* gy);

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
