// The CUDA backend's matrix products through cuBLAS (row-major, batched, strided).
#include "evenflow/engine/cuda/cuda_launch.cuh"

namespace evenflow::cuda_backend {

// Note [Row-major gemm on cuBLAS]
// cuBLAS is column-major. A row-major matrix with row stride ld is, read column-major with leading
// dimension ld, its own transpose. So the row-major C = op(A)·op(B)  [m,k]x[k,n]  is the
// column-major Cᵀ = op(B)ᵀ·op(A)ᵀ  [n,k]x[k,m]: pass B first, then A, swap m and n, and keep each
// operand's transpose flag. Batch strides may be 0 (an operand shared by every batch).
// Float32 runs on TF32 tensor cores only where cuda_math().allow_tf32_matmul allows it (off by
// default, as in PyTorch): otherwise CUBLAS_COMPUTE_32F, true fp32 FMA, so results agree with the CPU
// backend within float rounding.
// Note [bfloat16 products on cuBLAS]
// GemmArgs::compute = BFloat16 (Note [bfloat16 compute] in engine/ops.h): each float32 operand is
// cast to bfloat16 (round to nearest even, the cast every bfloat16 tensor gets) into this device's
// scratch buffer, compact, one matrix for an operand shared by the batch (batch stride 0); cuBLAS
// then multiplies them on the tensor cores with float32 accumulation (CUBLAS_COMPUTE_32F) into the
// float32 C. The scratch buffer stays ours while the library lock is held; the casts and the
// product are queued on one stream, so the next user of the buffer comes after them.
namespace {

struct Bf16Operand {
  int64_t ld = 0, stride = 0;
  size_t offset = 0, bytes = 0;  // in the scratch buffer
};

// A stored [rows, cols] float32 matrix (leading dimension ld, batch stride `stride`) as the
// compact bfloat16 copy it becomes at `offset`.
Bf16Operand bf16_operand(int64_t rows, int64_t cols, int64_t stride, int64_t batch, size_t offset) {
  const int64_t matrices = stride == 0 ? 1 : batch;
  Bf16Operand op;
  op.ld = cols;
  op.stride = stride == 0 ? 0 : rows * cols;
  op.offset = offset;
  op.bytes = static_cast<size_t>(matrices * rows * cols) * sizeof(uint16_t);
  return op;
}

}  // namespace

void CudaBackend::gemm(const GemmArgs& g) {
  const auto gate_pass = activate();
  EF_CHECK(is_floating(g.dtype), "gemm: dtype ", dtype_name(g.dtype),
           " is not supported (float32 or float64 expected)");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.k == 0) {  // C = beta·C; cuBLAS wants k >= 1
    View c;
    c.data = g.c;
    c.dtype = g.dtype;
    c.ndim = 3;
    c.shape[0] = g.batch;
    c.shape[1] = g.m;
    c.shape[2] = g.n;
    c.strides[0] = g.stride_c;
    c.strides[1] = g.ldc;
    c.strides[2] = 1;
    if (g.beta == 0.0)
      fill(c, 0.0);
    else
      unary(UnaryOp::MulScalar, c, c, g.beta, 0.0);
    return;
  }
  // cuBLAS checks ld >= (row-major) columns even for a single-row matrix, whose ld we never use.
  auto ld_of = [](int64_t ld, int64_t rows, int64_t cols) { return rows <= 1 ? std::max<int64_t>({ld, cols, 1}) : ld; };
  const int64_t lda = ld_of(g.lda, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k);
  const int64_t ldb = ld_of(g.ldb, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n);
  const int64_t ldc = ld_of(g.ldc, g.m, g.n);
  const bool f32 = g.dtype == DType::Float32;
  const float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  const void* alpha = f32 ? static_cast<const void*>(&alpha_f) : static_cast<const void*>(&g.alpha);
  const void* beta = f32 ? static_cast<const void*>(&beta_f) : static_cast<const void*>(&g.beta);
  const cudaDataType type = f32 ? CUDA_R_32F : CUDA_R_64F;
  // Note [CUDA math settings] (engine/device.h): TF32 for float32 products only when allowed.
  const cublasComputeType_t compute = !f32                            ? CUBLAS_COMPUTE_64F
                                      : cuda_math().allow_tf32_matmul ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                      : CUBLAS_COMPUTE_32F;

  const Lock lock = lock_libraries();
  if (g.compute == DType::BFloat16) {
    EF_ASSERT(bf16_gemm(g), "gemm: bfloat16 compute for a case cuBLAS is not given");
    const int64_t rows_a = g.trans_a ? g.k : g.m, cols_a = g.trans_a ? g.m : g.k;
    const int64_t rows_b = g.trans_b ? g.n : g.k, cols_b = g.trans_b ? g.k : g.n;
    const Bf16Operand a = bf16_operand(rows_a, cols_a, g.stride_a, g.batch, 0);
    const Bf16Operand b = bf16_operand(rows_b, cols_b, g.stride_b, g.batch, (a.bytes + 255) / 256 * 256);
    std::byte* buf = static_cast<std::byte*>(scratch(lock, b.offset + b.bytes));
    EF_CHECK(buf != nullptr, "matmul: out of memory on ", name(), " for the bfloat16 copies of its operands (",
             b.offset + b.bytes, " bytes)");
    const auto cast = [&](const void* src, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                          const Bf16Operand& to) {
      View from, into;
      from.data = const_cast<void*>(src);
      from.dtype = DType::Float32;
      into.data = buf + to.offset;
      into.dtype = DType::BFloat16;
      for (View* v : {&from, &into}) {
        v->ndim = 3;
        v->shape[0] = to.stride == 0 ? 1 : g.batch;
        v->shape[1] = rows;
        v->shape[2] = cols;
      }
      from.strides[0] = stride;
      from.strides[1] = ld;
      from.strides[2] = 1;
      into.strides[0] = rows * cols;
      into.strides[1] = cols;
      into.strides[2] = 1;
      copy(into, from);
    };
    cast(g.a, rows_a, cols_a, g.lda, g.stride_a, a);
    cast(g.b, rows_b, cols_b, g.ldb, g.stride_b, b);
    const float one = 1.0f, zero = 0.0f;
    EF_CUDA_CHECK(cublasGemmStridedBatchedEx_64(
        cublas(lock), g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k, &one,
        buf + b.offset, CUDA_R_16BF, std::max<int64_t>(b.ld, 1), b.stride, buf + a.offset, CUDA_R_16BF,
        std::max<int64_t>(a.ld, 1), a.stride, &zero, g.c, CUDA_R_32F, ldc, g.stride_c, g.batch, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    return;
  }
  EF_CUDA_CHECK(cublasGemmStridedBatchedEx_64(cublas(lock), g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                              g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k, alpha, g.b, type,
                                              ldb, g.stride_b, g.a, type, lda, g.stride_a, beta, g.c, type, ldc,
                                              g.stride_c, g.batch, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace evenflow::cuda_backend
