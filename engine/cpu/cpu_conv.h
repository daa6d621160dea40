// Internal to the CPU backend: the matrix kernels, kept out of the kernel families' files so that
// only cpu_gemm.cpp compiles Eigen's GEMM. CpuBackend forwards gemm (cpu_gemm.cpp) and the three
// convolution kernels (cpu_conv.cpp) here; the convolutions are im2col/col2im around a packed GEMM
// of their own (packed_gemm.h).
#pragma once

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cpu/isa.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

// A buffer of at least `bytes` (64-byte aligned) that grows and is kept, one per calling thread:
// each device has its own worker thread, so concurrent devices never share one, and steady-state
// training allocates nothing. The im2col kernels and the oneDNN ones use it in turn.
void* thread_workspace(size_t bytes);

// Batched row-major GEMM as described at GemmArgs (Eigen; beta == 0 ignores C's old contents).
void gemm(const GemmArgs& args);

// The same through the packed GEMM alone, whichever gemm would pick (Note [Packed GEMM for matmul]
// in packed_gemm.h; gemm picks it for some float32 products on AVX2 machines): float32, alpha 1,
// beta 0 or 1, on `threads` threads. For tests, which run it on every CPU.
void packed_sgemm(const GemmArgs& args, int threads);

// The three convolution kernels of Backend (every view contiguous, but the activations where
// args.channels_last: Backend::channels_last_conv; outputs are overwritten).
void conv2d_forward(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias);
void conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w);
void conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy);

// Backend::channels_last_conv (`dtype`: the operands' before any bfloat16 conversion): the passes
// oneDNN runs, and the one of our own kernels that reads channels-last activations (the input
// gradient of a one-channel input).
bool conv_takes_channels_last(const ConvArgs& args, ConvPass pass, DType dtype);

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
