// PipelineSchedule1F1B: runs one stage's share of a step over M micro-batches in the
// one-forward-one-backward order (warm-up forwards, steady 1F1B, cool-down
// backwards), sending activations to the next stage and gradients to the previous
// one. Stage s keeps at most min(M, P - s) micro-batches in flight, which is the
// number of activation slots its LlamaStage is built with (slots_for()).
#pragma once
#include <functional>
#include <vector>

#include "lns/stage.h"
#include "parallel/process_grid.h"

namespace lns {

struct PipelineOp {
  bool forward;
  int micro;
};

// The order of forward/backward micro-batches on `stage` of `stages`.
std::vector<PipelineOp> schedule_1f1b(int num_micro, int stage, int stages);

class PipelineSchedule1F1B {
 public:
  static int slots_for(int num_micro, int stage, int stages);

  PipelineSchedule1F1B(ProcessGrid& grid, LlamaStage& stage, int num_micro);

  // One training pass: inputs(m) gives micro-batch m's token ids [B,T] (first stage),
  // targets(m) its targets [B*T] (last stage). Parameter gradients accumulate in the
  // stage, scaled by grad_scale. on_logits(m, logits) sees the last stage's logits
  // before backward overwrites them; before_backward(m) runs just before micro-batch
  // m's backward, before_forward(m, slot) just before its forward on this stage (in the
  // slot it will use). Returns the sum of token losses (last stage; 0 elsewhere).
  double train(const std::function<Tensor(int)>& inputs, const std::function<Tensor(int)>& targets,
               float grad_scale, const std::function<void(int, Tensor)>& on_logits = {},
               const std::function<void(int)>& before_backward = {},
               const std::function<void(int, int)>& before_forward = {});
  // Forward only, micro-batches one after another (evaluation). Returns the loss sum.
  // tag_base offsets the message tags (callers making several calls in a row).
  double forward_only(int count, const std::function<Tensor(int)>& inputs,
                      const std::function<Tensor(int)>& targets, int tag_base = 0);

 private:
  Tensor forward_micro(int m, int slot, const std::function<Tensor(int)>& inputs);
  Tensor forward_micro_as(int m, int tag, int slot, const std::function<Tensor(int)>& inputs);

  ProcessGrid& grid_;
  LlamaStage& stage_;
  int num_micro_;
  OwnedTensor recv_act_, recv_grad_;               // [B,T,C]
  OwnedTensor step_losses_, step_losses_host_;     // [num_micro, B*T] f32, last stage
  std::vector<OwnedTensor> send_act_, send_grad_;  // one per micro-batch: sends complete late
};

}  // namespace lns
