// The CPU backend: Eigen for matrix products, OpenMP loops for the rest (see backend.h).
#pragma once

#include <memory>

#include "evenflow/engine/backend.h"

namespace evenflow::cpu_backend {
std::unique_ptr<Backend> make_backend();
}
