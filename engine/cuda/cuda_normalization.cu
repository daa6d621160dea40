// The CUDA backend's group normalizations: the fused layer norm / batch norm forward, first-order
// backward and second-order backward (Note [Fused normalization]). Softmax is cuda_softmax.cu.
#include "evenflow/engine/cuda/cuda_launch.cuh"

namespace evenflow::cuda_backend {
namespace {

// --- Normalization --------------------------------------------------------------------------------------

// Feature i of a group as an index of the per-feature parameters and their gradients: i itself, or
// with NormArgs::param_channels = C (a channels-last layer norm: features in H, W, C order,
// parameters in C, H, W order) (i % C)·(inner / C) + i / C.
template <typename I>
__device__ __forceinline__ I param_index(const NormArgs& a, I i) {
  if (a.param_channels == 0) return i;
  const I channels = static_cast<I>(a.param_channels);
  return i % channels * (static_cast<I>(a.inner) / channels) + i / channels;
}

// RunningStats (backend.h) in the kernels' type: null pointers where there is none to update.
template <typename T>
struct RunningUpdate {
  T* mean = nullptr;
  T* var = nullptr;
  T keep = 1, mean_weight = 0, var_weight = 0;
};

__device__ __forceinline__ float mul_rounded(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rounded(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float add_rounded(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rounded(double a, double b) {
  return __dadd_rn(a, b);
}

// Group g's statistics, and its running ones updated: each product and sum rounded, where nvcc
// would contract them into an FMA, so that they are the CPU's bits (RunningStats).
template <typename T>
__device__ __forceinline__ void write_statistics(int64_t g, T mean, T var, T rstd, T* mean_out, T* var_out, T* rstd_out,
                                                 const RunningUpdate<T>& running) {
  mean_out[g] = mean;
  var_out[g] = var;
  rstd_out[g] = rstd;
  if (running.mean != nullptr)
    running.mean[g] = add_rounded(mul_rounded(running.mean[g], running.keep), mul_rounded(running.mean_weight, mean));
  if (running.var != nullptr)
    running.var[g] = add_rounded(mul_rounded(running.var[g], running.keep), mul_rounded(running.var_weight, var));
}

// NormArgs (backend.h): a block of K = kBlockGroupThreads threads per statistic group (layer norm
// rows of up to 1024 features take normalize_rows_kernel, large groups normalize_chunks_kernel).
// Element j of a group is x[(j / inner) * groups * inner + g * inner + j % inner]; I (uint32_t where
// every offset fits) keeps that division cheap. Three passes over the group: mean, variance about
// it, output.
template <typename I, typename T>
__global__ void normalize_kernel(NormArgs a, T* y, T* mean_out, T* var_out, T* rstd_out, RunningUpdate<T> running,
                                 const T* x, const T* w, const T* b) {
  constexpr int K = kBlockGroupThreads;
  __shared__ T shared[K / 32];
  const int lane = static_cast<int>(threadIdx.x);
  const I inner = static_cast<I>(a.inner), n = static_cast<I>(a.outer * a.inner);
  const I stride = static_cast<I>(a.groups * a.inner);
  for (int64_t g = blockIdx.x; g < a.groups; g += gridDim.x) {
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
    if (lane == 0) write_statistics(g, mean, var, rstd, mean_out, var_out, rstd_out, running);
    for (I j = lane; j < n; j += K) {
      const I i = j % inner, at = j / inner * stride + i;
      T v = (xg[at] - mean) * rstd;
      if (w != nullptr) v *= w[a.affine_per_group ? static_cast<I>(g) : param_index(a, i)];
      if (b != nullptr) v += b[a.affine_per_group ? static_cast<I>(g) : param_index(a, i)];
      yg[at] = v;
    }
  }
}

// Layer norm rows of up to 1024 features (outer == 1): a warp per row, holding it in registers
// (kPerLane values a lane), so that memory is read once. normalize_kernel's passes, run by a warp
// per row, took these rows until 2026-11-30 (layer_norm's forward then took 1.14x PyTorch's time on
// the H200) and read it three times; the arithmetic is theirs, in their order.
template <int kPerLane, typename T>
__global__ void normalize_rows_kernel(NormArgs a, T* y, T* mean_out, T* var_out, T* rstd_out, RunningUpdate<T> running,
                                      const T* x, const T* w, const T* b) {
  const int rows_per_block = static_cast<int>(blockDim.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32, n = static_cast<int>(a.inner);
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / 32; g < a.groups;
       g += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const T* xg = x + g * a.inner;
    T* yg = y + g * a.inner;
    T v[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) v[k] = lane + 32 * k < n ? xg[lane + 32 * k] : T(0);
    T sum = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
      if (lane + 32 * k < n) sum += v[k];
    sum = group_all_reduce<32>(sum, SumOf{}, static_cast<T*>(nullptr));
    const T mean = sum / static_cast<T>(n);
    T squares = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      if (lane + 32 * k < n) {
        const T d = v[k] - mean;
        squares += d * d;
      }
    }
    squares = group_all_reduce<32>(squares, SumOf{}, static_cast<T*>(nullptr));
    const T var = squares / static_cast<T>(n);
    const T rstd = T(1) / scalar::sqrt_(var + static_cast<T>(a.eps));
    if (lane == 0) write_statistics(g, mean, var, rstd, mean_out, var_out, rstd_out, running);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;
      if (j >= n) continue;
      T o = (v[k] - mean) * rstd;
      if (w != nullptr) o *= w[a.affine_per_group ? g : param_index(a, j)];
      if (b != nullptr) o += b[a.affine_per_group ? g : param_index(a, j)];
      yg[j] = o;
    }
  }
}

// Rows a block of the kernels that hold a row in registers: a lane holding 32 float32 values takes 143
// registers in the forward (167 with the backward's two rows, 168 and 230 in float64), with which an
// SM keeps 12-14 warps in 2-warp blocks but 8 in 8-warp ones.
constexpr int kHeldRowsPerBlock = 2;

// Calls f(std::integral_constant<int, P>{}), P the fewest values a lane (1, 2, 4, ..., 32) with
// which a warp holds a row of `inner` (at most 1024) features.
template <typename F>
void with_values_per_lane(int64_t inner, F&& f) {
  const int64_t needed = ceil_div(inner, 32);
  if (needed <= 1)
    f(std::integral_constant<int, 1>{});
  else if (needed <= 2)
    f(std::integral_constant<int, 2>{});
  else if (needed <= 4)
    f(std::integral_constant<int, 4>{});
  else if (needed <= 8)
    f(std::integral_constant<int, 8>{});
  else if (needed <= 16)
    f(std::integral_constant<int, 16>{});
  else
    f(std::integral_constant<int, 32>{});
}

// Note [Group statistics in chunks]
// normalize_kernel gives a group one block: a batch norm's 64 channels got 64 blocks on an H200's
// 132 multiprocessors, and its forward took 1.47x PyTorch's time (docs/gpu.md, 2026-11-30). Groups
// of more than two chunks (statistic_chunk: a shape's chunks depend on its group size alone, so the
// result repeats bit for bit on any GPU) are split: chunk_moments_kernel gives each (group, chunk)
// a block writing the chunk's mean and sum of squared deviations about it (two passes over the
// chunk, the second from cache); normalize_chunks_kernel merges a group's chunks in order (Chan et
// al.'s pairwise update, as stable as the two passes about the group's mean) and normalizes its own
// chunk. Memory is read twice and written once, where normalize_kernel reads it three times.
constexpr int64_t kMinChunkElements = 8192;  // 16 per thread of a block: enough to hide the loads
constexpr int64_t kMaxChunks = 64;           // chunks a block merges one by one

// The elements per chunk of a group of n elements: at least kMinChunkElements, at most kMaxChunks.
int64_t statistic_chunk(int64_t n) {
  return std::max(kMinChunkElements, ceil_div(n, kMaxChunks));
}

// The group's j-th element, x[(j / inner) * groups * inner + g * inner + j % inner] past xg = x + g * inner.
template <typename I>
__device__ __forceinline__ I group_offset(I j, I inner, I stride) {
  return j / inner * stride + j % inner;
}

template <typename I, typename T>
__global__ void chunk_moments_kernel(NormArgs a, I chunk, T* chunk_mean, T* chunk_m2, const T* x) {
  __shared__ T shared[kBlockGroupThreads / 32];
  const int64_t g = blockIdx.x, c = blockIdx.y;
  const I inner = static_cast<I>(a.inner), n = static_cast<I>(a.outer * a.inner);
  const I stride = static_cast<I>(a.groups * a.inner);
  const I first = static_cast<I>(c) * chunk, last = min(n, first + chunk);
  const T* xg = x + g * a.inner;
  T sum = 0;
  for (I j = first + threadIdx.x; j < last; j += blockDim.x) sum += xg[group_offset(j, inner, stride)];
  const T mean = group_all_reduce<kBlockGroupThreads>(sum, SumOf{}, shared) / static_cast<T>(last - first);
  T squares = 0;
  for (I j = first + threadIdx.x; j < last; j += blockDim.x) {
    const T d = xg[group_offset(j, inner, stride)] - mean;
    squares += d * d;
  }
  squares = group_all_reduce<kBlockGroupThreads>(squares, SumOf{}, shared);
  if (threadIdx.x == 0) {
    chunk_mean[g * gridDim.y + c] = mean;
    chunk_m2[g * gridDim.y + c] = squares;
  }
}

template <typename I, typename T>
__global__ void normalize_chunks_kernel(NormArgs a, I chunk, const T* chunk_mean, const T* chunk_m2, T* y, T* mean_out,
                                        T* var_out, T* rstd_out, RunningUpdate<T> running, const T* x, const T* w,
                                        const T* b) {
  __shared__ T stats[2];
  const int64_t g = blockIdx.x, c = blockIdx.y, chunks = gridDim.y;
  const I inner = static_cast<I>(a.inner), n = static_cast<I>(a.outer * a.inner);
  const I stride = static_cast<I>(a.groups * a.inner);
  if (threadIdx.x == 0) {
    // Chan et al.: merging (n_a, mean_a, M2_a) with (n_b, mean_b, M2_b), δ = mean_b - mean_a,
    // mean = mean_a + δ·n_b/n, M2 = M2_a + M2_b + δ²·n_a·n_b/n, n = n_a + n_b.
    const int64_t size = chunk, group_size = n;
    T mean = 0, m2 = 0;
    int64_t merged = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t count = min(size, group_size - k * size);
      const int64_t total = merged + count;
      const T delta = chunk_mean[g * chunks + k] - mean;
      const T weight = static_cast<T>(count) / static_cast<T>(total);
      mean += delta * weight;
      m2 += chunk_m2[g * chunks + k] + delta * delta * (static_cast<T>(merged) * weight);
      merged = total;
    }
    const T var = m2 / static_cast<T>(n);
    stats[0] = mean;
    stats[1] = T(1) / scalar::sqrt_(var + static_cast<T>(a.eps));
    if (c == 0) write_statistics(g, mean, var, stats[1], mean_out, var_out, rstd_out, running);
  }
  __syncthreads();
  const T mean = stats[0], rstd = stats[1];
  const I first = static_cast<I>(c) * chunk, last = min(n, first + chunk);
  const T* xg = x + g * a.inner;
  T* yg = y + g * a.inner;
  for (I j = first + threadIdx.x; j < last; j += blockDim.x) {
    const I i = j % inner, at = j / inner * stride + i;
    T v = (xg[at] - mean) * rstd;
    if (w != nullptr) v *= w[a.affine_per_group ? static_cast<I>(g) : param_index(a, i)];
    if (b != nullptr) v += b[a.affine_per_group ? static_cast<I>(g) : param_index(a, i)];
    yg[at] = v;
  }
}

// A batch norm's gw and gb for group g (written by the group's first lane) from its sums Σĝ·x̂ and
// Σĝ (taken without the weight), and the weight its gx scales by: w[g] for a per-group weight, else
// 1 (a per-feature weight is in ĝ itself; layer norm's gw and gb are summed over groups apart).
template <typename T>
__device__ __forceinline__ T group_gradients(const NormArgs& a, int64_t g, bool first_lane, T sum_g, T sum_g_x_hat,
                                             T* gw, T* gb, const T* w) {
  if (!a.affine_per_group) return T(1);
  if (first_lane && gw != nullptr) gw[g] = sum_g_x_hat;
  if (first_lane && gb != nullptr) gb[g] = sum_g;
  return w != nullptr ? w[g] : T(1);
}

// Backend::normalize_backward: a block per statistic group, as normalize_kernel; two passes (the
// sums, then gx). A per-group weight factors out of the sums (taken without it: gw and gb per
// group). Per-feature gw and gb (layer norm) sum over groups: feature_sums_kernel.
template <typename I, typename T>
__global__ void normalize_backward_kernel(NormArgs a, T* gx, T* gw, T* gb, const T* gy, const T* x, const T* mean,
                                          const T* rstd, const T* w) {
  constexpr int K = kBlockGroupThreads;
  __shared__ T shared[K / 32];
  const int lane = static_cast<int>(threadIdx.x);
  const I inner = static_cast<I>(a.inner), n = static_cast<I>(a.outer * a.inner);
  const I stride = static_cast<I>(a.groups * a.inner);
  const T* fw = w != nullptr && !a.affine_per_group ? w : nullptr;
  for (int64_t g = blockIdx.x; g < a.groups; g += gridDim.x) {
    const T* xg = x + g * a.inner;
    const T* gyg = gy + g * a.inner;
    const T m = mean[g], r = rstd[g];
    T sum_g = 0, sum_g_x_hat = 0;
    for (I j = lane; j < n; j += K) {
      const I i = j % inner, at = j / inner * stride + i;
      const T x_hat = (xg[at] - m) * r, g_hat = fw != nullptr ? gyg[at] * fw[param_index(a, i)] : gyg[at];
      sum_g += g_hat;
      sum_g_x_hat += g_hat * x_hat;
    }
    sum_g = group_all_reduce<K>(sum_g, SumOf{}, shared);
    sum_g_x_hat = group_all_reduce<K>(sum_g_x_hat, SumOf{}, shared);
    const T group_w = group_gradients(a, g, lane == 0, sum_g, sum_g_x_hat, gw, gb, w);
    if (gx == nullptr) continue;
    const T mean_g = sum_g / static_cast<T>(n) * group_w, mean_g_x_hat = sum_g_x_hat / static_cast<T>(n) * group_w;
    T* gxg = gx + g * a.inner;
    for (I j = lane; j < n; j += K) {
      const I i = j % inner, at = j / inner * stride + i;
      const T x_hat = (xg[at] - m) * r, g_hat = gyg[at] * (fw != nullptr ? fw[param_index(a, i)] : group_w);
      gxg[at] = r * (g_hat - mean_g - x_hat * mean_g_x_hat);
    }
  }
}

// normalize_backward_kernel's two passes for layer norm rows of up to 1024 features (outer == 1), a
// warp per row holding its x and gy in registers, so that memory is read once; the same arithmetic
// in the same order as those passes run by a warp (as normalize_rows_kernel is normalize_kernel's).
template <int kPerLane, typename T>
__global__ void normalize_backward_rows_kernel(NormArgs a, T* gx, T* gw, T* gb, const T* gy, const T* x, const T* mean,
                                               const T* rstd, const T* w) {
  const int rows_per_block = static_cast<int>(blockDim.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32, n = static_cast<int>(a.inner);
  const T* fw = w != nullptr && !a.affine_per_group ? w : nullptr;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / 32; g < a.groups;
       g += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const T* xg = x + g * a.inner;
    const T* gyg = gy + g * a.inner;
    T xv[kPerLane], gv[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;
      xv[k] = j < n ? xg[j] : T(0);
      gv[k] = j < n ? gyg[j] : T(0);
    }
    const T m = mean[g], r = rstd[g];
    T sum_g = 0, sum_g_x_hat = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;
      if (j >= n) continue;
      const T x_hat = (xv[k] - m) * r, g_hat = fw != nullptr ? gv[k] * fw[param_index(a, j)] : gv[k];
      sum_g += g_hat;
      sum_g_x_hat += g_hat * x_hat;
    }
    sum_g = group_all_reduce<32>(sum_g, SumOf{}, static_cast<T*>(nullptr));
    sum_g_x_hat = group_all_reduce<32>(sum_g_x_hat, SumOf{}, static_cast<T*>(nullptr));
    const T group_w = group_gradients(a, g, lane == 0, sum_g, sum_g_x_hat, gw, gb, w);
    if (gx == nullptr) continue;
    const T mean_g = sum_g / static_cast<T>(n) * group_w, mean_g_x_hat = sum_g_x_hat / static_cast<T>(n) * group_w;
    T* gxg = gx + g * a.inner;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;
      if (j >= n) continue;
      const T x_hat = (xv[k] - m) * r, g_hat = gv[k] * (fw != nullptr ? fw[param_index(a, j)] : group_w);
      gxg[j] = r * (g_hat - mean_g - x_hat * mean_g_x_hat);
    }
  }
}

