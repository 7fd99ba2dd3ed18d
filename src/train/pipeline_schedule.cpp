#include "lns/train/pipeline_schedule.h"

#include <algorithm>
#include <cstring>

#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/core/op_profile.h"

namespace lns {

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

std::vector<PipelineOp> schedule_interleaved(int M, int s, int P, int V) {
  LNS_CHECK(M % P == 0 && V >= 1) << "check_micro_batches() refuses " << M << " micro-batches for " << P << " stages";
  const int total = M * V, group = P * V;
  // Megatron's warm-up: enough forwards that the first backward of the last chunk can
  // reach this rank without it waiting; M == P leaves no steady state.
  const int warmup = M == P ? total : std::min(total, 2 * (P - s - 1) + (V - 1) * P);
  // The k-th forward (backward) of this rank: micro-batch groups of P, each through
  // every chunk before the next group starts.
  const auto op = [&](int k, bool forward) {
    const int c = (k % group) / P;
    return PipelineOp{forward, (k / group) * P + k % P, forward ? c : V - 1 - c};
  };
  std::vector<PipelineOp> ops;
  for (int k = 0; k < warmup; ++k) ops.push_back(op(k, true));
  for (int i = 0; i < total - warmup; ++i) {
    ops.push_back(op(warmup + i, true));
    ops.push_back(op(i, false));
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(op(k, false));
  return ops;
}

std::vector<PipelineOp> pipeline_schedule(int M, int s, int P, int V) {
  return V == 1 ? schedule_1f1b(M, s, P) : schedule_interleaved(M, s, P, V);
}

void check_micro_batches(int M, int P, int V) {
  LNS_REQUIRE(V == 1 || M % P == 0, "--virtual_stages=", V, " (interleaved pipeline) needs the micro-batches ",
              "per step, --global_batch_size / (--micro_batch_size x data-parallel size) = ", M,
              ", to be a multiple of --pp=", P);
}

std::vector<int> chunk_slots(int M, int s, int P, int V) {
  std::vector<int> now(V, 0), most(V, 1);
  for (const PipelineOp& op : pipeline_schedule(M, s, P, V)) {
    now[op.chunk] += op.forward ? 1 : -1;
    most[op.chunk] = std::max(most[op.chunk], now[op.chunk]);
  }
  return most;
}

double pipeline_bubble(int M, int P, int V) { return double(P - 1) / (double(V) * M); }

PipelineSchedule1F1B::PipelineSchedule1F1B(ProcessGrid& grid, LlamaStage& stage, int num_micro)
    : grid_(grid), stage_(stage), num_micro_(num_micro), chunks_(grid.layout.virtual_stages) {
  LNS_CHECK(stage.num_chunks() == chunks_) << "the stage holds " << stage.num_chunks() << " chunks, the layout "
                                           << chunks_;
  // [B*T, C] hidden states and their gradients (this rank's B*T/tp tokens under
  // sequence parallelism), where and as the stage keeps them; one pair serves every
  // chunk (each receive is consumed before the next is posted).
  const Shape act{stage.hidden_tokens(), stage.config().hidden_size};
  const DType dt = stage.activation_dtype();
  const Device dev = stage.device();
  if (!model_first(0) || chunks_ > 1) recv_act_ = OwnedTensor(dt, act, dev);
  if (!model_last(chunks_ - 1) || chunks_ > 1) recv_grad_ = OwnedTensor(dt, act, dev);
  if (grid.last_stage()) {
    step_losses_ = OwnedTensor(DType::F32, Shape{num_micro, stage.tokens()}, dev);
    if (dev != Device::CPU) step_losses_host_ = OwnedTensor(DType::F32, Shape{num_micro, stage.tokens()});
  }
  for (int m = 0; m < num_micro; ++m)
    for (int c = 0; c < chunks_; ++c) {
      send_act_.push_back(model_last(c) ? OwnedTensor() : OwnedTensor(dt, act, dev));
      send_grad_.push_back(model_first(c) ? OwnedTensor() : OwnedTensor(dt, act, dev));
    }
}

int PipelineSchedule1F1B::tag(int m, int model_chunk, bool forward) const {
  const int64_t chunks = int64_t{grid_.layout.pp} * chunks_;
  return static_cast<int>(2 * ((int64_t{m} * chunks + model_chunk) % 16384) + (forward ? 0 : 1));  // MPI: <= 32767
}

Tensor PipelineSchedule1F1B::forward_micro(int m, int tag_m, int slot, int chunk,
                                           const std::function<Tensor(int)>& inputs) {
  Tensor in;
  if (model_first(chunk)) {
    in = inputs(m);
  } else {
    // LN-free end-of-text rows: a later stage needs the micro-batch's token ids too
    if (stage_.needs_token_ids()) stage_.set_token_ids(inputs(m), slot, chunk);
    grid_.world().recv(recv_act_, grid_.layout.prev_stage_rank(grid_.coords), tag(tag_m, model_chunk(chunk), true));
    in = recv_act_;
  }
  return stage_.forward(in, slot, chunk);
}

double PipelineSchedule1F1B::train(const std::function<Tensor(int)>& inputs,
                                   const std::function<Tensor(int)>& targets, float grad_scale,
                                   const std::function<void(int, Tensor)>& on_logits,
                                   const std::function<void()>& before_last_backward,
                                   const std::function<void(int, int, int)>& before_forward) {
  Communicator& world = grid_.world();
  const Layout& layout = grid_.layout;
  const int s = grid_.coords.pp, P = layout.pp;
  const std::vector<int> slots = chunk_slots(num_micro_, s, P, chunks_);
  const std::vector<PipelineOp> ops = pipeline_schedule(num_micro_, s, P, chunks_);
  const int next = layout.next_stage_rank(grid_.coords), prev = layout.prev_stage_rank(grid_.coords);
  // Not in the first step: it grows the scratch buffers and meets every GEMM shape
  // (allocations a capture may not make). Not the last micro-batch: it arms the
  // overlapped gradient reduction (side-stream collectives).
  const bool graphs = trained_ && graphs_apply(static_cast<bool>(on_logits));
  for (size_t i = 0; i < ops.size(); ++i) {
    const int m = ops[i].micro, c = ops[i].chunk, slot = m % slots[c];  // in flight: consecutive m
    OwnedTensor& sa = send_act_[m * chunks_ + c];
    OwnedTensor& sg = send_grad_[m * chunks_ + c];
    if (graphs && ops[i].forward && m + 1 < num_micro_) {
      if (before_forward) before_forward(m, slot, c);
      run_graphed(m, inputs, targets, grad_scale, /*record=*/m == 0);
      ++i;  // pp = 1: the next op is this micro-batch's backward, which the graph ran
      continue;
    }
    if (ops[i].forward) {
      if (before_forward) before_forward(m, slot, c);
      const Tensor out = forward_micro(m, m, slot, c, inputs);
      if (model_last(c)) {
        // kept on the device; read once after the last micro-batch
        copy_tensor(step_losses_.t.rows(m, m + 1).view({stage_.tokens()}), stage_.loss_tokens(targets(m), slot));
        if (on_logits) on_logits(m, out);
      } else {
        copy_tensor(sa, out.view(sa.t.shape));
        world.send(sa, next, tag(m, model_chunk(c) + 1, true));
      }
    } else {
      Tensor dout;
      if (!model_last(c)) {
        world.recv(recv_grad_, next, tag(m, model_chunk(c), false));
        dout = recv_grad_;
      }
      if (before_last_backward && i + 1 == ops.size()) before_last_backward();
      const Tensor din = stage_.backward(dout, grad_scale, slot, c);
      if (!model_first(c)) {
        copy_tensor(sg, din.view(sg.t.shape));
        world.send(sg, prev, tag(m, model_chunk(c) - 1, false));
      }
    }
  }
  world.wait_sends();
  trained_ = true;
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

bool PipelineSchedule1F1B::graphs_apply(bool has_on_logits) const {
  return cuda_graphs_ && stage_.device() == Device::CUDA && grid_.layout.pp == 1 && chunks_ == 1 &&
         grid_.layout.tp == 1 && !has_on_logits && !op_profile_running();
}

void PipelineSchedule1F1B::run_graphed(int m, const std::function<Tensor(int)>& inputs,
                                       const std::function<Tensor(int)>& targets, float grad_scale, bool record) {
  const Tensor in = inputs(m), tg = targets(m);
  if (graph_in_.t.empty()) {
    graph_in_ = OwnedTensor(in.dtype, in.shape, in.device);
    graph_tg_ = OwnedTensor(tg.dtype, tg.shape, tg.device);
    graph_loss_ = OwnedTensor(DType::F32, Shape{stage_.tokens()}, stage_.device());
  }
  copy_tensor(graph_in_, in);  // device to device, queued before the launch
  copy_tensor(graph_tg_, tg);
  if (record) {
    // Read at record time and fixed in the graph: this step's grad_scale, the
    // activation and scratch pointers. Recorded again every step.
    micro_graph_.record([&] {
      stage_.forward(graph_in_, 0, 0);
      copy_tensor(graph_loss_, stage_.loss_tokens(graph_tg_, 0));
      stage_.backward(Tensor(), grad_scale, 0, 0);
    });
  }
  micro_graph_.launch();
  copy_tensor(step_losses_.t.rows(m, m + 1).view({stage_.tokens()}), graph_loss_);
}

double PipelineSchedule1F1B::forward_only(int count, const std::function<Tensor(int)>& inputs,
                                          const std::function<Tensor(int)>& targets, int tag_base) {
  Communicator& world = grid_.world();
  const int next = grid_.layout.next_stage_rank(grid_.coords);
  double loss_sum = 0.0;
  for (int i = 0; i < count; ++i) {
    const int m = tag_base + i;  // the tag; the callbacks see i
    for (int c = 0; c < chunks_; ++c) {
      const Tensor out = forward_micro(i, m, 0, c, inputs);
      if (model_last(c)) {
        loss_sum += stage_.loss(targets(i), 0);
      } else {
        OwnedTensor& sa = send_act_[c];
        copy_tensor(sa, out.view(sa.t.shape));
        world.send(sa, next, tag(m, model_chunk(c) + 1, true));
        world.wait_sends();  // slot 0 and its send buffer are reused by the next micro-batch
      }
    }
  }
  return loss_sum;
}

}  // namespace lns
