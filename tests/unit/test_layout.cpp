// The parallel layout as a pure value (parallel/layout.h), checked against
// independent computations: the Megatron rank order enumerated by nested loops, the
// stage split and the ZeRO shard by counting, the manifest object against the text
// existing checkpoints hold. No MPI here; tests/mpi/ runs the same layouts for real.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "lns/core/errors.h"
#include "lns/core/json_in.h"
#include "lns/model/model_layout.h"
#include "lns/model/param_set.h"
#include "parallel/communicator.h"
#include "parallel/layout.h"

namespace lns {
namespace {

void expect_user_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

Layout sizes(int tp, int pp, int dp) {
  Layout l;
  l.tp = tp, l.pp = pp, l.dp = dp;
  return l;
}

// Megatron order by enumeration: ranks are handed out with tp innermost, then dp,
// then pp, so a running counter over the nested loops is the rank.
TEST(Layout, RankOrderIsMegatronAndRoundTrips) {
  for (int tp : {1, 2, 3, 4})
    for (int pp : {1, 2, 3})
      for (int dp : {1, 2, 5}) {
        const Layout l = sizes(tp, pp, dp);
        ASSERT_EQ(l.world_size(), tp * pp * dp);
        int counter = 0;
        for (int p = 0; p < pp; ++p)
          for (int d = 0; d < dp; ++d)
            for (int t = 0; t < tp; ++t, ++counter) {
              EXPECT_EQ(l.rank_of({t, d, p}), counter) << tp << " " << pp << " " << dp;
              EXPECT_EQ(l.coords_of(counter), (RankCoords{t, d, p})) << counter;
            }
      }
}

TEST(Layout, ProcessGridExampleOfTheDocs) {
  // docs/parallelism.md: 8 ranks = tp 2 x dp 2 x pp 2; rank 6 is tp 0, dp 1, pp 1.
  const Layout l = layout_for_world(2, 2, 8);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.coords_of(6), (RankCoords{0, 1, 1}));
  EXPECT_EQ(l.rank_of({1, 0, 1}), 5);
}

TEST(Layout, WorldSizeIsValidated) {
  EXPECT_EQ(layout_for_world(1, 1, 7).dp, 7);
  EXPECT_EQ(layout_for_world(3, 2, 12).dp, 2);
  expect_user_error([] { layout_for_world(4, 1, 6); }, "the world of 6 ranks is not divisible by --tp=4 x --pp=1");
  expect_user_error([] { layout_for_world(2, 3, 8); }, "launch a multiple of 6 ranks");
  expect_user_error([] { layout_for_world(0, 1, 4); }, "--tp and --pp must be >= 1");
  expect_user_error([] { layout_for_world(1, -2, 4); }, "--pp=-2");
}

// Even split: stage sizes differ by at most one, the larger ones first, contiguous
// and covering every layer.
TEST(Layout, EvenStageSplit) {
  for (int layers = 1; layers <= 13; ++layers)
    for (int pp = 1; pp <= layers; ++pp) {
      const auto r = split_layers(layers, pp, "");
      ASSERT_EQ(static_cast<int>(r.size()), pp);
      int next = 0, prev_size = layers + 1;
      for (const auto& [first, last] : r) {
        EXPECT_EQ(first, next);
        const int size = last - first;
        EXPECT_GE(size, 1);
        EXPECT_LE(size, prev_size);  // extra layers on the first stages
        EXPECT_TRUE(size == layers / pp || size == layers / pp + 1);
        prev_size = size, next = last;
      }
      EXPECT_EQ(next, layers);
    }
  EXPECT_EQ(split_layers(7, 3, ""), (std::vector<std::pair<int, int>>{{0, 3}, {3, 5}, {5, 7}}));
}

TEST(Layout, ExplicitStageSplit) {
  EXPECT_EQ(split_layers(7, 3, "1,4,2"), (std::vector<std::pair<int, int>>{{0, 1}, {1, 5}, {5, 7}}));
  expect_user_error([] { split_layers(7, 3, "3,2"); }, "--pp_layers=3,2 names 2 stages but --pp=3");
  expect_user_error([] { split_layers(7, 2, "3,3"); }, "adds up to 6 layers but --num_layers=7");
  expect_user_error([] { split_layers(7, 2, "5,x"); }, "expected positive layer counts");
  expect_user_error([] { split_layers(7, 2, "7,0"); }, "expected positive layer counts");
  expect_user_error([] { split_layers(2, 3, ""); }, "every stage needs at least one layer");
  // Counts whose int sum would overflow are refused, not wrapped.
  expect_user_error([] { split_layers(7, 2, "2147483647,2147483647"); }, "adds up to 4294967294");
}

TEST(Layout, StageRangeAndSpec) {
  LlamaConfig cfg;
  cfg.num_layers = 7, cfg.num_heads = 4, cfg.num_kv_heads = 2;
  const Layout l = layout_for_model(cfg, sizes(2, 3, 1), "");
  EXPECT_EQ(l.stage_range(1), (std::pair<int, int>{3, 5}));
  const StageSpec first = stage_spec(l, 0), mid = stage_spec(l, 1), last = stage_spec(l, 2);
  EXPECT_EQ(first.first_layer, 0);
  EXPECT_EQ(first.last_layer, 3);
  EXPECT_TRUE(first.has_embedding);
  EXPECT_FALSE(first.has_head);
  EXPECT_EQ(mid.first_layer, 3);
  EXPECT_EQ(mid.last_layer, 5);
  EXPECT_FALSE(mid.has_embedding);
  EXPECT_FALSE(mid.has_head);
  EXPECT_EQ(last.first_layer, 5);
  EXPECT_EQ(last.last_layer, 7);
  EXPECT_FALSE(last.has_embedding);
  EXPECT_TRUE(last.has_head);
}

TEST(Layout, ModelConstraints) {
  LlamaConfig cfg;
  cfg.num_layers = 3, cfg.num_heads = 6, cfg.num_kv_heads = 2;
  EXPECT_EQ(layout_for_model(cfg, sizes(2, 3, 1), "").stage_layers.size(), 3u);
  expect_user_error([&] { layout_for_model(cfg, sizes(4, 1, 1), ""); }, "--num_heads=6 must be divisible by --tp=4");
  expect_user_error([&] { layout_for_model(cfg, sizes(3, 1, 1), ""); }, "--num_kv_heads=2 must be divisible by --tp=3");
  expect_user_error([&] { layout_for_model(cfg, sizes(1, 4, 1), ""); }, "--pp=4 stages for --num_layers=3");
  expect_user_error([&] { layout_for_model(cfg, sizes(1, 2, 1), "1,1"); }, "adds up to 2 layers");
}

// The ZeRO shard: equal padded shares that tile [0, n) without overlap, in dp order.
TEST(Layout, ZeroShardTilesTheBuffer) {
  for (int dp : {1, 2, 3, 7})
    for (int64_t n : {int64_t{1}, int64_t{6}, int64_t{7}, int64_t{1000}, int64_t{1} << 33}) {
      const Layout l = sizes(1, 1, dp);
      const int64_t share = (n + dp - 1) / dp;  // ceil, as reduce-scatter needs equal sizes
      int64_t next = 0;
      for (int d = 0; d < dp; ++d) {
        const ShardRange s = l.zero_shard(n, d);
        EXPECT_EQ(s.size, share);
        EXPECT_EQ(s.begin, d * share);
        EXPECT_EQ(s.end(), s.begin + s.valid);
        if (s.begin >= n) {  // more ranks than elements: an empty share past the end
          EXPECT_EQ(s.valid, 0);
          continue;
        }
        EXPECT_EQ(s.begin, next);
        EXPECT_EQ(s.end(), std::min(n, (d + 1) * share));
        next = s.end();
      }
      EXPECT_EQ(next, n) << "dp " << dp;
    }
}

// The manifest's "layout" object is what existing checkpoints hold, byte for byte.
TEST(Layout, ManifestObjectIsUnchanged) {
  Layout l = sizes(2, 2, 2);
  l.zero = true, l.stage_layers = {{0, 3}, {3, 5}};
  EXPECT_EQ(l.to_json().dump(), R"({"dp":2,"pp":2,"stage_layers":[[0,3],[3,5]],"tp":2,"zero":true})");
  const nlohmann::json j = l.to_json();
  EXPECT_EQ(Layout::from_json(JsonIn(j, "m.json", "layout"), 5), l);
  nlohmann::json bad = j;
  bad["stage_layers"] = {{0, 2}, {3, 5}};
  expect_user_error([&] { Layout::from_json(JsonIn(bad, "m.json", "layout"), 5); }, "m.json: layout.stage_layers[1]");
  bad = j;
  bad["tp"] = 0;
  expect_user_error([&] { Layout::from_json(JsonIn(bad, "m.json", "layout"), 5); }, "m.json: layout.tp");
  expect_user_error([&] { Layout::from_json(JsonIn(j, "m.json", "layout"), 6); }, "covers 5 of 6 layers");
}

TEST(Layout, OnePrinter) {
  Layout l = layout_for_world(2, 2, 8);
  l.stage_layers = split_layers(7, 2, "");
  EXPECT_EQ(l.brief(), "tp=2 pp=2 dp=2");
  l.set_zero(true);
  EXPECT_EQ(l.brief(), "tp=2 pp=2 dp=2 zero");
  l.set_zero(false);
  EXPECT_EQ(l.brief(), "tp=2 pp=2 dp=2");
  Layout one = l;
  one.dp = 1;
  one.set_zero(true);  // the default --zero at dp = 1: nothing to shard, nothing said
  EXPECT_FALSE(one.zero);
  EXPECT_EQ(one.brief(), "tp=2 pp=2 dp=1");
  EXPECT_EQ(l.describe(),
            "world 8 = tp 2 x dp 2 x pp 2 (rank = tp + dp*2 + pp*4)\n"
            "  stage 0: layers 0..3 (4) + embedding, ranks 0..3\n"
            "  stage 1: layers 4..6 (3) + final norm + head, ranks 4..7");
}

// Virtual stages: pp * V model chunks, dealt round-robin (chunk k = c*pp + s is chunk
// c of stage s), layer numbers global; the manifest, the printer and the flags say so.
TEST(Layout, VirtualStagesDealChunksRoundRobin) {
  LlamaConfig cfg;
  cfg.num_layers = 7, cfg.num_heads = 4, cfg.num_kv_heads = 2;
  Layout want = sizes(1, 2, 1);
  want.virtual_stages = 3;
  const Layout l = layout_for_model(cfg, want, "");
  // 7 layers over 6 chunks: the first chunk takes the extra one.
  EXPECT_EQ(l.stage_layers, (std::vector<std::pair<int, int>>{{0, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}}));
  EXPECT_EQ(l.stage_chunks(0), (std::vector<std::pair<int, int>>{{0, 2}, {3, 4}, {5, 6}}));
  EXPECT_EQ(l.stage_chunks(1), (std::vector<std::pair<int, int>>{{2, 3}, {4, 5}, {6, 7}}));
  const StageSpec first = stage_spec(l, 0), last = stage_spec(l, 1);
  EXPECT_EQ(first.chunk_ranges(), l.stage_chunks(0));
  EXPECT_EQ(first.num_chunks(), 3);
  EXPECT_EQ(first.first_layer, 0);
  EXPECT_EQ(first.last_layer, 2);
  EXPECT_TRUE(first.has_embedding && !first.has_head);
  EXPECT_EQ(last.chunk_ranges(), l.stage_chunks(1));
  EXPECT_TRUE(!last.has_embedding && last.has_head);
  // Every layer on exactly one stage, each stage's chunks in layer order.
  std::vector<int> owner(7, -1);
  for (int s = 0; s < 2; ++s)
    for (const auto& [a, b] : l.stage_chunks(s))
      for (int g = a; g < b; ++g) EXPECT_EQ(std::exchange(owner[g], s), -1) << g;
  for (int g = 0; g < 7; ++g) EXPECT_GE(owner[g], 0) << g;
  // Ranks of the next and previous chunk wrap from the last stage to the first.
  const Layout w = layout_for_world(2, 3, 12);
  EXPECT_EQ(w.next_stage_rank({1, 1, 2}), w.rank_of({1, 1, 0}));
  EXPECT_EQ(w.prev_stage_rank({1, 1, 0}), w.rank_of({1, 1, 2}));
  EXPECT_EQ(w.next_stage_rank({1, 0, 0}), w.rank_of({1, 0, 1}));
  // --pp_layers names one count per chunk.
  EXPECT_EQ(split_layers(7, 2, "1,2,1,3", 2), (std::vector<std::pair<int, int>>{{0, 1}, {1, 3}, {3, 4}, {4, 7}}));
  expect_user_error([] { split_layers(7, 2, "3,4", 2); },
                    "--pp_layers=3,4 names 2 model chunks but --pp=2 x --virtual_stages=2 = 4 model chunks");
  expect_user_error([&] { layout_for_model(cfg, [] { Layout x = sizes(1, 4, 1); x.virtual_stages = 2; return x; }(), ""); },
                    "--pp=4 x --virtual_stages=2 = 8 model chunks for 7 layers: every chunk needs at least one layer");
  expect_user_error([] { split_layers(7, 1, "", 2); }, "--virtual_stages=2 interleaves pipeline stages: it needs --pp > 1");
  expect_user_error([] { split_layers(7, 2, "", 0); }, "--virtual_stages must be >= 1, got 0");
  // The manifest: "virtual_stages" written when above 1, and read back.
  EXPECT_EQ(l.to_json().dump(),
            R"({"dp":1,"pp":2,"stage_layers":[[0,2],[2,3],[3,4],[4,5],[5,6],[6,7]],"tp":1,"virtual_stages":3,"zero":false})");
  EXPECT_EQ(Layout::from_json(JsonIn(l.to_json(), "m.json", "layout"), 7), l);
  nlohmann::json bad = l.to_json();
  bad["virtual_stages"] = 2;
  expect_user_error([&] { Layout::from_json(JsonIn(bad, "m.json", "layout"), 7); },
                    "m.json: layout.stage_layers: has 6 stages, layout.pp is 2 x virtual_stages 2");
  bad["virtual_stages"] = 0;
  expect_user_error([&] { Layout::from_json(JsonIn(bad, "m.json", "layout"), 7); }, "m.json: layout.virtual_stages");
  EXPECT_EQ(l.brief(), "tp=1 pp=2 dp=1 vp=3");
  EXPECT_EQ(l.describe(),
            "world 2 = tp 1 x dp 1 x pp 2 (rank = tp + dp*1 + pp*1), 3 model chunks per stage (interleaved)\n"
            "  stage 0: layers 0..1, 3..3, 5..5 (4) + embedding, ranks 0..0\n"
            "  stage 1: layers 2..2, 4..4, 6..6 (3) + final norm + head, ranks 1..1");
}

// Who reports a parameter once: split tensors on every tp rank (each its own slice),
// replicated ones on tp rank 0, the tied head copy nowhere.
TEST(Layout, CountedOnce) {
  ParamInfo split, replicated, tied;
  split.split_dim = 0, replicated.split_dim = -1, tied.split_dim = 0, tied.tied_copy = true;
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(split.counted_on(r));
    EXPECT_EQ(replicated.counted_on(r), r == 0);
    EXPECT_FALSE(tied.counted_on(r));
  }
}

