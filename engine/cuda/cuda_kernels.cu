// The CUDA backend's kernels: elementwise ops over strided views (fill, arange, copy, unary,
// binary, where), reductions, softmax, max pooling, gather/scatter and index ops, random numbers,
// and gemm through cuBLAS. The scalar math is the CPU backend's: the functors of scalar_ops.h and
// random::sample, compiled for the device, so both backends compute the same function.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "evenflow/engine/context.h"
#include "evenflow/engine/cuda/cuda_internal.h"
#include "evenflow/engine/device.h"
#include "evenflow/engine/random.h"

namespace evenflow::cuda_backend {
namespace {

constexpr int kThreads = 256;  // block size of every kernel here but the wide softmax

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Blocks for a grid-stride loop over `work` items: enough to fill the GPU, no more.
int grid_for(const CudaBackend& be, int64_t work) {
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

void check_same_shape(const View& out, const View& in) {
  EF_ASSERT(in.ndim == out.ndim, "elementwise operand has ", in.ndim, " dims, output ", out.ndim);
  for (int d = 0; d < out.ndim; ++d) {
    EF_ASSERT(in.shape[d] == out.shape[d], "elementwise operand not broadcast to the output's shape");
  }
}

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

bool aligned_to(const void* p, size_t bytes) {
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

template <typename Out>
struct CastTo {
  template <typename In>
  __device__ Out operator()(In v) const {
    return static_cast<Out>(v);
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
  EF_DISPATCH_ALL(x.dtype, "copy", [&] { map<Out, scalar_t>(be, CastTo<Out>{}, out, x); });
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

// The same draw as the CPU backend: sample i depends only on (seed, offset + i), see random.h.
template <typename T>
struct RandomDraw {
  int kind;
  double a, b;
  uint64_t seed, offset;
  __device__ T operator()(int64_t i) const {
    return static_cast<T>(random::sample(kind, a, b, seed, offset + static_cast<uint64_t>(i)));
  }
};

// --- Reductions ---------------------------------------------------------------------------------------
// Note [CUDA reductions]
// x's dims split into kept dims (out has x's size) and reduced dims (out has 1): M outputs, each
// reducing R elements. Each output gets a group of `lanes` threads of a 256-thread block; lane l
// takes elements l, l + lanes, ... of the reduced index space, then the group combines its lanes
// with a shared-memory tree. When the reduced dims include x's contiguous one ("inner"), a group's
// lanes are adjacent threads reading adjacent elements; otherwise ("outer") adjacent threads serve
// adjacent outputs, which are adjacent in memory, and a few lanes add parallelism when M is small.
// When M alone cannot fill the GPU, R is also split across `splits` blocks (grid y) that write
// partial results, combined by a second kernel. The order of combination depends only on the
// shapes, so results are deterministic. Accumulation is in the element type (float sums in float,
// but as a tree of per-thread partial sums); max/min propagate NaN, argmax/argmin return the first
// index of the extreme value (the first NaN if any).

template <typename T>
struct SumOp {
  using Acc = T;
  using Out = T;
  __device__ Acc identity() const { return T(0); }
  __device__ Acc make(T x, int64_t) const { return x; }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ Out finish(Acc a) const { return a; }
};

template <typename T, bool kMax>
struct ExtremeOp {
  using Acc = T;
  using Out = T;
  __device__ Acc identity() const { return extreme_identity<T, kMax>(); }
  __device__ Acc make(T x, int64_t) const { return x; }
  __device__ Acc combine(Acc a, Acc b) const { return scalar::isnan_(a) || (kMax ? a > b : a < b) ? a : b; }
  __device__ Out finish(Acc a) const { return a; }
};

template <typename T>
struct ValueIndex {
  T value;
  int64_t index;
};

template <typename T, bool kMax>
struct ArgExtremeOp {
  using Acc = ValueIndex<T>;
  using Out = int64_t;
  __device__ Acc identity() const { return {extreme_identity<T, kMax>(), std::numeric_limits<int64_t>::max()}; }
  __device__ Acc make(T x, int64_t index) const { return {x, index}; }
  __device__ Acc combine(Acc a, Acc b) const {
    const bool a_nan = scalar::isnan_(a.value), b_nan = scalar::isnan_(b.value);
    if (a_nan != b_nan) return a_nan ? a : b;
    if (a_nan || a.value == b.value) return a.index <= b.index ? a : b;
    return (kMax ? a.value > b.value : a.value < b.value) ? a : b;
  }
  __device__ Out finish(Acc a) const { return a.index; }
};

struct ReducePlan {
  Indexer<2> kept;     // over the kept dims: offsets in x and in out
  Indexer<1> reduced;  // over the reduced dims: offsets in x
  int64_t m = 0, r = 0;
  int lanes = 1;
  bool outer = false;
  int64_t chunk = 0;  // reduced elements per split
  int splits = 1;
  int reduced_dims = 0;  // before collapsing
};

template <typename I, typename T, typename Op>
__global__ void reduce_kernel(const T* x, typename Op::Out* out, typename Op::Acc* partial, ReducePlan p, Op op) {
  using Acc = typename Op::Acc;
  extern __shared__ __align__(16) unsigned char reduce_smem[];
  Acc* acc_of = reinterpret_cast<Acc*>(reduce_smem);
  const int t = static_cast<int>(threadIdx.x);
  const int lanes = p.lanes, groups = static_cast<int>(blockDim.x) / lanes;
  const int group = p.outer ? t % groups : t / lanes;
  const int lane = p.outer ? t / groups : t % lanes;
  const int lane_stride = p.outer ? groups : 1;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * groups + group;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * p.chunk;
  const int64_t r_end = std::min(p.r, r_begin + p.chunk);

  Acc acc = op.identity();
  int64_t out_off = 0;
  if (o < p.m) {
    int64_t kept_off[2];
    p.kept.offsets(static_cast<I>(o), kept_off);
    const T* base = x + kept_off[0];
    out_off = kept_off[1];
    for (I r = static_cast<I>(r_begin + lane); r < static_cast<I>(r_end); r += static_cast<I>(lanes)) {
      int64_t red_off[1];
      p.reduced.offsets(r, red_off);
      acc = op.combine(acc, op.make(base[red_off[0]], static_cast<int64_t>(r)));
    }
  }
  acc_of[t] = acc;
  __syncthreads();
  for (int s = lanes / 2; s > 0; s /= 2) {
    if (lane < s) acc_of[t] = op.combine(acc_of[t], acc_of[t + s * lane_stride]);
    __syncthreads();
  }
  if (lane == 0 && o < p.m) {
    if (p.splits == 1)
      out[out_off] = op.finish(acc_of[t]);
    else
      partial[static_cast<int64_t>(blockIdx.y) * p.m + o] = acc_of[t];
  }
}

template <typename Op>
__global__ void reduce_partials_kernel(const typename Op::Acc* partial, typename Op::Out* out, ReducePlan p, Op op) {
  for (int64_t o = thread_index(); o < p.m; o += grid_stride()) {
    typename Op::Acc acc = partial[o];
    for (int s = 1; s < p.splits; ++s) acc = op.combine(acc, partial[s * p.m + o]);
    int64_t kept_off[2];
    p.kept.offsets(static_cast<uint64_t>(o), kept_off);
    out[kept_off[1]] = op.finish(acc);
  }
}

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

int64_t floor_pow2(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

ReducePlan plan_reduce(const CudaBackend& be, const View& out, const View& x) {
  EF_ASSERT(out.ndim == x.ndim, "reduce: output has ", out.ndim, " dims, input ", x.ndim);
  int64_t kept_shape[kMaxDims], kept_x[kMaxDims], kept_out[kMaxDims], red_shape[kMaxDims], red_x[kMaxDims];
  int nk = 0, nr = 0;
  for (int d = 0; d < x.ndim; ++d) {
    if (out.shape[d] == x.shape[d]) {
      kept_shape[nk] = x.shape[d];
      kept_x[nk] = x.strides[d];
      kept_out[nk++] = out.strides[d];
    } else {
      EF_ASSERT(out.shape[d] == 1, "reduce: output dim ", d, " is ", out.shape[d], ", input ", x.shape[d]);
      red_shape[nr] = x.shape[d];
      red_x[nr++] = x.strides[d];
    }
  }
  ReducePlan p;
  p.reduced_dims = nr;
  p.kept = make_indexer<2>(nk, kept_shape, {kept_x, kept_out});
  p.reduced = make_indexer<1>(nr, red_shape, {red_x});
  p.m = out.numel();
  p.r = 1;
  for (int d = 0; d < nr; ++d) p.r *= red_shape[d];
  p.outer = !(p.reduced.ndim > 0 && p.reduced.strides[0][0] == 1);
  if (p.m == 0 || p.r == 0) return p;  // nothing to launch (the caller handles these)

  const int64_t sms = be.sm_count();
  if (!p.outer) {
    p.lanes = static_cast<int>(std::min<int64_t>(kThreads, next_pow2(p.r)));
  } else {
    // At most 8 lanes, so a block serves at least 32 adjacent outputs and a warp reads whole
    // 128-byte lines; splits supply the rest of the parallelism when M is small.
    constexpr int64_t kMaxOuterLanes = 8;
    const int64_t wanted = floor_pow2(std::max<int64_t>(1, sms * 2048 / p.m));
    p.lanes = static_cast<int>(std::min<int64_t>({kMaxOuterLanes, wanted, next_pow2(p.r)}));
  }
  const int64_t blocks = ceil_div(p.m, kThreads / p.lanes);
  EF_CHECK(blocks <= INT32_MAX, "reduce: ", p.m, " outputs are too many for one launch");
  int64_t splits = 1;
  if (blocks < 4 * sms) {
    constexpr int64_t kMinPerThread = 16;  // elements a thread should reduce to be worth a split
    splits = std::min<int64_t>({ceil_div(p.r, p.lanes * kMinPerThread), ceil_div(4 * sms, blocks), 65535});
    splits = std::max<int64_t>(splits, 1);
  }
  p.chunk = ceil_div(p.r, splits);
  p.splits = static_cast<int>(ceil_div(p.r, p.chunk));
  return p;
}

template <typename T, typename Op>
void run_reduce(const CudaBackend& be, const ReducePlan& p, const View& out, const View& x, Op op) {
  using Acc = typename Op::Acc;
  using Out = typename Op::Out;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.m, kThreads / p.lanes)), static_cast<unsigned>(p.splits));
  const size_t smem = sizeof(Acc) * kThreads;
  auto* o = static_cast<Out*>(out.data);
  const auto* xp = static_cast<const T*>(x.data);
  auto launch = [&](Acc* partial) {
    with_index_type(std::max(p.m, p.r + p.lanes), [&](auto index_type) {
      using I = decltype(index_type);
      reduce_kernel<I, T, Op><<<grid, kThreads, smem, be.stream()>>>(xp, o, partial, p, op);
    });
    EF_CUDA_CHECK_LAUNCH();
  };
  if (p.splits == 1) {
    launch(nullptr);
    return;
  }
  const DeviceTemporary partial(be, sizeof(Acc) * static_cast<size_t>(p.splits * p.m));
  launch(partial.get<Acc>());
  reduce_partials_kernel<Op><<<grid_for(be, p.m), kThreads, 0, be.stream()>>>(partial.get<Acc>(), o, p, op);
  EF_CUDA_CHECK_LAUNCH();
}

// --- Softmax ------------------------------------------------------------------------------------------

// NaN wins from either side, so that every thread of a group reduces to the same maximum (the
// plain a > b ? a : b is not symmetric in NaN); a row holding a NaN then gives NaN, as in PyTorch.
struct MaxOf {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b || scalar::isnan_(a) ? a : b;
  }
};
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
constexpr int kBlockGroupThreads = 512;

// One group of K threads per row (K = 32 for rows of up to 1024 columns, else one block per row).
// Numerically stable: exp(x - max). Groups are whole warps or the whole block, so the row loop's
// condition is uniform where the group synchronizes.
template <int K, typename T>
__global__ void softmax_kernel(T* out, const T* x, int64_t rows, int64_t cols, bool log) {
  __shared__ T shared[K / 32];
  const int rows_per_block = static_cast<int>(blockDim.x) / K;
  const int lane = static_cast<int>(threadIdx.x) % K;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / K; row < rows;
       row += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const T* xr = x + row * cols;
    T* yr = out + row * cols;
    T max = -std::numeric_limits<T>::infinity();
    for (int64_t c = lane; c < cols; c += K) max = MaxOf{}(max, xr[c]);
    max = group_all_reduce<K>(max, MaxOf{}, shared);
    T sum = 0;
    for (int64_t c = lane; c < cols; c += K) sum += scalar::exp_(xr[c] - max);
    sum = group_all_reduce<K>(sum, SumOf{}, shared);
    if (log) {
      const T log_sum = scalar::log_(sum);
      for (int64_t c = lane; c < cols; c += K) yr[c] = xr[c] - max - log_sum;
    } else {
      for (int64_t c = lane; c < cols; c += K) yr[c] = scalar::exp_(xr[c] - max) / sum;
    }
  }
}

// --- Normalization --------------------------------------------------------------------------------------

// NormArgs (backend.h): one group of K threads per statistic group, as in softmax_kernel (K = 32 for
// layer norm rows of up to 1024 features, else the whole block). Element j of a group is
// x[(j / inner) * groups * inner + g * inner + j % inner]; I (uint32_t where every offset fits) keeps
// that division cheap. Three passes over the group: mean, variance about it, output.
template <int K, typename I, typename T>
__global__ void normalize_kernel(NormArgs a, T* y, T* mean_out, T* var_out, const T* x, const T* w, const T* b) {
  __shared__ T shared[K / 32];
  const int groups_per_block = static_cast<int>(blockDim.x) / K;
  const int lane = static_cast<int>(threadIdx.x) % K;
  const I inner = static_cast<I>(a.inner), n = static_cast<I>(a.outer * a.inner);
  const I stride = static_cast<I>(a.groups * a.inner);
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / K; g < a.groups;
       g += static_cast<int64_t>(gridDim.x) * groups_per_block) {
    const T* xg = x + g * a.inner;
    T* yg = y + g * a.inner;
    T sum = 0;
    for (I j = lane; j < n; j += K) sum += xg[j / inner * stride + j % inner];
    sum = group_all_reduce<K>(sum, SumOf{}, shared);
    const T mean = sum / static_cast<T>(n);
    T squares = 0;
    for (I j = lane; j < n; j += K) {
      const T d = xg[j / inner * stride + j % inner] - mean;
      squares += d * d;
    }
    squares = group_all_reduce<K>(squares, SumOf{}, shared);
    const T var = squares / static_cast<T>(n);
    const T rstd = T(1) / scalar::sqrt_(var + static_cast<T>(a.eps));
    if (lane == 0) {
      mean_out[g] = mean;
      var_out[g] = var;
    }
    for (I j = lane; j < n; j += K) {
      const I i = j % inner, at = j / inner * stride + i;
      T v = (xg[at] - mean) * rstd;
      if (w != nullptr) v *= w[a.affine_per_group ? static_cast<I>(g) : i];
      if (b != nullptr) v += b[a.affine_per_group ? static_cast<I>(g) : i];
      yg[at] = v;
    }
  }
}

// Backend::normalize_backward: one group of K threads per statistic group, as normalize_kernel;
// two passes (the sums, then gx). A per-group weight factors out of the sums (taken without it:
// gw and gb per group). Per-feature gw and gb (layer norm) sum over groups: feature_sums_kernel.
template <int K, typename I, typename T>
__global__ void normalize_backward_kernel(NormArgs a, T* gx, T* gw, T* gb, const T* gy, const T* x, const T* mean,
                                          const T* rstd, const T* w) {
  __shared__ T shared[K / 32];
  const int groups_per_block = static_cast<int>(blockDim.x) / K;
  const int lane = static_cast<int>(threadIdx.x) % K;
  const I inner = static_cast<I>(a.inner), n = static_cast<I>(a.outer * a.inner);
  const I stride = static_cast<I>(a.groups * a.inner);
  const T* fw = w != nullptr && !a.affine_per_group ? w : nullptr;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / K; g < a.groups;
       g += static_cast<int64_t>(gridDim.x) * groups_per_block) {
    const T* xg = x + g * a.inner;
    const T* gyg = gy + g * a.inner;
    const T m = mean[g], r = rstd[g];
    T sum_g = 0, sum_g_x_hat = 0;
    for (I j = lane; j < n; j += K) {
      const I i = j % inner, at = j / inner * stride + i;
      const T x_hat = (xg[at] - m) * r, g_hat = fw != nullptr ? gyg[at] * fw[i] : gyg[at];
      sum_g += g_hat;
      sum_g_x_hat += g_hat * x_hat;
    }
    sum_g = group_all_reduce<K>(sum_g, SumOf{}, shared);
    sum_g_x_hat = group_all_reduce<K>(sum_g_x_hat, SumOf{}, shared);
    T group_w = 1;
    if (a.affine_per_group) {
      if (lane == 0 && gw != nullptr) gw[g] = sum_g_x_hat;
      if (lane == 0 && gb != nullptr) gb[g] = sum_g;
      if (w != nullptr) group_w = w[g];
    }
    if (gx == nullptr) continue;
    const T mean_g = sum_g / static_cast<T>(n) * group_w, mean_g_x_hat = sum_g_x_hat / static_cast<T>(n) * group_w;
    T* gxg = gx + g * a.inner;
    for (I j = lane; j < n; j += K) {
      const I i = j % inner, at = j / inner * stride + i;
      const T x_hat = (xg[at] - m) * r, g_hat = gyg[at] * (fw != nullptr ? fw[i] : group_w);
      gxg[at] = r * (g_hat - mean_g - x_hat * mean_g_x_hat);
    }
  }
}

