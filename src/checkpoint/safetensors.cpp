#include "lns/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "lns/core/bf16.h"
#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "lns/core/json_in.h"

namespace lns {
namespace {

size_t safetensor_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

}  // namespace

bool is_float_dtype(const std::string& d) { return d == "F32" || d == "BF16" || d == "F16" || d == "F64"; }

int64_t SafetensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // the reader checked the product fits
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path)
    : path_(path), file_(std::make_unique<MappedFile>(path, "safetensors file")) {
  const size_t size = file_->size();
  if (size < 8) fail(path, ": not a safetensors file (", size, " bytes, shorter than the 8-byte header)");
  const uint8_t* bytes = file_->data();
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian host (x86-64, aarch64)
  if (header_len > size - 8 || header_len > kMaxSafetensorsHeaderBytes)
    // The length is the file's first 8 bytes as a number: for a file of another kind
    // (text, JSON) that number is noise, so the message does not print it.
    fail(path, ": not a safetensors file (its first 8 bytes, read as the header length, give more than ",
         header_len > size - 8 ? absl::StrCat("the file's ", size, " bytes hold")
                                    : absl::StrCat("the limit of ", kMaxSafetensorsHeaderBytes, " bytes"),
         ")");
  data_ = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    // e.what() would quote the file's bytes; a binary file must not reach the terminal.
    fail(path, ": not a safetensors file (its header is not JSON",
         e.id == 101 ? absl::StrCat(": syntax error at byte offset ", 8 + static_cast<const nlohmann::json::parse_error&>(e).byte - 1) : "",
         ")");
  }
  const JsonIn in(header, path, "header");
  if (!header.is_object()) fail(path, ": not a safetensors file (its header is not a JSON object)");
  for (auto& [name, v] : header.items()) {
    const JsonIn entry(v, path, "header['" + printable(name, 60) + "']");
    if (name == "__metadata__") {
      entry.require_object();
      for (auto& [k, mv] : v.items())
        if (mv.is_string()) metadata_[k] = mv.get<std::string>();
      continue;
    }
    SafetensorEntry e;
    e.dtype = entry["dtype"].string();
    const uint64_t es = safetensor_dtype_size(e.dtype);
    if (es == 0) entry["dtype"].error("unknown dtype '", printable(e.dtype, 16), "'");
    e.shape = entry["shape"].integers(0, kMaxDims, 0, INT64_MAX);
    int64_t numel = 0, nbytes = 0;
    const auto offsets = entry["data_offsets"].integers(2, 2, 0, INT64_MAX);
    if (!numel_within(e.shape, INT64_MAX, &numel) || !mul_within(numel, static_cast<int64_t>(es), INT64_MAX, &nbytes) ||
        offsets[0] > offsets[1] || static_cast<uint64_t>(offsets[1]) > data_size || offsets[1] - offsets[0] != nbytes)
      fail(path, ": tensor '", printable(name, 60), "' has data offsets [", offsets[0], ", ", offsets[1],
           ") that do not fit its shape ", Shape(e.shape).str(), " or the file (", data_size,
           " data bytes); truncated?");
    e.begin = static_cast<size_t>(offsets[0]);
    e.end = static_cast<size_t>(offsets[1]);
    entries_[name] = std::move(e);
  }
}

SafetensorsReader::~SafetensorsReader() = default;

const SafetensorEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const SafetensorEntry& SafetensorsReader::entry(const std::string& name) const {
  const SafetensorEntry* e = find(name);
  if (!e) fail(path_, ": has no tensor named '", printable(name), "'");
  return *e;
}

std::vector<float> SafetensorsReader::read_f32(const std::string& name) const {
  const SafetensorEntry& e = entry(name);
  std::vector<float> out(e.numel());
  const uint8_t* p = raw(e);
  if (e.dtype == "F32") {
    std::memcpy(out.data(), p, out.size() * 4);
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    const bool bf = e.dtype == "BF16";
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
    }
  } else if (e.dtype == "F64") {
    for (size_t i = 0; i < out.size(); ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    fail(path_, ": tensor '", printable(name), "' is ", e.dtype, ", expected a float type");
  }
  return out;
}

std::vector<int32_t> SafetensorsReader::read_i32(const std::string& name) const {
  const SafetensorEntry& e = entry(name);
  std::vector<int32_t> out(e.numel());
  const uint8_t* p = raw(e);
  if (e.dtype == "I32") {
    std::memcpy(out.data(), p, out.size() * 4);
  } else if (e.dtype == "I64") {
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      out[i] = static_cast<int32_t>(v);
    }
  } else {
    fail(path_, ": tensor '", printable(name), "' is ", e.dtype, ", expected I32 or I64");
  }
  return out;
}

void SafetensorsReader::read_into(const std::string& name, Tensor dst) const {
  const SafetensorEntry& e = entry(name);
  if (Shape(e.shape) != dst.shape)
    fail(path_, ": tensor '", name, "' has shape ", Shape(e.shape).str(), ", expected ",
         dst.shape.str());
  const std::vector<float> v = read_f32(name);
  std::memcpy(dst.f32(), v.data(), v.size() * sizeof(float));
}

void SafetensorsWriter::add(const std::string& name, const Tensor& t) {
  LNS_CHECK(t.device == Device::CPU);
  Item it{dtype_name(t.dtype), t.shape.to_vector(), {}};
  it.bytes.assign(static_cast<const uint8_t*>(t.data), static_cast<const uint8_t*>(t.data) + t.nbytes());
  items_[name] = std::move(it);
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const float* data) {
  Tensor t;
  t.data = const_cast<float*>(data);
  t.shape = Shape(shape);
  add(name, t);
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::json header = nlohmann::json::object();
  size_t off = 0;
  for (const auto& [name, it] : items_) {  // std::map: sorted names, contiguous offsets
    header[name] = {{"dtype", it.dtype}, {"shape", it.shape}, {"data_offsets", {off, off + it.bytes.size()}}};
    off += it.bytes.size();
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  write_file_atomically(path, [&](std::FILE* f) {  // readers never see half a file
    const uint64_t len = h.size();
    bool ok = std::fwrite(&len, 8, 1, f) == 1 && std::fwrite(h.data(), 1, h.size(), f) == h.size();
    for (const auto& [name, it] : items_)
      ok = ok && std::fwrite(it.bytes.data(), 1, it.bytes.size(), f) == it.bytes.size();
    return ok;
  });
}

}  // namespace lns
