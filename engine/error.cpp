#include "evenflow/engine/error.h"

namespace evenflow::detail {

void throw_error(const std::string& msg) {
  throw Error(msg);
}

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(str_cat("internal error (a bug in evenflow, please report it): ", file, ":", line, ": `", cond,
                      "` failed", msg.empty() ? "" : ": ", msg));
}

}  // namespace evenflow::detail
