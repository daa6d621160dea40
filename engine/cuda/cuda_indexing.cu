// The CUDA backend's indexing kernels: gather, scatter_add, index_select, index_add and
// check_index_range. Bad indices are flagged, never followed (Note [Index checks]).
#include "evenflow/engine/cuda/cuda_launch.cuh"

namespace evenflow::cuda_backend {
namespace {

// --- Gather / scatter (Note [Strided indexing]) -------------------------------------------------------
// Operands of the indexer: 0 = the element-wise side (out for gathers, src for scatters), 1 = the
// index, 2 = the indexed tensor with stride 0 on `dim`; the index value times dim_stride moves along
// `dim`. Out-of-range indices are skipped and reported through `error` = {flag, offending index}.

template <typename T>
__device__ __forceinline__ void atomic_add(T* address, T value) {
  if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(address), static_cast<unsigned long long>(value));
  } else {
    atomicAdd(address, value);  // float and double (sm_60+)
  }
}

template <typename I, typename T>
__global__ void gather_kernel(I n, Indexer<3> ix, T* out, const int64_t* index, const T* x, int64_t dim_size,
                              int64_t dim_stride, int64_t* error) {
  for (I i = static_cast<I>(thread_index()); i < n; i += static_cast<I>(grid_stride())) {
    int64_t off[3];
    ix.offsets(i, off);
    const int64_t j = index[off[1]];
    if (j < 0 || j >= dim_size) {
      error[1] = j;
      __threadfence_system();  // the index before the flag, for a host reading them mid-replay
      error[0] = 1;
      continue;
    }
    out[off[0]] = x[off[2] + j * dim_stride];
  }
}

template <typename I, typename T>
__global__ void scatter_add_kernel(I n, Indexer<3> ix, const T* src, const int64_t* index, T* out, int64_t dim_size,
                                   int64_t dim_stride, int64_t* error) {
  for (I i = static_cast<I>(thread_index()); i < n; i += static_cast<I>(grid_stride())) {
    int64_t off[3];
    ix.offsets(i, off);
    const int64_t j = index[off[1]];
    if (j < 0 || j >= dim_size) {
      error[1] = j;
      __threadfence_system();  // the index before the flag, for a host reading them mid-replay
      error[0] = 1;
      continue;
    }
    atomic_add(out + off[2] + j * dim_stride, src[off[0]]);
  }
}

// Runs launch(flag) for an indexing kernel; a bad index is reported at the next synchronization
// (Note [Index checks] in deferred_errors.h).
template <typename Launch>
void with_index_check(const CudaBackend& be, const char* op, int dim, int64_t dim_size, Launch&& launch) {
  const DeferredErrors::Slot slot = be.index_check([op, dim, dim_size](int64_t bad) {
    return ::evenflow::detail::str_cat(op, ": index ", bad, " is out of range for dim ", dim, " of size ", dim_size);
  });
  launch(slot.device_flag());
  EF_CUDA_CHECK_LAUNCH();
}

__global__ void check_index_range_kernel(int64_t n, const int64_t* index, int64_t size, int64_t allowed,
                                         int64_t* error) {
  for (int64_t i = thread_index(); i < n; i += grid_stride()) {
    const int64_t j = index[i];
    if ((j < 0 || j >= size) && j != allowed) {
      error[1] = j;
      __threadfence_system();  // the index before the flag, for a host reading them mid-replay
      error[0] = 1;
    }
  }
}

// out[o] = x[... index(o) on dim ...]; index_strides address the index tensor over out's shape.
void launch_gather(const CudaBackend& be, const char* op, const View& out, const View& x, int dim, const View& index,
                   const int64_t* index_strides) {
  EF_ASSERT(out.dtype == x.dtype && index.dtype == DType::Int64 && out.ndim == x.ndim && dim >= 0 && dim < x.ndim, op,
            ": bad operands");
  const int64_t n = out.numel();
  if (n == 0) return;
  int64_t x_strides[kMaxDims];
  std::copy(x.strides, x.strides + kMaxDims, x_strides);
  x_strides[dim] = 0;
  const auto ix = make_indexer<3>(out.ndim, out.shape, {out.strides, index_strides, x_strides});
  EF_DISPATCH_ALL(out.dtype, op, [&] {
    with_index_check(be, op, dim, x.shape[dim], [&](int64_t* error) {
      with_index_type(n, [&](auto index_type) {
        using I = decltype(index_type);
        gather_kernel<I, scalar_t><<<grid_for(be, n), kThreads, 0, be.stream()>>>(
            static_cast<I>(n), ix, static_cast<scalar_t*>(out.data), static_cast<const int64_t*>(index.data),
            static_cast<const scalar_t*>(x.data), x.shape[dim], x.strides[dim], error);
      });
    });
  });
}

