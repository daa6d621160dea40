// The CPU backend's fused multi-tensor Adam / AdamW step (AdamArgs): one pass over the four tensors
// instead of ten kernels and five temporaries, a large share of classify's step on its 3.2M-parameter
// layer (docs/benchmarks.md, "Where the time goes").
#include <algorithm>
#include <cstdint>
#include <vector>

#include "evenflow/engine/cpu/cpu_internal.h"
#include "evenflow/engine/cpu/threads.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {

namespace {

// One thread's share of the Adam step. The scalars are a by-value copy and the arrays do not
// overlap, so the loops vectorize: inside the OpenMP region GCC reloaded the scalars from memory
// each element (the stores might change them) and ran the step one element at a time. Two loops,
// so that the common one has no amsgrad test.
template <typename T>
void adam_range(const scalar::AdamScalars<T> s, int64_t n, T* __restrict p, const T* __restrict grad, T* __restrict m,
                T* __restrict v, T* __restrict v_max) {
  if (v_max != nullptr) {
    for (int64_t i = 0; i < n; ++i) scalar::adam_element(s, p[i], grad[i], m[i], v[i], v_max + i);
  } else {
    for (int64_t i = 0; i < n; ++i) scalar::adam_element<T>(s, p[i], grad[i], m[i], v[i], nullptr);
  }
}

// Every parameter's elements as one range split evenly over the threads: a model of many small
// tensors wakes the team once, not once per tensor.
template <typename T>
void adam_typed(const AdamArgs& args, const std::vector<AdamOperands>& params) {
  const AdamArgs& a = args.in_device ? *args.in_device : args;  // a recorded step's (Note [Step scalars])
  const auto scalars = scalar::adam_scalars<T>(a);
  std::vector<int64_t> begin{0};  // params[k] holds elements [begin[k], begin[k + 1]) of the range
  for (const AdamOperands& o : params) begin.push_back(begin.back() + o.param.numel());
  const int64_t total = begin.back();
  [[maybe_unused]] const int nt = threads_for(total * 8);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int64_t t = thread_index(), team = team_size(), lo = total * t / team, hi = total * (t + 1) / team;
    for (size_t k = 0; k < params.size(); ++k) {
      const int64_t from = std::max(lo, begin[k]) - begin[k], to = std::min(hi, begin[k + 1]) - begin[k];
      if (from >= to) continue;
      const AdamOperands& o = params[k];
      adam_range<T>(scalars, to - from, static_cast<T*>(o.param.data) + from, static_cast<const T*>(o.grad.data) + from,
                    static_cast<T*>(o.exp_avg.data) + from, static_cast<T*>(o.exp_avg_sq.data) + from,
                    a.amsgrad ? static_cast<T*>(o.max_exp_avg_sq.data) + from : nullptr);
    }
  }
}

}  // namespace

void CpuBackend::adam(const AdamArgs& args, const std::vector<AdamOperands>& params) {
  if (params.empty()) return;
  EF_DISPATCH_FLOAT(params[0].param.dtype, "adam", [&] { adam_typed<scalar_t>(args, params); });
}

}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
