#include "lns/train/train_flags.h"

#include "lns/train/resilience_flags.h"
#include "lns/train/tensorboard.h"

#include <gflags/gflags.h>

#include <absl/strings/match.h>
#include <algorithm>
#include <vector>

// ---- data -----------------------------------------------------------------------------
DEFINE_string(data, "random",
              "Training tokens: an lns token file (tools/prepare_data.py), a Megatron indexed "
              "dataset prefix (PREFIX.bin + PREFIX.idx), shards (a comma-separated list, a glob, an "
              "index.json), a weighted blend of those (0.7:PATH_A,0.3:PATH_B; docs/data.md), or "
              "'random' for synthetic tokens.");
DEFINE_string(val_data, "",
              "Validation tokens (same formats; a blend reports a loss per source); empty disables "
              "validation.");
DEFINE_string(data_mode, "packed",
              "packed: contiguous windows of the token stream; document: one document per "
              "sequence, truncated or padded with the loss masked (the paper's setup).");
DEFINE_int32(seq_len, 256, "Tokens per sequence T.");
DEFINE_int32(micro_batch_size, 8, "Sequences per forward/backward pass.");
DEFINE_int32(global_batch_size, 8,
             "Sequences per optimizer step; gradients of global/micro micro-batches accumulate.");
DEFINE_uint64(seed, 1234, "Seed of the weight initialisation and the data order.");
// ---- optimisation -----------------------------------------------------------------------
DEFINE_int64(steps, 100, "Optimizer steps; the cosine schedule ends here.");
DEFINE_double(lr, 1e-3, "Peak learning rate.");
DEFINE_double(min_lr_ratio, 0.1, "Final learning rate as a fraction of --lr (cosine decay).");
DEFINE_int64(warmup_steps, 0, "Linear warm-up steps.");
DEFINE_double(beta1, 0.9, "AdamW beta1.");
DEFINE_double(beta2, 0.999, "AdamW beta2.");
DEFINE_double(adam_eps, 1e-8, "AdamW epsilon.");
DEFINE_double(weight_decay, 0.0, "Decoupled weight decay, applied to matrices only.");
DEFINE_double(grad_clip, 1.0, "Clip the global gradient norm to this value; 0 = off.");
// ---- evaluation and output --------------------------------------------------------------
DEFINE_int64(eval_every, 0, "Validate every N steps (and always at the end); 0 = only at the end.");
DEFINE_int64(eval_tokens, 65536, "Validation target tokens per evaluation.");
DEFINE_bool(eval_spread, false,
            "Evaluate --eval_tokens in sequences spread evenly over the whole validation file instead of "
            "its first ones (a file in source order: every source at its share).");
DEFINE_int64(log_every, 10, "Print the training line every N steps.");
DEFINE_string(out_dir, "", "Run directory: metrics.jsonl and config.flags go here.");
DEFINE_double(peak_tflops, 0, "Peak TFLOP/s of one device, for MFU in the log (0 = not shown).");
// ---- parallelism ------------------------------------------------------------------------
DEFINE_string(device, "cpu",
              "Where to compute: cpu (f32 reference) or cuda (bf16 activations and weights for "
              "the GEMMs, f32 master weights and optimizer state; each rank takes the GPU of its "
              "local rank).");
DEFINE_string(comm, "nccl",
              "CUDA runs: how ranks exchange GPU tensors: nccl, or mpi (through host memory; "
              "lets several ranks share one GPU). CPU runs always use MPI.");
DEFINE_int32(tp, 1, "Tensor-parallel size: splits heads, FFN width and vocabulary.");
DEFINE_int32(pp, 1, "Pipeline-parallel stages (1F1B schedule). Data parallel = world / (tp * pp).");
DEFINE_string(pp_layers, "",
              "Layers per pipeline stage, e.g. 3,2,2 (default: even split); with --virtual_stages, "
              "layers per model chunk, pp x virtual_stages counts in layer order.");
DEFINE_int32(virtual_stages, 1,
             "Model chunks per pipeline rank: > 1 runs the interleaved 1F1B schedule (layers dealt "
             "round-robin in pp x virtual_stages chunks; bubble (pp-1)/(virtual_stages x micro-batches)); "
             "needs --pp > 1 and micro-batches per step a multiple of --pp.");
DEFINE_bool(zero, true,
            "ZeRO-1 (the default; no effect with one data-parallel rank): each dp rank has its shard of the "
            "gradients summed on it, updates only that shard with AdamW (moments for the shard only) and "
            "gathers the others' updated weights. --zero=false: every rank all-reduces and updates everything.");
DEFINE_bool(sequence_parallel, false,
            "With --tp > 1: split the tokens between the tensor-parallel linears (norms, residual "
            "adds, stage boundaries) over the tp ranks, Megatron's sequence parallelism; needs --seq_len "
            "divisible by --tp (docs/parallelism.md).");
DEFINE_double(dp_bucket_mb, 25, "Data-parallel gradient all-reduce bucket size in MiB.");
DEFINE_bool(overlap_grad_reduce, true,
            "Start each data-parallel all-reduce bucket as soon as the last micro-batch's backward "
            "has finished its gradients (runs beside backward with --comm=nccl).");
DEFINE_bool(cuda_graphs, false,
            "With --device=cuda, --pp=1, --tp=1: run each step's micro-batches but the last as one "
            "CUDA graph (forward, loss, backward), recorded at the first micro-batch of every step from "
            "the second step on: one launch instead of hundreds; the same bits (docs/cuda.md). Ignored "
            "where it does not apply.");
