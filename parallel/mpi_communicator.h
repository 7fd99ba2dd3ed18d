// The MPI implementation of Communicator (host memory).
#pragma once
#include <mpi.h>

#include "parallel/communicator.h"

namespace lns {

// Wraps `comm` (not owned when it is MPI_COMM_WORLD; split communicators are freed).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace lns
