// The CPU backend: Eigen for matrix products, OpenMP loops for the rest (see backend.h).
#pragma once

#include <memory>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/cpu/isa.h"

namespace evenflow::cpu_backend {
inline namespace EF_CPU_ISA {
std::unique_ptr<Backend> make_backend();
}  // namespace EF_CPU_ISA
}  // namespace evenflow::cpu_backend