// Per-feature gw = Σ gy·x̂ and gb = Σ gy over the groups (rows) of a layer norm, in two kernels so
// that the whole GPU works on it: feature_partial_sums_kernel sums each chunk of rows per feature
// (a thread per feature and chunk, adjacent threads reading adjacent features of a row) into
// partial sums, feature_sums_kernel adds a feature's chunks in order and writes the sums in the
// parameters' order (param_index; with one chunk the first kernel does). The chunks depend on the shape
// alone (feature_sum_rows_per_chunk), so the result repeats bit for bit on any GPU. One thread per feature
// over every row (1024 threads for 1024 features) ran layer_norm's forward+backward far slower than
// PyTorch on an H200 (docs/gpu.md, "2026-11-26, NVIDIA H200", run 1).
template <typename T>
__global__ void feature_partial_sums_kernel(NormArgs a, int64_t rows_per_chunk, bool sums, T* pw, T* pb, const T* gy,
                                            const T* x, const T* mean, const T* rstd) {
  const int64_t i = thread_index(), chunk = blockIdx.y;
  if (i >= a.inner) return;
  const int64_t first = chunk * rows_per_chunk, last = min(a.groups, first + rows_per_chunk);
  T sw = 0, sb = 0;
  for (int64_t g = first; g < last; ++g) {
    const int64_t at = g * a.inner + i;
    sw += gy[at] * ((x[at] - mean[g]) * rstd[g]);
    sb += gy[at];
  }
  // `sums` (one chunk): the partial sums are the sums, written in the parameters' order.
  const int64_t at = sums ? param_index(a, i) : chunk * a.inner + i;
  if (pw != nullptr) pw[at] = sw;
  if (pb != nullptr) pb[at] = sb;
}