// Sequence parallelism is part of the layout value: its token split, its refusal of a
// sequence length that tp does not divide, its manifest field and its printers.
TEST(Layout, SequenceParallel) {
  Layout l = sizes(4, 1, 1);
  EXPECT_FALSE(l.sequence_parallel_on());
  EXPECT_EQ(l.sequence_shard(24, 2).begin, 0);  // off: every rank holds every token
  EXPECT_EQ(l.sequence_shard(24, 2).valid, 24);
  l.sequence_parallel = true;
  ASSERT_TRUE(l.sequence_parallel_on());
  int64_t next = 0;  // contiguous quarters that tile the 24 tokens
  for (int r = 0; r < 4; ++r) {
    const ShardRange s = l.sequence_shard(24, r);
    EXPECT_EQ(s.begin, next);
    EXPECT_EQ(s.size, 6);
    EXPECT_EQ(s.valid, 6);
    next = s.end();
  }
  EXPECT_EQ(next, 24);
  l.check_sequence_length(12);
  expect_user_error([&] { l.check_sequence_length(10); },
                    "--sequence_parallel needs --seq_len divisible by --tp, got --seq_len=10 and --tp=4");
  // With one tp rank there is nothing to split: accepted, and no effect.
  Layout one = sizes(1, 2, 2);
  one.sequence_parallel = true;
  EXPECT_FALSE(one.sequence_parallel_on());
  one.check_sequence_length(7);
  // The manifest records it only when asked; old manifests (without it) read as off.
  l.stage_layers = {{0, 5}};
  EXPECT_EQ(l.to_json().dump(),
            R"({"dp":1,"pp":1,"sequence_parallel":true,"stage_layers":[[0,5]],"tp":4,"zero":false})");
  const nlohmann::json j = l.to_json();
  EXPECT_EQ(Layout::from_json(JsonIn(j, "m.json", "layout"), 5), l);
  nlohmann::json bad = j;
  bad["sequence_parallel"] = 1;
  expect_user_error([&] { Layout::from_json(JsonIn(bad, "m.json", "layout"), 5); }, "m.json: layout.sequence_parallel");
  EXPECT_EQ(l.brief(), "tp=4 pp=1 dp=1 sp");
  EXPECT_NE(l.describe().find("sequence parallel over tp"), std::string::npos) << l.describe();
}