// Per-feature gw = Σ gy·x̂ and gb = Σ gy over the groups (rows) of a layer norm: a thread per
// feature, adjacent threads reading adjacent features of a row.
template <typename T>
__global__ void feature_sums_kernel(NormArgs a, T* gw, T* gb, const T* gy, const T* x, const T* mean, const T* rstd) {
  for (int64_t i = thread_index(); i < a.inner; i += grid_stride()) {
    T sw = 0, sb = 0;
    for (int64_t g = 0; g < a.groups; ++g) {
      const int64_t at = g * a.inner + i;
      sw += gy[at] * ((x[at] - mean[g]) * rstd[g]);
      sb += gy[at];
    }
    if (gw != nullptr) gw[i] = sw;
    if (gb != nullptr) gb[i] = sb;
  }
}

// --- Max pooling --------------------------------------------------------------------------------------

// One thread per output. Positions in the padding are skipped (padding never wins); among real
// positions the first maximum wins, and the first NaN wins over numbers (NaN propagates, as in PyTorch).
template <typename T>
__global__ void max_pool2d_kernel(PoolArgs a, T* out, int64_t* indices, const T* x, int64_t total) {
  for (int64_t i = thread_index(); i < total; i += grid_stride()) {
    const int64_t ow = i % a.ow, oh = (i / a.ow) % a.oh, plane = i / (a.ow * a.oh);
    const T* xp = x + plane * a.h * a.w;
    T best = -std::numeric_limits<T>::infinity();
    int64_t best_index = -1;
    for (int64_t ky = 0; ky < a.kh; ++ky) {
      const int64_t iy = oh * a.stride_h - a.pad_h + ky * a.dil_h;
      if (iy < 0 || iy >= a.h) continue;
      for (int64_t kx = 0; kx < a.kw; ++kx) {
        const int64_t ix = ow * a.stride_w - a.pad_w + kx * a.dil_w;
        if (ix < 0 || ix >= a.w) continue;
        const T v = xp[iy * a.w + ix];
        if (best_index < 0 || v > best || (scalar::isnan_(v) && !scalar::isnan_(best))) {
          best = v;
          best_index = iy * a.w + ix;
        }
      }
    }
    out[i] = best;
    indices[i] = best_index;
  }
}

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
      error[0] = 1;
      continue;
    }
    atomic_add(out + off[2] + j * dim_stride, src[off[0]]);
  }
}

