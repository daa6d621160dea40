/// @file
/// Errors. `EF_CHECK` reports a caller's mistake as `ef::Error` with a message naming what was
/// wrong and the values involved; `EF_ASSERT` guards our own invariants and says "internal error".
/// Library code never calls exit() or abort(): every failure becomes an exception the caller sees.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace evenflow {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const std::string& msg);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace evenflow

namespace ef = evenflow;

#define EF_CHECK(cond, ...)                                                                 \
  do {                                                                                      \
    if (!(cond)) ::evenflow::detail::throw_error(::evenflow::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define EF_ASSERT(cond, ...)                                                                          \
  do {                                                                                                \
    if (!(cond))                                                                                      \
      ::evenflow::detail::throw_internal(__FILE__, __LINE__, #cond,                                   \
                                         ::evenflow::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#define EF_ERROR(...) ::evenflow::detail::throw_error(::evenflow::detail::str_cat(__VA_ARGS__))
