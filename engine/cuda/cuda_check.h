// Error checks for the CUDA runtime, cuBLAS and cuDNN. Each macro evaluates its argument once,
// keeps the statement's text and throws ef::Error with the library's message, e.g.
//   CUDA error 'out of memory' (2) at cudaMemcpyAsync(dst, src, n, kind, s) in engine/cuda/x.cu:42
// The *_CHECK_PRINT variants only print to stderr: they are for destructors, which must not throw.
// EF_CUDA_CHECK_LAUNCH() follows every kernel launch (launch errors are reported by
// cudaGetLastError, not by the launch itself).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>

#include "evenflow/engine/error.h"

namespace evenflow::cuda_backend::detail {

[[noreturn]] inline void throw_library_error(const char* library, const char* message, long code, const char* statement,
                                             const char* file, int line) {
  ::evenflow::detail::throw_error(::evenflow::detail::str_cat(library, " error '", message, "' (", code, ") at ",
                                                              statement, " in ", file, ":", line));
}

inline void print_library_error(const char* library, const char* message, long code, const char* statement,
                                const char* file, int line) {
  std::fprintf(stderr, "evenflow: %s error '%s' (%ld) at %s in %s:%d (ignored)\n", library, message, code, statement,
               file, line);
}

}  // namespace evenflow::cuda_backend::detail

#define CUDA_CHECK(stmt)                                                                                         \
  do {                                                                                                           \
    const cudaError_t ef_cuda_err_ = (stmt);                                                                     \
    if (ef_cuda_err_ != cudaSuccess) {                                                                           \
      (void)cudaGetLastError(); /* clear a non-sticky error so the next call does not report it again */         \
      ::evenflow::cuda_backend::detail::throw_library_error(                                                     \
          "CUDA", cudaGetErrorString(ef_cuda_err_), static_cast<long>(ef_cuda_err_), #stmt, __FILE__, __LINE__); \
    }                                                                                                            \
  } while (0)

// Ignores cudaErrorCudartUnloading: at process exit the runtime may go before our last destructor,
// and then there is nothing left to release.
#define CUDA_CHECK_PRINT(stmt)                                                                                   \
  do {                                                                                                           \
    const cudaError_t ef_cuda_err_ = (stmt);                                                                     \
    if (ef_cuda_err_ != cudaSuccess && ef_cuda_err_ != cudaErrorCudartUnloading) {                               \
      (void)cudaGetLastError();                                                                                  \
      ::evenflow::cuda_backend::detail::print_library_error(                                                     \
          "CUDA", cudaGetErrorString(ef_cuda_err_), static_cast<long>(ef_cuda_err_), #stmt, __FILE__, __LINE__); \
    }                                                                                                            \
  } while (0)

#define CUBLAS_CHECK(stmt)                                                                                     \
  do {                                                                                                         \
    const cublasStatus_t ef_cublas_st_ = (stmt);                                                               \
    if (ef_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                                              \
      ::evenflow::cuda_backend::detail::throw_library_error("cuBLAS", cublasGetStatusString(ef_cublas_st_),    \
                                                            static_cast<long>(ef_cublas_st_), #stmt, __FILE__, \
                                                            __LINE__);                                         \
    }                                                                                                          \
  } while (0)

#define CUBLAS_CHECK_PRINT(stmt)                                                                               \
  do {                                                                                                         \
    const cublasStatus_t ef_cublas_st_ = (stmt);                                                               \
    if (ef_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                                              \
      ::evenflow::cuda_backend::detail::print_library_error("cuBLAS", cublasGetStatusString(ef_cublas_st_),    \
                                                            static_cast<long>(ef_cublas_st_), #stmt, __FILE__, \
                                                            __LINE__);                                         \
    }                                                                                                          \
  } while (0)

#define CUDNN_CHECK(stmt)                                                                                          \
  do {                                                                                                             \
    const cudnnStatus_t ef_cudnn_st_ = (stmt);                                                                     \
    if (ef_cudnn_st_ != CUDNN_STATUS_SUCCESS) {                                                                    \
      ::evenflow::cuda_backend::detail::throw_library_error(                                                       \
          "cuDNN", cudnnGetErrorString(ef_cudnn_st_), static_cast<long>(ef_cudnn_st_), #stmt, __FILE__, __LINE__); \
    }                                                                                                              \
  } while (0)

#define CUDNN_CHECK_PRINT(stmt)                                                                                    \
  do {                                                                                                             \
    const cudnnStatus_t ef_cudnn_st_ = (stmt);                                                                     \
    if (ef_cudnn_st_ != CUDNN_STATUS_SUCCESS) {                                                                    \
      ::evenflow::cuda_backend::detail::print_library_error(                                                       \
          "cuDNN", cudnnGetErrorString(ef_cudnn_st_), static_cast<long>(ef_cudnn_st_), #stmt, __FILE__, __LINE__); \
    }                                                                                                              \
  } while (0)

// After every kernel launch: a bad configuration or missing kernel image shows up here.
#define EF_CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
