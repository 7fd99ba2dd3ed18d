#include "lns/pipeline_schedule.h"

#include <algorithm>
#include <cstring>

#include "lns/device.h"

namespace lns {
namespace {

// Tags keep the two directions of one micro-batch apart.
int act_tag(int m) { return 2 * (m % 16384); }  // MPI guarantees tags up to 32767
int grad_tag(int m) { return 2 * (m % 16384) + 1; }

}  // namespace

std::vector<PipelineOp> schedule_1f1b(int M, int s, int P) {
  const int warmup = std::min(P - s - 1, M);
  std::vector<PipelineOp> ops;
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({true, f});
  while (f < M) {  // steady state: one forward, one backward
    ops.push_back({true, f++});
    ops.push_back({false, b++});
  }
  while (b < M) ops.push_back({false, b++});  // cool-down
  return ops;
}

int PipelineSchedule1F1B::slots_for(int M, int s, int P) { return std::max(1, std::min(M, P - s)); }

PipelineSchedule1F1B::PipelineSchedule1F1B(ProcessGrid& grid, LlamaStage& stage, int num_micro)
    : grid_(grid), stage_(stage), num_micro_(num_micro) {
  // [B*T, C] hidden states and their gradients, where and as the stage keeps them.
  const Shape act{stage.tokens(), stage.config().hidden_size};
  const DType dt = stage.activation_dtype();
  const Device dev = stage.device();
  if (!grid.first_stage()) recv_act_ = OwnedTensor(dt, act, dev);
  if (!grid.last_stage()) recv_grad_ = OwnedTensor(dt, act, dev);
  if (grid.last_stage()) {
    step_losses_ = OwnedTensor(DType::F32, Shape{num_micro, stage.tokens()}, dev);
    if (dev != Device::CPU) step_losses_host_ = OwnedTensor(DType::F32, Shape{num_micro, stage.tokens()});
  }
  for (int m = 0; m < num_micro; ++m) {
    if (!grid.last_stage()) send_act_.emplace_back(dt, act, dev);
    if (!grid.first_stage()) send_grad_.emplace_back(dt, act, dev);
  }
}

Tensor PipelineSchedule1F1B::forward_micro(int m, int slot, const std::function<Tensor(int)>& inputs) {
  return forward_micro_as(m, m, slot, inputs);
}

Tensor PipelineSchedule1F1B::forward_micro_as(int m, int tag, int slot,
                                              const std::function<Tensor(int)>& inputs) {
  Communicator& world = grid_.world();
  Tensor in;
  if (grid_.first_stage()) {
    in = inputs(m);
  } else {
    world.recv(recv_act_, grid_.prev_stage_rank(), act_tag(tag));
    in = recv_act_;
  }
  return stage_.forward(in, slot);
}

double PipelineSchedule1F1B::train(const std::function<Tensor(int)>& inputs,
                                   const std::function<Tensor(int)>& targets, float grad_scale,
                                   const std::function<void(int, Tensor)>& on_logits,
                                   const std::function<void(int)>& before_backward,
                                   const std::function<void(int, int)>& before_forward) {
  Communicator& world = grid_.world();
  const int slots = slots_for(num_micro_, grid_.coords.pp, grid_.layout.pp);
  for (const PipelineOp& op : schedule_1f1b(num_micro_, grid_.coords.pp, grid_.layout.pp)) {
    const int m = op.micro, slot = m % slots;
    if (op.forward) {
      if (before_forward) before_forward(m, slot);
      const Tensor out = forward_micro(m, slot, inputs);
      if (grid_.last_stage()) {
        // kept on the device; read once after the last micro-batch
        copy_tensor(step_losses_.t.rows(m, m + 1).view({stage_.tokens()}), stage_.loss_tokens(targets(m), slot));
        if (on_logits) on_logits(m, out);
      } else {
        copy_tensor(send_act_[m], out.view(send_act_[m].t.shape));
        world.send(send_act_[m], grid_.next_stage_rank(), act_tag(m));
      }
    } else {
      Tensor dout;
      if (!grid_.last_stage()) {
        world.recv(recv_grad_, grid_.next_stage_rank(), grad_tag(m));
        dout = recv_grad_;
      }
      if (before_backward) before_backward(m);
      const Tensor din = stage_.backward(dout, grad_scale, slot);
      if (!grid_.first_stage()) {
        copy_tensor(send_grad_[m], din.view(send_grad_[m].t.shape));
        world.send(send_grad_[m], grid_.prev_stage_rank(), grad_tag(m));
      }
    }
  }
  world.wait_sends();
  if (!grid_.last_stage()) return 0.0;
  const float* host = step_losses_.f32();
  if (step_losses_.t.device != Device::CPU) {  // the step's one read of the losses
    copy_tensor(step_losses_host_, step_losses_);
    host = step_losses_host_.f32();
  }
  // Per micro-batch in token order, then over micro-batches: the sums loss() makes.
  double loss_sum = 0.0;
  for (int m = 0; m < num_micro_; ++m) {
    double sum = 0.0;
    for (int64_t n = 0; n < stage_.tokens(); ++n) sum += host[m * stage_.tokens() + n];
    loss_sum += sum;
  }
  return loss_sum;
}

double PipelineSchedule1F1B::forward_only(int count, const std::function<Tensor(int)>& inputs,
                                          const std::function<Tensor(int)>& targets, int tag_base) {
  Communicator& world = grid_.world();
  double loss_sum = 0.0;
  for (int i = 0; i < count; ++i) {
    const int m = tag_base + i;  // the tag; the callbacks see i
    const Tensor out = forward_micro_as(i, m, 0, inputs);
    if (grid_.last_stage()) {
      loss_sum += stage_.loss(targets(i), 0);
    } else {
      copy_tensor(send_act_[0], out.view(send_act_[0].t.shape));
      world.send(send_act_[0], grid_.next_stage_rank(), act_tag(m));
      world.wait_sends();  // slot 0 and its send buffer are reused by the next micro-batch
    }
  }
  return loss_sum;
}

}  // namespace lns
