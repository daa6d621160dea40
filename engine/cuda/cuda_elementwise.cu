// The CUDA backend's elementwise entry points but the unary ops (cuda_unary.cu): fill, arange, copy
// (with dtype casts), binary ops, where, random numbers.
#include "evenflow/engine/cuda/cuda_elementwise.cuh"

namespace evenflow::cuda_backend {

void CudaBackend::fill(const View& out, double value) {
  const auto gate_pass = activate();
  EF_DISPATCH_STORAGE(out.dtype, "fill",
                      [&] { map<scalar_t>(*this, Constant<scalar_t>{CastTo<scalar_t>{}(value)}, out); });
}

void CudaBackend::arange(const View& out, double start, double step) {
  const auto gate_pass = activate();
  EF_DISPATCH_ALL(out.dtype, "arange", [&] { generate<scalar_t>(*this, out, Arange<scalar_t>{start, step}); });
}

void CudaBackend::copy(const View& out, const View& x) {
  const auto gate_pass = activate();
  check_same_shape(out, x);
  const auto ix = make_indexer<2>(out.ndim, out.shape, {out.strides, x.strides});
  if (out.dtype == x.dtype && ix.contiguous()) {
    const size_t nbytes = static_cast<size_t>(out.numel()) * dtype_size(out.dtype);
    if (nbytes > 0) EF_CUDA_CHECK(cudaMemcpyAsync(out.data, x.data, nbytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  EF_DISPATCH_STORAGE(out.dtype, "copy", [&] { copy_cast<scalar_t>(*this, out, x); });
}

void CudaBackend::binary(BinaryOp op, const View& out, const View& x, const View& y, double a) {
  const auto gate_pass = activate();
  EF_ASSERT(out.dtype == x.dtype && out.dtype == y.dtype, "binary: mixed dtypes");
  EF_DISPATCH_ALL(out.dtype, "binary op", [&] {
    visit_binary(op, a, [&](auto fn) { map<scalar_t, scalar_t, scalar_t>(*this, fn, out, x, y); });
  });
}

void CudaBackend::where(const View& out, const View& cond, const View& x, const View& y) {
  const auto gate_pass = activate();
  EF_ASSERT(out.dtype == x.dtype && out.dtype == y.dtype, "where: mixed dtypes");
  EF_DISPATCH_ALL(out.dtype, "where", [&] { select<scalar_t>(*this, out, cond, x, y); });
}

namespace {

// Backend::add_n's operands, up to kAddOperands a launch.
constexpr int kAddOperands = 8;
template <typename T>
struct AddOperands {
  const T* p[kAddOperands];
  int count;
};

// out[i] = p[0][i] + p[1][i] + ..., left to right; with `accumulate`, out[i] (the sum of the
// launches before) + p[0][i] + ....
template <typename T>
__global__ void add_n_kernel(T* out, AddOperands<T> ops, bool accumulate, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T acc = accumulate ? out[i] : ops.p[0][i];
    for (int k = accumulate ? 0 : 1; k < ops.count; ++k) acc = acc + ops.p[k][i];
    out[i] = acc;
  }
}

}  // namespace

void CudaBackend::add_n(const View& out, const std::vector<View>& xs) {
  const auto gate_pass = activate();
  const int64_t n = out.numel();
  EF_ASSERT(xs.size() >= 2 && out.is_contiguous(), "add_n: at least two operands into a contiguous output");
  for (const View& x : xs) {
    EF_ASSERT(x.dtype == out.dtype && x.numel() == n && x.is_contiguous() && x.data != out.data,
              "add_n: contiguous operands of the output's size and dtype, apart from it");
  }
  if (n == 0) return;
  EF_DISPATCH_FLOAT(out.dtype, "add_n", [&] {
    // A launch a kAddOperands operands; each after the first starts from the sum so far, so that
    // every element is added left to right.
    for (size_t first = 0; first < xs.size(); first += kAddOperands) {
      AddOperands<scalar_t> ops{};
      ops.count = static_cast<int>(std::min<size_t>(kAddOperands, xs.size() - first));
      for (int k = 0; k < ops.count; ++k)
        ops.p[k] = static_cast<const scalar_t*>(xs[first + static_cast<size_t>(k)].data);
      add_n_kernel<scalar_t>
          <<<grid_for(*this, n), kThreads, 0, stream_>>>(static_cast<scalar_t*>(out.data), ops, first > 0, n);
      EF_CUDA_CHECK_LAUNCH();
    }
  });
}

void CudaBackend::random(const View& out, RandomKind kind, double a, double b, const RandomKey& key) {
  const auto gate_pass = activate();
  EF_DISPATCH_ALL(out.dtype, "random", [&] {
    generate<scalar_t>(*this, out,
                       RandomDraw<scalar_t>{static_cast<int>(kind), a, b, key.seed, key.offset, key.in_device});
  });
}

}  // namespace evenflow::cuda_backend
