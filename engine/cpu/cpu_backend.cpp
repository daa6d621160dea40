// The CPU backend (see backend.h): memory and copies here, and the forwarding of GEMM and
// convolution to cpu_gemm.cpp and cpu_conv.cpp (cpu_conv.h). The other kernels are OpenMP loops over
// strided views, in one file per family (cpu_elementwise.cpp, cpu_unary.cpp, cpu_reduce.cpp,
// cpu_normalization.cpp, cpu_pooling.cpp, cpu_indexing.cpp, cpu_adam.cpp; the CpuBackend class and
// what they share are in cpu_internal.h). Every kernel that walks views goes through one
// strided-iteration helper (Note [Strided iteration]); the scalar math comes from scalar_ops.h,
// shared with the CUDA backend.
#include "evenflow/engine/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "evenflow/engine/cpu/cpu_conv.h"
#include "evenflow/engine/cpu/cpu_internal.h"
#if EF_ONEDNN
#include "evenflow/engine/cpu/onednn_conv.h"
#include "evenflow/engine/cpu/onednn_matmul.h"
#endif

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

// Bytes of physical memory (half the address space when the system does not say).
size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return std::numeric_limits<size_t>::max() / 2;
  return static_cast<size_t>(pages) * static_cast<size_t>(page_size);
}

}  // namespace

void* CpuBackend::raw_alloc(size_t nbytes) {
  // More than the machine's memory is refused up front: such a request can only fail or thrash,
  // and sanitizer allocators abort on absurd sizes instead of returning nullptr.
  static const size_t physical = physical_memory();
  if (nbytes > physical) return nullptr;
  // aligned_alloc wants a multiple of the alignment.
  constexpr size_t kAlign = 64;
  const size_t rounded = std::max(kAlign, (nbytes + kAlign - 1) / kAlign * kAlign);
  return std::aligned_alloc(kAlign, rounded);
}

void CpuBackend::raw_free(void* ptr) {
  std::free(ptr);
}

void CpuBackend::copy_from_host(void* dst, const void* src, size_t nbytes) {
  if (nbytes > 0) std::memcpy(dst, src, nbytes);
}

void CpuBackend::copy_to_host(void* dst, const void* src, size_t nbytes) {
  if (nbytes > 0) std::memcpy(dst, src, nbytes);
}

std::function<void()> CpuBackend::copy_to_host_later(void* dst, const void* src, size_t nbytes) {
  copy_to_host(dst, src, nbytes);
  return [] {};
}

void CpuBackend::synchronize() {}

void CpuBackend::gemm(const GemmArgs& args) {
  cpu_backend::gemm(args);
}

bool CpuBackend::bf16_gemm(const GemmArgs& args) const {
#if EF_ONEDNN
  return onednn_takes_bf16_gemm(args);
#else
  (void)args;
  return false;
#endif
}

void CpuBackend::conv2d(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias) {
  conv2d_forward(args, y, x, w, bias);
}

void CpuBackend::conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) {
  cpu_backend::conv2d_input_grad(args, gx, gy, w);
}

void CpuBackend::conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) {
  cpu_backend::conv2d_weight_grad(args, gw, x, gy);
}

bool CpuBackend::bf16_conv(const ConvArgs& args, ConvPass pass) {
#if EF_ONEDNN
  return onednn_takes_bf16(args, pass);
#else
  (void)args;
  (void)pass;
  return false;
#endif
}

bool CpuBackend::channels_last_conv(const ConvArgs& args, ConvPass pass, DType dtype) {
  return conv_takes_channels_last(args, pass, dtype);
}

std::unique_ptr<Backend> make_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
