// Where a CUDA step's time goes, by class of work (lns_bench_step --profile). While
// on, every op dispatched to the GPU (lns/core/op_table.h) is bracketed by two CUDA
// events on the compute stream (the outermost op only, when one op calls another);
// stop() waits for the stream and sums each class's event-to-event times. What no op
// covers (copies, casts, collectives, the host's gaps between launches) is the step's
// wall time minus the rows, which the caller adds as its own row, so that the rows
// add up to the measured step. An op may time a part of itself as a class of its own
// (cuda::ProfileSegment: the FP8 casts inside an FP8 linear), cut out of the op's time,
// so the rows still add up. Under the SIMT emulator the times are the host's
// (docs/cuda.md): the classes and op counts are real, the milliseconds are not.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lns {

struct OpClassTime {
  std::string name;   // "GEMMs (cuBLASLt)", "attention", ...
  double ms = 0;      // summed event-to-event time of its ops
  int64_t ops = 0;    // ops (outermost dispatches) in the class, or its op's segments
};

// The class of an op by the source file that registered its implementation
// (src/cuda/gemm.cpp -> "GEMMs (cuBLASLt)"; the CPU's files, src/cpu/linear.cpp, map
// alike); a file no class names is its own.
std::string op_class_of_file(const std::string& file);
// Every class op_class_of_file names, in table order.
const std::vector<std::string>& op_classes();

// UserError without CUDA support. start() begins a profile (stream synchronized
// first); stop() ends it and returns every class of op_classes() (zeros included),
// then any other class seen, in that order.
void op_profile_start();
std::vector<OpClassTime> op_profile_stop();
// Between op_profile_start() and op_profile_stop() (work then runs op by op, ungraphed).
bool op_profile_running();

}  // namespace lns
