// Trainer: data -> forward/backward over micro-batches -> clip -> AdamW -> schedule,
// with periodic validation, the rank-0 training line and a JSONL metrics file.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lns/model/config.h"
#include "lns/data/data.h"
#include "lns/core/device.h"
#include "lns/train/evaluator.h"
#include "lns/train/gradient_sync.h"
#include "lns/train/ln_free_schedule.h"
#include "lns/checkpoint/manifest.h"
#include "lns/optim/optim.h"
#include "lns/train/pipeline_schedule.h"
#include "lns/model/stage.h"
#include "lns/train/step_guard.h"
#include "lns/train/straggler.h"
#include "parallel/process_grid.h"
#include "parallel/watchdog.h"

namespace lns {

class Checkpoint;
class CheckpointManager;
class FaultInjector;
class Metrics;
class StepLog;

struct TrainConfig {
  std::string data = "random";  // token file, Megatron prefix, a weighted blend (lns/data/data.h), or "random"
  std::string val_data;         // the same forms; empty: no validation
  SampleMode data_mode = SampleMode::Packed;
  int64_t seq_len = 256, micro_batch = 8, global_batch = 8;
  int64_t steps = 100;
  uint64_t seed = 1234;
  double lr = 1e-3, min_lr_ratio = 0.1;
  int64_t warmup_steps = 0;
  AdamWConfig adam;
  double grad_clip = 1.0;
  int64_t eval_every = 0, eval_tokens = 65536, log_every = 10;
  bool eval_spread = false;  // EvalOptions::spread
  std::string out_dir;  // empty: no files written
  std::string tensorboard_dir;  // TensorBoard event files (lns/train/tensorboard.h); empty: none
  double peak_tflops = 0;  // for MFU in the log; 0 = not shown
  Device device = Device::CPU;  // where the stage computes (lns/core/device.h)
  std::string init_from;
  // Parallel layout (tp and pp live in the ProcessGrid).
  std::string pp_layers;     // layers per stage, e.g. "3,2,2"; empty = even split
  int virtual_stages = 1;    // model chunks per pipeline rank (interleaved 1F1B when > 1)
  bool zero = true;          // ZeRO-1 when dp > 1: gradients summed and AdamW run per dp shard (GradientSync)
  bool sequence_parallel = false;  // Megatron's sequence parallelism over tp (Layout)
  double dp_bucket_mb = 25;  // data-parallel all-reduce bucket size
  bool overlap_grad_reduce = true;  // all-reduce buckets during the last backward (GradientSync)
  bool cuda_graphs = false;  // micro-batches as CUDA graphs where PipelineSchedule1F1B::graphs_apply
  // Checkpoints (docs/checkpoints.md), under out_dir/checkpoints.
  int64_t save_every = 0;     // 0: only at the end and on SIGTERM/SIGUSR1
  int keep_checkpoints = 0;   // 0: keep all
  std::string resume;         // "", "auto" (newest complete in out_dir) or a checkpoint path
  int checkpoint_test_pause_ms = 0;
  // Curse-of-depth diagnostics every N steps (0 = off): per block, the residual
  // stream's variance and norm, the input/output angular distance (on the first
  // validation micro-batch, or the first training one) and the block's gradient norm.
  int64_t diag_every = 0;
  // LN-free fine-tuning (docs/ln_free.md): the schedule (lns/train/ln_free_schedule.h; empty:
  // none), the training tokens each calibration reads, the end-of-text id of ':eot'
  // events, and the steps a '~' trigger averages.
  std::string ln_free;
  int64_t ln_free_calib_tokens = 16384;
  int ln_free_eot_token = -1;
  int ln_free_loss_window = 20;
  // Fault handling (docs/resilience.md; the flags in src/train/resilience_flags.cpp).
  StragglerConfig straggler;
  bool rerun_suspicious = true;  // run a non-finite or spiking step again (lns/train/step_guard.h)
  double spike_factor = 5;
  int spike_window = 50;
  bool skip_bad_batches = false;
  bool async_save = false;       // lns/checkpoint/async_checkpoint.h
  std::string inject_fault;      // tests only (lns/train/fault_injection.h)
  void validate() const;  // UserError naming the flag
};

// Set by the SIGTERM/SIGUSR1 handler of lns_train: save and stop after this step.
void request_stop(int signal);
int stop_requested();

struct StepStats {
  int64_t step = 0;       // 1-based number of optimizer steps taken
  double loss = 0;        // mean over the global batch's unmasked targets
  double grad_norm = 0;   // before clipping
  double lr = 0;
  int64_t tokens = 0;     // unmasked targets in the global batch
  double seconds = 0;
};

// Where the time from launch to the end of the first step went (seconds), as
// `start-up ...` in the log and "startup_*" in the first metrics record: the process
// (libraries, MPI, flags) until the Trainer starts, opening the data, the model's
// buffers (host and device allocation), the initial weights (drawn, or read with
// --init_from) and their upload, the rest of set-up (optimizer, checkpoint resume),
// and the first step (the first use of every kernel, cuBLASLt's plans).
struct StartupTimes {
  double process = 0, data = 0, buffers = 0, weights = 0, setup = 0, first_step = 0;
  double total() const { return process + data + buffers + weights + setup + first_step; }
  std::string line() const;  // "start-up 12.3 s to the end of the first step: ..."
};

class Trainer {
 public:
  // grid: the parallel layout; null for one process without MPI. watchdog: told which
  // section the trainer is in (set-up, checkpoint load, steps, saves, evaluation); may
  // be null.
  Trainer(const LlamaConfig& model_cfg, const TrainConfig& cfg, ProcessGrid* grid = nullptr,
          Watchdog* watchdog = nullptr);
  ~Trainer();

