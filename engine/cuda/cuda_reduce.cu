// The CUDA backend's reductions (sum, max, min, argmax, argmin over any set of dims):
// Note [CUDA reductions].
#include "evenflow/engine/cuda/cuda_launch.cuh"

namespace evenflow::cuda_backend {
namespace {

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

// The sum times 1 / count, rounded after the sum as mean()'s MulScalar rounded (ReduceOp::Mean).
template <typename T>
struct MeanOp {
  using Acc = T;
  using Out = T;
  T scale;
  __device__ Acc identity() const { return T(0); }
  __device__ Acc make(T x, int64_t) const { return x; }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ Out finish(Acc a) const { return a * scale; }
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
  int64_t kept_shape[kMaxDims] = {}, kept_x[kMaxDims] = {}, kept_out[kMaxDims] = {}, red_shape[kMaxDims] = {},
          red_x[kMaxDims] = {};
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

}  // namespace

void CudaBackend::reduce(ReduceOp op, const View& out, const View& x) {
  const auto gate_pass = activate();
  const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  EF_ASSERT(arg ? out.dtype == DType::Int64 : out.dtype == x.dtype, "reduce: output dtype ", dtype_name(out.dtype));
  const ReducePlan p = plan_reduce(*this, out, x);
  if (p.m == 0) return;
  EF_ASSERT(!arg || p.reduced_dims <= 1, "reduce: argmax/argmin reduce one dim, not ", p.reduced_dims);
  EF_CHECK(p.r > 0 || op == ReduceOp::Sum, "reduce: mean/max/min/argmax/argmin over an empty dimension");
  if (p.r == 0) return fill(out, 0.0);
  EF_DISPATCH_ALL(x.dtype, "reduce", [&] {
    using T = scalar_t;
    switch (op) {
      case ReduceOp::Sum:
        return run_reduce<T>(*this, p, out, x, SumOp<T>{});
      case ReduceOp::Mean:
        if constexpr (std::is_floating_point_v<T>)
          return run_reduce<T>(*this, p, out, x, MeanOp<T>{static_cast<T>(1.0 / static_cast<double>(p.r))});
        EF_ERROR("reduce: mean of an integer tensor");
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

}  // namespace evenflow::cuda_backend
