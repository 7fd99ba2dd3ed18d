#include "lns/core/errors.h"

#include <cstdio>
#include <filesystem>
#include <new>

#include <nlohmann/json.hpp>

#include "lns/core/files.h"

namespace lns {

std::string current_exception_message() {
  try {
    throw;
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::bad_alloc&) {
    return "out of memory (a size read from a file or a flag is larger than this machine can hold)";
  } catch (const std::filesystem::filesystem_error& e) {
    return printable(e.what(), 400);
  } catch (const nlohmann::json::exception& e) {
    return "unexpected JSON content: " + printable(e.what(), 200);
  } catch (const std::exception& e) {
    return printable(e.what(), 400);
  } catch (...) {
    return "unknown error";
  }
}

void line_buffered_stdout() { std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ); }

int main_guard(const char* app, const std::function<int()>& body) {
  line_buffered_stdout();
  try {
    return body();
  } catch (...) {
    std::fprintf(stderr, "%s: error: %s\n", app, current_exception_message().c_str());
    return 1;
  }
}

}  // namespace lns