  LlamaStage& model() { return *model_; }
  ProcessGrid& grid() { return *grid_; }
  // null without --val_data; of a blend, its first source's
  Evaluator* evaluator() { return evaluator_ ? &evaluator_->first() : nullptr; }
  int micro_batches() const { return num_micro_; }  // per data-parallel rank and step
  AdamW& optimizer() { return *optim_; }
  BlendedSampler& sampler() { return *train_sampler_; }

  // Gradients of the next global batch accumulated into model().params().grad()
  // (zeroed first), normalised by its unmasked targets, before any cross-rank
  // reduction. Returns the mean loss of the global batch (on every rank).
  double compute_gradients(int64_t* tokens = nullptr);
  // compute_gradients, clipping, one AdamW step at the schedule's learning rate. A
  // suspicious result (StepGuard) is run again first, from the same state and batch.
  StepStats train_step();
  // Mean loss over the first --eval_tokens target positions of the validation data.
  EvalStats evaluate();
  // The diagnostics of the current weights, with block gradient norms when the last
  // step's gradients are given (grads = true: after reduce, before clipping).
  std::vector<LayerDiagnostics> diagnostics(bool grads);
  // The whole run: steps, logs, metrics, validation, checkpoints. Returns true when
  // it stopped early on SIGTERM/SIGUSR1 (after saving a checkpoint). A resumed run
  // first drops the metrics records after its checkpoint's step (one per step).
  bool run();
  // Collective over dp: under ZeRO on CUDA each step gathers only what the kernels
  // read (bf16 weights, f32 norm gains ...), so the f32 master weights outside this
  // rank's shard lag behind; this brings them up to date (a no-op when they are, and
  // on the CPU). save_checkpoint and the end-of-run check call it; so must anything
  // else that reads every master weight (ParamSet::download, flat_params).
  void gather_master_weights();
  // Collective: writes a checkpoint of the current state; returns its directory.
  // Refuses (CollectiveError on every rank) a state with inf or NaN in it. With
  // --async_save (and allow_async) the write runs in the background and the directory
  // is final once committed at a later step boundary; otherwise it is final on return.
  std::string save_checkpoint(bool allow_async = false);
  // Forward/backward of the first global batch, reduced across ranks and written by
  // rank 0 as a step-state dump with logical (single-rank) names and shapes.
  void dump_step_state(const std::string& path);
  int64_t flops_per_token() const;  // 6 * parameters + attention (see docs/training.md)
  // Filled by the constructor, and by the first train_step for first_step.
  const StartupTimes& startup() const { return startup_; }
  // LN-free: the state (norms fixed so far, the schedule's progress), as a checkpoint
  // stores it; empty without --ln_free and without a resumed LN-free checkpoint.
  const LnFreeState& ln_free() const { return ln_free_; }
  // Collective: the divisor sums of --ln_free_calib_tokens of training data (the first
  // sequences of the unshuffled data, the same at every calibration) under the current
  // weights and fixed divisors.
  DivisorSums calibrate_divisors();
  // Collective: fires every --ln_free event due before the next step (calibrating and
  // fixing norms) and queues its metrics record. train_step() calls it first.
  void run_ln_free_events();
  // What this rank sent during the last train_step, by group and collective kind
  // (ProcessGrid::comm_counts; the ring-model bytes of CommCounts). Logged by rank 0
  // after step 1, and in every step's metrics.jsonl record as "comm_bytes".
  const std::vector<std::pair<std::string, CommCounts>>& last_step_comm() const { return last_step_comm_; }
  // "tp.all_reduce" -> bytes, for the kinds that moved anything.
  static std::vector<std::pair<std::string, double>> comm_bytes_by_kind(
      const std::vector<std::pair<std::string, CommCounts>>& counts);

