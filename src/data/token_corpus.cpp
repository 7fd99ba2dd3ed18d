#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <fstream>

#include <absl/strings/str_split.h>
#include <nlohmann/json.hpp>

#include "lns/data/data.h"
#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "lns/core/json_in.h"
#include "lns/core/rng.h"

namespace lns {
namespace {

constexpr char kMagic[8] = {'L', 'N', 'S', 'T', 'O', 'K', 'E', 'N'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 64;
constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kMaxTokens = uint64_t{1} << 40;

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// Our format (docs/data.md): 64-byte header, tokens, padding to 8, doc offsets.
class LnsTokenFile : public TokenCorpus {
 public:
  explicit LnsTokenFile(const std::string& path) : file_(path, "data file") {
    path_ = path;
    const uint8_t* p = file_.data();
    if (file_.size() < kHeaderBytes || std::memcmp(p, kMagic, 8) != 0)
      fail(path, ": not an lns token file (bad magic; expected 'LNSTOKEN', or a Megatron prefix ",
           "with .bin/.idx)");
    const uint32_t version = load<uint32_t>(p + 8);
    if (version != kVersion) fail(path, ": token file version ", version, ", expected ", kVersion);
    token_bytes_ = static_cast<int>(load<uint32_t>(p + 12));
    if (token_bytes_ != 2 && token_bytes_ != 4)
      fail(path, ": corrupt header (token width ", token_bytes_, " bytes, expected 2 or 4)");
    const uint64_t n = load<uint64_t>(p + 16), docs = load<uint64_t>(p + 24), vocab = load<uint64_t>(p + 32);
    if (vocab > INT32_MAX) fail(path, ": corrupt header (vocabulary size ", vocab, ")");
    vocab_size_ = static_cast<int64_t>(vocab);
    // 64 + n * width, padded to 8, + (docs + 1) * 8 bytes, each step overflow-checked.
    const int64_t size = static_cast<int64_t>(file_.size());
    int64_t tok_bytes = 0, tok_end = 0, idx_bytes = 0, want = 0;
    const bool fits = n <= kMaxTokens && docs < kMaxTokens &&
                      mul_within(static_cast<int64_t>(n), token_bytes_, size, &tok_bytes) &&
                      add_within(tok_bytes, int64_t{kHeaderBytes} + 7, INT64_MAX, &tok_end) &&
                      mul_within(static_cast<int64_t>(docs) + 1, 8, size, &idx_bytes) &&
                      add_within(tok_end / 8 * 8, idx_bytes, INT64_MAX, &want);
    if (!fits || want != size)
      fail(path, ": corrupt or truncated token file (header says ", n, " tokens and ", docs, " documents",
           fits ? absl::StrCat(" = ", want, " bytes") : "", ", file has ", size, " bytes)");
    num_tokens_ = static_cast<int64_t>(n);
    tokens_ = p + kHeaderBytes;
    doc_starts_.resize(docs + 1);
    std::memcpy(doc_starts_.data(), p + want - idx_bytes, idx_bytes);
    if (doc_starts_.front() != 0 || doc_starts_.back() != num_tokens_)
      fail(path, ": corrupt document index (must span tokens 0..", num_tokens_, ")");
    for (uint64_t d = 0; d < docs; ++d)
      if (doc_starts_[d] > doc_starts_[d + 1])
        fail(path, ": corrupt document index (document ", d, " ends before it starts)");
  }

 private:
  MappedFile file_;
};

// Megatron-LM's MMapIndexedDataset: PREFIX.idx = "MMIDIDX\0\0", u64 version 1, u8 dtype
// code, u64 sequence count S, u64 document-index length D, i32 sizes[S], i64 byte
// pointers[S], i64 doc_idx[D] (sequence index where each document starts, then S).
class MegatronCorpus : public TokenCorpus {
 public:
  explicit MegatronCorpus(const std::string& prefix)
      : idx_(prefix + ".idx", "Megatron index"), bin_(prefix + ".bin", "Megatron data file") {
    path_ = prefix;
    const std::string ip = prefix + ".idx";
    const uint8_t* p = idx_.data();
    if (idx_.size() < 34 || std::memcmp(p, kMegatronMagic, 9) != 0)
      fail(ip, ": not a Megatron index (bad magic, expected MMIDIDX)");
    if (load<uint64_t>(p + 9) != 1) fail(ip, ": Megatron index version ", load<uint64_t>(p + 9), ", expected 1");
    const uint8_t code = p[17];
    if (code == 8) token_bytes_ = 2;       // uint16
    else if (code == 4) token_bytes_ = 4;  // int32
    else fail(ip, ": token dtype code ", int(code), " not supported (expected 8 = uint16 or 4 = int32)");
    const uint64_t S = load<uint64_t>(p + 18), D = load<uint64_t>(p + 26);
    // 34 + 12 * S + 8 * D bytes: a count that wraps 64 bits must not pass for a size.
    const int64_t size = static_cast<int64_t>(idx_.size());
    int64_t seq_bytes = 0, doc_bytes = 0, want = 0;
    const bool fits = S < static_cast<uint64_t>(size) && D < static_cast<uint64_t>(size) &&
                      mul_within(static_cast<int64_t>(S), 12, size, &seq_bytes) &&
                      mul_within(static_cast<int64_t>(D), 8, size, &doc_bytes) &&
                      add_within(34 + seq_bytes, doc_bytes, INT64_MAX, &want);
    if (!fits || want != size)
      fail(ip, ": corrupt or truncated Megatron index (", S, " sequences, ", D, " document entries",
           fits ? absl::StrCat(" = ", want, " bytes") : "", ", file has ", size, " bytes)");
    const uint8_t* sizes = p + 34;
    const uint8_t* ptrs = sizes + S * 4;
    const uint8_t* doc_idx = ptrs + S * 8;
    num_tokens_ = static_cast<int64_t>(bin_.size() / token_bytes_);
    tokens_ = bin_.data();
    // Sequences are stored back to back; a document is a run of sequences.
    const int64_t bin_size = static_cast<int64_t>(bin_.size());
    int64_t expect_ptr = 0;
    for (uint64_t s = 0; s < S; ++s) {
      const int64_t ptr = load<int64_t>(ptrs + s * 8), len = load<int32_t>(sizes + s * 4);
      if (ptr != expect_ptr || len < 0)
        fail(ip, ": sequence ", s, " is not stored contiguously after the previous one");
      expect_ptr = ptr + len * token_bytes_;  // <= bin_size + 2^33: no overflow
      if (expect_ptr > bin_size)
        fail(prefix, ".bin: has ", bin_size, " bytes, the index describes at least ", expect_ptr);
    }
    if (expect_ptr != bin_size)
      fail(prefix, ".bin: has ", bin_size, " bytes, the index describes ", expect_ptr);
    auto seq_start = [&](uint64_t s) {
      return s == S ? num_tokens_ : load<int64_t>(ptrs + s * 8) / token_bytes_;
    };
    if (D == 0) {
      doc_starts_ = {0, num_tokens_};
    } else {
      int64_t prev = 0;
      for (uint64_t d = 0; d < D; ++d) {
        const int64_t s = load<int64_t>(doc_idx + d * 8);
        if (s < 0 || static_cast<uint64_t>(s) > S || s < prev)
          fail(ip, ": document index entry ", d, " (", s, ") is out of range or out of order (sequences 0..", S, ")");
        prev = s;
        doc_starts_.push_back(seq_start(s));
      }
      if (doc_starts_.back() != num_tokens_) doc_starts_.push_back(num_tokens_);
    }
  }

 private:
  MappedFile idx_, bin_;
};

class RandomCorpus : public TokenCorpus {
 public:
  RandomCorpus(int64_t vocab, int64_t n, uint64_t seed) : tokens_store_(n) {
    path_ = "random";
    const uint64_t key = rng_key(seed, "data.random");
    for (int64_t i = 0; i < n; ++i)
      tokens_store_[i] = static_cast<int32_t>(uniform_at(key, i) * static_cast<float>(vocab)) % vocab;
    tokens_ = reinterpret_cast<const uint8_t*>(tokens_store_.data());
    token_bytes_ = 4;
    num_tokens_ = n;
    vocab_size_ = vocab;
    doc_starts_ = {0, n};
  }

 private:
  std::vector<int32_t> tokens_store_;
};

}  // namespace

std::unique_ptr<TokenCorpus> TokenCorpus::random(int64_t vocab_size, int64_t num_tokens,
                                                 uint64_t seed) {
  return std::make_unique<RandomCorpus>(vocab_size, num_tokens, seed);
}

// Several corpora read as one: tokens and documents concatenated in order.
class ConcatCorpus : public TokenCorpus {
 public:
  explicit ConcatCorpus(std::vector<std::unique_ptr<TokenCorpus>> parts, const std::string& spec)
      : parts_(std::move(parts)) {
    path_ = spec;
    doc_starts_ = {0};
    for (const auto& p : parts_) {
      starts_.push_back(num_tokens_);
      for (int64_t d = 0; d < p->num_docs(); ++d) doc_starts_.push_back(num_tokens_ + p->doc_end(d));
      num_tokens_ += p->num_tokens();
      vocab_size_ = std::max(vocab_size_, p->vocab_size());
    }
    if (doc_starts_.back() != num_tokens_) doc_starts_.push_back(num_tokens_);
  }
  void read(int64_t begin, int64_t n, int32_t* out) const override {
    size_t i = std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1;
    while (n > 0) {
      const int64_t local = begin - starts_[i], take = std::min(n, parts_[i]->num_tokens() - local);
      parts_[i]->read(local, take, out);
      out += take, begin += take, n -= take, ++i;
    }
  }

