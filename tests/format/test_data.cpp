// Token files (ours and Megatron's), and the samplers: determinism, coverage of an
// epoch, document-mode padding and masking, data-parallel shares, resumable state,
// and clear errors for damaged files and out-of-vocabulary tokens.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include "lns/data/data.h"
#include "lns/core/errors.h"
#include "lns/core/ops.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

std::string tmp(const std::string& name) {
  return ::testing::TempDir() + "/lns_data_" + std::to_string(::getpid()) + "_" + name;
}

std::string fs_name(const std::string& p) { return p.substr(p.rfind('/') + 1); }

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void spit(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

template <typename F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenFile, RoundTripBothWidths) {
  for (int width : {2, 4}) {
    std::vector<int32_t> toks = {5, 0, 65535, 17, 3, 9, 2};
    if (width == 4) toks[2] = 100000;
    const std::vector<int64_t> docs = {0, 3, 3, 7};  // an empty document is allowed
    const std::string p = tmp("rt" + std::to_string(width));
    write_token_file(p, toks, docs, width, 100001);
    auto c = TokenCorpus::open(p);
    EXPECT_EQ(c->num_tokens(), 7);
    EXPECT_EQ(c->num_docs(), 3);
    EXPECT_EQ(c->vocab_size(), 100001);
    EXPECT_EQ(c->doc_begin(2), 3);
    EXPECT_EQ(c->doc_end(2), 7);
    std::vector<int32_t> back(7);
    c->read(0, 7, back.data());
    EXPECT_EQ(back, toks);
  }
}

TEST(TokenFile, DamageIsAClearError) {
  const std::string p = tmp("good");
  write_token_file(p, {1, 2, 3, 4, 5}, {0, 2, 5}, 2, 10);
  const std::string bytes = slurp(p);

  spit(tmp("trunc"), bytes.substr(0, bytes.size() - 3));
  EXPECT_NE(user_error([&] { TokenCorpus::open(tmp("trunc")); }).find("truncated token file"),
            std::string::npos);
  std::string magic = bytes;
  magic[0] = 'X';
  spit(tmp("magic"), magic);
  EXPECT_NE(user_error([&] { TokenCorpus::open(tmp("magic")); }).find("bad magic"), std::string::npos);
  std::string width = bytes;
  width[12] = 3;
  spit(tmp("width"), width);
  EXPECT_NE(user_error([&] { TokenCorpus::open(tmp("width")); }).find("token width 3"),
            std::string::npos);
  // doc_starts sits after 64 header bytes and 5 tokens padded to 16 bytes: set
  // doc_starts[1] = 9, past doc_starts[2] = 5.
  std::string order = bytes;
  const int64_t past_end = 9;
  std::memcpy(&order[64 + 16 + 8], &past_end, 8);
  spit(tmp("order"), order);
  EXPECT_NE(user_error([&] { TokenCorpus::open(tmp("order")); }).find("document 1 ends before"),
            std::string::npos);
  EXPECT_NE(user_error([&] { TokenCorpus::open(tmp("missing")); }).find("data file not found"),
            std::string::npos);
}

TEST(TokenFile, ShardsReadAsOneCorpus) {
  // Three shards by list, by glob and by index.json read exactly as one file would.
  std::vector<int32_t> all;
  std::vector<int64_t> all_docs = {0};
  const std::string dir = tmp("shards_dir");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::string list, index = R"({"shards": [)";
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> toks;
    std::vector<int64_t> docs = {0};
    for (int d = 0; d < 4 + s; ++d) {
      for (int i = 0; i < 3 + d; ++i) toks.push_back((s * 100 + d * 10 + i) % 500);
      docs.push_back(static_cast<int64_t>(toks.size()));
    }
    const std::string name = "shard_" + std::to_string(s) + ".tok";
    write_token_file(dir + "/" + name, toks, docs, 2, 500);
    for (size_t d = 1; d < docs.size(); ++d) all_docs.push_back(static_cast<int64_t>(all.size()) + docs[d]);
    all.insert(all.end(), toks.begin(), toks.end());
    list += (s ? "," : "") + dir + "/" + name;
    index += std::string(s ? "," : "") + R"({"file": ")" + name + "\"}";
  }
  std::ofstream(dir + "/index.json") << index << "]}";
  write_token_file(tmp("joined"), all, all_docs, 2, 500);
  auto one = TokenCorpus::open(tmp("joined"));
  for (const std::string& spec : {list, dir + "/shard_*.tok", dir + "/index.json"}) {
    auto many = TokenCorpus::open(spec);
    ASSERT_EQ(many->num_tokens(), one->num_tokens()) << spec;
    ASSERT_EQ(many->num_docs(), one->num_docs()) << spec;
    for (int64_t d = 0; d <= one->num_docs(); ++d) ASSERT_EQ(many->doc_begin(std::min(d, one->num_docs() - 1)), one->doc_begin(std::min(d, one->num_docs() - 1)));
    std::vector<int32_t> a(one->num_tokens()), b(one->num_tokens());
    one->read(0, one->num_tokens(), a.data());
    many->read(0, many->num_tokens(), b.data());  // crosses every shard boundary
    EXPECT_EQ(a, b) << spec;
    BatchSampler sa(*one, SampleMode::Document, 6, 9, true, 500), sb(*many, SampleMode::Document, 6, 9, true, 500);
    std::vector<int32_t> ia(6), ta(6), ib(6), tb(6);
    for (uint64_t i = 0; i < 20; ++i) {
      sa.fill(i, ia.data(), ta.data());
      sb.fill(i, ib.data(), tb.data());
      ASSERT_EQ(ia, ib);
      ASSERT_EQ(ta, tb);
    }
  }
  EXPECT_NE(user_error([&] { TokenCorpus::open(dir + "/nothing_*.tok"); }).find("no data file matches"),
            std::string::npos);
}