// Runs launch(flag) for an indexing kernel; a bad index is reported at the next synchronization
// (Note [Index checks] in cuda_backend.cu).
template <typename Launch>
void with_index_check(const CudaBackend& be, const char* op, int dim, int64_t dim_size, Launch&& launch) {
  launch(be.index_check_flag([op, dim, dim_size](int64_t bad) {
    return ::evenflow::detail::str_cat(op, ": index ", bad, " is out of range for dim ", dim, " of size ", dim_size);
  }));
  EF_CUDA_CHECK_LAUNCH();
}

__global__ void check_index_range_kernel(int64_t n, const int64_t* index, int64_t size, int64_t allowed,
                                         int64_t* error) {
  for (int64_t i = thread_index(); i < n; i += grid_stride()) {
    const int64_t j = index[i];
    if ((j < 0 || j >= size) && j != allowed) {
      error[1] = j;
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

// --- Backend entry points -------------------------------------------------------------------------------

void CudaBackend::fill(const View& out, double value) {
  activate();
  EF_DISPATCH_ALL(out.dtype, "fill",
                  [&] { map<scalar_t>(*this, Constant<scalar_t>{static_cast<scalar_t>(value)}, out); });
}

void CudaBackend::arange(const View& out, double start, double step) {
  activate();
  EF_DISPATCH_ALL(out.dtype, "arange", [&] { generate<scalar_t>(*this, out, Arange<scalar_t>{start, step}); });
}

void CudaBackend::copy(const View& out, const View& x) {
  activate();
  check_same_shape(out, x);
  const auto ix = make_indexer<2>(out.ndim, out.shape, {out.strides, x.strides});
  if (out.dtype == x.dtype && ix.contiguous()) {
    const size_t nbytes = static_cast<size_t>(out.numel()) * dtype_size(out.dtype);
    if (nbytes > 0) CUDA_CHECK(cudaMemcpyAsync(out.data, x.data, nbytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  EF_DISPATCH_ALL(out.dtype, "copy", [&] { copy_cast<scalar_t>(*this, out, x); });
}

void CudaBackend::unary(UnaryOp op, const View& out, const View& x, double a, double b) {
  activate();
  EF_ASSERT(out.dtype == x.dtype, "unary: output ", dtype_name(out.dtype), ", input ", dtype_name(x.dtype));
  EF_DISPATCH_FLOAT(out.dtype, "unary op", [&] {
    visit_unary(op, [&](auto fn) { map<scalar_t, scalar_t>(*this, BoundUnary<decltype(fn)>{fn, a, b}, out, x); });
  });
}

void CudaBackend::binary(BinaryOp op, const View& out, const View& x, const View& y) {
  activate();
  EF_ASSERT(out.dtype == x.dtype && out.dtype == y.dtype, "binary: mixed dtypes");
  EF_DISPATCH_ALL(out.dtype, "binary op",
                  [&] { visit_binary(op, [&](auto fn) { map<scalar_t, scalar_t, scalar_t>(*this, fn, out, x, y); }); });
}

void CudaBackend::where(const View& out, const View& cond, const View& x, const View& y) {
  activate();
  EF_ASSERT(out.dtype == x.dtype && out.dtype == y.dtype, "where: mixed dtypes");
  EF_DISPATCH_ALL(out.dtype, "where", [&] { select<scalar_t>(*this, out, cond, x, y); });
}

// The fused Adam step of AdamArgs (see engine/backend.h) on up to kAdamTensorsPerLaunch
// parameters per launch, passed by value in the kernel's parameters (no table to copy to the
// device first). Parameter k gets blocks [block_begin[k], block_begin[k + 1]) of the grid, one
// thread per element in a grid-stride loop over its own blocks.
constexpr int kAdamTensorsPerLaunch = 32;

template <typename T>
struct AdamLaunch {
  int count = 0;
  int block_begin[kAdamTensorsPerLaunch + 1] = {};
  int64_t n[kAdamTensorsPerLaunch] = {};
  T* p[kAdamTensorsPerLaunch] = {};
  const T* grad[kAdamTensorsPerLaunch] = {};
  T* m[kAdamTensorsPerLaunch] = {};
  T* v[kAdamTensorsPerLaunch] = {};
  T* v_max[kAdamTensorsPerLaunch] = {};  // null without amsgrad
};
static_assert(sizeof(AdamLaunch<double>) + 64 <= 4096, "kernel parameters are limited to 4 KiB");

template <typename T>
__global__ void adam_kernel(scalar::AdamScalars<T> s, AdamLaunch<T> l) {
  int k = 0;
  while (k + 1 < l.count && static_cast<int>(blockIdx.x) >= l.block_begin[k + 1]) ++k;
  const int64_t blocks = l.block_begin[k + 1] - l.block_begin[k];
  const int64_t stride = blocks * blockDim.x;
  T* v_max = l.v_max[k];
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) - l.block_begin[k]) * blockDim.x + threadIdx.x; i < l.n[k];
       i += stride)
    scalar::adam_element(s, l.p[k][i], l.grad[k][i], l.m[k][i], l.v[k][i], v_max ? v_max + i : nullptr);
}

void CudaBackend::adam(const AdamArgs& args, const std::vector<AdamOperands>& params) {
  activate();
  if (params.empty()) return;
  EF_DISPATCH_FLOAT(params[0].param.dtype, "adam", [&] {
    using T = scalar_t;
    const auto scalars = scalar::adam_scalars<T>(args);
    AdamLaunch<T> l;
    const auto launch = [&] {
      if (l.count == 0) return;
      adam_kernel<T><<<l.block_begin[l.count], kThreads, 0, stream()>>>(scalars, l);
      EF_CUDA_CHECK_LAUNCH();
      l = AdamLaunch<T>{};
    };
    for (const AdamOperands& o : params) {
      const int64_t n = o.param.numel();
      if (n == 0) continue;
      const int k = l.count++;
      l.n[k] = n;
      l.p[k] = static_cast<T*>(o.param.data);
      l.grad[k] = static_cast<const T*>(o.grad.data);
      l.m[k] = static_cast<T*>(o.exp_avg.data);
      l.v[k] = static_cast<T*>(o.exp_avg_sq.data);
      l.v_max[k] = args.amsgrad ? static_cast<T*>(o.max_exp_avg_sq.data) : nullptr;
      l.block_begin[k + 1] = l.block_begin[k] + grid_for(*this, n);
      if (l.count == kAdamTensorsPerLaunch) launch();
    }
    launch();
  });
}

void CudaBackend::reduce(ReduceOp op, const View& out, const View& x) {
  activate();
  const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  EF_ASSERT(arg ? out.dtype == DType::Int64 : out.dtype == x.dtype, "reduce: output dtype ", dtype_name(out.dtype));
  const ReducePlan p = plan_reduce(*this, out, x);
  if (p.m == 0) return;
  EF_ASSERT(!arg || p.reduced_dims <= 1, "reduce: argmax/argmin reduce one dim, not ", p.reduced_dims);
  EF_CHECK(p.r > 0 || op == ReduceOp::Sum, "reduce: max/min/argmax/argmin over an empty dimension");
  if (p.r == 0) return fill(out, 0.0);
  EF_DISPATCH_ALL(x.dtype, "reduce", [&] {
    using T = scalar_t;
    switch (op) {
      case ReduceOp::Sum:
        return run_reduce<T>(*this, p, out, x, SumOp<T>{});
      case ReduceOp::Max:
        return run_reduce<T>(*this, p, out, x, ExtremeOp<T, true>{});
      case ReduceOp::Min:
        return run_reduce<T>(*this, p, out, x, ExtremeOp<T, false>{});
      case ReduceOp::ArgMax:
        return run_reduce<T>(*this, p, out, x, ArgExtremeOp<T, true>{});
      case ReduceOp::ArgMin:
        return run_reduce<T>(*this, p, out, x, ArgExtremeOp<T, false>{});
    }
    EF_ERROR("reduce: unknown op");
  });
}

void CudaBackend::softmax(const View& out, const View& x, bool log) {
  activate();
  EF_ASSERT(out.dtype == x.dtype && x.ndim >= 1 && out.is_contiguous() && x.is_contiguous(),
            "softmax: operands must be contiguous and of one dtype");
  const int64_t cols = x.shape[x.ndim - 1];
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / cols;
  EF_DISPATCH_FLOAT(x.dtype, "softmax", [&] {
    auto* y = static_cast<scalar_t*>(out.data);
    const auto* xp = static_cast<const scalar_t*>(x.data);
    if (cols <= 1024) {
      constexpr int kRowsPerBlock = kThreads / 32;
      const int grid = static_cast<int>(std::min<int64_t>(ceil_div(rows, kRowsPerBlock), INT32_MAX));
      softmax_kernel<32, scalar_t><<<grid, kThreads, 0, stream_>>>(y, xp, rows, cols, log);
    } else {
      const int grid = static_cast<int>(std::min<int64_t>(rows, INT32_MAX));
      softmax_kernel<kBlockGroupThreads, scalar_t><<<grid, kBlockGroupThreads, 0, stream_>>>(y, xp, rows, cols, log);
    }
    EF_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::normalize(const NormArgs& args, const View& y, const View& mean, const View& var, const View& x,
                            const View& weight, const View& bias) {
  activate();
  EF_ASSERT(x.is_contiguous() && y.is_contiguous() && mean.is_contiguous() && var.is_contiguous(),
            "normalize: expects contiguous views");
  if (args.groups == 0 || args.outer * args.inner == 0) return;
  EF_DISPATCH_FLOAT(x.dtype, "normalize", [&] {
    auto* yp = static_cast<scalar_t*>(y.data);
    auto* mp = static_cast<scalar_t*>(mean.data);
    auto* vp = static_cast<scalar_t*>(var.data);
    const auto* xp = static_cast<const scalar_t*>(x.data);
    const auto* wp = static_cast<const scalar_t*>(weight.data);
    const auto* bp = static_cast<const scalar_t*>(bias.data);
    // Offsets reach outer * groups * inner, plus one stride of the loop.
    with_index_type(x.numel() + args.groups * args.inner, [&](auto index) {
      using I = decltype(index);
      if (args.outer == 1 && args.inner <= 1024) {
        constexpr int kGroupsPerBlock = kThreads / 32;
        const int grid = static_cast<int>(std::min<int64_t>(ceil_div(args.groups, kGroupsPerBlock), INT32_MAX));
        normalize_kernel<32, I, scalar_t><<<grid, kThreads, 0, stream_>>>(args, yp, mp, vp, xp, wp, bp);
      } else {
        const int grid = static_cast<int>(std::min<int64_t>(args.groups, INT32_MAX));
        normalize_kernel<kBlockGroupThreads, I, scalar_t>
            <<<grid, kBlockGroupThreads, 0, stream_>>>(args, yp, mp, vp, xp, wp, bp);
      }
    });
    EF_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::normalize_backward(const NormArgs& args, const View& gx, const View& gw, const View& gb,
                                     const View& gy, const View& x, const View& mean, const View& rstd,
                                     const View& weight) {
  activate();
  EF_ASSERT(x.is_contiguous() && gy.is_contiguous() && mean.is_contiguous() && rstd.is_contiguous(),
            "normalize_backward: expects contiguous views");
  if (args.groups == 0 || args.outer * args.inner == 0) return;
  EF_DISPATCH_FLOAT(x.dtype, "normalize_backward", [&] {
    using T = scalar_t;
    auto* gxp = static_cast<T*>(gx.data);
    auto* gwp = static_cast<T*>(gw.data);
    auto* gbp = static_cast<T*>(gb.data);
    const auto* gyp = static_cast<const T*>(gy.data);
    const auto* xp = static_cast<const T*>(x.data);
    const auto* mp = static_cast<const T*>(mean.data);
    const auto* rp = static_cast<const T*>(rstd.data);
    const auto* wp = static_cast<const T*>(weight.data);
    // The group kernel writes gx, and per-group gw and gb; per-feature ones need the rows summed.
    T* group_gw = args.affine_per_group ? gwp : nullptr;
    T* group_gb = args.affine_per_group ? gbp : nullptr;
    if (gxp != nullptr || group_gw != nullptr || group_gb != nullptr) {
      with_index_type(x.numel() + args.groups * args.inner, [&](auto index) {
        using I = decltype(index);
        if (args.outer == 1 && args.inner <= 1024) {
          constexpr int kGroupsPerBlock = kThreads / 32;
          const int grid = static_cast<int>(std::min<int64_t>(ceil_div(args.groups, kGroupsPerBlock), INT32_MAX));
          normalize_backward_kernel<32, I, T>
              <<<grid, kThreads, 0, stream_>>>(args, gxp, group_gw, group_gb, gyp, xp, mp, rp, wp);
        } else {
          const int grid = static_cast<int>(std::min<int64_t>(args.groups, INT32_MAX));
          normalize_backward_kernel<kBlockGroupThreads, I, T>
              <<<grid, kBlockGroupThreads, 0, stream_>>>(args, gxp, group_gw, group_gb, gyp, xp, mp, rp, wp);
        }
      });
      EF_CUDA_CHECK_LAUNCH();
    }
    if (!args.affine_per_group && (gwp != nullptr || gbp != nullptr)) {
      EF_ASSERT(args.outer == 1, "normalize_backward: per-feature weights need outer == 1");
      feature_sums_kernel<T><<<grid_for(*this, args.inner), kThreads, 0, stream_>>>(args, gwp, gbp, gyp, xp, mp, rp);
      EF_CUDA_CHECK_LAUNCH();
    }
  });
}

void CudaBackend::max_pool2d(const PoolArgs& args, const View& out, const View& indices, const View& x) {
  activate();
  EF_ASSERT(out.dtype == x.dtype && indices.dtype == DType::Int64 && out.is_contiguous() && indices.is_contiguous() &&
                x.is_contiguous(),
            "max_pool2d: bad operands");
  const int64_t total = args.n * args.c * args.oh * args.ow;
  if (total == 0) return;
  EF_DISPATCH_FLOAT(x.dtype, "max_pool2d", [&] {
    max_pool2d_kernel<scalar_t><<<grid_for(*this, total), kThreads, 0, stream_>>>(
        args, static_cast<scalar_t*>(out.data), static_cast<int64_t*>(indices.data),
        static_cast<const scalar_t*>(x.data), total);
    EF_CUDA_CHECK_LAUNCH();
  });
}

// Zeros, then the scatter_add of every plane's gradient at its indices (the kernels the general
// scatter_add op runs).
void CudaBackend::max_pool2d_backward(const PoolArgs& args, const View& gx, const View& gy, const View& indices) {
  EF_ASSERT(gx.is_contiguous() && gy.is_contiguous() && indices.is_contiguous() && gx.dtype == gy.dtype &&
                indices.dtype == DType::Int64,
            "max_pool2d_backward: bad operands");
  fill(gx, 0.0);
  const int64_t n = args.n, c = args.c;
  scatter_add(contiguous_view(gx.data, gx.dtype, {n, c, args.h * args.w}), 2,
              contiguous_view(indices.data, DType::Int64, {n, c, args.oh * args.ow}),
              contiguous_view(gy.data, gy.dtype, {n, c, args.oh * args.ow}));
}

void CudaBackend::gather(const View& out, const View& x, int dim, const View& index) {
  activate();
  EF_ASSERT(index.ndim == out.ndim, "gather: index has ", index.ndim, " dims, output ", out.ndim);
  launch_gather(*this, "gather", out, x, dim, index, index.strides);
}

void CudaBackend::scatter_add(const View& out, int dim, const View& index, const View& src) {
  activate();
  EF_ASSERT(index.ndim == src.ndim, "scatter_add: index has ", index.ndim, " dims, src ", src.ndim);
  launch_scatter_add(*this, "scatter_add", out, dim, index, index.strides, src);
}

void CudaBackend::check_index_range(const View& index, int64_t size, int64_t allowed,
                                    std::function<std::string(int64_t)> describe) {
  activate();
  EF_ASSERT(index.is_contiguous() && index.dtype == DType::Int64, "check_index_range: expects contiguous int64");
  const int64_t n = index.numel();
  if (n == 0) return;
  check_index_range_kernel<<<grid_for(*this, n), kThreads, 0, stream_>>>(
      n, static_cast<const int64_t*>(index.data), size, allowed, index_check_flag(std::move(describe)));
  EF_CUDA_CHECK_LAUNCH();
}

void CudaBackend::index_select(const View& out, const View& x, int dim, const View& index) {
  activate();
  launch_gather(*this, "index_select", out, x, dim, index, index_along(index, out.ndim, dim).data());
}

void CudaBackend::index_add(const View& out, int dim, const View& index, const View& src) {
  activate();
  launch_scatter_add(*this, "index_add", out, dim, index, index_along(index, src.ndim, dim).data(), src);
}

void CudaBackend::random(const View& out, RandomKind kind, double a, double b, uint64_t seed, uint64_t offset) {
  activate();
  EF_DISPATCH_ALL(out.dtype, "random", [&] {
    generate<scalar_t>(*this, out, RandomDraw<scalar_t>{static_cast<int>(kind), a, b, seed, offset});
  });
}

// Note [Row-major gemm on cuBLAS]
// cuBLAS is column-major. A row-major matrix with row stride ld is, read column-major with leading
// dimension ld, its own transpose. So the row-major C = op(A)·op(B)  [m,k]x[k,n]  is the
// column-major Cᵀ = op(B)ᵀ·op(A)ᵀ  [n,k]x[k,m]: pass B first, then A, swap m and n, and keep each
// operand's transpose flag. Batch strides may be 0 (an operand shared by every batch).
// Float32 uses CUBLAS_COMPUTE_32F with the default math mode: true fp32 FMA, no TF32 tensor cores,
// so results agree with the CPU backend within float rounding (TF32 would cost ~3 digits).
void CudaBackend::gemm(const GemmArgs& g) {
  activate();
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
  CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(cublas(lock), g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k, alpha, g.b, type,
                                             ldb, g.stride_b, g.a, type, lda, g.stride_a, beta, g.c, type, ldc,
                                             g.stride_c, g.batch, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace evenflow::cuda_backend