template <typename T>
__global__ void feature_sums_kernel(NormArgs a, int64_t chunks, T* gw, T* gb, const T* pw, const T* pb) {
  for (int64_t i = thread_index(); i < a.inner; i += grid_stride()) {
    T sw = 0, sb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      sw += pw[c * a.inner + i];
      if (pb != nullptr) sb += pb[c * a.inner + i];
    }
    const int64_t at = param_index(a, i);
    if (gw != nullptr) gw[at] = sw;
    if (gb != nullptr) gb[at] = sb;
  }
}

// Rows per chunk of feature_partial_sums_kernel: at least 32 (each thread's loop long enough to
// hide its loads), at most 1024 chunks, and partial sums of at most 64 MiB.
int64_t feature_sum_rows_per_chunk(int64_t groups, int64_t inner, size_t elem_size) {
  constexpr int64_t kMinRows = 32, kMaxChunks = 1024, kMaxPartialBytes = int64_t{64} << 20;
  const int64_t max_chunks =
      std::clamp<int64_t>(kMaxPartialBytes / (2 * inner * static_cast<int64_t>(elem_size)), 1, kMaxChunks);
  return std::max(kMinRows, ceil_div(groups, max_chunks));
}

// Backend::normalize_double_backward: the formula of normalize_double_backward_typed
// (cpu_normalization.cpp; its comment derives it), a block per statistic group as
// normalize_backward_kernel. The first pass takes the seven sums over the group -- of ĝ, ĝ·x̂, A,
// A·x̂, A·ĝ, Bw·gy and Bw·gy·x̂ (A = ggx, Bw = ggw; ĝ = gy·w) -- in float64 whatever T, as the CPU's
// float32 kernel does (mean(A·gx) = r·(mean(A·ĝ) - a1·m1 - a2·m2) is a difference of them); the
// second writes dgy and dx, and a per-group dw (batch norm). A per-feature dw (layer norm) sums
// over the groups apart (double_backward_feature_partial_sums_kernel), from each group's a1 and a2,
// which this kernel writes to `coef` (two per group) where coef is not null. Until 2026-12-01 the
// CUDA backend had no such kernel and ran the formula as differentiable ops: about 45 kernels per
// normalization in a penalty's backward, where this takes one to three. Rows of up to 1024
// features, which the forward and backward give a warp each, get a whole block here too (most of
// it idle on short rows): a warp-per-row version waits for a GPU profile that asks for it.
template <typename I, typename T>
__global__ void __launch_bounds__(kBlockGroupThreads)
    normalize_double_backward_kernel(NormArgs a, T* dgy, T* dx, T* dw, T* coef, const T* ggx, const T* ggw,
                                     const T* ggb, const T* gy, const T* x, const T* mean, const T* rstd, const T* w) {
  constexpr int K = kBlockGroupThreads;
  __shared__ double shared[K / 32];
  const int lane = static_cast<int>(threadIdx.x);
  const I inner = static_cast<I>(a.inner), n = static_cast<I>(a.outer * a.inner);
  const I stride = static_cast<I>(a.groups * a.inner);
  const bool per_feature = !a.affine_per_group;
  // Per-feature operands as pointers; per-group ones (and absent ones: w 1, ggw and ggb 0) as values.
  const T* fw = per_feature ? w : nullptr;
  const T* fbw = per_feature ? ggw : nullptr;
  const T* fbb = per_feature ? ggb : nullptr;
  for (int64_t g = blockIdx.x; g < a.groups; g += gridDim.x) {
    const int64_t base = g * a.inner;
    const T* xg = x + base;
    const T* gyg = gy + base;
    const T* ggg = ggx != nullptr ? ggx + base : nullptr;
    const T m = mean[g], r = rstd[g];
    const T group_w = !per_feature && w != nullptr ? w[g] : T(1);
    const T group_bw = !per_feature && ggw != nullptr ? ggw[g] : T(0);
    const T group_bb = !per_feature && ggb != nullptr ? ggb[g] : T(0);
    double s_g = 0, s_gx = 0, s_a = 0, s_ax = 0, s_ag = 0, s_b = 0, s_bx = 0;
    for (I j = lane; j < n; j += K) {
      const I i = j % inner, at = j / inner * stride + i;
      const I p = param_index(a, i);
      const T x_hat = (xg[at] - m) * r, dy = gyg[at];
      const T g_hat = dy * (fw != nullptr ? fw[p] : group_w), gg = ggg != nullptr ? ggg[at] : T(0);
      const T b_gy = dy * (fbw != nullptr ? fbw[p] : group_bw);
      s_g += g_hat;
      s_gx += g_hat * x_hat;
      s_a += gg;
      s_ax += gg * x_hat;
      s_ag += gg * g_hat;
      s_b += b_gy;
      s_bx += b_gy * x_hat;
    }
    s_g = group_all_reduce<K>(s_g, SumOf{}, shared);
    s_gx = group_all_reduce<K>(s_gx, SumOf{}, shared);
    s_a = group_all_reduce<K>(s_a, SumOf{}, shared);
    s_ax = group_all_reduce<K>(s_ax, SumOf{}, shared);
    s_ag = group_all_reduce<K>(s_ag, SumOf{}, shared);
    s_b = group_all_reduce<K>(s_b, SumOf{}, shared);
    s_bx = group_all_reduce<K>(s_bx, SumOf{}, shared);
    const double inv_n = 1.0 / static_cast<double>(n);
    const T m1 = static_cast<T>(s_g * inv_n), m2 = static_cast<T>(s_gx * inv_n);
    const T a1 = static_cast<T>(s_a * inv_n), a2 = static_cast<T>(s_ax * inv_n);
    const T a3 = r * static_cast<T>(s_ag * inv_n - double(a1) * double(m1) - double(a2) * double(m2));
    const T r_m2 = r * m2, r_a2 = r * a2;
    const T mean_big_g = static_cast<T>((s_b - double(r_m2) * s_a - double(r_a2) * s_g) * inv_n);
    const T mean_big_g_x_hat = static_cast<T>((s_bx - double(r_m2) * s_ax - double(r_a2) * s_gx) * inv_n);
    if (lane == 0 && coef != nullptr) {
      coef[2 * g] = a1;
      coef[2 * g + 1] = a2;
    }
    double dw_sum = 0;  // a per-group dw
    for (I j = lane; j < n; j += K) {
      const I i = j % inner, at = j / inner * stride + i;
      const T x_hat = (xg[at] - m) * r, dy = gyg[at], gg = ggg != nullptr ? ggg[at] : T(0);
      const I p = param_index(a, i);
      const T wv = fw != nullptr ? fw[p] : group_w, bw = fbw != nullptr ? fbw[p] : group_bw;
      const T t = r * (gg - a1 - x_hat * a2);  // the gradient reaching ĝ
      if (dgy != nullptr) dgy[base + at] = wv * t + (fbb != nullptr ? fbb[p] : group_bb) + bw * x_hat;
      if (dx != nullptr) {
        const T big_g = bw * dy - r_m2 * gg - r_a2 * (dy * wv);  // the gradient reaching x̂
        dx[base + at] = r * (big_g - mean_big_g - x_hat * mean_big_g_x_hat) - r * x_hat * a3;
      }
      dw_sum += dy * t;
    }
    if (!per_feature && dw != nullptr) {
      dw_sum = group_all_reduce<K>(dw_sum, SumOf{}, shared);
      if (lane == 0) dw[g] = static_cast<T>(dw_sum);
    }
  }
}

