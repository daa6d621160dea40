// Small helpers shared by the test suites.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "evenflow/engine/ops.h"

namespace evenflow::testing {

inline std::vector<double> vals(const Tensor& t) {
  return t.to_vector();
}

// The message of the ef::Error that f throws, or "(no error)".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Sets the CUDA math settings for a scope (Note [CUDA math settings] in engine/device.h).
class CudaMathGuard {
 public:
  explicit CudaMathGuard(const CudaMath& m) : saved_(cuda_math()) { set_cuda_math(m); }
  ~CudaMathGuard() { set_cuda_math(saved_); }
  CudaMathGuard(const CudaMathGuard&) = delete;
  CudaMathGuard& operator=(const CudaMathGuard&) = delete;

 private:
  CudaMath saved_;
};

// True when at least `needed` CUDA (logical) devices are visible. Otherwise the calling test is
// skipped, saying why -- or fails when EF_REQUIRE_CUDA=1 (scripts/gpu_check.sh sets it), so that a
// GPU run cannot pass with its CUDA tests skipped. EF_CUDA_DEVICES=0,0 gives one GPU two devices.
inline bool cuda_required() {
  const char* require = std::getenv("EF_REQUIRE_CUDA");
  return require != nullptr && std::string(require) == "1";
}

// Marks the calling test skipped, saying why (the caller then returns): CTest reports a test whose
// output holds "TEST SKIPPED:" as skipped, not passed (tests/CMakeLists.txt), so the totals count
// what ran. For a test that cannot run at all here; a test that checks less here says so otherwise.
#define EF_SKIP_TEST(why) MESSAGE("TEST SKIPPED: " << why)

// Skips the calling test, saying why -- or fails it under EF_REQUIRE_CUDA=1: a GPU run must not
// pass with part of its CUDA checks skipped.
#define EF_SKIP_CUDA_TEST(why)                                                        \
  do {                                                                                \
    if (::evenflow::testing::cuda_required()) FAIL("EF_REQUIRE_CUDA=1, but " << why); \
    EF_SKIP_TEST(why);                                                                \
  } while (0)

inline bool cuda_devices_available(int needed = 1) {
  const int have = cuda_device_count();
  if (have >= needed) return true;
  std::string why = "this test needs " + std::to_string(needed) +
                    " CUDA device(s) (EF_CUDA_DEVICES=0,0 makes two of one GPU), " + std::to_string(have) + " visible";
  if (have == 0) why += ": " + cuda_unavailable_reason();
  EF_SKIP_CUDA_TEST(why);
  return false;
}

// Note [Gradient layout] (engine/autograd.cpp) for named tensors: "" when every defined .grad() is
// contiguous and shares storage with no other tensor's gradient nor with the tensors themselves;
// otherwise what is wrong, naming the tensor.
inline std::string gradient_layout_problem(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::set<const Storage*> seen;
  for (const auto& [name, t] : named) seen.insert(t.storage().get());
  for (const auto& [name, t] : named) {
    const Tensor g = t.grad();
    if (!g.defined()) continue;
    if (!g.is_contiguous()) return "the gradient of '" + name + "' is not contiguous";
    if (!seen.insert(g.storage().get()).second)
      return "the gradient of '" + name + "' shares its storage with another tensor or gradient";
  }
  return "";
}

}  // namespace evenflow::testing
