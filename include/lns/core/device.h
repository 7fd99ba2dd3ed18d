// Where a run computes (--device=cpu|cuda) and moving tensors between host and GPU.
//
// The CPU is the reference backend (f32 everywhere). The CUDA backend keeps f32 master
// weights, gradients and optimizer state, and runs activations and GEMM inputs in bf16
// (activation_dtype); statistics (norm rstd/mean, losses) stay f32 on both.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "lns/core/tensor.h"

namespace lns {

// "cpu" or "cuda"; anything else is a UserError naming --device.
Device parse_device(const std::string& value);
const char* device_name(Device d);
// The dtype of activations (hidden states, logits, GEMM inputs) on a device.
inline DType activation_dtype(Device d) { return d == Device::CUDA ? DType::BF16 : DType::F32; }
// Elements to which a tensor-parallel dimension that becomes a GEMM leading dimension
// (FFN width, vocabulary) is padded in storage on `d` (parallel/shard.h, `stored`):
// 64 on CUDA, a 128-byte bf16 row pitch (cuBLASLt's TMA kernels on Hopper need 16-byte
// multiples; 5461 x 2 bytes is not one), 1 on the CPU (its results stay bit for bit).
inline int64_t gemm_dim_align(Device d) { return d == Device::CUDA ? 64 : 1; }

// True when this binary was built with -DLNS_CUDA=ON.
bool cuda_built();
// Visible CUDA devices; 0 without CUDA support, driver or GPU (never throws).
int cuda_device_count();
// Why cuda_device_count() is 0, in one line (for error messages and test skips).
std::string cuda_unavailable_reason();

// The local rank of this process on its node, from Open MPI (OMPI_COMM_WORLD_LOCAL_RANK),
// SLURM (SLURM_LOCALID) or torchrun-style LOCAL_RANK; 0 when none is set.
int local_rank_from_env();
// Makes GPU (local_rank mod visible GPUs) current for this process and returns its
// ordinal. More local ranks than GPUs share GPUs (only the MPI communicator allows
// that; see --comm). UserError when CUDA is not built or no GPU is visible.
int bind_local_gpu(int local_rank);
// "NVIDIA H100 80GB HBM3, driver 580.159, 132 SMs, 79.1 GiB" for the current GPU.
std::string current_gpu_description();

// dst = src (same dtype and element count) between any two devices; returns when the
// copy is done.
void copy_tensor(Tensor dst, Tensor src);
// Sets every byte of t to zero (queued on the CUDA stream for device tensors).
void zero_tensor(Tensor t);
// The elements of an f32 or bf16 tensor on any device, as f32 on the host.
std::vector<float> to_host_f32(Tensor src);
// Padding inside a device allocation (between the tensors of a flat buffer) that must
// stay zero: under the SIMT emulator every kernel is checked not to change it
// (docs/cuda.md); a no-op elsewhere.
void guard_device_padding(Tensor padding);
// Waits for every kernel queued on the CUDA stream (no-op on the CPU).
void device_synchronize(Device d);
// For code that queues device work of its own beside the ops (NCCL): the compute
// stream every op and copy runs on, as the device's handle (a cudaStream_t on CUDA;
// nullptr on the CPU), and watches that device_synchronize runs while it waits, so
// that work which can never finish (a collective whose peer died) ends the process
// instead of hanging (a watch throws).
void* device_stream(Device d);
void add_device_sync_watch(Device d, void (*watch)(void* ctx), void* ctx);
void remove_device_sync_watch(Device d, void* ctx);

// Device work recorded once and replayed with one launch: a CUDA graph of what the
// host queues on the compute stream while `work` runs. record() runs nothing; each
// launch() queues the recorded work. The work must not wait for the device, allocate,
// free or copy host memory, use another stream or take a new cuBLASLt shape (a GPU
// refuses, the emulator reports each); what it reads at record time (pointers,
// scalars) is what every launch uses. CUDA builds only.
class DeviceGraph {
 public:
  DeviceGraph() = default;
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;
  ~DeviceGraph() { reset(); }
  void record(const std::function<void()>& work);
  void launch() const;
  bool empty() const { return exec_ == nullptr; }
  void reset();

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
};
// Peak bytes allocated by Buffers on the CUDA device since start (0 on the CPU), and
// the bytes they hold now.
size_t cuda_peak_allocated_bytes();
size_t cuda_allocated_bytes();
// Bytes held by host Buffers now and at most since start or the last reset (each
// allocation rounded up to its 64-byte alignment): the CPU path's memory high-water
// mark (activation recomputation's account is checked against it).
size_t host_allocated_bytes();
size_t host_peak_allocated_bytes();
void reset_host_peak_allocated_bytes();
// Bytes in use on the current GPU (total - free: every allocation of the process,
// scratch and library workspaces included, plus the CUDA context); 0 without a GPU.
size_t cuda_memory_in_use();

}  // namespace lns