DEFINE_int64(diag_every, 0,
             "Write per-block depth diagnostics (variance, norm, angular distance, gradient "
             "norm) to metrics.jsonl every N steps; 0 = off.");
// ---- LN-free fine-tuning (docs/ln_free.md) ------------------------------------------------
DEFINE_string(ln_free, "",
              "LN-free schedule: comma-separated ACTION@TRIGGER events that replace norm divisors by "
              "constants measured on training data, e.g. mlp@+100,attn_qk@~0.05/200,attn_v:eot@~0.05/200,"
              "final@~0.05/200,drop_eot@~0.05/200,drop_pos0@~0.05/200. Groups mlp, attn_qk, attn_v, attn, "
              "final, all (optionally [A-B] layers, ':eot'); drop_eot, drop_pos0. Triggers: N (total steps), "
              "+N (steps after the previous event), ~TOL[/MAX] (loss back within TOL of the baseline, or "
              "after MAX steps). Empty: off.");
DEFINE_int64(ln_free_calib_tokens, 16384,
             "Training tokens each --ln_free calibration measures the divisors on (the first sequences "
             "of the unshuffled training data).");
DEFINE_int32(ln_free_eot_token, -1,
             "End-of-text token id for --ln_free ':eot' events (rows with this token divide by the "
             "position-0 constant until drop_eot); -1: none.");
DEFINE_int32(ln_free_loss_window, 20, "Steps whose mean loss a --ln_free '~TOL' trigger compares with the baseline.");
// ---- checkpoints ------------------------------------------------------------------------
DEFINE_int64(save_every, 0, "Save a checkpoint every N steps (also at the end and on SIGTERM/SIGUSR1); 0 = only those.");
DEFINE_int32(keep_checkpoints, 0, "Keep only the newest K complete checkpoints; 0 = keep all.");
DEFINE_string(resume, "", "'auto': continue from the newest complete checkpoint in --out_dir; or a checkpoint directory.");
DEFINE_int32(exit_code_on_signal, 0,
             "Exit status after saving on SIGTERM/SIGUSR1 (launch/slurm/train.sbatch requeues the job "
             "when it sees its value).");
DEFINE_int32(checkpoint_test_pause_ms, 0, "Test hook: each rank sleeps this long after writing its shard, before the rename.");
// ---- debugging ----------------------------------------------------------------------------
DEFINE_string(init_from, "", "Load all weights from this safetensors file (Hugging Face names).");
DEFINE_string(dump_step_state, "",
              "Write inputs, targets, logits, loss and grad.<param> of the first micro-batch, "
              "before any optimizer step, to this safetensors file, then exit.");

namespace lns {

TrainConfig train_config_from_flags() {
  TrainConfig c;
  c.data = FLAGS_data;
  c.val_data = FLAGS_val_data;
  c.data_mode = parse_sample_mode(FLAGS_data_mode);
  c.seq_len = FLAGS_seq_len;
  c.micro_batch = FLAGS_micro_batch_size;
  c.global_batch = FLAGS_global_batch_size;
  c.seed = FLAGS_seed;
  c.steps = FLAGS_steps;
  c.lr = FLAGS_lr;
  c.min_lr_ratio = FLAGS_min_lr_ratio;
  c.warmup_steps = FLAGS_warmup_steps;
  c.adam = {static_cast<float>(FLAGS_beta1), static_cast<float>(FLAGS_beta2),
            static_cast<float>(FLAGS_adam_eps), static_cast<float>(FLAGS_weight_decay)};
  c.grad_clip = FLAGS_grad_clip;
  c.eval_every = FLAGS_eval_every;
  c.eval_tokens = FLAGS_eval_tokens;
  c.eval_spread = FLAGS_eval_spread;
  c.log_every = FLAGS_log_every;
  c.out_dir = FLAGS_out_dir;
  c.tensorboard_dir = tensorboard_dir_from_flags(FLAGS_out_dir);
  c.peak_tflops = FLAGS_peak_tflops;
  c.device = parse_device(FLAGS_device);
  c.init_from = FLAGS_init_from;
  c.pp_layers = FLAGS_pp_layers;
  c.virtual_stages = FLAGS_virtual_stages;
  c.zero = FLAGS_zero;
  c.sequence_parallel = FLAGS_sequence_parallel;
  c.dp_bucket_mb = FLAGS_dp_bucket_mb;
  c.overlap_grad_reduce = FLAGS_overlap_grad_reduce;
  c.cuda_graphs = FLAGS_cuda_graphs;
  c.save_every = FLAGS_save_every;
  c.diag_every = FLAGS_diag_every;
  c.keep_checkpoints = FLAGS_keep_checkpoints;
  c.resume = FLAGS_resume;
  c.checkpoint_test_pause_ms = FLAGS_checkpoint_test_pause_ms;
  c.ln_free = FLAGS_ln_free;
  c.ln_free_calib_tokens = FLAGS_ln_free_calib_tokens;
  c.ln_free_eot_token = FLAGS_ln_free_eot_token;
  c.ln_free_loss_window = FLAGS_ln_free_loss_window;
  add_resilience_flags(c);
  c.validate();
  return c;
}

std::string dump_step_state_flag() { return FLAGS_dump_step_state; }
int tp_flag() { return FLAGS_tp; }
int pp_flag() { return FLAGS_pp; }
CommKind comm_flag() { return parse_comm(FLAGS_comm); }

std::string resolved_flags() {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  std::string out;
  for (const auto& f : all)
    if (absl::EndsWith(f.filename, "_flags.cpp")) out += "--" + f.name + "=" + f.current_value + "\n";
  return out;
}

}  // namespace lns
