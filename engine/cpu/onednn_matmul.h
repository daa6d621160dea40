// Internal to the CPU backend: matrix products with bfloat16 operands (GemmArgs::compute, Note
// [bfloat16 compute] in engine/ops.h) through oneDNN's matmul primitive, on our float32 data.
#pragma once

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cpu/isa.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

// Whether onednn_gemm_bf16 runs this product: a float32 C = A·B (alpha 1, beta 0, nothing empty)
// on a CPU with bfloat16 dot-product instructions (AVX512-BF16; AMX too where it has it).
bool onednn_takes_bf16_gemm(const GemmArgs& g);

// C = A·B for each matrix of the batch, the float32 operands rounded to bfloat16 (to nearest even,
// as engine/bfloat16.h) by the reorders into the primitive's layout, products summed in float32.
// Runs on this thread's OpenMP team; may be called from several threads at once.
void onednn_gemm_bf16(const GemmArgs& g);

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
