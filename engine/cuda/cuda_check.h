// Error checks for the CUDA runtime and the libraries on it (cuBLAS, cuDNN, NCCL): one pair of
// macros for all of them. Each evaluates its argument once, keeps the statement's text and, on a
// failure, throws ef::Error with the library's message, e.g.
//   CUDA error 'out of memory' (2) at cudaMemcpyAsync(dst, src, n, kind, s) in engine/cuda/x.cu:42
// EF_CUDA_CHECK_PRINT only prints to stderr: it is for destructors, which must not throw.
// EF_CUDA_CHECK_LAUNCH() follows every kernel launch (launch errors are reported by
// cudaGetLastError, not by the launch itself). A library joins by specializing StatusTraits for
// its status type (parallel/nccl_internal.h does for NCCL).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>

#include "evenflow/engine/error.h"

namespace evenflow::cuda_backend::detail {

// What the checks need of a library's status type.
template <typename Status>
struct StatusTraits;

template <>
struct StatusTraits<cudaError_t> {
  static constexpr const char* kLibrary = "CUDA";
  static bool ok(cudaError_t s) { return s == cudaSuccess; }
  static const char* message(cudaError_t s) { return cudaGetErrorString(s); }
  // A non-sticky error stays recorded until read: clear it, so that the next check does not report it.
  static void clear() { (void)cudaGetLastError(); }
  // At process exit the runtime may go before our last destructor: nothing is left to release.
  static bool ignorable(cudaError_t s) { return s == cudaErrorCudartUnloading; }
};

template <>
struct StatusTraits<cublasStatus_t> {
  static constexpr const char* kLibrary = "cuBLAS";
  static bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
  static const char* message(cublasStatus_t s) { return cublasGetStatusString(s); }
  static void clear() {}
  static bool ignorable(cublasStatus_t) { return false; }
};

template <>
struct StatusTraits<cudnnStatus_t> {
  static constexpr const char* kLibrary = "cuDNN";
  static bool ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
  static const char* message(cudnnStatus_t s) { return cudnnGetErrorString(s); }
  static void clear() {}
  static bool ignorable(cudnnStatus_t) { return false; }
};

template <typename Status>
void check_status(Status s, const char* statement, const char* file, int line) {
  using T = StatusTraits<Status>;
  if (T::ok(s)) return;
  T::clear();
  ::evenflow::detail::throw_error(::evenflow::detail::str_cat(T::kLibrary, " error '", T::message(s), "' (",
                                                              static_cast<long>(s), ") at ", statement, " in ", file,
                                                              ":", line));
}

template <typename Status>
void print_status(Status s, const char* statement, const char* file, int line) {
  using T = StatusTraits<Status>;
  if (T::ok(s) || T::ignorable(s)) return;
  T::clear();
  std::fprintf(stderr, "evenflow: %s error '%s' (%ld) at %s in %s:%d (ignored)\n", T::kLibrary, T::message(s),
               static_cast<long>(s), statement, file, line);
}

}  // namespace evenflow::cuda_backend::detail

#define EF_CUDA_CHECK(stmt) ::evenflow::cuda_backend::detail::check_status((stmt), #stmt, __FILE__, __LINE__)
#define EF_CUDA_CHECK_PRINT(stmt) ::evenflow::cuda_backend::detail::print_status((stmt), #stmt, __FILE__, __LINE__)
// After every kernel launch: a bad configuration or missing kernel image shows up here.
#define EF_CUDA_CHECK_LAUNCH() EF_CUDA_CHECK(cudaGetLastError())