// Megatron's .idx written byte by byte from its documented layout.
void write_megatron(const std::string& prefix, const std::vector<std::vector<uint16_t>>& seqs,
                    const std::vector<int64_t>& doc_idx) {
  std::string bin, idx("MMIDIDX\0\0", 9);
  auto put = [&](auto v) { idx.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint64_t{1});
  put(uint8_t{8});  // uint16
  put(uint64_t(seqs.size()));
  put(uint64_t(doc_idx.size()));
  for (auto& s : seqs) put(int32_t(s.size()));
  int64_t ptr = 0;
  for (auto& s : seqs) {
    put(ptr);
    ptr += 2 * s.size();
    bin.append(reinterpret_cast<const char*>(s.data()), 2 * s.size());
  }
  for (int64_t d : doc_idx) put(d);
  spit(prefix + ".bin", bin);
  spit(prefix + ".idx", idx);
}

TEST(MegatronDataset, ReadsTokensAndDocuments) {
  const std::string prefix = tmp("mega");
  // Three sequences; document 0 = sequences 0..1, document 1 = sequence 2.
  write_megatron(prefix, {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}}, {0, 2, 3});
  auto c = TokenCorpus::open(prefix);
  EXPECT_EQ(c->num_tokens(), 9);
  ASSERT_EQ(c->num_docs(), 2);
  EXPECT_EQ(c->doc_end(0), 5);
  EXPECT_EQ(c->doc_end(1), 9);
  std::vector<int32_t> t(9);
  c->read(0, 9, t.data());
  EXPECT_EQ(t, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  std::string idx = slurp(prefix + ".idx");
  spit(prefix + ".idx", idx.substr(0, idx.size() - 4));
  EXPECT_NE(user_error([&] { TokenCorpus::open(prefix); }).find("truncated Megatron index"),
            std::string::npos);
}

// Counts in a header that overflow 64 bits must not pass for the file's size: the old
// reader computed 34 + 12*S + 8*D, which wraps to the real size for S + 2^62, and then
// read 2^62 sequences past its mapping.
TEST(MegatronDataset, HostileCountsAreRefused) {
  const std::string prefix = tmp("mega_hostile");
  write_megatron(prefix, {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}}, {0, 2, 3});
  const std::string good = slurp(prefix + ".idx");
  auto with = [&](size_t at, uint64_t v) {
    std::string b = good;
    std::memcpy(&b[at], &v, 8);
    spit(prefix + ".idx", b);
    return user_error([&] { TokenCorpus::open(prefix); });
  };
  EXPECT_NE(with(18, 3 + (uint64_t{1} << 62)).find("corrupt or truncated Megatron index (4611686018427387907 sequences"),
            std::string::npos);
  EXPECT_NE(with(26, 3 + (uint64_t{1} << 61)).find("corrupt or truncated Megatron index"), std::string::npos);
  EXPECT_NE(with(18, ~uint64_t{0}).find("corrupt or truncated Megatron index"), std::string::npos);
  // Sequence pointers and lengths consistent with the .bin, document starts in order.
  EXPECT_NE(with(34 + 12, 2).find("sequence 0 is not stored contiguously"), std::string::npos);
  EXPECT_NE(with(34 + 12 + 8, 4).find("sequence 1 is not stored contiguously"), std::string::npos);
  const size_t doc_idx = 34 + 3 * 12;
  EXPECT_NE(with(doc_idx + 8, 9).find("document index entry 1 (9) is out of range or out of order"), std::string::npos);
  std::string order = good;
  const int64_t two = 2, one = 1;
  std::memcpy(&order[doc_idx], &two, 8);
  std::memcpy(&order[doc_idx + 8], &one, 8);
  spit(prefix + ".idx", order);
  EXPECT_NE(user_error([&] { TokenCorpus::open(prefix); }).find("out of range or out of order"), std::string::npos);
  // A length that makes the sequences outrun the .bin.
  std::string len = good;
  const int32_t big = INT32_MAX;
  std::memcpy(&len[34 + 8], &big, 4);
  spit(prefix + ".idx", len);
  EXPECT_NE(user_error([&] { TokenCorpus::open(prefix); }).find(".bin: has 18 bytes, the index describes at least"),
            std::string::npos);
}

