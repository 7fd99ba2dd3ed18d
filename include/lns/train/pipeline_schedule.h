// PipelineSchedule1F1B: runs one stage's share of a step over M micro-batches in the
// one-forward-one-backward order (warm-up forwards, steady 1F1B, cool-down
// backwards), sending activations to the next stage and gradients to the previous
// one. Stage s keeps at most min(M, P - s) micro-batches in flight, which is the
// number of activation slots its LlamaStage is built with (chunk_slots()).
//
// With V > 1 virtual stages (layout.virtual_stages) each rank holds V model chunks
// and runs Megatron's interleaved 1F1B: model chunk k = c*P + s is chunk c of rank
// s, a micro-batch's forward visits chunks 0..P*V-1 in order (rank P-1 hands chunk
// c's output to rank 0's chunk c+1), and the bubble falls from (P-1)/M to
// (P-1)/(V*M) of the ideal time (pipeline_bubble()). docs/parallelism.md draws both.
#pragma once
#include <functional>
#include <vector>

#include "lns/core/device.h"
#include "lns/model/stage.h"
#include "parallel/process_grid.h"

namespace lns {

struct PipelineOp {
  bool forward;
  int micro;
  int chunk = 0;  // the rank's model chunk (0..V-1); always 0 without virtual stages
  bool operator==(const PipelineOp&) const = default;
};

// The order of forward/backward micro-batches on `stage` of `stages`.
std::vector<PipelineOp> schedule_1f1b(int num_micro, int stage, int stages);
// Megatron's interleaved order for `chunks` model chunks per stage: micro-batches go
// in groups of `stages`, each group through chunk 0, then chunk 1, ... (backward:
// the last chunk first); warm-up 2*(P-s-1) + (V-1)*P forwards (all of them when
// M == P), then one forward one backward, then the cool-down backwards. Needs
// num_micro a multiple of stages (check_micro_batches).
std::vector<PipelineOp> schedule_interleaved(int num_micro, int stage, int stages, int chunks);
// The schedule a layout runs: 1F1B for one chunk, interleaved for more.
std::vector<PipelineOp> pipeline_schedule(int num_micro, int stage, int stages, int chunks);
// UserError unless the schedule can run num_micro micro-batches per step: the
// interleaved one needs a multiple of the stages (as Megatron's does).
void check_micro_batches(int num_micro, int stages, int chunks);
// The most micro-batches each chunk of `stage` holds at once under
// pipeline_schedule(): the activation slots its LlamaStage needs per chunk.
std::vector<int> chunk_slots(int num_micro, int stage, int stages, int chunks);
// Idle time over useful time of the schedule, (P-1)/(V*M): the pipeline bubble,
// logged at start-up (tests/unit/test_schedule.cpp times the op lists against it).
double pipeline_bubble(int num_micro, int stages, int chunks);

class PipelineSchedule1F1B {
 public:
  PipelineSchedule1F1B(ProcessGrid& grid, LlamaStage& stage, int num_micro);

  // One training pass: inputs(m) gives micro-batch m's token ids [B,T] (first stage; on
  // the others too when the stage needs_token_ids() for LN-free end-of-text rows),
  // targets(m) its targets [B*T] (last stage). Parameter gradients accumulate in the
  // stage, scaled by grad_scale. on_logits(m, logits) sees the last stage's logits
  // before backward overwrites them; before_forward(m, slot, chunk) runs just before
  // micro-batch m's forward through the stage's `chunk` (in the slot it will use);
  // before_last_backward() just before this rank's last backward op (micro-batch M-1,
  // chunk 0), after which every gradient the stage reports ready is final. Returns the
  // sum of token losses (last stage; 0 elsewhere). The stage needs chunk_slots()
  // activation slots per chunk.
  double train(const std::function<Tensor(int)>& inputs, const std::function<Tensor(int)>& targets,
               float grad_scale, const std::function<void(int, Tensor)>& on_logits = {},
               const std::function<void()>& before_last_backward = {},
               const std::function<void(int, int, int)>& before_forward = {});
  // Forward only, micro-batches one after another (evaluation), each through every
  // chunk in order, in slot 0. Returns the loss sum. tag_base offsets the message
  // tags (callers making several calls in a row).
  double forward_only(int count, const std::function<Tensor(int)>& inputs,
                      const std::function<Tensor(int)>& targets, int tag_base = 0);
  // --cuda_graphs: where graphs_apply(), micro-batches 0..M-2 of each step run their
  // forward, loss and backward as one CUDA graph (DeviceGraph), recorded at micro-batch
  // 0 of every step from the second on and launched for each. Same kernels, same
  // arguments, same order as ungraphed: the same bits.
  void set_cuda_graphs(bool on) { cuda_graphs_ = on; }
  // The rule: one stage holding the whole model (pp = 1, one chunk: no messages inside
  // a micro-batch), tp = 1 (no collectives inside it), on CUDA, nothing to hand the
  // logits to, no op profile running (it times op by op).
  bool graphs_apply(bool has_on_logits) const;

 private:
  // Micro-batch m (its message tags from `tag`) through `chunk` in `slot`: receives
  // its input unless it is the model's first chunk.
  Tensor forward_micro(int m, int tag, int slot, int chunk, const std::function<Tensor(int)>& inputs);
  bool model_first(int chunk) const { return grid_.first_stage() && chunk == 0; }
  bool model_last(int chunk) const { return grid_.last_stage() && chunk == chunks_ - 1; }
  // This rank's chunk c as the model's chunk k (Layout::chunk_index).
  int model_chunk(int c) const { return grid_.layout.chunk_index(grid_.coords.pp, c); }
  // The message into model chunk k for micro-batch m: activations (forward) or
  // gradients; unique per micro-batch, model chunk and direction.
  int tag(int m, int model_chunk, bool forward) const;
  // Micro-batch m's forward, loss and backward through the graph (recorded first when
  // `record`): its inputs and targets copied into fixed buffers the graph reads, its
  // token losses copied out of the one it writes.
  void run_graphed(int m, const std::function<Tensor(int)>& inputs, const std::function<Tensor(int)>& targets,
                   float grad_scale, bool record);

  ProcessGrid& grid_;
  LlamaStage& stage_;
  int num_micro_;
  int chunks_;                                     // V, layout.virtual_stages
  OwnedTensor recv_act_, recv_grad_;               // [B,T,C]
  OwnedTensor step_losses_, step_losses_host_;     // [num_micro, B*T] f32, last stage
  // one per micro-batch and chunk (index m * V + c): sends complete late
  std::vector<OwnedTensor> send_act_, send_grad_;
  bool cuda_graphs_ = false;
  bool trained_ = false;  // a step has run: scratch buffers have grown, every GEMM shape is known
  DeviceGraph micro_graph_;
  OwnedTensor graph_in_, graph_tg_, graph_loss_;  // [B,T] i32, [B*T] i32, [B*T] f32
};

}  // namespace lns
