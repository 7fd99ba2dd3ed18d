#include "parallel/layout.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include "lns/core/errors.h"
#include "lns/core/json_in.h"

namespace lns {
namespace {
constexpr int kMaxRanks = 1 << 20;  // a manifest's layout sizes are range-checked to this
}  // namespace

int Layout::rank_of(RankCoords c) const { return c.tp + c.dp * tp + c.pp * tp * dp; }

RankCoords Layout::coords_of(int rank) const { return {rank % tp, (rank / tp) % dp, rank / (tp * dp)}; }

std::pair<int, int> Layout::stage_range(int pp_rank) const {
  LNS_CHECK(virtual_stages == 1) << "a stage of an interleaved layout is several ranges: stage_chunks()";
  return stage_chunks(pp_rank)[0];
}

std::vector<std::pair<int, int>> Layout::stage_chunks(int pp_rank) const {
  LNS_CHECK(pp_rank >= 0 && pp_rank < pp && static_cast<int>(stage_layers.size()) == pp * virtual_stages)
      << "stage " << pp_rank << " of a layout with " << stage_layers.size()
      << " chunks split (layout_for_model fills the split)";
  std::vector<std::pair<int, int>> chunks;
  for (int c = 0; c < virtual_stages; ++c) chunks.push_back(stage_layers[chunk_index(pp_rank, c)]);
  return chunks;
}

ShardRange Layout::sequence_shard(int64_t tokens, int tp_rank) const {
  if (!sequence_parallel_on()) return {0, tokens, tokens, tokens};
  return shard_range(tokens, tp, tp_rank);
}

void Layout::check_sequence_length(int64_t seq_len) const {
  LNS_REQUIRE(!sequence_parallel_on() || seq_len % tp == 0, "--sequence_parallel needs --seq_len divisible by --tp, got --seq_len=",
              seq_len, " and --tp=", tp, " (pick a --seq_len that is a multiple of ", tp,
              ", or drop --sequence_parallel)");
}

std::string Layout::brief() const {
  return absl::StrCat("tp=", tp, " pp=", pp, " dp=", dp,
                      virtual_stages > 1 ? absl::StrCat(" vp=", virtual_stages) : "", zero ? " zero" : "",
                      sequence_parallel ? " sp" : "");
}

std::string Layout::describe() const {
  std::string s = absl::StrCat("world ", world_size(), " = tp ", tp, " x dp ", dp, " x pp ", pp,
                               " (rank = tp + dp*", tp, " + pp*", tp * dp, ")",
                               sequence_parallel_on() ? ", sequence parallel over tp" : "");
  if (virtual_stages > 1) absl::StrAppend(&s, ", ", virtual_stages, " model chunks per stage (interleaved)");
  if (static_cast<int>(stage_layers.size()) != pp * virtual_stages) return s;  // not split yet
  for (int p = 0; p < pp; ++p) {
    absl::StrAppend(&s, "\n  stage ", p, ": layers ");
    int count = 0;
    const auto chunks = stage_chunks(p);
    for (size_t c = 0; c < chunks.size(); ++c) {
      absl::StrAppend(&s, c ? ", " : "", chunks[c].first, "..", chunks[c].second - 1);
      count += chunks[c].second - chunks[c].first;
    }
    absl::StrAppend(&s, " (", count, ")", p == 0 ? " + embedding" : "", p + 1 == pp ? " + final norm + head" : "",
                    ", ranks ", rank_of({0, 0, p}), "..", rank_of({tp - 1, dp - 1, p}));
  }
  return s;
}

nlohmann::json Layout::to_json() const {
  nlohmann::json j = {{"tp", tp}, {"pp", pp}, {"dp", dp}, {"zero", zero}, {"stage_layers", stage_layers}};
  if (virtual_stages > 1) j["virtual_stages"] = virtual_stages;  // absent in older manifests: 1
  if (sequence_parallel) j["sequence_parallel"] = true;
  return j;
}

Layout Layout::from_json(const JsonIn& j, int num_layers) {
  Layout l;
  l.tp = static_cast<int>(j["tp"].integer(1, kMaxRanks));
  l.pp = static_cast<int>(j["pp"].integer(1, kMaxRanks));
  l.dp = static_cast<int>(j["dp"].integer(1, kMaxRanks));
  l.zero = j["zero"].boolean();
  if (j.has("virtual_stages")) l.virtual_stages = static_cast<int>(j["virtual_stages"].integer(1, kMaxRanks));
  l.sequence_parallel = j.has("sequence_parallel") && j["sequence_parallel"].boolean();
  const JsonIn stages = j["stage_layers"];
  if (stages.size() != static_cast<size_t>(int64_t{l.pp} * l.virtual_stages))
    stages.error("has ", std::to_string(stages.size()), " stages, layout.pp is ", std::to_string(l.pp),
                 l.virtual_stages > 1 ? absl::StrCat(" x virtual_stages ", l.virtual_stages) : "");
  int next = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto r = stages.at(s).integers(2, 2, 0, num_layers);
    if (r[0] != next || r[1] <= r[0])
      stages.at(s).error("stages must cover layers 0..", std::to_string(num_layers),
                         " in order, each at least one layer");
    l.stage_layers.emplace_back(static_cast<int>(r[0]), static_cast<int>(r[1]));
    next = static_cast<int>(r[1]);
  }
  if (next != num_layers) stages.error("covers ", std::to_string(next), " of ", std::to_string(num_layers), " layers");
  return l;
}

