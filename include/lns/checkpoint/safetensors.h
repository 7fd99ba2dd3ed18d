// safetensors files: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
// then the data. Readers memory-map the file and validate the whole header on open
// (its length, every entry's dtype, shape and offsets, overflow-safe, inside the
// data section); every malformed byte is a UserError that names the file and never
// echoes the file's bytes.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lns/core/tensor.h"

namespace lns {

class MappedFile;

// A header longer than this is refused (real ones are kilobytes to a few megabytes).
constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// F32, BF16, F16 or F64: what read_f32 converts.
bool is_float_dtype(const std::string& dtype);

struct SafetensorEntry {
  std::string dtype;  // "F32", "BF16", "F16", "F64", "I32", "I64", ...
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t numel() const;
};

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  const SafetensorEntry& entry(const std::string& name) const;  // UserError if absent
  const SafetensorEntry* find(const std::string& name) const;   // null if absent
  // Values converted to f32 (from F32, BF16, F16, F64) or i32 (from I32, I64).
  std::vector<float> read_f32(const std::string& name) const;
  std::vector<int32_t> read_i32(const std::string& name) const;
  // Copies `name` into dst (F32 destination) after checking the shape matches.
  void read_into(const std::string& name, Tensor dst) const;
  const uint8_t* raw(const SafetensorEntry& e) const { return data_ + e.begin; }

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  const uint8_t* data_ = nullptr;
  std::map<std::string, SafetensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Copies the tensor's bytes (CPU tensors; F32, BF16, I32).
  void add(const std::string& name, const Tensor& t);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes `path` atomically (write_file_atomically: a unique temporary file, fsync,
  // rename), so readers never see half a file.
  void write(const std::string& path) const;

 private:
  struct Item {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Item> items_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace lns
