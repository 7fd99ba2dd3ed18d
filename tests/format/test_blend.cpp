// Weighted blends (--data=0.7:A,0.3:B): the text and its errors, the interleaving index
// (shares, a pure function of the position), and the blended stream against the
// sources' own samplers (issue 48).
#include <unistd.h>

#include <cmath>
#include <map>

#include "lns/data/data.h"
#include "lns/core/errors.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

std::string tmp(const std::string& name) {
  return ::testing::TempDir() + "/lns_blend_" + std::to_string(::getpid()) + "_" + name;
}

// Tokens base, base + 1, ... : every token says which corpus and where it came from.
std::string counting_file(const std::string& name, int32_t base, int64_t n) {
  std::vector<int32_t> toks(n);
  for (int64_t i = 0; i < n; ++i) toks[i] = base + static_cast<int32_t>(i);
  write_token_file(tmp(name), toks, {0, n}, 4, 0);
  return tmp(name);
}

TEST(BlendSpec, PlainFormsKeepTheirMeaning) {
  for (const std::string s : {"a.tok", "a.tok,b.tok", "data/c4/shard_*.tok", "data/x:y.tok", "d/index.json"}) {
    const BlendSpec b = parse_blend_spec(s, "--data");
    EXPECT_FALSE(b.weighted) << s;
    ASSERT_EQ(b.sources.size(), 1u) << s;
    EXPECT_EQ(b.sources[0].path, s);  // the whole text, to TokenCorpus::open as before
  }
}

TEST(BlendSpec, WeightsPathsAndShards) {
  BlendSpec b = parse_blend_spec("0.7:a.tok,0.3:data/b", "--data");
  EXPECT_TRUE(b.weighted);
  ASSERT_EQ(b.sources.size(), 2u);
  EXPECT_EQ(b.sources[0].path, "a.tok");
  EXPECT_EQ(b.sources[0].weight, 0.7);
  EXPECT_EQ(b.sources[1].path, "data/b");
  EXPECT_EQ(b.sources[1].weight, 0.3);
  // Items without a weight are more shards of the source before them.
  b = parse_blend_spec("2:a1.tok,a2.tok,1e0:d/shard_*.tok,5:x/a:b.tok,./c:d.tok", "--data");
  ASSERT_EQ(b.sources.size(), 3u);
  EXPECT_EQ(b.sources[0].path, "a1.tok,a2.tok");
  EXPECT_EQ(b.sources[0].weight, 2);
  EXPECT_EQ(b.sources[1].path, "d/shard_*.tok");
  EXPECT_EQ(b.sources[2].path, "x/a:b.tok,./c:d.tok");
  EXPECT_EQ(b.sources[2].weight, 5);
  b = parse_blend_spec("1:only.tok", "--val_data");  // one weighted source is a blend too
  EXPECT_TRUE(b.weighted);
  EXPECT_EQ(b.sources.size(), 1u);
}

TEST(BlendSpec, BadWeightsNameTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"x:a.tok,0.3:b.tok", "--data: the weight 'x' of source 1 is not a number"},
      {"0.7:a.tok,0.3.1:b.tok", "--data: the weight '0.3.1' of source 2 is not a number"},
      {":a.tok", "--data: the weight '' of source 1 is not a number"},
      {"-0.3:a.tok,1:b.tok", "--data: the weight -0.3 of source 1 (a.tok) is negative; weights must be positive"},
      {"0:a.tok,0:b.tok", "--data: the weight 0 of source 1 (a.tok) is zero; weights must be positive"},
      {"1:a.tok,0.0:b.tok", "--data: the weight 0.0 of source 2 (b.tok) is zero"},
      {"nan:a.tok", "--data: the weight 'nan' of source 1 is not a finite number"},
      {"1:a.tok,1e400:b.tok", "--data: the weight '1e400' of source 2 is not a finite number"},
      {"0.5:,0.5:b.tok", "--data: source 1 has the weight 0.5 but no path"},
      {"a.tok,0.3:b.tok", "--data: 'a.tok' has no weight but a later source does"},
      {"0.5:a.tok,0.5:a.tok", "--data: 'a.tok' is given twice (sources 1 and 2)"},
  };
  for (const auto& [spec, want] : cases) {
    const std::string e = error_of([&] { parse_blend_spec(spec, "--data"); });
    EXPECT_NE(e.find(want), std::string::npos) << spec << " -> " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  EXPECT_NE(error_of([&] { parse_blend_spec("1:a,-1:b", "--val_data"); }).find("--val_data: the weight -1"),
            std::string::npos);
  std::string many;
  for (int k = 0; k <= BlendIndex::kMaxSources; ++k) many += (k ? ",1:s" : "1:s") + std::to_string(k);
  EXPECT_NE(error_of([&] { parse_blend_spec(many, "--data"); }).find("4097 sources in the blend, at most 4096"),
            std::string::npos);
}