 private:
  StartupTimes startup_;
  bool is_root() const { return grid_->rank == 0; }
  void log_activation_accounts() const;
  double peak_memory_bytes();  // collective
  // Samples the next global batch and runs it through the pipeline: gradients
  // accumulate (zeroed first); returns the batch's mean loss and unmasked targets.
  struct BatchResult {
    double loss = 0;
    int64_t tokens = 0;
  };
  // overlap: start the data-parallel gradient reduction during the last backward.
  BatchResult run_global_batch(const std::function<void(int, Tensor)>& on_logits, bool overlap = false);
  void resume_from(const std::string& dir);
  void check_finite_state();  // collective; CollectiveError naming the cause
  void resume_fp8(const Checkpoint& ck);

  LlamaConfig model_cfg_;
  TrainConfig cfg_;
  std::unique_ptr<ProcessGrid> own_grid_;
  ProcessGrid* grid_;
  int num_micro_ = 1;
  LrSchedule schedule_;
  std::unique_ptr<LlamaStage> model_;
  std::unique_ptr<PipelineSchedule1F1B> pipeline_;
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<AdamW> optim_;
  std::unique_ptr<DataBlend> train_data_, val_data_;
  std::unique_ptr<BlendedSampler> train_sampler_;
  std::unique_ptr<BlendEvaluator> evaluator_;
  std::unique_ptr<Evaluator> diag_;
  std::vector<double> last_block_grad_norms_;
  OwnedTensor inputs_, targets_;  // [M * B, T]: this dp rank's share of the global batch
  // CUDA: their device copies, uploaded once per step, so that no micro-batch waits
  // for a host-to-device copy of its ids or targets (empty on the CPU).
  OwnedTensor inputs_dev_, targets_dev_;
  int64_t resumed_step_ = -1;     // the checkpoint's step when resumed, else -1
  // Fault handling (docs/resilience.md): components the loop calls.
  Watchdog* watchdog_ = nullptr;
  std::unique_ptr<FaultInjector> faults_;
  std::unique_ptr<StragglerDetector> stragglers_;
  std::unique_ptr<StepGuard> guard_;
  std::unique_ptr<CheckpointManager> checkpoints_;
  std::vector<nlohmann::json> fault_records_;  // re-runs since the last metrics write
  double last_save_stall_s_ = 0;
  double last_injected_s_ = 0;  // --inject_fault slow: the last step's added seconds
  // One pass over a global batch: forward/backward, the sums across ranks, the norm.
  struct Attempt {
    uint64_t first_sample = 0;  // the batch's first sample in the training stream
    double loss = 0, grad_norm = 0;
    int64_t tokens = 0;
    uint64_t fingerprint = 0;   // this rank's own gradients before any cross-rank sum
  };
  Attempt attempt_step(int64_t step, bool flip_bit);
  // The re-run of a suspicious attempt (StepGuard); returns the attempt to go on with.
  Attempt settle_suspicious(int64_t step, Attempt a, std::string why);
  void section(Section s, int64_t step);  // watchdog_->enter when there is one
  // run()'s parts: the loop keeps the order, these do the work (docs/training.md).
  void open_metrics(Metrics& metrics);
  void log_plan() const;
  void report_step(const StepStats& s, bool first, StepLog& log, Metrics& metrics, double start);
  void run_eval(int64_t step, Metrics& metrics, double start);
  void between_steps(const StepStats& s, const StepLog& log, Metrics& metrics, double start);
  std::vector<ConversionRecord> conversions_;  // the resumed checkpoint's, written again
  std::unique_ptr<LnFreeSchedule> ln_free_schedule_;  // null without --ln_free
  LnFreeState ln_free_;
  std::unique_ptr<Evaluator> calib_;                  // reads the calibration tokens
  std::vector<nlohmann::json> ln_free_records_;       // events since the last metrics write
  std::vector<std::pair<std::string, CommCounts>> last_step_comm_;
};

}  // namespace lns
