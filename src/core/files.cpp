#include "lns/core/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <absl/strings/str_format.h>
#include <nlohmann/json.hpp>

#include "lns/core/errors.h"

namespace lns {

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_file_atomically(const std::string& path, const std::function<bool(std::FILE*)>& write) {
  std::string tmpl = path + ".tmp-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);  // O_EXCL: a name nobody else has
  if (fd < 0) fail(path, ": cannot write: ", std::strerror(errno));
  const std::string tmp(name.data());
  // mkostemp creates 0600; give the file the mode an ordinary create would have.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(path, ": cannot write: ", std::strerror(errno));
  }
  bool ok = write(f);
  ok = std::fflush(f) == 0 && ok;
  const int saved = errno;
  ok = ::fsync(::fileno(f)) == 0 && ok;  // durable before the rename makes it visible
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : saved;
    ::unlink(tmp.c_str());  // ours: created above under a unique name
    fail(path, ": write failed: ", std::strerror(err ? err : EIO));
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](std::FILE* f) {
    return std::fwrite(text.data(), 1, text.size(), f) == text.size();
  });
}

bool is_plain_file_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (unsigned char c : name)
    if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f) return false;
  return true;
}

std::string read_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot read ", what, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": ", what, " is not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    fail(path, ": ", what, " has ", st.st_size, " bytes, more than the ", max_bytes,
         " such a file can sensibly have");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail(path, ": cannot read ", what, ": ", n < 0 ? std::strerror(errno) : "the file shrank while reading");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return out;
}

nlohmann::json parse_json_text(std::string_view text, const std::string& path) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() quotes the bytes around the error; the offset is enough.
    fail(path, ": not valid JSON (syntax error at byte offset ", e.byte > 0 ? e.byte - 1 : 0, ")");
  } catch (const nlohmann::json::exception&) {
    fail(path, ": not valid JSON");
  }
}

nlohmann::json parse_json_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  return parse_json_text(read_file(path, max_bytes, what), path);
}

MappedFile::MappedFile(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open ", what, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a ", what, " (not a regular file)");
  }
  size_ = static_cast<size_t>(st.st_size);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  reserved_ = (size_ + page - 1) / page * page + page;
  // Reserve the file's pages and one more, inaccessible; map the file over the start.
  base_ = ::mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* file = base_ == MAP_FAILED || size_ == 0
                   ? base_
                   : ::mmap(base_, size_, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base_ == MAP_FAILED || file == MAP_FAILED) {
    if (base_ != MAP_FAILED) ::munmap(base_, reserved_);
    base_ = nullptr;
    fail(path, ": cannot map ", what, ": ", std::strerror(err));
  }
  data_ = static_cast<const uint8_t*>(base_);
}

MappedFile::~MappedFile() {
  if (base_) ::munmap(base_, reserved_);
}

std::string printable(std::string_view s, size_t max_chars) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\\') out += static_cast<char>(c);
    else out += absl::StrFormat("\\x%02x", c);
  }
  return out;
}

}  // namespace lns
