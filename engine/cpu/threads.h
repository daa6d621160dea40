// OpenMP, or its serial stand-in when the build has none (EF_OPENMP=OFF, used for ThreadSanitizer
// builds because libgomp is not instrumented). Kernels call these instead of omp_* directly.
#pragma once

#ifdef _OPENMP
#include <omp.h>
#endif

namespace evenflow::cpu_backend {

inline int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

inline int team_size() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

// Sets how many threads this thread's next parallel regions (and Eigen's GEMM) use.
inline void set_team_size([[maybe_unused]] int n) {
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

// Frees the calling thread's OpenMP thread pool; its next parallel region starts a new one
// (Note [One OpenMP team per core]).
inline void release_team() {
#ifdef _OPENMP
  omp_pause_resource(omp_pause_soft, omp_get_initial_device());
#endif
}

}  // namespace evenflow::cpu_backend
