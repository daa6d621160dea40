// The CPU backend's indexing kernels: gather, scatter_add, index_select, index_add and
// check_index_range. Indices are checked before any parallel loop: an exception must not leave an
// OpenMP region.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>

#include "evenflow/engine/cpu/cpu_internal.h"
#include "evenflow/engine/error.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

// The first element of idx[0, n) outside [0, size) and other than `allowed`, if any. The common
// case, none, takes one parallel pass.
std::optional<int64_t> first_out_of_range(const int64_t* idx, int64_t n, int64_t size,
                                          std::optional<int64_t> allowed = std::nullopt) {
  const auto bad = [&](int64_t v) { return (v < 0 || v >= size) && v != allowed; };
  int64_t count = 0;
  [[maybe_unused]] const int nt = threads_for(n);
#pragma omp parallel for num_threads(nt) if (nt > 1) reduction(+ : count)
  for (int64_t i = 0; i < n; ++i) count += bad(idx[i]);
  if (count == 0) return std::nullopt;
  return *std::find_if(idx, idx + n, bad);
}

void check_indices(const char* op, const int64_t* idx, int64_t n, int dim, int64_t size) {
  const std::optional<int64_t> bad = first_out_of_range(idx, n, size);
  EF_CHECK(!bad, op, ": index ", *bad, " is out of range for dim ", dim, " of size ", size, " (valid range [0, ",
           size - 1, "])");
}

// The 1-D index of index_select / index_add as an index view shaped like `like`: stride 1 along
// dim, 0 elsewhere. Both kernels then run as gather / scatter_add.
View broadcast_index(const View& index, const View& like, int dim) {
  View v = like;
  v.data = index.data;
  v.dtype = DType::Int64;
  for (int d = 0; d < v.ndim; ++d) v.strides[d] = d == dim ? index.strides[0] : 0;
  return v;
}

// out[i..., j, k...] = x[i..., index[i..., j, k...], k...] along dim; index shaped like out.
void gather_impl(const char* op, const View& out, const View& x, int dim, const View& index) {
  EF_ASSERT(index.dtype == DType::Int64 && out.dtype == x.dtype, op, ": bad dtypes");
  View xb = x;
  for (int d = 0; d < x.ndim; ++d) xb.shape[d] = out.shape[d];
  xb.strides[dim] = 0;  // the row's base; the index supplies the position along dim
  const int64_t xs = x.strides[dim];
  EF_DISPATCH_ALL(out.dtype, op, [&] {
    const StridedIter<3> it = make_iter(std::array<View, 3>{out, index, xb});
    for_each_row(it, [xs](char* const* p, const int64_t* s, int64_t n) {
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = *reinterpret_cast<const int64_t*>(p[1] + k * s[1]);
        *reinterpret_cast<scalar_t*>(p[0] + k * s[0]) = reinterpret_cast<const scalar_t*>(p[2] + k * s[2])[i * xs];
      }
    });
  });
}

// out[i..., index[i..., j, k...], k...] += src[i..., j, k...] along dim; index shaped like src.
// Dim is made the innermost and rows are never split between threads: two src elements can only
// hit the same output when they lie in the same row, so no two threads write one output.
void scatter_add_impl(const char* op, const View& out, int dim, const View& index, const View& src) {
  EF_ASSERT(index.dtype == DType::Int64 && out.dtype == src.dtype, op, ": bad dtypes");
  View ob = out;
  for (int d = 0; d < src.ndim; ++d) ob.shape[d] = src.shape[d];
  ob.strides[dim] = 0;
  const int64_t os = out.strides[dim];
  std::array<View, 3> views{src, index, ob};
  for (View& v : views) {
    std::rotate(v.shape + dim, v.shape + dim + 1, v.shape + v.ndim);
    std::rotate(v.strides + dim, v.strides + dim + 1, v.strides + v.ndim);
  }
  EF_DISPATCH_ALL(out.dtype, op, [&] {
    const StridedIter<3> it = make_iter(views);
    for_each_row(
        it,
        [os](char* const* p, const int64_t* s, int64_t n) {
          for (int64_t k = 0; k < n; ++k) {
            const int64_t i = *reinterpret_cast<const int64_t*>(p[1] + k * s[1]);
            reinterpret_cast<scalar_t*>(p[2] + k * s[2])[i * os] += *reinterpret_cast<const scalar_t*>(p[0] + k * s[0]);
          }
        },
        /*whole_rows=*/true);
  });
}

}  // namespace

void CpuBackend::check_index_range(const View& index, int64_t size, int64_t allowed,
                                   std::function<std::string(int64_t)> describe) {
  EF_ASSERT(index.is_contiguous() && index.dtype == DType::Int64, "check_index_range: expects contiguous int64");
  const std::optional<int64_t> bad =
      first_out_of_range(static_cast<const int64_t*>(index.data), index.numel(), size, allowed);
  EF_CHECK(!bad, describe(*bad));
}

void CpuBackend::gather(const View& out, const View& x, int dim, const View& index) {
  EF_ASSERT(index.is_contiguous(), "gather: index must be contiguous");
  check_indices("gather", static_cast<const int64_t*>(index.data), index.numel(), dim, x.shape[dim]);
  gather_impl("gather", out, x, dim, index);
}

void CpuBackend::scatter_add(const View& out, int dim, const View& index, const View& src) {
  EF_ASSERT(index.is_contiguous(), "scatter_add: index must be contiguous");
  check_indices("scatter_add", static_cast<const int64_t*>(index.data), index.numel(), dim, out.shape[dim]);
  scatter_add_impl("scatter_add", out, dim, index, src);
}

void CpuBackend::index_select(const View& out, const View& x, int dim, const View& index) {
  EF_ASSERT(index.ndim == 1 && index.is_contiguous(), "index_select: index must be contiguous 1-D");
  check_indices("index_select", static_cast<const int64_t*>(index.data), index.numel(), dim, x.shape[dim]);
  gather_impl("index_select", out, x, dim, broadcast_index(index, out, dim));
}

void CpuBackend::index_add(const View& out, int dim, const View& index, const View& src) {
  EF_ASSERT(index.ndim == 1 && index.is_contiguous(), "index_add: index must be contiguous 1-D");
  check_indices("index_add", static_cast<const int64_t*>(index.data), index.numel(), dim, out.shape[dim]);
  scatter_add_impl("index_add", out, dim, broadcast_index(index, src, dim), src);
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