// A communicator of p ranks that moves nothing, to see what the counter makes of
// each call.
class NullComm : public Communicator {
 public:
  explicit NullComm(int p) : p_(p) {}
  int rank() const override { return 0; }
  int size() const override { return p_; }
  void all_reduce(Tensor, ReduceOp) override {}
  void all_reduce(double*, int, ReduceOp) override {}
  void all_gather(Tensor, Tensor) override {}
  void reduce_scatter(Tensor, Tensor) override {}
  void broadcast(Tensor, int) override {}
  void reduce(Tensor, int) override {}
  void send(Tensor, int, int) override {}
  void recv(Tensor, int, int) override {}
  void wait_sends() override {}
  void barrier() override {}
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>&) override { return {}; }

 private:
  int p_;
};

// The byte counter against the ring formulas written out by hand for p = 4 ranks:
// all-reduce 2*(p-1)/p*S, all-gather and reduce-scatter (p-1)/p*S of the full
// buffer, reduce to one root (p-1)/p*S, send S; one rank counts nothing.
TEST(CommCounter, RingBytesPerKind) {
  auto c = make_counting_communicator(std::make_unique<NullComm>(4));
  std::vector<float> full(400), part(100);
  const Tensor F{full.data(), DType::F32, Device::CPU, Shape{400}}, P{part.data(), DType::F32, Device::CPU, Shape{100}};
  c->all_reduce(F, ReduceOp::Sum);   // 1600 bytes: 2 * 3/4 * 1600 = 2400
  c->all_reduce_start(P);            // 400 bytes: 600
  c->all_gather(F, P);               // 3/4 * 1600 = 1200
  c->reduce_scatter(P, F);           // 1200
  c->send(P, 1, 0);                  // 400
  c->reduce(F, 2);                   // 3/4 * 1600 = 1200
  c->reduce_start(P, 0);             // 300
  double v[3] = {};
  c->all_reduce(v, 3, ReduceOp::Max);  // 24 bytes: 36
  const CommCounts n = c->counts();
  auto at = [&](Collective k) { return static_cast<int>(k); };
  EXPECT_EQ(n.calls[at(Collective::AllReduce)], 3);
  EXPECT_DOUBLE_EQ(n.bytes[at(Collective::AllReduce)], 2400 + 600 + 36);
  EXPECT_EQ(n.calls[at(Collective::AllGather)], 1);
  EXPECT_DOUBLE_EQ(n.bytes[at(Collective::AllGather)], 1200);
  EXPECT_DOUBLE_EQ(n.bytes[at(Collective::ReduceScatter)], 1200);
  EXPECT_DOUBLE_EQ(n.bytes[at(Collective::Send)], 400);
  EXPECT_DOUBLE_EQ(n.bytes[at(Collective::Broadcast)], 0);
  EXPECT_EQ(n.calls[at(Collective::Reduce)], 2);
  EXPECT_DOUBLE_EQ(n.bytes[at(Collective::Reduce)], 1500);
  EXPECT_DOUBLE_EQ(n.total_bytes(), 3036 + 2400 + 400 + 1500);
  EXPECT_DOUBLE_EQ((n - n).total_bytes(), 0);
  EXPECT_STREQ(collective_name(Collective::ReduceScatter), "reduce_scatter");
  EXPECT_STREQ(collective_name(Collective::Reduce), "reduce");
  auto one = make_counting_communicator(make_local_communicator());
  one->all_reduce(F, ReduceOp::Sum);
  EXPECT_DOUBLE_EQ(one->counts().total_bytes(), 0);
}

}  // namespace
}  // namespace lns
