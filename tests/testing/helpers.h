// Small helpers shared by the test suites.
#pragma once

#include <string>
#include <vector>

#include "engine/ops.h"

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

}  // namespace evenflow::testing