// A layer norm's per-feature dw = Σ gy·t over the rows, t = r·(A - a1 - x̂·a2) with each row's a1
// and a2 from normalize_double_backward_kernel's `coef`: in chunks of rows as
// feature_partial_sums_kernel (one sum a feature, in pw), added by feature_sums_kernel (its gb
// and pb null); with `sums` (one chunk) pw is dw itself, written in the parameters' order.
template <typename T>
__global__ void double_backward_feature_partial_sums_kernel(NormArgs a, int64_t rows_per_chunk, bool sums, T* pw,
                                                            const T* coef, const T* ggx, const T* gy, const T* x,
                                                            const T* mean, const T* rstd) {
  const int64_t i = thread_index(), chunk = blockIdx.y;
  if (i >= a.inner) return;
  const int64_t first = chunk * rows_per_chunk, last = min(a.groups, first + rows_per_chunk);
  T sw = 0;
  for (int64_t g = first; g < last; ++g) {
    const int64_t at = g * a.inner + i;
    const T r = rstd[g], x_hat = (x[at] - mean[g]) * r, gg = ggx != nullptr ? ggx[at] : T(0);
    sw += gy[at] * (r * (gg - coef[2 * g] - x_hat * coef[2 * g + 1]));
  }
  pw[sums ? param_index(a, i) : chunk * a.inner + i] = sw;
}

}  // namespace

