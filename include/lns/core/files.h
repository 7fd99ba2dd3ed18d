// File primitives every reader and writer of the project shares, so that the rules
// live in one place:
//  - a file is replaced atomically (written to a fresh temporary name that this
//    process created, fsynced, renamed), so a reader sees the old or the new file and
//    a crash never leaves half a file behind under the real name;
//  - a name read from a file (a shard, an index entry) is a plain file name inside
//    its directory, never a path;
//  - a JSON file is read with a size bound, and a parse error reports the byte offset,
//    never the file's bytes (a binary file must not spill into the terminal).
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace lns {

// Writes `path` through `write(f)` (which returns false on a write error) into a
// temporary file created next to it with O_EXCL, fsyncs it and renames it over
// `path`. On any failure the temporary file is removed and a UserError names `path`.
void write_file_atomically(const std::string& path, const std::function<bool(std::FILE*)>& write);
void write_file_atomically(const std::string& path, const std::string& text);

// fsync of a file or directory (directories: so a rename inside it is durable).
void fsync_path(const std::string& path);

// True for a name that stays inside its directory: not empty, not "." or "..", no
// '/', '\\' or control characters, at most 255 bytes.
bool is_plain_file_name(std::string_view name);

// The whole file, refusing one larger than max_bytes (UserError naming the file).
std::string read_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// A JSON document from a file of at most max_bytes. A syntax error is reported as
// "<path>: not valid JSON (syntax error at byte offset N)", without the offending bytes.
nlohmann::json parse_json_file(const std::string& path, uint64_t max_bytes, const std::string& what);
nlohmann::json parse_json_text(std::string_view text, const std::string& path);

// A read-only memory map of a whole file, followed by an inaccessible guard page: a
// read past the end faults at once instead of returning the bytes of whatever mapping
// happens to follow (so a missed bounds check cannot go unnoticed, in the fuzz tests
// or in use). UserError naming the file (`what` says what it should be).
class MappedFile {
 public:
  MappedFile(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* base_ = nullptr;  // the reservation: file pages + guard page
  size_t reserved_ = 0;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// `s` for an error message: control and non-ASCII bytes escaped as \xNN, at most
// max_chars characters ("..." appended when cut). Names read from hostile files go
// through this so an error stays one printable line.
std::string printable(std::string_view s, size_t max_chars = 80);

}  // namespace lns
