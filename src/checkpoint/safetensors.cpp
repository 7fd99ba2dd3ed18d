#include "lns/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "lns/bf16.h"
#include "lns/errors.h"

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

int64_t SafetensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(path, ": cannot open safetensors file: ", std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    fail(path, ": not a safetensors file (", map_size_, " bytes, shorter than the 8-byte header)");
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(path, ": cannot map file: ", std::strerror(errno));
  }
  const auto* bytes = static_cast<const uint8_t*>(map_);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian host (x86-64, aarch64)
  if (header_len > map_size_ - 8)
    fail(path, ": corrupt safetensors header (header length ", header_len, " exceeds file size ",
         map_size_, ")");
  data_ = bytes + 8 + header_len;
  const size_t data_size = map_size_ - 8 - header_len;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": corrupt safetensors header (not JSON: ", e.what(), ")");
  }
  if (!header.is_object()) fail(path, ": corrupt safetensors header (not a JSON object)");
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      for (auto& [k, mv] : v.items())
        if (mv.is_string()) metadata_[k] = mv.get<std::string>();
      continue;
    }
    SafetensorEntry e;
    try {
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      auto off = v.at("data_offsets").get<std::vector<size_t>>();
      if (off.size() != 2) throw std::runtime_error("data_offsets must have 2 entries");
      e.begin = off[0];
      e.end = off[1];
    } catch (const std::exception& ex) {
      fail(path, ": corrupt safetensors entry '", name, "': ", ex.what());
    }
    const size_t es = safetensor_dtype_size(e.dtype);
    if (es == 0) fail(path, ": tensor '", name, "' has unknown dtype ", e.dtype);
    if (e.begin > e.end || e.end > data_size || (e.end - e.begin) != e.numel() * es)
      fail(path, ": tensor '", name, "' has data offsets [", e.begin, ", ", e.end,
           ") that do not fit its shape or the file (", data_size, " data bytes); truncated?");
    entries_[name] = std::move(e);
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (map_) ::munmap(map_, map_size_);
}

const SafetensorEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail(path_, ": has no tensor named '", name, "'");
  return it->second;
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
    fail(path_, ": tensor '", name, "' is ", e.dtype, ", expected a float type");
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
    fail(path_, ": tensor '", name, "' is ", e.dtype, ", expected I32 or I64");
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
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(path, ": cannot write: ", std::strerror(errno));
  const uint64_t len = h.size();
  bool ok = std::fwrite(&len, 8, 1, f) == 1 && std::fwrite(h.data(), 1, h.size(), f) == h.size();
  for (const auto& [name, it] : items_)
    ok = ok && std::fwrite(it.bytes.data(), 1, it.bytes.size(), f) == it.bytes.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (::fsync(::fileno(f)) == 0) && ok;  // durable before the rename makes it visible
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(path, ": write failed: ", std::strerror(errno));
  }
}

}  // namespace lns