void CudaBackend::normalize(const NormArgs& args, const View& y, const View& mean, const View& var, const View& rstd,
                            const View& x, const View& weight, const View& bias, const RunningStats& running) {
  const auto gate_pass = activate();
  EF_ASSERT(
      x.is_contiguous() && y.is_contiguous() && mean.is_contiguous() && var.is_contiguous() && rstd.is_contiguous(),
      "normalize: expects contiguous views");
  if (args.groups == 0 || args.outer * args.inner == 0) return;
  EF_DISPATCH_FLOAT(x.dtype, "normalize", [&] {
    auto* yp = static_cast<scalar_t*>(y.data);
    auto* mp = static_cast<scalar_t*>(mean.data);
    auto* vp = static_cast<scalar_t*>(var.data);
    auto* rp = static_cast<scalar_t*>(rstd.data);
    const auto* xp = static_cast<const scalar_t*>(x.data);
    const auto* wp = static_cast<const scalar_t*>(weight.data);
    const auto* bp = static_cast<const scalar_t*>(bias.data);
    for (const View* stat : {&running.mean, &running.var}) {
      EF_ASSERT(
          stat->data == nullptr || (stat->is_contiguous() && stat->dtype == x.dtype && stat->numel() == args.groups),
          "normalize: running statistics are contiguous [groups] views of the input's dtype");
    }
    const RunningUpdate<scalar_t> run{static_cast<scalar_t*>(running.mean.data),
                                      static_cast<scalar_t*>(running.var.data), static_cast<scalar_t>(running.keep),
                                      static_cast<scalar_t>(running.mean_weight),
                                      static_cast<scalar_t>(running.var_weight)};
    const int64_t n = args.outer * args.inner, chunk = statistic_chunk(n), chunks = ceil_div(n, chunk);
    if (chunks > 2 && args.groups <= INT32_MAX) {  // Note [Group statistics in chunks]
      // The scratch buffer stays ours while the library lock is held (Note [Library handles and
      // threads]); the kernels queued under it run before any later user's.
      const Lock lock = lock_libraries();
      const size_t partial_bytes = static_cast<size_t>(2 * chunks * args.groups) * sizeof(scalar_t);
      auto* chunk_mean = static_cast<scalar_t*>(scratch(lock, partial_bytes));
      EF_CHECK(chunk_mean != nullptr, "normalization: out of memory on ", name(), " for ", partial_bytes,
               " bytes of partial statistics");
      scalar_t* chunk_m2 = chunk_mean + chunks * args.groups;
      const dim3 grid(static_cast<unsigned>(args.groups), static_cast<unsigned>(chunks));
      with_index_type(x.numel() + args.groups * args.inner, [&](auto index) {
        using I = decltype(index);
        chunk_moments_kernel<I, scalar_t>
            <<<grid, kBlockGroupThreads, 0, stream_>>>(args, static_cast<I>(chunk), chunk_mean, chunk_m2, xp);
        EF_CUDA_CHECK_LAUNCH();
        normalize_chunks_kernel<I, scalar_t><<<grid, kBlockGroupThreads, 0, stream_>>>(
            args, static_cast<I>(chunk), chunk_mean, chunk_m2, yp, mp, vp, rp, run, xp, wp, bp);
      });
      EF_CUDA_CHECK_LAUNCH();
      return;
    }
    if (args.outer == 1 && args.inner <= 1024) {
      const int grid = static_cast<int>(std::min<int64_t>(ceil_div(args.groups, kHeldRowsPerBlock), INT32_MAX));
      with_values_per_lane(args.inner, [&](auto per_lane) {
        normalize_rows_kernel<decltype(per_lane)::value, scalar_t>
            <<<grid, 32 * kHeldRowsPerBlock, 0, stream_>>>(args, yp, mp, vp, rp, run, xp, wp, bp);
      });
    } else {
      // Offsets reach outer * groups * inner, plus one stride of the loop.
      with_index_type(x.numel() + args.groups * args.inner, [&](auto index) {
        using I = decltype(index);
        const int grid = static_cast<int>(std::min<int64_t>(args.groups, INT32_MAX));
        normalize_kernel<I, scalar_t><<<grid, kBlockGroupThreads, 0, stream_>>>(args, yp, mp, vp, rp, run, xp, wp, bp);
      });
    }
    EF_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::normalize_backward(const NormArgs& args, const View& gx, const View& gw, const View& gb,
                                     const View& gy, const View& x, const View& mean, const View& rstd,
                                     const View& weight) {
  const auto gate_pass = activate();
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
      if (args.outer == 1 && args.inner <= 1024) {
        const int grid = static_cast<int>(std::min<int64_t>(ceil_div(args.groups, kHeldRowsPerBlock), INT32_MAX));
        with_values_per_lane(args.inner, [&](auto per_lane) {
          normalize_backward_rows_kernel<decltype(per_lane)::value, T>
              <<<grid, 32 * kHeldRowsPerBlock, 0, stream_>>>(args, gxp, group_gw, group_gb, gyp, xp, mp, rp, wp);
        });
      } else {
        with_index_type(x.numel() + args.groups * args.inner, [&](auto index) {
          using I = decltype(index);
          const int grid = static_cast<int>(std::min<int64_t>(args.groups, INT32_MAX));
          normalize_backward_kernel<I, T>
              <<<grid, kBlockGroupThreads, 0, stream_>>>(args, gxp, group_gw, group_gb, gyp, xp, mp, rp, wp);
        });
      }
      EF_CUDA_CHECK_LAUNCH();
    }
    if (!args.affine_per_group && (gwp != nullptr || gbp != nullptr)) {
      EF_ASSERT(args.outer == 1, "normalize_backward: per-feature weights need outer == 1");
      const int64_t rows_per_chunk = feature_sum_rows_per_chunk(args.groups, args.inner, sizeof(T));
      const int64_t chunks = ceil_div(args.groups, rows_per_chunk);
      const dim3 grid(static_cast<unsigned>(ceil_div(args.inner, kThreads)), static_cast<unsigned>(chunks));
      if (chunks == 1) {  // the partial sums are the sums
        feature_partial_sums_kernel<T>
            <<<grid, kThreads, 0, stream_>>>(args, rows_per_chunk, true, gwp, gbp, gyp, xp, mp, rp);
        EF_CUDA_CHECK_LAUNCH();
        return;
      }
      // The scratch buffer stays ours while the library lock is held (Note [Library handles and
      // threads]); the kernels queued under it run before any later user's.
      const Lock lock = lock_libraries();
      auto* partial = static_cast<T*>(scratch(lock, static_cast<size_t>(2 * chunks * args.inner) * sizeof(T)));
      EF_CHECK(partial != nullptr, "layer_norm backward: out of memory on ", name(), " for ",
               2 * chunks * args.inner * static_cast<int64_t>(sizeof(T)), " bytes of partial sums");
      T* partial_b = partial + chunks * args.inner;
      feature_partial_sums_kernel<T>
          <<<grid, kThreads, 0, stream_>>>(args, rows_per_chunk, false, partial, partial_b, gyp, xp, mp, rp);
      EF_CUDA_CHECK_LAUNCH();
      feature_sums_kernel<T>
          <<<grid_for(*this, args.inner), kThreads, 0, stream_>>>(args, chunks, gwp, gbp, partial, partial_b);
      EF_CUDA_CHECK_LAUNCH();
    }
  });
}

