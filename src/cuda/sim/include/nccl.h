// Emulation build (-DLNS_CUDA_SIM=ON) stand-in for NCCL: the calls
// parallel/nccl_communicator.cpp makes, with NCCL's names and signatures, carried out
// over MPI (one emulated device per rank, any number of ranks per machine). Every
// collective is queued on its stream and moves data when the stream reaches it, as on
// a GPU. Checked on top of what NCCL checks: buffers inside live device allocations,
// NCCL's in-place rules, every rank issuing the same call with the same arguments in
// the same order. Implementation: src/cuda/sim/nccl.cpp; limits: docs/cuda.md.
#pragma once
#include <cstddef>

struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // as the runtime shim and sim_api.h spell it

#define NCCL_MAJOR 2
#define NCCL_MINOR 21
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE 22100
#define NCCL_UNIQUE_ID_BYTES 128

typedef struct ncclComm* ncclComm_t;
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 10
} ncclDataType_t;

const char* ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetVersion(int* version);

// Needs MPI initialised: the emulated bootstrap rendezvous runs over MPI_COMM_WORLD at
// the world rank that created the id, which must itself join the communicator.
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
// Binds the communicator to the current device. Two ranks on one device of one host:
// ncclInvalidUsage on every rank, as NCCL reports a duplicate GPU.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
// Errors stop the process at once under emulation, so there is never one pending.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
// recvbuff is significant (written) on the root only.
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);

// Grouping changes nothing for the collectives above (each is already queued on its
// stream in call order); the calls are counted so that an unbalanced end is reported.
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