TEST(TokenFile, HostileCountsAreRefused) {
  const std::string p = tmp("tok_hostile");
  write_token_file(p, {1, 2, 3, 4, 5}, {0, 2, 5}, 2, 10);
  const std::string good = slurp(p);
  auto with = [&](size_t at, uint64_t v) {
    std::string b = good;
    std::memcpy(&b[at], &v, 8);
    spit(p, b);
    return user_error([&] { TokenCorpus::open(p); });
  };
  // n * 2 wraps to 10 bytes for n = 2^63 + 5.
  EXPECT_NE(with(16, (uint64_t{1} << 63) + 5).find("corrupt or truncated token file (header says 9223372036854775813 tokens"),
            std::string::npos);
  EXPECT_NE(with(24, (uint64_t{1} << 61) - 1).find("corrupt or truncated token file"), std::string::npos);
  EXPECT_NE(with(24, ~uint64_t{0}).find("corrupt or truncated token file"), std::string::npos);
  EXPECT_NE(with(32, uint64_t{1} << 40).find("corrupt header (vocabulary size 1099511627776)"), std::string::npos);
  // Document starts outside the tokens.
  EXPECT_NE(with(64 + 16, 3).find("must span tokens 0..5"), std::string::npos);
  EXPECT_NE(with(64 + 16 + 16, 9).find("must span tokens 0..5"), std::string::npos);
  // index.json names only files in its own directory.
  const std::string dir = tmp("tok_index");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  write_token_file(tmp("outside.tok"), {1, 2, 3}, {0, 3}, 2, 10);
  for (const std::string& bad : std::vector<std::string>{"../" + fs_name(tmp("outside.tok")), "/etc/passwd", ".."}) {
    std::ofstream(dir + "/index.json") << R"({"shards": [{"file": ")" << bad << R"("}]})";
    EXPECT_NE(user_error([&] { TokenCorpus::open(dir + "/index.json"); })
                  .find("index.json: shards[0].file: '" + bad + "' is not a plain file name"),
              std::string::npos)
        << bad;
  }
  std::ofstream(dir + "/index.json") << "\x01\x02garbage";
  EXPECT_NE(user_error([&] { TokenCorpus::open(dir + "/index.json"); }).find("index.json: not valid JSON (syntax error at byte offset 0)"),
            std::string::npos);
}

// A corpus whose token at position i is i: a sample's first input names the sample.
std::unique_ptr<TokenCorpus> counting_corpus(int64_t n, const std::vector<int64_t>& docs,
                                             const std::string& name) {
  std::vector<int32_t> toks(n);
  for (int64_t i = 0; i < n; ++i) toks[i] = static_cast<int32_t>(i);
  write_token_file(tmp(name), toks, docs, 4, n);
  return TokenCorpus::open(tmp(name));
}

