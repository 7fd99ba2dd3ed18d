// A seeded mutation fuzzer over the file parsers: checkpoint manifests (through
// Checkpoint and the loads that follow), safetensors headers, Megatron indexes and
// our token files. Each starts from real files written by the code, applies random
// mutations (byte flips, truncation, length and count fields set to boundary values,
// JSON values replaced by other types or extremes, keys removed, nodes swapped) and
// requires every outcome to be success or a one-line UserError: no crash, no other
// exception, no sanitizer report (tests/sanitize.sh runs this under ASan/UBSan), and
// no allocation above a small bound (operator new is replaced in this binary; while a
// fuzz target runs, a larger request is recorded and refused).
//
// Reproducible: the seed is printed (LNS_FUZZ_SEED overrides it), the iteration count
// is fixed (LNS_FUZZ_ITERS scales it), and a failure names the iteration and the
// mutations. A time budget per target stops a slow machine early, saying so.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <random>

#include <gtest/gtest-spi.h>

#include "lns/checkpoint/checkpoint.h"
#include "lns/data/data.h"
#include "lns/core/files.h"
#include "lns/checkpoint/safetensors.h"
#include "lns/model/stage.h"
#include "lns/train/trainer.h"
#include "test_util.h"

// ---- allocation bound --------------------------------------------------------------
// GCC sees the replaced operator delete inlined next to `new` and calls free() on a
// pointer from operator new a mismatch; here both are malloc/free by construction.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<size_t> g_alloc_cap{0};       // 0: no bound (outside the fuzz loops)
std::atomic<size_t> g_alloc_refused{0};   // the largest request refused
}  // namespace

