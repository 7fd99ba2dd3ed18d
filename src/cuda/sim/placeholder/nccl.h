// TEMPORARY placeholder until the emulator's NCCL stand-in (src/cuda/sim/include/nccl.h,
// written separately) lands: the declarations parallel/nccl_communicator.cpp compiles
// against; ncclCommInitRank reports that NCCL is not emulated yet. CMake uses this
// directory only while src/cuda/sim/include/nccl.h does not exist.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

enum ncclResult_t { ncclSuccess = 0, ncclInternalError = 3, ncclInvalidUsage = 5 };
enum ncclDataType_t { ncclInt32 = 2, ncclUint8 = 1, ncclFloat32 = 7, ncclBfloat16 = 9 };
enum ncclRedOp_t { ncclSum = 0, ncclMax = 2 };
struct ncclUniqueId {
  char internal[128];
};
struct ncclComm;
typedef ncclComm* ncclComm_t;

const char* ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream);
