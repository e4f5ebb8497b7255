// keel::Error: the one exception type Keel throws for bad input or misuse (shared vocabulary,
// keel/base; the engine's keel/error.h includes it).
// Invariant: messages name the op (where there is one) and the shapes/dtypes involved; nothing in
// the engine aborts or exits on user input.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace keel {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace keel

// Throws keel::Error with the streamed message when cond is false.
#define KEEL_CHECK(cond, ...)                                              \
  do {                                                                     \
    if (!(cond)) throw ::keel::Error(::keel::detail::concat(__VA_ARGS__)); \
  } while (0)