TEST(PackedSampler, EpochIsAPermutationAndSeedsDiffer) {
  const int64_t T = 8, n = 20 * T + 1;
  auto c = counting_corpus(n, {0, n}, "packed");
  BatchSampler s(*c, SampleMode::Packed, T, 7, true, n);
  ASSERT_EQ(s.samples_per_epoch(), 20);
  std::vector<int32_t> in(T), tg(T);
  std::vector<int64_t> epoch0, epoch1;
  for (uint64_t i = 0; i < 40; ++i) {
    EXPECT_EQ(s.fill(i, in.data(), tg.data()), T);
    for (int64_t t = 0; t < T; ++t) {  // contiguous window, targets shifted by one
      ASSERT_EQ(in[t], in[0] + t);
      ASSERT_EQ(tg[t], in[0] + t + 1);
    }
    (i < 20 ? epoch0 : epoch1).push_back(in[0] / T);
  }
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t k = 0; k < 20; ++k) EXPECT_EQ(sorted[k], k);  // every sample exactly once
  EXPECT_NE(epoch0, epoch1);  // a fresh order per epoch
  BatchSampler same(*c, SampleMode::Packed, T, 7, true, n), other(*c, SampleMode::Packed, T, 8, true, n);
  std::vector<int64_t> a, b;
  for (uint64_t i = 0; i < 20; ++i) {
    same.fill(i, in.data(), tg.data());
    a.push_back(in[0]);
    other.fill(i, in.data(), tg.data());
    b.push_back(in[0]);
  }
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k] / T, epoch0[k]);  // deterministic
  EXPECT_NE(a, b);  // the seed matters
}

TEST(DocumentSampler, TruncatesPadsAndMasks) {
  const int64_t T = 6;
  // Documents of 1 (skipped: no target), 4 (padded), 12 (truncated) and 7 = T+1 tokens.
  auto c = counting_corpus(24, {0, 1, 5, 17, 24}, "docs");
  BatchSampler s(*c, SampleMode::Document, T, 3, false, 24);
  ASSERT_EQ(s.samples_per_epoch(), 3);
  std::vector<int32_t> in(T), tg(T);
  EXPECT_EQ(s.fill(0, in.data(), tg.data()), 3);
  EXPECT_EQ(in, (std::vector<int32_t>{1, 2, 3, 4, 0, 0}));
  EXPECT_EQ(tg, (std::vector<int32_t>{2, 3, 4, kIgnoreIndex, kIgnoreIndex, kIgnoreIndex}));
  EXPECT_EQ(s.fill(1, in.data(), tg.data()), T);
  EXPECT_EQ(in, (std::vector<int32_t>{5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(tg, (std::vector<int32_t>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(s.fill(2, in.data(), tg.data()), T);
  EXPECT_EQ(tg.back(), 23);
}

TEST(BatchSampler, DataParallelSharesAndResumableState) {
  const int64_t T = 4, n = 64 * T + 1;
  auto c = counting_corpus(n, {0, n}, "dp");
  const int64_t G = 8;
  BatchSampler whole(*c, SampleMode::Packed, T, 5, true, n);
  OwnedTensor in(DType::I32, {G, T}), tg(DType::I32, {G, T});
  whole.next_batch(G, 0, 1, in, tg);
  whole.next_batch(G, 0, 1, in, tg);  // the second global batch
  for (int r = 0; r < 4; ++r) {       // four dp ranks, two samples each
    BatchSampler rank(*c, SampleMode::Packed, T, 5, true, n);
    rank.set_consumed(G);  // resumed after one step
    OwnedTensor ri(DType::I32, {2, T}), rt(DType::I32, {2, T});
    rank.next_batch(G, r, 4, ri, rt);
    EXPECT_EQ(rank.consumed(), uint64_t(2 * G));
    for (int64_t k = 0; k < 2 * T; ++k) ASSERT_EQ(ri.i32()[k], in.i32()[r * 2 * T + k]);
  }
}

TEST(BatchSampler, OutOfVocabularyTokensAreNamed) {
  write_token_file(tmp("oov"), {1, 2, 300, 4, 5, 6, 7, 8, 9}, {0, 9}, 2, 0);
  auto c = TokenCorpus::open(tmp("oov"));
  BatchSampler s(*c, SampleMode::Packed, 4, 1, false, 257);
  std::vector<int32_t> in(4), tg(4);
  const std::string e = user_error([&] { s.fill(0, in.data(), tg.data()); });
  EXPECT_NE(e.find("token id 300 at position 2 is outside the model's vocabulary [0, 257)"),
            std::string::npos) << e;
  EXPECT_NE(e.find(tmp("oov")), std::string::npos);
  write_token_file(tmp("bigvocab"), {1, 2, 3, 4, 5}, {0, 5}, 2, 50000);
  auto big = TokenCorpus::open(tmp("bigvocab"));
  EXPECT_NE(user_error([&] { BatchSampler(*big, SampleMode::Packed, 2, 1, false, 257); })
                .find("vocabulary of 50000 tokens, larger than the model's 257 (--vocab_size)"),
            std::string::npos);
}

}  // namespace
}  // namespace lns
