// The elementwise engine of the CUDA backend: out = f(in...) over views of one shape with any
// strides (contiguous views with 16-byte vector loads), and generated sequences out[i] = g(i). The
// functors are the CPU backend's (scalar_ops.h, random_internal.h) compiled for the device, so both backends
// compute the same function. Used by cuda_elementwise.cu and cuda_unary.cu.
#pragma once

#include <utility>

#include "evenflow/engine/cuda/cuda_launch.cuh"
#include "evenflow/engine/random_internal.h"

namespace evenflow::cuda_backend {

// --- Elementwise: out = f(in...) ----------------------------------------------------------------------

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <int V, typename Out, typename F, typename... In>
__device__ __forceinline__ void apply_vec(Out* out, const F& f, Vec<In, V>... x) {
  Vec<Out, V> r;
#pragma unroll
  for (int j = 0; j < V; ++j) r.v[j] = f(x.v[j]...);
  *reinterpret_cast<Vec<Out, V>*>(out) = r;
}

// All operands contiguous: V elements per thread and step with vector loads and stores (the host
// checked the alignment; V = 1 otherwise), then the tail one by one.
template <int V, typename Out, typename F, typename... In>
__global__ void map_contiguous_kernel(int64_t n, F f, Out* out, const In*... in) {
  const int64_t step = grid_stride(), first = thread_index();
  const int64_t nvec = n / V;
  for (int64_t i = first; i < nvec; i += step) {
    apply_vec<V>(out + i * V, f, reinterpret_cast<const Vec<In, V>*>(in)[i]...);
  }
  for (int64_t i = nvec * V + first; i < n; i += step) out[i] = f(in[i]...);
}

template <typename F, size_t... K, typename... In>
__device__ __forceinline__ auto call_at(const F& f, const int64_t* off, std::index_sequence<K...>, const In*... in) {
  return f(in[off[K + 1]]...);
}

template <typename I, typename Out, typename F, typename... In>
__global__ void map_strided_kernel(I n, Indexer<1 + sizeof...(In)> ix, F f, Out* out, const In*... in) {
  for (I i = static_cast<I>(thread_index()); i < n; i += static_cast<I>(grid_stride())) {
    int64_t off[1 + sizeof...(In)];
    ix.offsets(i, off);
    out[off[0]] = call_at(f, off, std::index_sequence_for<In...>{}, in...);
  }
}

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// out = f(in...) elementwise, where Out and In... are the operands' element types and every input
// has out's shape (broadcast dims with stride 0).
template <typename Out, typename... In, typename F, typename... Views>
void map(const CudaBackend& be, F f, const View& out, const Views&... in) {
  static_assert(sizeof...(In) == sizeof...(Views), "one element type per input view");
  (check_same_shape(out, in), ...);
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto ix = make_indexer<1 + sizeof...(In)>(out.ndim, out.shape, {out.strides, in.strides...});
  Out* o = static_cast<Out*>(out.data);
  if (ix.contiguous()) {
    constexpr int V = static_cast<int>(16 / std::max({sizeof(Out), sizeof(In)...}));
    const bool aligned = aligned_to(o, sizeof(Out) * V) && (aligned_to(in.data, sizeof(In) * V) && ...);
    if (V > 1 && aligned) {
      map_contiguous_kernel<V, Out, F, In...>
          <<<grid_for(be, ceil_div(n, V)), kThreads, 0, be.stream()>>>(n, f, o, static_cast<const In*>(in.data)...);
    } else {
      map_contiguous_kernel<1, Out, F, In...>
          <<<grid_for(be, n), kThreads, 0, be.stream()>>>(n, f, o, static_cast<const In*>(in.data)...);
    }
  } else {
    with_index_type(n, [&](auto index_type) {
      using I = decltype(index_type);
      map_strided_kernel<I, Out, F, In...><<<grid_for(be, n), kThreads, 0, be.stream()>>>(
          static_cast<I>(n), ix, f, o, static_cast<const In*>(in.data)...);
    });
  }
  EF_CUDA_CHECK_LAUNCH();
}

template <typename T>
struct Constant {
  T value;
  __device__ T operator()() const { return value; }
};

// Between any two dtypes (dtype_cast in engine/bfloat16.h), as a functor for map.
template <typename Out>
struct CastTo {
  template <typename In>
  __host__ __device__ Out operator()(In v) const {
    return dtype_cast<Out>(v);
  }
};

// A scalar_ops unary functor with its parameters bound.
template <typename Op>
struct BoundUnary {
  Op op;
  double a, b;
  template <typename T>
  __device__ T operator()(T x) const {
    return op(x, a, b);
  }
};

struct Select {
  template <typename C, typename T>
  __device__ T operator()(C cond, T x, T y) const {
    return cond != static_cast<C>(0) ? x : y;
  }
};

// The second dtype dispatch of copy and where (the input's, the condition's).
template <typename Out>
void copy_cast(const CudaBackend& be, const View& out, const View& x) {
  EF_DISPATCH_STORAGE(x.dtype, "copy", [&] { map<Out, scalar_t>(be, CastTo<Out>{}, out, x); });
}

template <typename T>
void select(const CudaBackend& be, const View& out, const View& cond, const View& x, const View& y) {
  EF_DISPATCH_ALL(cond.dtype, "where", [&] { map<T, scalar_t, T, T>(be, Select{}, out, cond, x, y); });
}

// --- Generated sequences: out[i] = g(i) over a contiguous view ------------------------------------

template <typename T, typename G>
__global__ void generate_kernel(int64_t n, T* out, G g) {
  for (int64_t i = thread_index(); i < n; i += grid_stride()) {
    out[i] = g(i);
  }
}

template <typename T, typename G>
void generate(const CudaBackend& be, const View& out, G g) {
  EF_ASSERT(out.is_contiguous(), "generated sequence into a non-contiguous view");
  const int64_t n = out.numel();
  if (n == 0) return;
  generate_kernel<<<grid_for(be, n), kThreads, 0, be.stream()>>>(n, static_cast<T*>(out.data), g);
  EF_CUDA_CHECK_LAUNCH();
}

template <typename T>
struct Arange {
  double start, step;
  __device__ T operator()(int64_t i) const { return static_cast<T>(start + step * static_cast<double>(i)); }
};

// The same draw as the CPU backend: sample i depends only on (seed, offset + i), see random_internal.h. In a
// recorded step the key is read from device memory when the kernel runs (Note [Step scalars]).
template <typename T>
struct RandomDraw {
  int kind;
  double a, b;
  uint64_t seed, offset;
  const uint64_t* key_in_device;
  __device__ T operator()(int64_t i) const {
    const uint64_t s = key_in_device ? key_in_device[0] : seed;
    const uint64_t o = key_in_device ? key_in_device[1] : offset;
    return static_cast<T>(random::sample(kind, a, b, s, o + static_cast<uint64_t>(i)));
  }
};

}  // namespace evenflow::cuda_backend
