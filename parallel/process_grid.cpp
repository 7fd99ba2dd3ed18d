#include "parallel/process_grid.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>

#include <cstdio>

#include "lns/errors.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_communicator.h"

namespace lns {

std::unique_ptr<ProcessGrid> ProcessGrid::single() {
  auto g = std::make_unique<ProcessGrid>();
  g->world_ = make_local_communicator();
  g->tp_ = make_local_communicator();
  g->dp_ = make_local_communicator();
  g->embed_ = make_local_communicator();
  return g;
}

std::unique_ptr<ProcessGrid> ProcessGrid::create_mpi(int tp, int pp) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  LNS_REQUIRE(tp >= 1 && pp >= 1, "--tp and --pp must be >= 1, got --tp=", tp, " --pp=", pp);
  LNS_REQUIRE(world % (tp * pp) == 0, "the world of ", world, " ranks is not divisible by --tp=",
              tp, " x --pp=", pp, "; launch a multiple of ", tp * pp, " ranks");
  auto g = std::make_unique<ProcessGrid>();
  g->rank = rank, g->world_size = world, g->tp = tp, g->pp = pp, g->dp = world / (tp * pp);
  g->tp_rank = rank % tp;
  g->dp_rank = (rank / tp) % g->dp;
  g->pp_rank = rank / (tp * g->dp);
  g->tp_color_ = g->dp_rank + g->pp_rank * g->dp;
  g->dp_color_ = g->tp_rank + g->pp_rank * tp;
  // The embedding group pairs the first and last stage of each (tp, dp); middle
  // stages form groups of one.
  const bool ends = g->pp_rank == 0 || g->pp_rank == pp - 1;
  g->embed_color_ = ends ? g->tp_rank + g->dp_rank * tp : tp * g->dp + rank;
  g->build_communicators(/*device=*/false, CommKind::Mpi);
  return g;
}

void ProcessGrid::use_device_communicators(CommKind comm) { build_communicators(true, comm); }

void ProcessGrid::build_communicators(bool device, CommKind comm) {
  auto wrap = [&](MPI_Comm c) -> std::unique_ptr<Communicator> {
    if (!device) return make_mpi_communicator(c);
    if (comm == CommKind::Nccl) return make_nccl_communicator(c);
    return make_host_staging_communicator(make_mpi_communicator(c));
  };
  auto split = [&](int color, int key) {
    MPI_Comm c;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &c);
    return wrap(c);
  };
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  // The world carries host values only (losses, norms, flags): MPI, never a third
  // NCCL communicator beside tp and dp (device tensors would be staged through host).
  world_ = device ? make_host_staging_communicator(make_mpi_communicator(world)) : make_mpi_communicator(world);
  tp_ = split(tp_color_, tp_rank);
  dp_ = split(dp_color_, dp_rank);
  embed_ = split(embed_color_, pp_rank);
}

std::string ProcessGrid::describe(const std::vector<std::pair<int, int>>& stage_layers) const {
  std::string s = absl::StrCat("world ", world_size, " = tp ", tp, " x dp ", dp, " x pp ", pp,
                               " (rank = tp + dp*", tp, " + pp*", tp * dp, ")");
  for (int p = 0; p < static_cast<int>(stage_layers.size()); ++p)
    absl::StrAppend(&s, "\n  stage ", p, ": layers ", stage_layers[p].first, "..",
                    stage_layers[p].second - 1, " (", stage_layers[p].second - stage_layers[p].first,
                    ")", p == 0 ? " + embedding" : "",
                    p + 1 == static_cast<int>(stage_layers.size()) ? " + final norm + head" : "",
                    ", ranks ", global_rank(0, 0, p), "..", global_rank(tp - 1, dp - 1, p));
  return s;
}

std::vector<std::pair<int, int>> stage_layer_ranges(int num_layers, int pp,
                                                    const std::string& pp_layers) {
  std::vector<int> counts;
  if (pp_layers.empty()) {
    LNS_REQUIRE(pp <= num_layers, "--pp=", pp, " stages for ", num_layers,
                " layers: every stage needs at least one layer");
    for (int p = 0; p < pp; ++p) counts.push_back(num_layers / pp + (p < num_layers % pp ? 1 : 0));
  } else {
    for (absl::string_view part : absl::StrSplit(pp_layers, ',')) {
      int c = 0;
      LNS_REQUIRE(absl::SimpleAtoi(part, &c) && c >= 1, "--pp_layers=", pp_layers,
                  ": expected positive layer counts per stage, e.g. 3,2,2");
      counts.push_back(c);
    }
    LNS_REQUIRE(static_cast<int>(counts.size()) == pp, "--pp_layers=", pp_layers, " names ",
                counts.size(), " stages but --pp=", pp);
    int sum = 0;
    for (int c : counts) sum += c;
    LNS_REQUIRE(sum == num_layers, "--pp_layers=", pp_layers, " adds up to ", sum,
                " layers but --num_layers=", num_layers);
  }
  std::vector<std::pair<int, int>> ranges;
  int first = 0;
  for (int c : counts) ranges.push_back({first, first + c}), first += c;
  return ranges;
}

bool all_ranks_started(const std::string& app, const std::string& error) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int failed = error.empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!any) return true;
  int mine = failed ? rank : world, first = world;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  char msg[1024] = {};
  if (rank == first) std::snprintf(msg, sizeof(msg), "%s", error.c_str());
  MPI_Bcast(msg, sizeof(msg), MPI_CHAR, first, MPI_COMM_WORLD);
  if (rank == 0)
    std::fprintf(stderr, "%s: error: %s%s\n", app.c_str(), msg,
                 world > 1 && first != 0 ? (" (rank " + std::to_string(first) + ")").c_str() : "");
  return false;
}

void validate_layout(const LlamaConfig& cfg, int tp, int pp) {
  LNS_REQUIRE(cfg.num_heads % tp == 0, "--num_heads=", cfg.num_heads,
              " must be divisible by --tp=", tp);
  LNS_REQUIRE(cfg.num_kv_heads % tp == 0, "--num_kv_heads=", cfg.num_kv_heads,
              " must be divisible by --tp=", tp);
  LNS_REQUIRE(pp <= cfg.num_layers, "--pp=", pp, " stages for --num_layers=", cfg.num_layers,
              ": every stage needs at least one layer");
}

}  // namespace lns