// Each source's count over positions [from, from + n) of the index.
std::vector<int64_t> counts(const BlendIndex& ix, uint64_t from, int64_t n) {
  std::vector<int64_t> c(ix.sources(), 0);
  for (int64_t i = 0; i < n; ++i) ++c[ix.at(from + i).source];
  return c;
}

TEST(BlendIndex, SharesWithinOnePointOverTenThousandSamples) {
  const std::vector<std::vector<double>> cases = {
      {0.7, 0.3}, {0.5, 0.3, 0.2}, {1 / 3.0, 1 / 3.0, 1 / 3.0}, {0.01, 0.99}, {0.123, 0.456, 0.321, 0.05, 0.05}};
  for (const auto& w : cases) {
    const BlendIndex ix(w, std::vector<std::string>(w.size(), "s"), "--data");
    // From the start, across the first period boundary (65536), and far into the stream.
    for (uint64_t from : {uint64_t{0}, uint64_t{60000}, uint64_t{1000000007}, uint64_t{1} << 40}) {
      const std::vector<int64_t> c = counts(ix, from, 10000);
      for (size_t k = 0; k < w.size(); ++k) {
        const double share = c[k] / 10000.0;
        EXPECT_LE(std::abs(share - w[k]), 0.01) << "source " << k << " from " << from;  // the bound
        // What the greedy index actually keeps: within 3 samples of the weight's count.
        EXPECT_LE(std::abs(c[k] - w[k] * 10000), 3.0) << "source " << k << " of " << w.size() << " from " << from
                                                      << ": " << c[k] << " samples, weight " << w[k];
      }
    }
  }
}

// at(i) is computed from i alone (period, position in it); a replay of the stream from 0
// that counts each source's samples must agree with it at every position, across
// period boundaries, and count_before must equal the replay's counts.
TEST(BlendIndex, PositionIsAPureFunctionAgreeingWithAReplay) {
  const std::vector<double> w = {0.5, 0.3, 0.2};
  const BlendIndex ix(w, {"a", "b", "c"}, "--data");
  std::vector<uint64_t> seen(3, 0);
  const uint64_t n = 3 * BlendIndex::kPeriod + 123;
  for (uint64_t i = 0; i < n; ++i) {
    const BlendIndex::Pick p = ix.at(i);
    ASSERT_EQ(p.index, seen[p.source]) << "position " << i;
    ++seen[p.source];
    if (i % 997 == 0 || i + 1 == n) {
      for (int k = 0; k < 3; ++k) ASSERT_EQ(ix.count_before(k, i + 1), seen[k]) << "position " << i;
    }
  }
  // Far away, the same rule: the sample index at position i is the count before it.
  for (uint64_t i : {uint64_t{123456789}, uint64_t{1} << 50}) {
    const BlendIndex::Pick p = ix.at(i);
    EXPECT_EQ(p.index, ix.count_before(p.source, i));
    EXPECT_EQ(ix.count_before(p.source, i + 1), p.index + 1);
  }
  // Equal weights alternate, the lower index first on a tie.
  const BlendIndex eq({0.5, 0.5}, {"a", "b"}, "--data");
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(eq.at(i).source, int(i % 2));
  // One source is the identity.
  const BlendIndex one({1.0}, {"a"}, "--data");
  EXPECT_EQ(one.at(987654321).index, 987654321u);
  EXPECT_EQ(one.count_before(0, 42), 42u);
}

TEST(BlendIndex, AWeightTooSmallToDrawIsNamed) {
  const std::string e = error_of([] { BlendIndex({1e-6, 1.0}, {"rare.tok", "big.tok"}, "--data"); });
  EXPECT_NE(e.find("--data: the weight of source 1 (rare.tok) is too small beside the others"), std::string::npos) << e;
  EXPECT_NE(e.find("draws no sample in 65536"), std::string::npos) << e;
}

