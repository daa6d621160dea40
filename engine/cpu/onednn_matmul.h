// Internal to the CPU backend: matrix products through oneDNN's matmul primitive, on our float32
// data: with bfloat16 operands (GemmArgs::compute, Note [bfloat16 compute] in engine/ops.h), and
// float32 ones where the primitive beats oneDNN's sgemm.
#pragma once

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cpu/isa.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

// Whether onednn_gemm runs this product with bfloat16 operands: a float32 C = A·B (alpha 1, beta 0,
// nothing empty) on a CPU with bfloat16 dot-product instructions (AVX512-BF16; AMX too where it
// has it).
bool onednn_takes_bf16_gemm(const GemmArgs& g);

// Whether onednn_gemm runs this float32 product (compute float32) rather than oneDNN's sgemm: on
// AVX-512, a B transposed or a long inner dimension, and the shapes where the matmul primitive was
// measured faster (Note [float32 products with B transposed] in onednn_matmul.cpp).
bool onednn_takes_f32_gemm(const GemmArgs& g);

// C = A·B for each matrix of the batch through oneDNN's matmul primitive, for a product one of the
// two above takes. With bfloat16 compute the float32 operands are rounded to bfloat16 (to nearest
// even, as engine/bfloat16.h) by the reorders into the primitive's layout, and the products summed
// in float32. Runs on this thread's OpenMP team; may be called from several threads at once.
void onednn_gemm(const GemmArgs& g);

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
