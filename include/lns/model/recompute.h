// Activation recomputation (--recompute, --recompute_layers): which activations of a
// layer a micro-batch keeps from its forward to its backward, and which the stage
// recomputes in backward into one shared workspace instead. docs/parallelism.md,
// "Activation recomputation".
//
//   none       every activation is kept (the fastest step, the most memory)
//   selective  the attention core (its output and saved softmax statistics, the
//              [B,H,T,T] probabilities on the CPU) and the SwiGLU product are
//              recomputed from the kept q/k/v and gate/up: memory of the T^2 term and
//              one [N,F] per layer, for one attention forward and one elementwise pass
//   full       a layer keeps only its output (the next layer's input): backward
//              re-runs the layer's forward from its input, one more forward per layer.
//              With --recompute_layers=N only the first N layers of each stage do so
//              (Megatron's "block" method); the others keep everything. N counts per
//              stage, not per chunk: with --virtual_stages the stage's layers in local
//              order (chunk 0's first, whose slots hold the most micro-batches).
//
// Recomputation re-runs the same kernels on the same inputs, so every scheme, the LNS
// scale and the step are exactly (bitwise, on the CPU) what --recompute=none computes.
#pragma once
#include <string>

namespace lns {

enum class RecomputeMode { None, Selective, Full };

const char* recompute_mode_name(RecomputeMode m);  // "none", "selective", "full"
// Throws UserError naming `flag` and the accepted values.
RecomputeMode parse_recompute_mode(const std::string& s, const std::string& flag = "--recompute");

// The mode of the stage's layer with 0-based index `local` within the stage: the one
// rule for --recompute_layers (N > 0: full for local < N, none after; 0: all layers).
RecomputeMode layer_recompute(RecomputeMode mode, int recompute_layers, int local);

}  // namespace lns