// out[... index(s) on dim ...] += src[s]; index_strides address the index tensor over src's shape.
void launch_scatter_add(const CudaBackend& be, const char* op, const View& out, int dim, const View& index,
                        const int64_t* index_strides, const View& src) {
  EF_ASSERT(out.dtype == src.dtype && index.dtype == DType::Int64 && out.ndim == src.ndim && dim >= 0 && dim < out.ndim,
            op, ": bad operands");
  const int64_t n = src.numel();
  if (n == 0) return;
  int64_t out_strides[kMaxDims];
  std::copy(out.strides, out.strides + kMaxDims, out_strides);
  out_strides[dim] = 0;
  const auto ix = make_indexer<3>(src.ndim, src.shape, {src.strides, index_strides, out_strides});
  EF_DISPATCH_ALL(out.dtype, op, [&] {
    with_index_check(be, op, dim, out.shape[dim], [&](int64_t* error) {
      with_index_type(n, [&](auto index_type) {
        using I = decltype(index_type);
        scatter_add_kernel<I, scalar_t><<<grid_for(be, n), kThreads, 0, be.stream()>>>(
            static_cast<I>(n), ix, static_cast<const scalar_t*>(src.data), static_cast<const int64_t*>(index.data),
            static_cast<scalar_t*>(out.data), out.shape[dim], out.strides[dim], error);
      });
    });
  });
}

// A 1-D index used along `dim` of an ndim-dim shape: stride 0 on every other dim.
std::array<int64_t, kMaxDims> index_along(const View& index, int ndim, int dim) {
  EF_ASSERT(index.ndim == 1 && dim >= 0 && dim < ndim, "index_select/index_add: index must be 1-D");
  std::array<int64_t, kMaxDims> strides{};
  strides[dim] = index.strides[0];
  return strides;
}

}  // namespace

void CudaBackend::gather(const View& out, const View& x, int dim, const View& index) {
  const auto gate_pass = activate();
  EF_ASSERT(index.ndim == out.ndim, "gather: index has ", index.ndim, " dims, output ", out.ndim);
  launch_gather(*this, "gather", out, x, dim, index, index.strides);
}

void CudaBackend::scatter_add(const View& out, int dim, const View& index, const View& src) {
  const auto gate_pass = activate();
  EF_ASSERT(index.ndim == src.ndim, "scatter_add: index has ", index.ndim, " dims, src ", src.ndim);
  launch_scatter_add(*this, "scatter_add", out, dim, index, index.strides, src);
}

void CudaBackend::check_index_range(const View& index, int64_t size, int64_t allowed,
                                    std::function<std::string(int64_t)> describe) {
  const auto gate_pass = activate();
  EF_ASSERT(index.is_contiguous() && index.dtype == DType::Int64, "check_index_range: expects contiguous int64");
  const int64_t n = index.numel();
  if (n == 0) return;
  const DeferredErrors::Slot slot = index_check(std::move(describe));
  check_index_range_kernel<<<grid_for(*this, n), kThreads, 0, stream_>>>(n, static_cast<const int64_t*>(index.data),
                                                                         size, allowed, slot.device_flag());
  EF_CUDA_CHECK_LAUNCH();
}

void CudaBackend::index_select(const View& out, const View& x, int dim, const View& index) {
  const auto gate_pass = activate();
  launch_gather(*this, "index_select", out, x, dim, index, index_along(index, out.ndim, dim).data());
}

void CudaBackend::index_add(const View& out, int dim, const View& index, const View& src) {
  const auto gate_pass = activate();
  launch_scatter_add(*this, "index_add", out, dim, index, index_along(index, src.ndim, dim).data(), src);
}

}  // namespace evenflow::cuda_backend
