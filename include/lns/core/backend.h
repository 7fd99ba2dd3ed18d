// The device interface, as a ggml backend: what core asks of a device other than the
// CPU, and how a backend hands it over. Core knows no CUDA; src/cuda implements this
// interface and registers it at start-up (src/cuda/backend.cpp), so a binary without
// the CUDA backend simply has no device behind Device::CUDA. The ops a backend
// implements register separately, one table per op (lns/core/op_table.h).
//
// Every call is on the backend's one compute stream, in program order, unless it says
// it waits. Callers are core's device functions (lns/core/device.h, Buffer, DeviceGraph, the
// op profile); everything else goes through those.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "lns/core/tensor.h"

namespace lns {

// A dispatched op's time, by the file that registered its implementation (the op
// profile's class: op_class_of_file, lns/core/op_profile.h).
struct OpTiming {
  const char* file;
  double ms;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // ---- the devices ----------------------------------------------------------------
  virtual int device_count() = 0;                  // visible devices; 0 on any error, never throws
  virtual std::string unavailable_reason() = 0;    // why device_count() is 0, in one line
  virtual void set_device(int ordinal) = 0;        // makes device `ordinal` current
  virtual std::string describe() = 0;              // the current device in one line
  // Free and total bytes of the current device; false when unknown (no device).
  virtual bool memory_info(size_t* free_bytes, size_t* total_bytes) = 0;

  // ---- memory ---------------------------------------------------------------------
  // nbytes zeroed device bytes (waits), or nullptr when out of memory.
  virtual void* alloc(size_t nbytes) = 0;
  virtual void free(void* p) = 0;
  // dst = src, nbytes, either side on the host or the device (queued).
  virtual void copy(void* dst, const void* src, size_t nbytes) = 0;
  virtual void zero(void* p, size_t nbytes) = 0;  // queued
  // Bytes between the tensors of a flat buffer that must stay zero (see guard_device_padding).
  virtual void guard_padding(void* p, size_t nbytes) = 0;

  // ---- the compute stream ---------------------------------------------------------
  virtual void* stream() = 0;  // the backend's stream handle (cudaStream_t)
  // Waits for the stream; while it waits, every watch runs now and then (and may throw).
  virtual void synchronize() = 0;
  virtual void add_sync_watch(void (*watch)(void* ctx), void* ctx) = 0;
  virtual void remove_sync_watch(void* ctx) = 0;

  // ---- graphs: the stream's work recorded once, replayed (DeviceGraph) -------------
  virtual void* graph_record(const std::function<void()>& work) = 0;  // the executable graph
  virtual void graph_launch(void* graph) = 0;
  virtual void graph_destroy(void* graph) = 0;

  // ---- the op profile (lns/core/op_profile.h) -----------------------------------------------
  virtual void profile_start() = 0;  // waits for the stream first
  virtual std::vector<OpTiming> profile_stop() = 0;
  virtual void profile_op_begin(const char* file) = 0;  // around each dispatched op
  virtual void profile_op_end() = 0;

  // ---- libraries loaded at run time -------------------------------------------------
  // cuDNN's fused attention (AttentionImpl::Cudnn): "cuDNN 9.13.0 (path)"; UserError
  // starting with `what` (e.g. "--attention=cudnn") when it cannot be loaded.
  virtual std::string attention_library(const std::string& what) = 0;
};

// A backend registers itself once, at start-up (a static registrar; the programs link
// backends whole so the linker keeps it). Not thread-safe: start-up only.
void register_device_backend(Device device, DeviceBackend* backend);
// The backend behind `device`, or nullptr when this binary has none (always for the
// CPU, which core runs itself).
DeviceBackend* device_backend(Device device);

}  // namespace lns