 private:
  std::vector<std::unique_ptr<TokenCorpus>> parts_;
  std::vector<int64_t> starts_;
};

std::unique_ptr<TokenCorpus> TokenCorpus::open(const std::string& spec) {
  std::vector<std::string> paths;
  if (spec.size() > 11 && spec.substr(spec.size() - 11) == "/index.json") {
    const nlohmann::json j = parse_json_file(spec, 256 << 20, "shard index");
    const std::string dir = spec.substr(0, spec.size() - 10);
    const JsonIn shards = JsonIn(j, spec)["shards"];
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string file = shards.at(i)["file"].string();
      if (!is_plain_file_name(file))
        shards.at(i)["file"].error("'", printable(file), "' is not a plain file name in the index's directory");
      paths.push_back(dir + file);
    }
  } else {
    for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
      const std::string p(part);
      if (p.find_first_of("*?[") == std::string::npos) {
        paths.push_back(p);
        continue;
      }
      glob_t g{};
      const int rc = ::glob(p.c_str(), 0, nullptr, &g);
      if (rc != 0) {
        globfree(&g);
        fail(p, ": no data file matches this pattern");
      }
      for (size_t i = 0; i < g.gl_pathc; ++i) paths.push_back(g.gl_pathv[i]);
      globfree(&g);
    }
  }
  if (paths.empty()) fail("--data=", spec, ": no data files");
  if (paths.size() == 1) return open_one(paths[0]);
  std::vector<std::unique_ptr<TokenCorpus>> parts;
  for (const std::string& p : paths) parts.push_back(open_one(p));
  return std::make_unique<ConcatCorpus>(std::move(parts), spec);
}

