// Internal to the CPU backend: what its oneDNN kernels (onednn_conv.cpp, onednn_matmul.cpp) share.
// A plan is one oneDNN primitive, created once for a problem and kept, with the reorders that
// carry its two inputs from our layouts into the ones it runs on and its output back. Plans run
// on the calling thread's OpenMP team, in this thread's workspace (thread_workspace in cpu_conv.h),
// which holds the scratchpad of the primitive and its reorders and the reordered operands
// (Note [oneDNN convolution] in onednn_conv.cpp: why a user scratchpad, a stream per thread).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "evenflow/engine/cpu/isa.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

// The CPU engine every plan is made for.
const dnnl::engine& onednn_engine();

// One operand of a plan: our layout, the primitive's, and the reorder between them (ours -> the
// primitive's for inputs, back for the output; empty when they agree).
struct OnednnOperand {
  int arg = 0;  // DNNL_ARG_*
  dnnl::memory::desc plain, used;
  dnnl::reorder reorder;
  size_t offset = 0;  // of the reordered copy in the workspace
};

struct OnednnPlan {
  dnnl::primitive primitive;
  OnednnOperand in0, in1, out;
  dnnl::memory::desc bias;     // optional, passed as it is (DNNL_ARG_BIAS)
  dnnl::memory::desc scratch;  // bytes, the largest scratchpad of the primitive and its reorders
  size_t workspace_bytes = 0;  // the scratchpad at offset 0, then the reordered operands
};

// The plans made so far, by a key of N integers that tell one problem from another (the team size
// among them). A caller sets the team size (set_team_size) before asking for a plan: oneDNN sizes a
// primitive's threading for the team of the thread that makes it (brgemm's matmul keeps that count
// for every run), which is not always the team the plan is for (kernel_threads() is 1 off the
// devices' workers, whatever OpenMP's setting). A plan is never
// removed, so references to it stay valid, and it is only read after it is made, so threads may run
// one at once.
template <size_t N>
class OnednnPlanCache {
 public:
  using Key = std::array<int64_t, N>;

  // The plan of `key`, made by make() the first time.
  template <typename Make>
  const OnednnPlan& get(const Key& key, Make make) {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<OnednnPlan>& plan = plans_[key];
    if (!plan) plan = std::make_unique<OnednnPlan>(make());
    return *plan;
  }

 private:
  struct Hash {
    size_t operator()(const Key& k) const {
      size_t h = 0;
      for (int64_t v : k) h = h * 1000003u ^ std::hash<int64_t>{}(v);
      return h;
    }
  };
  std::mutex mutex_;
  std::unordered_map<Key, std::unique_ptr<OnednnPlan>, Hash> plans_;
};

// Completes a plan whose primitive, operands (arg, plain, used) and bias are set: the reorders
// (made with `attr`, which must ask for a user scratchpad) and the workspace's layout.
void finish_plan(OnednnPlan& plan, const dnnl::memory::desc& primitive_scratch, const dnnl::primitive_attr& attr);

// Runs a plan with `threads` OpenMP threads: reorders the inputs, runs the primitive (adding
// `bias` where the plan has one), reorders the output into `out`, and waits. Throws dnnl::error.
void execute_plan(const OnednnPlan& plan, int threads, const void* in0, const void* in1, void* out,
                  const void* bias = nullptr);

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
