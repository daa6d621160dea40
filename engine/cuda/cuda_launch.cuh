// What every kernel file of the CUDA backend shares: launch shapes, 32/64-bit index choice, the
// strided-view indexer (Note [Strided indexing]) and temporaries from the device's caching
// allocator, and sums over a group of threads. Included by the kernel files only (cuda_elementwise.cu,
// cuda_unary.cu, cuda_reduce.cu, cuda_softmax.cu, cuda_normalization.cu, cuda_indexing.cu, cuda_pooling.cu,
// cuda_adam.cu); one kernel family per file, so that nvcc compiles the families in parallel.
#pragma once

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/cuda/cuda_internal.h"
#include "evenflow/engine/device.h"

namespace evenflow::cuda_backend {

inline constexpr int kThreads = 256;  // block size of every kernel here but the wide softmax

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Blocks for a grid-stride loop over `work` items: enough to fill the GPU, no more.
inline int grid_for(const CudaBackend& be, int64_t work) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(work, kThreads), 1, static_cast<int64_t>(be.sm_count()) * 16));
}

// Calls f(I{}) with I = uint32_t when every index of a loop over n items (plus one grid stride)
// fits in 32 bits, else uint64_t: 32-bit division is several times cheaper on the GPU.
template <typename F>
void with_index_type(int64_t n, F&& f) {
  if (n <= INT32_MAX)
    f(static_cast<uint32_t>(0));
  else
    f(static_cast<uint64_t>(0));
}

// Grid-stride loops: this thread's first item, and the step.
__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// The identity of max (kMax) or min: -inf / +inf, or the integer limits.
template <typename T, bool kMax>
__device__ __forceinline__ T extreme_identity() {
  if constexpr (std::is_floating_point_v<T>) {
    return kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  } else {
    return kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  }
}

// --- Note [Strided indexing] -----------------------------------------------------------------------
// Every kernel that walks views with arbitrary strides does it through one helper, Indexer<N>: N
// operands sharing one shape, each with its own strides (0 on broadcast dims). The host builds it
// with make_indexer, which drops size-1 dims and merges adjacent dims that are contiguous in every
// operand, so most views reach the device as 1 or 2 dims (a contiguous one as 1 dim of stride 1).
// Dims are stored innermost first and walked by a loop unrolled to kMaxDims, so the kernel reads
// shape and strides straight from parameter space; the outermost dim needs no division.
// Indexing ops reuse it: gather reads x through an operand whose stride on `dim` is 0, plus the
// index tensor as another operand (for index_select: stride 0 except on `dim`), see launch_gather.

template <int N>
struct Indexer {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};       // innermost first
  int64_t strides[N][kMaxDims] = {};  // per operand, innermost first

  // Offsets (in elements) of element `linear` of the row-major shape, in every operand.
  template <typename I>
  __device__ __forceinline__ void offsets(I linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      I coord = linear;
      if (d < ndim - 1) {
        const I size = static_cast<I>(shape[d]);
        const I rest = linear / size;
        coord = linear - rest * size;
        linear = rest;
      }
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(coord) * strides[k][d];
    }
  }

  bool contiguous() const {
    if (ndim == 0) return true;
    if (ndim > 1) return false;
    for (int k = 0; k < N; ++k) {
      if (strides[k][0] != 1) return false;
    }
    return true;
  }
};

// `shape` (outermost first, as in View) with each operand's strides, collapsed as described above.
template <int N>
Indexer<N> make_indexer(int ndim, const int64_t* shape, const std::array<const int64_t*, N>& strides) {
  EF_ASSERT(ndim >= 0 && ndim <= kMaxDims, "view with ", ndim, " dims");
  Indexer<N> ix;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (ix.ndim > 0) {
      const int inner = ix.ndim - 1;
      bool mergeable = true;
      for (int k = 0; k < N; ++k) mergeable = mergeable && strides[k][d] == ix.strides[k][inner] * ix.shape[inner];
      if (mergeable) {
        ix.shape[inner] *= shape[d];
        continue;
      }
    }
    ix.shape[ix.ndim] = shape[d];
    for (int k = 0; k < N; ++k) ix.strides[k][ix.ndim] = strides[k][d];
    ++ix.ndim;
  }
  return ix;
}

inline void check_same_shape(const View& out, const View& in) {
  EF_ASSERT(in.ndim == out.ndim, "elementwise operand has ", in.ndim, " dims, output ", out.ndim);
  for (int d = 0; d < out.ndim; ++d) {
    EF_ASSERT(in.shape[d] == out.shape[d], "elementwise operand not broadcast to the output's shape");
  }
}

// --- Sums and maxima over a group of threads (softmax rows, normalization groups) ------------------

struct SumOf {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Combines v over a group of K threads (K = 32: one warp; K > 32: the whole block, K threads);
// every thread of the group gets the result. `shared` holds K / 32 values.
template <int K, typename T, typename Combine>
__device__ __forceinline__ T group_all_reduce(T v, Combine combine, T* shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = combine(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if constexpr (K > 32) {
    const int warp = static_cast<int>(threadIdx.x) / 32;
    __syncthreads();  // the previous call's readers are done with `shared`
    if (threadIdx.x % 32 == 0) shared[warp] = v;
    __syncthreads();
    v = shared[0];
    for (int w = 1; w < K / 32; ++w) v = combine(v, shared[w]);
  }
  return v;
}

// Threads of a group that is a whole block: wide softmax rows, normalization groups.
inline constexpr int kBlockGroupThreads = 512;

// Temporary device memory from the device's caching allocator, so that it counts in the memory
// statistics and reuses cached blocks (cudaMallocAsync's own pool could fail while the cache holds
// the memory). Given back when it goes out of scope, while kernels queued on the stream may still
// use it: safe, because the cache is per logical device, whose work all runs on its one stream,
// so a later user of the block runs after them.
class DeviceTemporary {
 public:
  DeviceTemporary(const CudaBackend& be, size_t nbytes) : allocator_(context(be.device()).allocator()) {
    ptr_ = allocator_.allocate(nbytes, &block_bytes_);
  }
  ~DeviceTemporary() { allocator_.release(ptr_, block_bytes_); }
  DeviceTemporary(const DeviceTemporary&) = delete;
  DeviceTemporary& operator=(const DeviceTemporary&) = delete;
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  CachingAllocator& allocator_;
  void* ptr_ = nullptr;
  size_t block_bytes_ = 0;
};

}  // namespace evenflow::cuda_backend
