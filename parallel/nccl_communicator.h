// The NCCL implementation of Communicator, for CUDA runs with one GPU per rank.
#pragma once
#include <mpi.h>

#include "parallel/communicator.h"

namespace lns {

// Collectives (all-reduce, all-gather, reduce-scatter, broadcast) of CUDA tensors go
// through NCCL on the compute stream, so they are ordered with the kernels around
// them without a host synchronisation. The NCCL unique id is created by rank 0 of
// `comm` and broadcast over MPI. Host tensors, point-to-point messages (pipeline) and
// the small host collectives go through MPI with host staging; NCCL's send/recv
// would need the schedule's sends and receives grouped, which the 1F1B schedule does
// not do yet. UserError if this build has no CUDA, or NCCL cannot start (e.g. two
// ranks on one GPU: use --comm=mpi).
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm);

}  // namespace lns