void* operator new(size_t n) {
  const size_t cap = g_alloc_cap.load(std::memory_order_relaxed);
  if (cap && n > cap) {
    size_t prev = g_alloc_refused.load();
    while (n > prev && !g_alloc_refused.compare_exchange_weak(prev, n)) {
    }
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace fs = std::filesystem;
using nlohmann::json;

namespace lns {
namespace {

using namespace lns::test;

constexpr size_t kAllocCap = size_t{64} << 20;  // the fixtures are kilobytes

uint64_t fuzz_seed() {
  const char* s = std::getenv("LNS_FUZZ_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261123;
}

int iterations(int n) {
  const char* s = std::getenv("LNS_FUZZ_ITERS");
  return s ? std::max(1, static_cast<int>(n * std::atof(s))) : n;
}

// Runs `one(rng, iteration, description)` `n` times under the allocation bound. Each
// call must return normally or throw UserError.
void fuzz(const char* target, int n, double budget_s,
          const std::function<void(std::mt19937_64&, std::string&)>& one) {
  const uint64_t seed = fuzz_seed();
  std::mt19937_64 rng(seed);
  int ok = 0, refused = 0, failures = 0, done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  g_alloc_refused = 0;
  for (int it = 0; it < n && failures < 3; ++it, ++done) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > budget_s) break;
    std::string what;
    g_alloc_cap = kAllocCap;
    try {
      one(rng, what);
      ++ok;
    } catch (const UserError& e) {
      ++refused;
      if (std::string(e.what()).find('\n') != std::string::npos) {
        ADD_FAILURE() << target << " iteration " << it << " (seed " << seed << ", " << what
                      << "): multi-line error: " << e.what();
        ++failures;
      }
    } catch (const std::bad_alloc&) {
      ADD_FAILURE() << target << " iteration " << it << " (seed " << seed << ", " << what
                    << "): allocation of " << g_alloc_refused.load() << " bytes, above the bound of " << kAllocCap;
      ++failures;
    } catch (const std::exception& e) {
      ADD_FAILURE() << target << " iteration " << it << " (seed " << seed << ", " << what
                    << "): not a UserError: " << e.what();
      ++failures;
    }
    g_alloc_cap = 0;
  }
  g_alloc_cap = 0;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("fuzz %s: seed %llu, %d of %d iterations in %.1f s%s: %d accepted, %d refused\n", target,
              static_cast<unsigned long long>(seed), done, n, secs,
              done < n && failures == 0 ? " (time budget reached)" : "", ok, refused);
  EXPECT_GT(refused, 0) << "the mutations never produced a bad file";
}

// The harness itself: an allocation above the bound, or an exception other than a
// UserError, is a failure naming the iteration (each case: one refusal, then the fault).
int g_selftest_calls = 0;

TEST(Fuzz, HarnessCatchesWhatItShould) {
  g_selftest_calls = 0;
  EXPECT_NONFATAL_FAILURE(fuzz("selftest", 2, 10,
                               [](std::mt19937_64&, std::string&) {
                                 if (g_selftest_calls++ == 0) throw UserError("refused");
                                 std::vector<char> big(size_t{100} << 20);
                               }),
                          "selftest iteration 1 (seed");
  g_selftest_calls = 0;
  EXPECT_NONFATAL_FAILURE(fuzz("selftest", 2, 10,
                               [](std::mt19937_64&, std::string&) {
                                 if (g_selftest_calls++ == 0) throw UserError("refused");
                                 nlohmann::json::parse("{").get<int>();
                               }),
                          "not a UserError: [json.exception.parse_error");
  g_selftest_calls = 0;
  EXPECT_NONFATAL_FAILURE(fuzz("selftest", 2, 10,
                               [](std::mt19937_64&, std::string&) {
                                 if (g_selftest_calls++ == 0) throw UserError("refused");
                                 throw UserError("two\nlines");
                               }),
                          "multi-line error");
}

// ---- mutations ---------------------------------------------------------------------

uint64_t pick(std::mt19937_64& rng, uint64_t n) { return n ? rng() % n : 0; }

// A value that tends to break a parser: boundaries, signs, types.
json hostile_value(std::mt19937_64& rng) {
  switch (pick(rng, 20)) {
    case 0: return -1;
    case 1: return 0;
    case 2: return 1;
    case 3: return 2;
    case 4: return int64_t{1} << 31;
    case 5: return uint64_t{1} << 32;
    case 6: return int64_t{1} << 40;
    case 7: return (int64_t{1} << 40) + 1;
    case 8: return int64_t{1} << 62;
    case 9: return INT64_MIN;
    case 10: return UINT64_MAX;
    case 11: return 1e300;
    case 12: return 0.5;
    case 13: return "12";
    case 14: return "";
    case 15: return nullptr;
    case 16: return true;
    case 17: return json::array();
    case 18: return json::object();
    default: return json::array({int64_t{1} << 33, -5});
  }
}

void collect(json& j, std::vector<json*>& out) {
  out.push_back(&j);
  if (j.is_object())
    for (auto& [k, v] : j.items()) collect(v, out);
  else if (j.is_array())
    for (auto& v : j) collect(v, out);
}

// 1..3 structural mutations of a JSON document; `what` gets a short description.
void mutate_json(json& doc, std::mt19937_64& rng, std::string& what) {
  const int count = 1 + static_cast<int>(pick(rng, 3));
  for (int m = 0; m < count; ++m) {
    std::vector<json*> nodes;
    collect(doc, nodes);
    json& node = *nodes[1 + pick(rng, nodes.size() - 1)];
    const uint64_t op = pick(rng, 6);
    if (op <= 2) {
      node = hostile_value(rng);
      what += "value;";
    } else if (op == 3 && node.is_object() && !node.empty()) {
      auto it = node.begin();
      std::advance(it, pick(rng, node.size()));
      what += "erase " + it.key() + ";";
      node.erase(it);
    } else if (op == 3 && node.is_array() && !node.empty()) {
      node.erase(pick(rng, node.size()));
      what += "erase element;";
    } else if (op == 4 && node.is_array() && !node.empty()) {
      node.push_back(json(node[pick(rng, node.size())]));
      what += "duplicate element;";
    } else {
      node = json(*nodes[1 + pick(rng, nodes.size() - 1)]);  // another node's value (often another type)
      what += "swap;";
    }
  }
}

void mutate_bytes(std::string& b, std::mt19937_64& rng, std::string& what) {
  if (b.empty()) return;
  switch (pick(rng, 3)) {
    case 0: {
      const int flips = 1 + static_cast<int>(pick(rng, 8));
      for (int i = 0; i < flips; ++i) b[pick(rng, b.size())] ^= static_cast<char>(1 + pick(rng, 255));
      what += "flip;";
      break;
    }
    case 1:
      b.resize(pick(rng, b.size()));
      what += "truncate;";
      break;
    default:
      b.insert(pick(rng, b.size()), std::string(1 + pick(rng, 16), static_cast<char>(pick(rng, 256))));
      what += "insert;";
  }
}

uint64_t boundary_u64(std::mt19937_64& rng, uint64_t real) {
  const uint64_t v[] = {0, 1, 7, 8, real - 1, real + 1, real * 2, uint64_t{1} << 31, uint64_t{1} << 32,
                        (uint64_t{1} << 62) + real, uint64_t{1} << 63, UINT64_MAX, UINT64_MAX - 7, 100u << 20};
  return v[pick(rng, std::size(v))];
}

void set_u64(std::string& b, size_t at, uint64_t v) {
  if (at + 8 <= b.size()) std::memcpy(&b[at], &v, 8);
}

uint64_t get_u64(const std::string& b, size_t at) {
  uint64_t v = 0;
  if (at + 8 <= b.size()) std::memcpy(&v, &b[at], 8);
  return v;
}

// ---- fixtures: real files written by the code ------------------------------------

LlamaConfig tiny() {
  LlamaConfig c;
  c.vocab_size = 17, c.hidden_size = 8, c.intermediate_size = 12, c.num_layers = 2;
  c.num_heads = 2, c.num_kv_heads = 2;
  return c;
}

struct Files {
  std::string dir, ck_one, ck_many;
  ~Files() {
    std::error_code ec;
    if (dir.rfind("/dev/shm/", 0) == 0) fs::remove_all(dir, ec);
  }
};

const Files& files() {
  static const Files f = [] {
    Files x;
    // Thousands of small rewrites: on tmpfs where there is one (ext4 flushes a file
    // rewritten in place on every close, 5 ms each).
    x.dir = fresh_test_dir("fuzz");
    if (::access("/dev/shm", W_OK) == 0) {
      fs::remove_all(x.dir);
      x.dir = "/dev/shm/lns_fuzz_" + std::to_string(::getpid());
      fs::remove_all(x.dir);
      fs::create_directories(x.dir);
    }
    TrainConfig t;
    t.data = "random", t.seq_len = 4, t.micro_batch = 2, t.global_batch = 4, t.steps = 1;
    t.out_dir = x.dir + "/run";
    Trainer tr(tiny(), t);
    tr.train_step();
    x.ck_one = tr.save_checkpoint();
    const Checkpoint ck(x.ck_one);
    Layout l;
    l.tp = 2, l.pp = 2, l.dp = 2, l.zero = true;  // split pieces and ZeRO moment ranges
    x.ck_many = x.dir + "/many";
    write_checkpoint_from_source(ck, ck.config(), l, "", ck.run_state(), ck.info().optimizer->adam, 1, x.ck_many);
    return x;
  }();
  return f;
}

// Everything a tool does with an opened checkpoint: every tensor of every kind, and a
// load into a model built from its config (any layout would do; this is tp=1).
void use_checkpoint(const std::string& dir) {
  const Checkpoint ck(dir);
  for (const std::string& n : ck.tensor_names())
    for (const char* kind : {"param", "exp_avg", "exp_avg_sq"})
      if (ck.has(n, kind)) ck.logical(n, kind);
  const LlamaConfig cfg = ck.config();
  ParamSet ps = LlamaStage::stage_params(cfg, StageSpec::whole(cfg), {});
  ps.finalize();
  AdamW optim(ps, ck.has_optimizer_state() ? ck.info().optimizer->adam : AdamWConfig{});
  ck.load_into(ps, &optim);
}

TEST(Fuzz, CheckpointManifest) {
  const Files& f = files();
  struct Source {
    std::string dir, copy;
    json manifest;
  };
  std::vector<Source> sources;
  for (const std::string& d : {f.ck_one, f.ck_many}) {
    Source s{d, d + "_fuzz", json::parse(slurp(d + "/manifest.json"))};
    fs::remove_all(s.copy);
    fs::copy(d, s.copy);
    sources.push_back(std::move(s));
  }
  for (const Source& s : sources) EXPECT_NO_THROW(use_checkpoint(s.copy));  // the unmutated ones load
  fuzz("manifest", iterations(2000), 30, [&](std::mt19937_64& rng, std::string& what) {
    const Source& s = sources[pick(rng, sources.size())];
    std::string text;
    if (pick(rng, 10) < 8) {
      json m = s.manifest;
      mutate_json(m, rng, what);
      if (m.is_object() && pick(rng, 10) < 9) m["manifest_crc32"] = manifest_crc(m);  // the CRC is no protection
      text = m.dump(1);
    } else {
      text = s.manifest.dump(1);
      mutate_bytes(text, rng, what);
    }
    spit(s.copy + "/manifest.json", text);
    use_checkpoint(s.copy);
  });
}

TEST(Fuzz, SafetensorsHeader) {
  const Files& f = files();
  const std::string real = slurp(f.ck_many + "/rank_00003.safetensors");
  const uint64_t hlen = get_u64(real, 0);
  const json header = json::parse(real.substr(8, hlen));
  const std::string data = real.substr(8 + hlen);
  const std::string path = f.dir + "/fuzz.safetensors";
  fuzz("safetensors", iterations(5000), 30, [&](std::mt19937_64& rng, std::string& what) {
    std::string b;
    const uint64_t kind = pick(rng, 3);
    if (kind == 0) {  // the header's JSON, re-serialized with a consistent length
      json h = header;
      mutate_json(h, rng, what);
      const std::string text = h.dump();
      const uint64_t n = text.size();
      b.assign(reinterpret_cast<const char*>(&n), 8);
      b += text + data;
    } else if (kind == 1) {  // the length field
      b = real;
      set_u64(b, 0, boundary_u64(rng, hlen));
      what += "length;";
    } else {
      b = real;
      mutate_bytes(b, rng, what);
    }
    spit(path, b);
    const SafetensorsReader r(path);
    for (const auto& [name, e] : r.entries()) {
      if (is_float_dtype(e.dtype)) r.read_f32(name);
      else if (e.dtype == "I32" || e.dtype == "I64") r.read_i32(name);
    }
  });
}

// Reading a corpus as training and evaluation do: every document, and samples of both
// modes with every token checked against a vocabulary.
void use_corpus(const std::string& spec) {
  const auto c = TokenCorpus::open(spec);
  std::vector<int32_t> buf;
  for (int64_t d = 0; d < c->num_docs(); ++d) {
    const int64_t n = c->doc_end(d) - c->doc_begin(d);
    buf.resize(static_cast<size_t>(n));
    c->read(c->doc_begin(d), n, buf.data());
  }
  for (SampleMode mode : {SampleMode::Packed, SampleMode::Document}) {
    BatchSampler s(*c, mode, 4, 1, true, 1 << 20);
    std::vector<int32_t> in(4), tg(4);
    for (uint64_t i = 0; i < 8; ++i) s.fill(i, in.data(), tg.data());
  }
}

TEST(Fuzz, MegatronIndex) {
  const std::string prefix = files().dir + "/mega";
  // Written byte by byte from Megatron's documented layout: 5 sequences, 3 documents.
  const std::vector<std::vector<uint16_t>> seqs = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}, {10}, {11, 12, 13, 14, 15}};
  const std::vector<int64_t> doc_idx = {0, 2, 4, 5};
  std::string bin, idx("MMIDIDX\0\0", 9);
  auto put = [&](auto v) { idx.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint64_t{1});
  put(uint8_t{8});
  put(uint64_t(seqs.size()));
  put(uint64_t(doc_idx.size()));
  for (auto& s : seqs) put(int32_t(s.size()));
  int64_t ptr = 0;
  for (auto& s : seqs) {
    put(ptr);
    ptr += 2 * static_cast<int64_t>(s.size());
    bin.append(reinterpret_cast<const char*>(s.data()), 2 * s.size());
  }
  for (int64_t d : doc_idx) put(d);
  spit(prefix + ".idx", idx);
  spit(prefix + ".bin", bin);
  EXPECT_NO_THROW(use_corpus(prefix));
  const size_t ptrs = 34 + 4 * seqs.size();
  fuzz("megatron", iterations(30000), 30, [&](std::mt19937_64& rng, std::string& what) {
    std::string i = idx, b = bin;
    switch (pick(rng, 5)) {
      case 0:  // the counts S and D: 34 + 12*S + 8*D must not wrap into the real size
        set_u64(i, pick(rng, 2) ? 18 : 26, boundary_u64(rng, seqs.size()));
        what += "count;";
        break;
      case 1:  // a pointer or document-index entry
        set_u64(i, pick(rng, 2) ? ptrs + 8 * pick(rng, seqs.size()) : ptrs + 8 * seqs.size() + 8 * pick(rng, doc_idx.size()),
                boundary_u64(rng, 4));
        what += "entry;";
        break;
      case 2: {  // a sequence length
        const int32_t v = static_cast<int32_t>(boundary_u64(rng, 3));
        std::memcpy(&i[34 + 4 * pick(rng, seqs.size())], &v, 4);
        what += "length;";
        break;
      }
      case 3:
        mutate_bytes(i, rng, what);
        break;
      default:
        mutate_bytes(b, rng, what);
    }
    spit(prefix + ".idx", i);
    spit(prefix + ".bin", b);
    use_corpus(prefix);
  });
}

TEST(Fuzz, TokenFile) {
  const std::string path = files().dir + "/fuzz.tok";
  std::vector<int32_t> toks;
  for (int i = 0; i < 61; ++i) toks.push_back((i * 7) % 50);
  write_token_file(path, toks, {0, 10, 10, 33, 61}, 2, 50);
  const std::string real = slurp(path);
  EXPECT_NO_THROW(use_corpus(path));
  fuzz("token file", iterations(30000), 30, [&](std::mt19937_64& rng, std::string& what) {
    std::string b = real;
    switch (pick(rng, 3)) {
      case 0: {  // version, width, tokens, documents, vocabulary
        const size_t fields[] = {8, 12, 16, 24, 32};
        const size_t at = fields[pick(rng, std::size(fields))];
        set_u64(b, at, boundary_u64(rng, get_u64(real, at) & 0xffffffff));
        what += "header " + std::to_string(at) + ";";
        break;
      }
      case 1:  // a document offset
        set_u64(b, b.size() - 8 * (1 + pick(rng, 5)), boundary_u64(rng, 33));
        what += "offset;";
        break;
      default:
        mutate_bytes(b, rng, what);
    }
    spit(path, b);
    use_corpus(path);
  });
}

}  // namespace
}  // namespace lns
