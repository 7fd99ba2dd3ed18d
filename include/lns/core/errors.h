// Errors. Two kinds, never mixed:
//  - UserError: bad flags, missing or corrupt files, impossible layouts. Thrown with a
//    one-line message that names the flag or file and what was expected; every app
//    catches it at the top, prints "<app>: error: <message>" and exits non-zero.
//  - LNS_CHECK (glog CHECK): programmer errors, invariants that input cannot break.
// Every main() runs inside main_guard, so that no exception of any kind (a JSON
// library's, a filesystem error, out of memory) ends a tool with std::terminate.
#pragma once
#include <functional>
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

// Thrown by every rank at the same point of a collective step, each knowing the
// whole story (a non-finite state found by an all-reduce): apps print it once, on
// rank 0, and every rank exits 1 without aborting the job.
class CollectiveError : public UserError {
 public:
  using UserError::UserError;
};

// A fault of the machine rather than of the input (a communicator that failed, a
// checkpoint write that failed): apps end the whole job with `status`, one of
// lns/core/exit_status.h, so that the launchers know to restart it.
class FaultError : public std::runtime_error {
 public:
  FaultError(int status, const std::string& what) : std::runtime_error(what), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// The one-line message of the exception being handled (call it inside a catch): a
// UserError's own message; out of memory and other exceptions named as such.
std::string current_exception_message();

// Runs body; any exception becomes "<app>: error: <message>" on stderr and exit 1.
// Calls line_buffered_stdout() first.
int main_guard(const char* app, const std::function<int()>& body);

// stdout flushed at every newline, also into a pipe or a file (C's default there is
// full buffering): a run killed by `timeout` or a batch system has printed every line
// it reached, its configuration first. Every app calls it before printing.
void line_buffered_stdout();

}  // namespace lns

// User-input check: `LNS_REQUIRE(x > 0, "--steps must be positive, got ", x)`.
#define LNS_REQUIRE(cond, ...)          \
  do {                                  \
    if (!(cond)) ::lns::fail(__VA_ARGS__); \
  } while (0)

#define LNS_CHECK(cond) CHECK(cond)