Layout layout_for_world(int tp, int pp, int world) {
  LNS_REQUIRE(tp >= 1 && pp >= 1, "--tp and --pp must be >= 1, got --tp=", tp, " --pp=", pp);
  LNS_REQUIRE(world % (int64_t{tp} * pp) == 0, "the world of ", world, " ranks is not divisible by --tp=", tp,
              " x --pp=", pp, "; launch a multiple of ", int64_t{tp} * pp, " ranks");
  Layout l;
  l.tp = tp, l.pp = pp, l.dp = world / (tp * pp);
  return l;
}

std::vector<std::pair<int, int>> split_layers(int num_layers, int pp, const std::string& pp_layers,
                                              int virtual_stages) {
  const int V = virtual_stages;
  LNS_REQUIRE(V >= 1 && V <= kMaxRanks, "--virtual_stages must be >= 1, got ", V);
  LNS_REQUIRE(V == 1 || pp > 1, "--virtual_stages=", V, " interleaves pipeline stages: it needs --pp > 1");
  // One range per model chunk; a stage is a chunk when V = 1, and the messages say so.
  const int64_t pieces = int64_t{pp} * V;
  const std::string what = V == 1 ? absl::StrCat("--pp=", pp, " stages")
                                  : absl::StrCat("--pp=", pp, " x --virtual_stages=", V, " = ", pieces, " model chunks");
  std::vector<int> counts;
  if (pp_layers.empty()) {
    LNS_REQUIRE(pieces <= num_layers, what, " for ", num_layers, " layers: every ",
                V == 1 ? "stage" : "chunk", " needs at least one layer");
    for (int k = 0; k < pieces; ++k) counts.push_back(num_layers / pieces + (k < num_layers % pieces ? 1 : 0));
  } else {
    for (absl::string_view part : absl::StrSplit(pp_layers, ',')) {
      int c = 0;
      LNS_REQUIRE(absl::SimpleAtoi(part, &c) && c >= 1, "--pp_layers=", pp_layers, ": expected positive layer counts per ",
                  V == 1 ? "stage, e.g. 3,2,2" : "model chunk in layer order, e.g. 2,2,2,1");
      counts.push_back(c);
    }
    LNS_REQUIRE(static_cast<int64_t>(counts.size()) == pieces, "--pp_layers=", pp_layers, " names ", counts.size(),
                V == 1 ? " stages but " : " model chunks but ", what);
    int64_t sum = 0;
    for (int c : counts) sum += c;
    LNS_REQUIRE(sum == num_layers, "--pp_layers=", pp_layers, " adds up to ", sum, " layers but --num_layers=",
                num_layers);
  }
  std::vector<std::pair<int, int>> ranges;
  int first = 0;
  for (int c : counts) ranges.push_back({first, first + c}), first += c;
  return ranges;
}

}  // namespace lns