std::unique_ptr<TokenCorpus> TokenCorpus::open_one(const std::string& path) {
  if (!file_exists(path) && file_exists(path + ".idx") && file_exists(path + ".bin"))
    return std::make_unique<MegatronCorpus>(path);
  if (!file_exists(path))
    fail(path, ": data file not found (expected an lns token file or a Megatron prefix with ",
         ".bin and .idx)");
  return std::make_unique<LnsTokenFile>(path);
}

void TokenCorpus::read(int64_t begin, int64_t n, int32_t* out) const {
  LNS_CHECK(begin >= 0 && begin + n <= num_tokens_);
  const uint8_t* p = tokens_ + begin * token_bytes_;
  if (token_bytes_ == 2) {
    for (int64_t i = 0; i < n; ++i) out[i] = load<uint16_t>(p + 2 * i);
  } else {
    std::memcpy(out, p, n * 4);
  }
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens,
                      const std::vector<int64_t>& doc_starts, int token_bytes, int64_t vocab_size) {
  LNS_CHECK(token_bytes == 2 || token_bytes == 4);
  LNS_CHECK(!doc_starts.empty() && doc_starts.front() == 0 &&
            doc_starts.back() == static_cast<int64_t>(tokens.size()));
  // The one atomic write of lns/core/files.h: a reader never maps half a token file.
  write_file_atomically(path, [&](std::FILE* f) {
    uint8_t header[kHeaderBytes] = {};
    std::memcpy(header, kMagic, 8);
    const uint32_t ver = kVersion, tb = token_bytes;
    const uint64_t n = tokens.size(), docs = doc_starts.size() - 1, vocab = vocab_size;
    std::memcpy(header + 8, &ver, 4);
    std::memcpy(header + 12, &tb, 4);
    std::memcpy(header + 16, &n, 8);
    std::memcpy(header + 24, &docs, 8);
    std::memcpy(header + 32, &vocab, 8);
    bool ok = std::fwrite(header, 1, kHeaderBytes, f) == kHeaderBytes;
    for (int32_t t : tokens) {
      if (token_bytes == 2) {
        const uint16_t v = static_cast<uint16_t>(t);
        ok = std::fwrite(&v, 2, 1, f) == 1 && ok;
      } else {
        ok = std::fwrite(&t, 4, 1, f) == 1 && ok;
      }
    }
    const uint64_t pad = (8 - (n * token_bytes) % 8) % 8;
    const uint8_t zeros[8] = {};
    ok = std::fwrite(zeros, 1, pad, f) == pad && ok;
    return std::fwrite(doc_starts.data(), 8, doc_starts.size(), f) == doc_starts.size() && ok;
  });
}

}  // namespace lns
