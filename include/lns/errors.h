// Errors. Two kinds, never mixed:
//  - UserError: bad flags, missing or corrupt files, impossible layouts. Thrown with a
//    one-line message that names the flag or file and what was expected; every app
//    catches it at the top, prints "<app>: error: <message>" and exits non-zero.
//  - LNS_CHECK (glog CHECK): programmer errors, invariants that input cannot break.
#pragma once
#include <stdexcept>
#include <string>

#include <absl/strings/str_cat.h>
#include <glog/logging.h>

namespace lns {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws UserError with the concatenation of the arguments (absl::StrCat rules).
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw UserError(absl::StrCat(args...));
}

}  // namespace lns

// User-input check: `LNS_REQUIRE(x > 0, "--steps must be positive, got ", x)`.
#define LNS_REQUIRE(cond, ...)          \
  do {                                  \
    if (!(cond)) ::lns::fail(__VA_ARGS__); \
  } while (0)

#define LNS_CHECK(cond) CHECK(cond)
