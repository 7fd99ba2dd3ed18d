// TEMPORARY: see cublasLt.h and nccl.h here. Every entry point reports through the
// emulator's fail() that the library is not emulated yet, so a test that needs a GEMM
// or a collective fails with that one line instead of computing garbage.
#include <cublasLt.h>
#include <nccl.h>

#include "cuda/sim/sim_api.h"

namespace {
[[noreturn]] void not_yet(const char* what) {
  lns::sim::fail(std::string(what) + ": not emulated yet (the cuBLASLt/NCCL stand-ins have not landed)");
}
}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t*) { not_yet("cublasLtCreate"); }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t) { not_yet("cuBLASLt"); }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*, size_t) { not_yet("cuBLASLt"); }
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t*, cudaDataType_t, uint64_t, uint64_t, int64_t) { not_yet("cuBLASLt"); }
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void*, size_t) { not_yet("cuBLASLt"); }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t*) { not_yet("cuBLASLt"); }
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t) { not_yet("cuBLASLt"); }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void*, size_t) { not_yet("cuBLASLt"); }
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                              cublasLtMatmulHeuristicResult_t*, int*) { not_yet("cuBLASLt"); }
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t, const void*,
                              cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t, void*, cublasLtMatrixLayout_t,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t) { not_yet("cublasLtMatmul"); }

const char* ncclGetErrorString(ncclResult_t) { return "NCCL is not emulated yet"; }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  *id = ncclUniqueId{};
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) { return ncclInvalidUsage; }
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) { not_yet("ncclAllReduce"); }
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) { not_yet("ncclAllGather"); }
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) { not_yet("ncclReduceScatter"); }
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { not_yet("ncclBroadcast"); }
