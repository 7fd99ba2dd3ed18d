#include "parallel/process_grid.h"

#include <cstdio>

#include "parallel/mpi_communicator.h"
#include "parallel/nccl_communicator.h"

namespace lns {

std::unique_ptr<ProcessGrid> ProcessGrid::single() {
  auto g = std::make_unique<ProcessGrid>();
  g->world_ = make_counting_communicator(make_local_communicator(), "world");
  g->tp_ = make_counting_communicator(make_local_communicator(), "tp");
  g->dp_ = make_counting_communicator(make_local_communicator(), "dp");
  g->embed_ = make_counting_communicator(make_local_communicator(), "embed");
  return g;
}

std::unique_ptr<ProcessGrid> ProcessGrid::create_mpi(int tp, int pp) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto g = std::make_unique<ProcessGrid>();
  g->layout = layout_for_world(tp, pp, world);
  g->rank = rank;
  const RankCoords c = g->coords = g->layout.coords_of(rank);
  // A group's color is the rank of its first member; the embedding group pairs the
  // first and last stage of each (tp, dp), middle stages form groups of one.
  g->tp_color_ = g->layout.rank_of({0, c.dp, c.pp});
  g->dp_color_ = g->layout.rank_of({c.tp, 0, c.pp});
  const bool ends = g->first_stage() || g->last_stage();
  g->embed_color_ = ends ? g->layout.rank_of({c.tp, c.dp, 0}) : world + rank;
  g->build_communicators(/*device=*/false, CommKind::Mpi);
  return g;
}

void ProcessGrid::use_device_communicators(CommKind comm) { build_communicators(true, comm); }

void ProcessGrid::build_communicators(bool device, CommKind comm) {
  // Every group's communicator counts its bytes (comm_counts); a new set of
  // communicators (use_device_communicators) starts from zero.
  auto wrap = [&](MPI_Comm c, const char* group) -> std::unique_ptr<Communicator> {
    if (!device) return make_counting_communicator(make_mpi_communicator(c), group);
    if (comm == CommKind::Nccl) return make_counting_communicator(make_nccl_communicator(c), group);
    return make_counting_communicator(make_host_staging_communicator(make_mpi_communicator(c)), group);
  };
  auto split = [&](int color, int key, const char* group) {
    MPI_Comm c;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &c);
    return wrap(c, group);
  };
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  // The world carries host values only (losses, norms, flags): MPI, never a third
  // NCCL communicator beside tp and dp (device tensors would be staged through host).
  world_ = make_counting_communicator(device ? make_host_staging_communicator(make_mpi_communicator(world))
                                            : make_mpi_communicator(world), "world");
  tp_ = split(tp_color_, coords.tp, "tp");
  dp_ = split(dp_color_, coords.dp, "dp");
  embed_ = split(embed_color_, coords.pp, "embed");
}

std::vector<std::pair<std::string, CommCounts>> ProcessGrid::comm_counts() const {
  // The world's sends are the pipeline's; its collectives are the step's scalars.
  const CommCounts w = world_->counts();
  CommCounts pp, world = w;
  const int send = static_cast<int>(Collective::Send);
  pp.calls[send] = w.calls[send], pp.bytes[send] = w.bytes[send];
  world.calls[send] = 0, world.bytes[send] = 0;
  return {{"tp", tp_->counts()}, {"dp", dp_->counts()}, {"pp", pp}, {"embed", embed_->counts()}, {"world", world}};
}

void ProcessGrid::abort_communicators() {
  for (Communicator* c : {tp_.get(), dp_.get(), embed_.get(), world_.get()})
    if (c) c->abort();
}

std::string ProcessGrid::communicator_error() {
  const std::pair<const char*, Communicator*> groups[] = {
      {"tp", tp_.get()}, {"dp", dp_.get()}, {"embed", embed_.get()}, {"world", world_.get()}};
  for (const auto& [name, c] : groups)
    if (c)
      if (std::string e = c->async_error(); !e.empty()) return std::string(name) + " communicator: " + e;
  return "";
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

}  // namespace lns