// The blended stream, checked through the tokens it hands out: corpus A holds tokens
// 0.., B 10000..: each sample says where it came from, independently of the index.
TEST(BlendedSampler, ReadsEachSourcesOwnSamplerInTheIndexOrder) {
  const int64_t T = 4;
  const std::string a = counting_file("a", 0, 50 * T + 1), b = counting_file("b", 10000, 30 * T + 1);
  const auto blend = DataBlend::open("0.7:" + a + ",0.3:" + b, "--data");
  ASSERT_TRUE(blend->weighted());
  EXPECT_DOUBLE_EQ(blend->weight(0), 0.7);
  EXPECT_EQ(blend->name(1), b);
  BlendedSampler s(*blend, SampleMode::Packed, T, 11, true, 20000);
  // The sources' own samplers: A with the seed, B with seed + 2^32.
  BatchSampler sa(blend->corpus(0), SampleMode::Packed, T, 11, true, 20000);
  BatchSampler sb(blend->corpus(1), SampleMode::Packed, T, 11 + (uint64_t{1} << 32), true, 20000);
  std::vector<int32_t> in(T), tg(T), want_in(T), want_tg(T);
  uint64_t na = 0, nb = 0;
  const int64_t N = 10000;
  for (int64_t i = 0; i < N; ++i) {
    s.fill(i, in.data(), tg.data());
    const bool from_b = in[0] >= 10000;
    (from_b ? sb : sa).fill(from_b ? nb++ : na++, want_in.data(), want_tg.data());
    ASSERT_EQ(in, want_in) << "position " << i;
    ASSERT_EQ(tg, want_tg) << "position " << i;
    ASSERT_EQ(s.source_of(i), from_b ? 1 : 0);
  }
  // The requirement, measured on the tokens: within 1 point of the weights.
  EXPECT_LE(std::abs(double(na) / N - 0.7), 0.01) << na << " of " << N << " from A";
  EXPECT_LE(std::abs(double(nb) / N - 0.3), 0.01) << nb << " of " << N << " from B";
  s.set_consumed(N);
  EXPECT_EQ(s.samples_by_source(), (std::vector<uint64_t>{na, nb}));
  // Deterministic for a seed; another seed reads other samples.
  BlendedSampler again(*blend, SampleMode::Packed, T, 11, true, 20000), other(*blend, SampleMode::Packed, T, 12, true, 20000);
  int differ = 0;
  for (int64_t i = 0; i < 200; ++i) {
    s.fill(i, want_in.data(), want_tg.data());
    again.fill(i, in.data(), tg.data());
    ASSERT_EQ(in, want_in);
    other.fill(i, in.data(), tg.data());
    differ += in != want_in;
  }
  EXPECT_GT(differ, 100);
}

TEST(BlendedSampler, UnweightedDataIsTheSamplerOfBefore) {
  const int64_t T = 4;
  const std::string a = counting_file("plain_a", 0, 40 * T + 1), b = counting_file("plain_b", 500, 20 * T + 1);
  const auto blend = DataBlend::open(a + "," + b, "--data");  // two shards, one corpus: no weights
  EXPECT_FALSE(blend->weighted());
  ASSERT_EQ(blend->size(), 1);
  const auto corpus = TokenCorpus::open(a + "," + b);
  BlendedSampler s(*blend, SampleMode::Document, T, 5, true, 1000);
  BatchSampler want(*corpus, SampleMode::Document, T, 5, true, 1000);
  std::vector<int32_t> in(T), tg(T), wi(T), wt(T);
  for (uint64_t i = 0; i < 30; ++i) {
    EXPECT_EQ(s.fill(i, in.data(), tg.data()), want.fill(i, wi.data(), wt.data()));
    ASSERT_EQ(in, wi);
    ASSERT_EQ(tg, wt);
  }
}

// The data-parallel shares of a blended global batch, resumed from the consumed count
// alone: every rank reads its rows of the one-rank batch.
TEST(BlendedSampler, DataParallelSharesAndResume) {
  const int64_t T = 4, G = 8;
  const std::string a = counting_file("dp_a", 0, 64 * T + 1), b = counting_file("dp_b", 10000, 64 * T + 1);
  const auto blend = DataBlend::open("3:" + a + ",1:" + b, "--data");
  BlendedSampler whole(*blend, SampleMode::Packed, T, 5, true, 20000);
  OwnedTensor in(DType::I32, {G, T}), tg(DType::I32, {G, T});
  for (int step = 0; step < 7; ++step) whole.next_batch(G, 0, 1, in, tg);  // the 7th global batch
  int from_b = 0;
  for (int64_t r = 0; r < G; ++r) from_b += in.i32()[r * T] >= 10000;
  EXPECT_EQ(from_b, 2);  // a quarter of 8, exactly: the greedy index never drifts
  for (int r = 0; r < 4; ++r) {
    BlendedSampler rank(*blend, SampleMode::Packed, T, 5, true, 20000);
    rank.set_consumed(6 * G);  // resumed after six steps
    OwnedTensor ri(DType::I32, {2, T}), rt(DType::I32, {2, T});
    rank.next_batch(G, r, 4, ri, rt);
    EXPECT_EQ(rank.consumed(), uint64_t(7 * G));
    for (int64_t k = 0; k < 2 * T; ++k) ASSERT_EQ(ri.i32()[k], in.i32()[r * 2 * T + k]) << "rank " << r;
  }
  EXPECT_EQ(whole.samples_by_source(), (std::vector<uint64_t>{42, 14}));  // 56 samples, 3:1
}

TEST(DataBlend, ASourceThatCannotBeOpenedNamesTheFlagAndTheFile) {
  const std::string a = counting_file("open_a", 0, 41);
  const std::string e = error_of([&] { DataBlend::open("0.5:" + a + ",0.5:" + tmp("missing.tok"), "--val_data"); });
  EXPECT_NE(e.find("--val_data source 2 of 2: " + tmp("missing.tok") + ": data file not found"), std::string::npos) << e;
  // Unweighted data keeps its error of before.
  EXPECT_EQ(error_of([&] { DataBlend::open(tmp("missing.tok"), "--data"); }).rfind(tmp("missing.tok") + ": data file", 0),
            0u);
}

}  // namespace
}  // namespace lns