bool CudaBackend::normalize_double_backward(const NormArgs& args, const View& dgy, const View& dx, const View& dw,
                                            const View& ggx, const View& ggw, const View& ggb, const View& gy,
                                            const View& x, const View& mean, const View& rstd, const View& weight) {
  const auto gate_pass = activate();
  EF_ASSERT(x.is_contiguous() && gy.is_contiguous() && mean.is_contiguous() && rstd.is_contiguous(),
            "normalize_double_backward: expects contiguous views");
  EF_DISPATCH_FLOAT(x.dtype, "normalize_double_backward", [&] {
    using T = scalar_t;
    auto* dgyp = static_cast<T*>(dgy.data);
    auto* dxp = static_cast<T*>(dx.data);
    auto* dwp = static_cast<T*>(dw.data);
    const auto* ggxp = static_cast<const T*>(ggx.data);
    const auto* ggwp = static_cast<const T*>(ggw.data);
    const auto* ggbp = static_cast<const T*>(ggb.data);
    const auto* gyp = static_cast<const T*>(gy.data);
    const auto* xp = static_cast<const T*>(x.data);
    const auto* mp = static_cast<const T*>(mean.data);
    const auto* rp = static_cast<const T*>(rstd.data);
    const auto* wp = static_cast<const T*>(weight.data);
    if (args.groups == 0 || args.outer * args.inner == 0) {  // dw sums nothing
      if (dwp != nullptr) EF_CUDA_CHECK(cudaMemsetAsync(dwp, 0, dw.numel() * sizeof(T), stream_));
      return;
    }
    const bool feature_dw = !args.affine_per_group && dwp != nullptr;
    EF_ASSERT(!feature_dw || args.outer == 1, "normalize_double_backward: per-feature weights need outer == 1");
    // A per-feature dw needs each group's a1 and a2, and with more than one chunk of rows the partial
    // sums: in the scratch buffer, which stays ours while the library lock is held (Note [Library
    // handles and threads]); the kernels queued under it run before any later user's.
    Lock lock;
    T* coef = nullptr;
    T* partial = nullptr;
    int64_t rows_per_chunk = 0, chunks = 0;
    if (feature_dw) {
      rows_per_chunk = feature_sum_rows_per_chunk(args.groups, args.inner, sizeof(T));
      chunks = ceil_div(args.groups, rows_per_chunk);
      const int64_t elements = 2 * args.groups + (chunks > 1 ? chunks * args.inner : 0);
      lock = lock_libraries();
      coef = static_cast<T*>(scratch(lock, static_cast<size_t>(elements) * sizeof(T)));
      EF_CHECK(coef != nullptr, "normalization double backward: out of memory on ", name(), " for ",
               elements * static_cast<int64_t>(sizeof(T)), " bytes of group coefficients and partial sums");
      if (chunks > 1) partial = coef + 2 * args.groups;
    }
    with_index_type(x.numel() + args.groups * args.inner, [&](auto index) {
      using I = decltype(index);
      const int grid = static_cast<int>(std::min<int64_t>(args.groups, INT32_MAX));
      normalize_double_backward_kernel<I, T><<<grid, kBlockGroupThreads, 0, stream_>>>(
          args, dgyp, dxp, feature_dw ? nullptr : dwp, coef, ggxp, ggwp, ggbp, gyp, xp, mp, rp, wp);
    });
    EF_CUDA_CHECK_LAUNCH();
    if (!feature_dw) return;
    const dim3 grid(static_cast<unsigned>(ceil_div(args.inner, kThreads)), static_cast<unsigned>(chunks));
    double_backward_feature_partial_sums_kernel<T><<<grid, kThreads, 0, stream_>>>(
        args, rows_per_chunk, chunks == 1, chunks == 1 ? dwp : partial, coef, ggxp, gyp, xp, mp, rp);
    EF_CUDA_CHECK_LAUNCH();
    if (chunks == 1) return;  // the partial sums are the sums
    feature_sums_kernel<T>
        <<<grid_for(*this, args.inner), kThreads, 0, stream_>>>(args, chunks, dwp, nullptr, partial, nullptr);
    EF_CUDA_CHECK_LAUNCH();
  });
  return true;
}

}  // namespace evenflow::cuda_backend
