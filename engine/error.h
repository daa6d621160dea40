/// @file
/// Errors. `EF_CHECK` reports a caller's mistake as `ef::Error` with a message naming what was
/// wrong and the values involved; `EF_ASSERT` guards our own invariants and says "internal error".
/// Library code never calls exit() or abort(): every failure becomes an exception the caller sees.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace evenflow {

/// The exception evenflow throws for every failure (also reachable as ef::Error). what() names the
/// op or function, what was wrong and the values involved; an internal error (EF_ASSERT) says
/// "internal error". Errors inside a backward pass are rethrown by backward() or grad() on the
/// calling thread, prefixed with the node and device.
class Error : public std::runtime_error {
 public:
  /// An error with message `what`.
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

/// Throws ef::Error unless `cond` holds: a caller's mistake. The message is the remaining arguments
/// streamed (`<<`) one after another; they are evaluated only when cond is false.
#define EF_CHECK(cond, ...)                                                                 \
  do {                                                                                      \
    if (!(cond)) ::evenflow::detail::throw_error(::evenflow::detail::str_cat(__VA_ARGS__)); \
  } while (0)

/// Throws ef::Error unless `cond` holds: one of evenflow's own invariants, never a caller's mistake.
/// The message reads "internal error (a bug in evenflow, please report it): FILE:LINE: `cond`
/// failed", then the optional arguments streamed together. Checked in every build type.
#define EF_ASSERT(cond, ...)                                                                          \
  do {                                                                                                \
    if (!(cond))                                                                                      \
      ::evenflow::detail::throw_internal(__FILE__, __LINE__, #cond,                                   \
                                         ::evenflow::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

/// Throws ef::Error unconditionally, with the arguments streamed together as its message.
#define EF_ERROR(...) ::evenflow::detail::throw_error(::evenflow::detail::str_cat(__VA_ARGS__))
