#include "lns/train/trainer.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <atomic>
#include <thread>

#include "lns/model/activation_memory.h"
#include "lns/checkpoint/checkpoint.h"
#include "lns/train/checkpoint_manager.h"
#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/train/fault_injection.h"
#include "lns/train/fp8_health.h"
#include "lns/model/fp8_state.h"
#include "lns/train/gather.h"
#include "lns/model/model_layout.h"
#include "lns/core/ops.h"
#include "lns/checkpoint/param_io.h"
#include "lns/train/run_dir.h"
#include "lns/checkpoint/safetensors.h"
#include "lns/train/step_log.h"
#include "lns/train/tensorboard.h"
#include "parallel/comm_activity.h"

namespace lns {
namespace {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Seconds since this process started (the kernel's start time of the process against
// the time since boot, both in /proc): loading the libraries and MPI_Init included.
// 0 where /proc does not say.
double seconds_since_process_start() {
  std::ifstream stat("/proc/self/stat"), up("/proc/uptime");
  std::string s;
  double uptime = 0;
  if (!std::getline(stat, s) || !(up >> uptime)) return 0;
  const size_t close = s.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) {
      const long ticks = sysconf(_SC_CLK_TCK);
      const double started = ticks > 0 ? std::strtod(field.c_str(), nullptr) / ticks : uptime;
      return std::max(0.0, uptime - started);
    }
  return 0;
}

std::atomic<int> g_stop_signal{0};

}  // namespace

void request_stop(int signal) { g_stop_signal.store(signal); }
int stop_requested() { return g_stop_signal.load(); }

void TrainConfig::validate() const {
  LNS_REQUIRE(seq_len > 0, "--seq_len must be positive, got ", seq_len);
  LNS_REQUIRE(micro_batch > 0, "--micro_batch_size must be positive, got ", micro_batch);
  LNS_REQUIRE(global_batch > 0, "--global_batch_size must be positive, got ", global_batch);
  LNS_REQUIRE(global_batch % micro_batch == 0, "--global_batch_size=", global_batch,
              " must be a multiple of --micro_batch_size=", micro_batch);
  LNS_REQUIRE(steps >= 0, "--steps must be >= 0, got ", steps);
  LNS_REQUIRE(std::isfinite(lr) && lr > 0 && lr <= std::numeric_limits<float>::max(),
              "--lr must be a positive number that f32 can hold, got ", lr);
  LNS_REQUIRE(min_lr_ratio >= 0 && min_lr_ratio <= 1, "--min_lr_ratio must be in [0, 1], got ",
              min_lr_ratio);
  LNS_REQUIRE(warmup_steps >= 0, "--warmup_steps must be >= 0, got ", warmup_steps);
  LNS_REQUIRE(adam.beta1 >= 0 && adam.beta1 < 1, "--beta1 must be in [0, 1), got ", adam.beta1);
  LNS_REQUIRE(adam.beta2 >= 0 && adam.beta2 < 1, "--beta2 must be in [0, 1), got ", adam.beta2);
  // As the f32 AdamW uses it: 1e-50 would be 0 there, and 0 divides 0 by 0 for any
  // parameter without gradient (v = 0).
  LNS_REQUIRE(std::isfinite(adam.eps) && adam.eps > 0, "--adam_eps must be a positive number that f32 can ",
              "hold (>= 1.4e-45), got ", adam.eps);
  LNS_REQUIRE(std::isfinite(adam.weight_decay) && adam.weight_decay >= 0,
              "--weight_decay must be >= 0, got ", adam.weight_decay);
  LNS_REQUIRE(std::isfinite(grad_clip) && grad_clip >= 0, "--grad_clip must be >= 0 (0 = off), got ", grad_clip);
  LNS_REQUIRE(std::isfinite(peak_tflops) && peak_tflops >= 0, "--peak_tflops must be >= 0, got ", peak_tflops);
  LNS_REQUIRE(virtual_stages >= 1, "--virtual_stages must be >= 1, got ", virtual_stages);
  LNS_REQUIRE(diag_every >= 0, "--diag_every must be >= 0 (0 = off), got ", diag_every);
  LNS_REQUIRE(log_every > 0, "--log_every must be positive, got ", log_every);
  LNS_REQUIRE(eval_every >= 0, "--eval_every must be >= 0 (0 = only at the end), got ", eval_every);
  LNS_REQUIRE(eval_tokens > 0, "--eval_tokens must be positive, got ", eval_tokens);
  LNS_REQUIRE(std::isfinite(dp_bucket_mb) && dp_bucket_mb > 0 && dp_bucket_mb <= 1 << 20,
              "--dp_bucket_mb must be in (0, 1048576], got ", dp_bucket_mb);
  LNS_REQUIRE(save_every >= 0, "--save_every must be >= 0, got ", save_every);
  LNS_REQUIRE(keep_checkpoints >= 0, "--keep_checkpoints must be >= 0, got ", keep_checkpoints);
  LNS_REQUIRE(resume != "auto" || !out_dir.empty(), "--resume=auto needs --out_dir");
  LNS_REQUIRE(save_every == 0 || !out_dir.empty(), "--save_every=", save_every,
              " needs --out_dir (where the checkpoints go)");
  LNS_REQUIRE(keep_checkpoints == 0 || !out_dir.empty(), "--keep_checkpoints needs --out_dir");
  if (!ln_free.empty()) {
    LNS_REQUIRE(ln_free_calib_tokens > 0, "--ln_free_calib_tokens must be positive, got ", ln_free_calib_tokens);
    LNS_REQUIRE(seq_len >= 2, "--ln_free needs --seq_len >= 2 (position 0 and the positions after it are ",
                "calibrated apart), got ", seq_len);
  }
  LNS_REQUIRE(ln_free_eot_token >= -1, "--ln_free_eot_token must be a token id or -1 (none), got ",
              ln_free_eot_token);
  LNS_REQUIRE(ln_free_loss_window >= 1 && ln_free_loss_window <= 100000,
              "--ln_free_loss_window must be in [1, 100000], got ", ln_free_loss_window);
}

Trainer::~Trainer() = default;

// Rank 0 prints every stage's activation-memory account (a pure function of the
// layout, lns/model/activation_memory.h), so one log shows what each pipeline rank holds.
void Trainer::log_activation_accounts() const {
  if (!is_root()) return;
  const Layout& layout = grid_->layout;
  for (int p = 0; p < layout.pp; ++p) {
    const StageSpec spec = stage_spec(layout, p);
    const ActivationAccount acc = activation_account(
        model_cfg_, spec, cfg_.micro_batch, cfg_.seq_len, chunk_slots(num_micro_, p, layout.pp, layout.virtual_stages),
        TensorParallel{0, layout.tp, nullptr, layout.sequence_parallel_on()}, cfg_.device);
    LOG(INFO) << "stage " << p << " (--recompute=" << recompute_mode_name(model_cfg_.recompute)
              << "): " << acc.str();
  }
}

// The most bytes any rank's Buffers held so far on the device the model computes on
// (host allocator on the CPU, device high-water mark on CUDA). Collective.
double Trainer::peak_memory_bytes() {
  double peak = static_cast<double>(cfg_.device == Device::CPU ? host_peak_allocated_bytes()
                                                              : cuda_peak_allocated_bytes());
  grid_->world().all_reduce(&peak, 1, ReduceOp::Max);
  return peak;
}

std::string StartupTimes::line() const {
  return absl::StrFormat(
      "start-up %.1f s to the end of the first step: process %.1f s, data %.1f s, model buffers %.1f s, initial weights "
      "%.1f s, rest of set-up %.1f s, first step %.1f s",
      total(), process, data, buffers, weights, setup, first_step);
}

Trainer::Trainer(const LlamaConfig& model_cfg, const TrainConfig& cfg, ProcessGrid* grid, Watchdog* watchdog)
    : model_cfg_(model_cfg), cfg_(cfg), watchdog_(watchdog) {
  startup_.process = seconds_since_process_start();
  double mark = now_seconds();
  auto lap = [&mark] {
    const double t = now_seconds(), d = t - mark;
    mark = t;
    return d;
  };
  if (!grid) {
    own_grid_ = ProcessGrid::single();
    grid = own_grid_.get();
  }
  grid_ = grid;
  cfg_.validate();
  model_cfg_.validate();
  if (cfg_.resume.empty()) check_fresh_run_dir(cfg_.out_dir);  // before anything is allocated
  // The model's part of the layout: its stage split, and --zero (which shards only
  // over more than one dp rank).
  grid_->layout.virtual_stages = cfg_.virtual_stages;
  grid_->layout = layout_for_model(model_cfg_, grid_->layout, cfg_.pp_layers);
  grid_->layout.set_zero(cfg_.zero);
  grid_->layout.sequence_parallel = cfg_.sequence_parallel;
  grid_->layout.check_sequence_length(cfg_.seq_len);
  const Layout& layout = grid_->layout;
  const int dp = layout.dp;
  LNS_REQUIRE(cfg_.global_batch % (cfg_.micro_batch * dp) == 0, "--global_batch_size=",
              cfg_.global_batch, " must be a multiple of --micro_batch_size=", cfg_.micro_batch,
              " x data-parallel size ", dp);
  num_micro_ = static_cast<int>(cfg_.global_batch / (cfg_.micro_batch * dp));
  check_micro_batches(num_micro_, layout.pp, layout.virtual_stages);
  schedule_ = {cfg_.lr, cfg_.min_lr_ratio, cfg_.warmup_steps, std::max<int64_t>(cfg_.steps, 1)};

  // Data first: a missing file should fail before gigabytes are allocated.
  if (cfg_.data == "random") {
    train_data_ = std::make_unique<DataBlend>(TokenCorpus::random(
        model_cfg_.vocab_size, std::max<int64_t>(1024, cfg_.global_batch) * cfg_.seq_len + 1, cfg_.seed));
  } else {
    train_data_ = DataBlend::open(cfg_.data, "--data");
  }
  train_sampler_ = std::make_unique<BlendedSampler>(*train_data_, cfg_.data_mode, cfg_.seq_len,
                                                    cfg_.seed, /*shuffle=*/cfg_.data != "random",
                                                    model_cfg_.vocab_size);
  if (!cfg_.val_data.empty()) {
    val_data_ = DataBlend::open(cfg_.val_data, "--val_data");
    BlendedSampler check(*val_data_, cfg_.data_mode, cfg_.seq_len, 0, false, model_cfg_.vocab_size);
  }
  startup_.data = lap();

  const StageSpec spec = stage_spec(layout, grid_->coords.pp);
  model_ = std::make_unique<LlamaStage>(
      model_cfg_, spec, cfg_.micro_batch, cfg_.seq_len,
      chunk_slots(num_micro_, grid_->coords.pp, layout.pp, layout.virtual_stages), grid_->tensor_parallel(),
      cfg_.device);
  log_activation_accounts();
  startup_.buffers = lap();
  if (cfg_.init_from.empty()) {
    model_->init_weights(cfg_.seed);
  } else {
    load_params(model_->params(), SafetensorsReader(cfg_.init_from), model_cfg_);
    if (is_root()) LOG(INFO) << "loaded weights from " << cfg_.init_from;
  }
  device_synchronize(cfg_.device);  // the upload is part of it
  startup_.weights = lap();
  pipeline_ = std::make_unique<PipelineSchedule1F1B>(*grid_, *model_, num_micro_);
  pipeline_->set_cuda_graphs(cfg_.cuda_graphs);
  const EvalOptions eval{cfg_.seq_len, cfg_.micro_batch, cfg_.eval_tokens, cfg_.data_mode, cfg_.eval_spread};
  if (val_data_) {
    evaluator_ = std::make_unique<BlendEvaluator>(*grid_, *model_, *pipeline_, *val_data_, eval);
    if (is_root())
      for (const std::string& w : evaluator_->shortfalls()) LOG(WARNING) << w;
  }
  // Diagnostics read one fixed micro-batch, so steps compare like with like.
  EvalOptions one = eval;
  one.eval_tokens = cfg_.micro_batch * cfg_.seq_len;
  diag_ = std::make_unique<Evaluator>(*grid_, *model_, *pipeline_, (val_data_ ? *val_data_ : *train_data_).corpus(0), one);
  sync_ = std::make_unique<GradientSync>(*grid_, model_->params(), model_cfg_.tie_embeddings, cfg_.dp_bucket_mb);
  model_->set_grad_ready_hook([this](int64_t from) { sync_->grads_ready(from); });
  // ZeRO: the optimizer owns this dp rank's shard; otherwise every rank updates all.
  optim_ = sync_->zero() ? std::make_unique<AdamW>(model_->params(), cfg_.adam,
                                                   sync_->shard_begin(), sync_->shard_end())
                         : std::make_unique<AdamW>(model_->params(), cfg_.adam);
  if (!cfg_.ln_free.empty()) {
    LNS_REQUIRE(cfg_.ln_free_eot_token < model_cfg_.vocab_size, "--ln_free_eot_token=", cfg_.ln_free_eot_token,
                " is not below --vocab_size=", model_cfg_.vocab_size);
    ln_free_schedule_ = std::make_unique<LnFreeSchedule>(cfg_.ln_free, model_cfg_, cfg_.ln_free_eot_token,
                                                         cfg_.ln_free_loss_window);
    ln_free_ = ln_free_schedule_->initial_state();
    EvalOptions calib = eval;
    calib.eval_tokens = cfg_.ln_free_calib_tokens;
    calib.spread = false;
    calib_ = std::make_unique<Evaluator>(*grid_, *model_, *pipeline_, train_data_->corpus(0), calib);
    if (is_root())
      LOG(INFO) << "ln_free: " << ln_free_schedule_->events().size() << " events (" << cfg_.ln_free
                << "); each calibration reads " << calib_->eval_tokens() << " training tokens";
  }
  inputs_ = OwnedTensor(DType::I32, {num_micro_ * cfg_.micro_batch, cfg_.seq_len});
  targets_ = OwnedTensor(DType::I32, {num_micro_ * cfg_.micro_batch, cfg_.seq_len});
  if (cfg_.device != Device::CPU) {
    inputs_dev_ = OwnedTensor(DType::I32, inputs_.t.shape, cfg_.device);
    targets_dev_ = OwnedTensor(DType::I32, targets_.t.shape, cfg_.device);
  }

  // Fault handling: the components the loop calls (docs/resilience.md).
  faults_ = std::make_unique<FaultInjector>(cfg_.inject_fault, grid_->rank, cfg_.out_dir);
  guard_ = std::make_unique<StepGuard>(cfg_.spike_factor, cfg_.spike_window);
  stragglers_ = std::make_unique<StragglerDetector>(cfg_.straggler, *grid_);
  checkpoints_ = std::make_unique<CheckpointManager>(cfg_.out_dir, grid_->world(), cfg_.save_every, cfg_.steps,
                                                     cfg_.keep_checkpoints, cfg_.async_save,
                                                     cfg_.checkpoint_test_pause_ms);
  checkpoints_->reserve(model_->params().numel(), optim_->end() - optim_->begin());
  if (!cfg_.resume.empty()) {
    section(Section::Load, 0);
    std::vector<std::string> notes;
    const std::string dir = cfg_.resume == "auto" ? find_latest_checkpoint(cfg_.out_dir, &notes) : cfg_.resume;
    if (is_root())
      for (const std::string& n : notes) LOG(WARNING) << "--resume=auto: " << n;
    if (dir.empty()) {
      if (is_root()) LOG(INFO) << "--resume=auto: no complete checkpoint in " << cfg_.out_dir << "/checkpoints; starting fresh";
    } else {
      resume_from(dir);
    }
    section(Section::Setup, resumed_step_);
  }
  startup_.setup = lap();
}

void Trainer::section(Section s, int64_t step) {
  if (watchdog_) watchdog_->enter(s, step);
}

void Trainer::resume_from(const std::string& dir) {
  const Checkpoint ck(dir);
  // The model must be the one the flags describe; the layout may differ.
  const nlohmann::json have = ck.config().to_json(), want = model_cfg_.to_json();
  for (const auto& [key, value] : want.items())
    if (!have.contains(key) || have[key] != value)
      fail(dir, "/manifest.json: the checkpoint's ", key, " is ",
           have.contains(key) ? have[key].dump() : "absent", " but the flags say ", value.dump());
  const auto text = [](bool b) { return b ? "true" : "false"; };
  LNS_REQUIRE(ck.config().folded_norms == model_cfg_.folded_norms, dir, "/manifest.json: the checkpoint's ",
              "folded_norms is ", text(ck.config().folded_norms), " but the flags say --folded_norms=",
              text(model_cfg_.folded_norms));
  ck.load_into(model_->params(), optim_.get());
  const RunState st = ck.run_state();
  train_sampler_->set_consumed(st.consumed_samples);
  resumed_step_ = optim_->steps_taken();
  conversions_ = st.conversions;
  // LN-free: the norms fixed so far and the schedule's progress, so that the run goes on
  // exactly as the uninterrupted one would.
  if (ln_free_schedule_) {
    if (st.ln_free.empty()) {
      ln_free_ = ln_free_schedule_->initial_state(optim_->steps_taken());  // starts on a plain checkpoint
    } else {
      ln_free_schedule_->check_resumed(st.ln_free, dir + "/manifest.json");
      ln_free_ = st.ln_free;
    }
  } else if (!st.ln_free.progress.schedule.empty() &&
             st.ln_free.progress.next_event <
                 static_cast<int>(parse_ln_free_schedule(st.ln_free.progress.schedule, model_cfg_,
                                                         st.ln_free.eot_token).size())) {
    fail(dir, "/manifest.json: the checkpoint is in the middle of the LN-free schedule '",
         st.ln_free.progress.schedule, "'; pass the same --ln_free (and --ln_free_eot_token) to continue it");
  } else {  // finished or no schedule: the fixed norms stay fixed

    ln_free_ = st.ln_free;
  }
  apply_ln_free(ln_free_, *model_);
  resume_fp8(ck);
  if (is_root())
    LOG(INFO) << "resumed from " << dir << " at step " << st.step << " (saved under layout "
              << ck.layout().brief() << ")";
}

// --fp8: every FP8 tensor's scaling state from the checkpoint, so the run casts with the
// scales the uninterrupted one would. A checkpoint without one (saved without --fp8, or
// rewritten by lns_convert) starts the scales afresh, with a warning; different scaling
// settings are an error (the history would not mean the same).
void Trainer::resume_fp8(const Checkpoint& ck) {
  Fp8State* fp8 = model_->fp8();
  const Fp8Record& rec = ck.run_state().fp8;
  const std::string where = ck.dir() + "/manifest.json";
  if (!fp8) {
    if (!rec.empty() && is_root())
      LOG(INFO) << where << ": the checkpoint's FP8 scaling state is not used (--fp8=none)";
    return;
  }
  if (rec.empty()) {
    if (is_root())
      LOG(WARNING) << where << ": no FP8 scaling state (saved without --fp8, or rewritten by lns_convert); "
                   << "the FP8 scales start at 1 as in a new run";
    return;
  }
  const Fp8ScalingConfig& want = model_cfg_.fp8_scaling;
  const bool blockwise = model_cfg_.fp8 == Fp8Mode::Blockwise;  // its scales do not depend on the --fp8_* settings
  LNS_REQUIRE(rec.mode == fp8_mode_name(model_cfg_.fp8) &&
                  (blockwise || (rec.scaling.history == want.history && rec.scaling.margin == want.margin &&
                                 rec.scaling.most_recent == want.most_recent)),
              where, ": the checkpoint's FP8 scaling is --fp8=", rec.mode, " --fp8_amax_history=", rec.scaling.history,
              " --fp8_margin=", rec.scaling.margin, " --fp8_amax_compute=", rec.scaling.most_recent ? "most_recent" : "max",
              "; pass the same to resume");
  if (blockwise) return;  // no state: its scales are made at each cast
  std::vector<std::vector<float>> states;
  for (const Fp8Health& h : fp8->last_health()) {
    std::optional<std::vector<float>> s = ck.fp8_state(h.name);
    if (!s) fail(where, ": has no FP8 scaling state for '", h.name, "'");
    states.push_back(std::move(*s));
  }
  fp8->restore(states, where);
}

std::string Trainer::save_checkpoint(bool allow_async) {
  LNS_REQUIRE(!cfg_.out_dir.empty(), "saving a checkpoint needs --out_dir");
  section(Section::Save, optim_->steps_taken());
  faults_->in_save(optim_->steps_taken());
  RunState st;
  st.step = optim_->steps_taken();
  st.tokens_seen = st.step * cfg_.global_batch * cfg_.seq_len;
  st.consumed_samples = train_sampler_->consumed();
  st.seed = cfg_.seed;
  st.training = {cfg_.seq_len, cfg_.data_mode == SampleMode::Packed ? "packed" : "document", cfg_.micro_batch,
                 cfg_.global_batch};
  st.conversions = conversions_;
  st.ln_free = ln_free_;
  Fp8States fp8;  // tp and dp ranks hold the same scales: their first ones write them
  if (const Fp8State* f = model_->fp8()) {
    st.fp8.mode = fp8_mode_name(model_cfg_.fp8), st.fp8.scaling = model_cfg_.fp8_scaling;
    if (grid_->coords.tp == 0 && grid_->coords.dp == 0) {
      const std::vector<std::vector<float>> s = f->state();
      for (size_t r = 0; r < s.size(); ++r) fp8.emplace_back(f->last_health()[r].name, s[r]);
    }
  }
  const double t0 = now_seconds();
  gather_master_weights();
  model_->params().download();  // CUDA: checkpoints read the host mirrors
  optim_->download();
  check_finite_state();  // a non-finite state is never saved
  const bool background = allow_async && checkpoints_->async();
  const std::string dir = checkpoints_->save(
      {model_->params(), *optim_, model_cfg_, grid_->layout, grid_->coords, st, fp8}, background);
  last_save_stall_s_ = now_seconds() - t0;
  if (is_root())
    LOG(INFO) << (background ? absl::StrFormat("checkpoint %s: state copied in %.2f s (training stalled that long); "
                                               "writing it in the background", dir, last_save_stall_s_)
                             : absl::StrFormat("saved checkpoint %s (%.1f s)", dir, last_save_stall_s_));
  return dir;
}

int64_t Trainer::flops_per_token() const {
  // 6 FLOPs per parameter per token (forward 2, backward 4) for every matrix the
  // tokens pass through, plus attention scores and values: 12 * L * C * T (as in
  // PaLM's accounting, causal masking not subtracted). The embedding lookup is free.
  // Counted on the logical model, so every layout reports the same figure.
  const int64_t C = model_cfg_.hidden_size, F = model_cfg_.intermediate_size,
                QD = int64_t{model_cfg_.num_heads} * model_cfg_.head_dim(), KD = model_cfg_.kv_dim();
  const int64_t per_layer = 2 * C * QD + 2 * C * KD + 3 * C * F;
  const int64_t matmul_params = model_cfg_.num_layers * per_layer + int64_t{model_cfg_.vocab_size} * C;
  return 6 * matmul_params + 12 * int64_t{model_cfg_.num_layers} * C * cfg_.seq_len;
}

Trainer::BatchResult Trainer::run_global_batch(const std::function<void(int, Tensor)>& on_logits,
                                               bool overlap) {
  const int64_t B = cfg_.micro_batch, T = cfg_.seq_len;
  // This rank's first sequence, by its index in the training stream: the routed layers'
  // Gumbel noise is keyed by it, so every layout and a resume draw the same noise.
  const uint64_t first_sample = train_sampler_->consumed() + uint64_t(grid_->coords.dp) * num_micro_ * B;
  train_sampler_->next_batch(cfg_.global_batch, grid_->coords.dp, grid_->layout.dp, inputs_, targets_);
  // One normaliser for the whole global batch: the loss is the mean over every
  // unmasked target, however the batch is cut into micro-batches and dp ranks.
  const double valid = grid_->dp_comm().all_reduce_sum(
      static_cast<double>(count_unmasked(targets_.i32(), num_micro_ * B * T)));
  model_->params().zero_grads();
  const bool dev = !inputs_dev_.t.empty();
  if (dev) {  // one upload per step (the stage then copies device to device)
    copy_tensor(inputs_dev_, inputs_);
    copy_tensor(targets_dev_, targets_);
  }
  const Tensor in = dev ? inputs_dev_.t : inputs_.t, tg = dev ? targets_dev_.t : targets_.t;
  const double loss_sum = pipeline_->train(
      [&](int m) { return in.rows(m * B, (m + 1) * B); },
      [&](int m) { return tg.rows(m * B, (m + 1) * B).view({B * T}); },
      valid > 0 ? static_cast<float>(1.0 / valid) : 0.0f, on_logits,
      [&] {
        if (overlap) sync_->arm_overlap();
      },
      [&](int m, int slot, int chunk) {
        if (model_->has_routed_layers())
          model_->set_gate_noise(cfg_.seed, first_sample + uint64_t(m) * B, slot, chunk);
      });
  // Every rank learns the global loss.
  const double total = grid_->world().all_reduce_sum(grid_->reports_loss() ? loss_sum : 0.0);
  return {valid > 0 ? total / valid : 0.0, static_cast<int64_t>(valid)};
}

double Trainer::compute_gradients(int64_t* tokens_out) {
  const BatchResult r = run_global_batch({});
  if (tokens_out) *tokens_out = r.tokens;
  return r.loss;
}

DivisorSums Trainer::calibrate_divisors() {
  LNS_CHECK(calib_) << "calibration needs --ln_free";
  return calib_->divisor_sums();
}

void Trainer::run_ln_free_events() {
  if (!ln_free_schedule_) return;
  const int64_t step = optim_->steps_taken();
  std::string why;
  while (const LnFreeEvent* e = ln_free_schedule_->due(ln_free_, step, &why)) {
    const int index = ln_free_.progress.next_event;
    const double t0 = now_seconds();
    const DivisorSums sums = e->action == LnFreeEvent::Action::Replace ? calibrate_divisors() : DivisorSums{};
    const std::vector<FixedNorm> fixed = apply_event(ln_free_, *e, step, sums);
    apply_ln_free(ln_free_, *model_);
    if (!is_root()) continue;
    nlohmann::json norms = nlohmann::json::array();
    std::string brief;
    for (const FixedNorm& n : fixed) {
      norms.push_back({{"layer", n.layer}, {"slot", divisor_slot_name(n.slot)}, {"pos0", n.pos0},
                       {"rest", n.rest}, {"eot", n.eot}});
      if (brief.size() < 400)
        absl::StrAppend(&brief, brief.empty() ? "" : ", ", n.slot == DivisorSlot::Final ? "final" :
                        absl::StrCat("L", n.layer, " ", divisor_slot_name(n.slot)), " ",
                        absl::StrFormat("%.4g/%.4g", n.pos0, n.rest));
    }
    const size_t total = ln_free_schedule_->events().size();
    LOG(INFO) << absl::StrFormat("ln_free: event %d/%d '%s' before step %d (%s): ", index + 1, total, e->text,
                                 step + 1, why)
              << (fixed.empty() ? std::string(e->action == LnFreeEvent::Action::DropEot
                                                  ? "end-of-text rows now divide by the positions > 0 constant"
                                                  : "position 0 now divides by the positions > 0 constant")
                                : absl::StrFormat("%d norms fixed, divisors pos0/rest: %s", fixed.size(), brief))
              << absl::StrFormat(" (%.1f s)", now_seconds() - t0);
    ln_free_records_.push_back(
        {{"step", step + 1},
         {"ln_free_event", {{"index", index}, {"of", total}, {"entry", e->text}, {"reason", why},
                            {"norms", norms}, {"fixed_total", ln_free_.norms.size()},
                            {"pos0_special", ln_free_.pos0_special},
                            {"baseline_loss", ln_free_.progress.baseline_loss}}}});
  }
}

std::vector<std::pair<std::string, double>> Trainer::comm_bytes_by_kind(
    const std::vector<std::pair<std::string, CommCounts>>& counts) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [group, c] : counts)
    for (int k = 0; k < CommCounts::kKinds; ++k)
      if (c.bytes[k] > 0) out.push_back({group + "." + collective_name(static_cast<Collective>(k)), c.bytes[k]});
  return out;
}

Trainer::Attempt Trainer::attempt_step(int64_t step, bool flip_bit) {
  Attempt a;
  a.first_sample = train_sampler_->consumed();
  // With overlap the data-parallel sums start inside the last backward; reduce()
  // finishes them (and does everything else).
  sync_->begin_step(flip_bit);
  const BatchResult r = run_global_batch({}, cfg_.overlap_grad_reduce);
  a.loss = r.loss * faults_->loss_factor(a.first_sample, cfg_.global_batch), a.tokens = r.tokens;
  sync_->reduce();
  if (Fp8State* fp8 = model_->fp8()) fp8->end_step({&grid_->tp_comm(), &grid_->dp_comm()});
  a.grad_norm = sync_->global_norm();
  a.fingerprint = sync_->local_fingerprint();
  (void)step;
  return a;
}

// A suspicious step, run again from the state before it: only the gradients changed,
// so rewinding the sampler gives the same batch and weights. The same bits blame the
// batch; other bits a transient fault, and each rank compares its own gradients'
// fingerprints to say whose differed. Collective (every rank decides the same).
Trainer::Attempt Trainer::settle_suspicious(int64_t step, Attempt a, std::string why) {
  const int world = grid_->world_size();
  for (int reruns = 0, skips = 0; !why.empty();) {
    train_sampler_->set_consumed(a.first_sample);
    if (is_root()) LOG(WARNING) << "step " << step << ": " << why << "; running the step again from the state before it";
    const Attempt b = attempt_step(step, /*flip_bit=*/false);
    ++reruns;
    std::vector<double> differs(world, 0.0);
    differs[grid_->rank] = a.fingerprint != b.fingerprint ? 1 : 0;
    grid_->world().all_reduce(differs.data(), world, ReduceOp::Sum);
    const bool same_result = std::memcmp(&a.loss, &b.loss, sizeof(double)) == 0 &&
                             std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)) == 0;
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r)
      if (differs[r] > 0) ranks.push_back(r);
    nlohmann::json rec = {{"step", step}, {"rerun", ""}, {"why", why}, {"loss", a.loss}, {"grad_norm", a.grad_norm},
                          {"rerun_loss", b.loss}, {"rerun_grad_norm", b.grad_norm}};
    if (same_result && ranks.empty()) {
      // Reproduced bit for bit: the batch is the cause.
      const int64_t n = cfg_.global_batch;
      nlohmann::json samples = nlohmann::json::array();
      std::string brief;
      for (int64_t i = 0; i < n && i < 1024; ++i) {
        const int64_t id = train_sampler_->sample_of(a.first_sample + i);
        samples.push_back(id);
        if (i < 8) absl::StrAppend(&brief, i ? " " : "", id);
      }
      rec["rerun"] = "reproduced", rec["stream_index"] = a.first_sample, rec["samples"] = samples;
      const bool skip = cfg_.skip_bad_batches;
      if (is_root())
        LOG(WARNING) << "step " << step << ": the re-run reproduced it bit for bit: the batch is the cause (training "
                     << "stream samples " << a.first_sample << ".." << a.first_sample + n - 1 << ", sample ids " << brief
                     << (n > 8 ? " ..." : "") << ")"
                     << (skip ? "; skipping it (--skip_bad_batches)" : "; --skip_bad_batches would skip it");
      rec["skipped"] = skip;
      fault_records_.push_back(rec);
      if (!skip) return b;
      LNS_REQUIRE(++skips <= 16, "step ", step, ": 16 batches in a row were bad and skipped (--skip_bad_batches); ",
                  "the data or the model is at fault, not single batches");
      a = attempt_step(step, false);  // the sampler stands after the bad batch: the next one
      why = guard_->suspicious(a.loss, a.grad_norm);
      continue;
    }
    // Another result: a transient fault (a flipped bit, a faulty device or link).
    std::string who;
    for (int r : ranks) absl::StrAppend(&who, who.empty() ? "" : ", ", r);
    rec["rerun"] = "transient", rec["ranks"] = ranks;
    if (is_root())
      LOG(WARNING) << "step " << step << ": the re-run gave another result (loss " << b.loss << ", gradient norm "
                   << b.grad_norm << "): a transient fault, "
                   << (ranks.empty() ? std::string("no rank's own gradients differed (the difference arose in a sum "
                                                   "across ranks or outside the gradients)")
                                     : "the gradients of rank(s) " + who + " differed between the two runs")
                   << "; training goes on with the re-run's result";
    fault_records_.push_back(rec);
    a = b;
    why = guard_->suspicious(a.loss, a.grad_norm);
    if (reruns >= 3) break;  // still suspicious after three runs: judged below like any result
  }
  return a;
}

StepStats Trainer::train_step() {
  run_ln_free_events();  // the schedule is decided from state the checkpoint holds
  const int64_t step = optim_->steps_taken() + 1;
  section(Section::Step, step);
  const double t0 = now_seconds(), wait0 = CommActivity::process().wait_seconds();
  // --inject_fault slow: as if computing `factor` times as long as this rank really does.
  const double extra = faults_->at_step_start(step, stragglers_->last_compute_s() - last_injected_s_);
  if (extra > 0) std::this_thread::sleep_for(std::chrono::duration<double>(extra));
  last_injected_s_ = extra;
  const auto comm_before = grid_->comm_counts();
  StepStats s;
  s.lr = schedule_.at(optim_->steps_taken());
  Fp8State* fp8 = model_->fp8();
  if (fp8) fp8->begin_step();  // drops what evaluation and diagnostics cast since the last step
  Attempt a = attempt_step(step, faults_->take_bitflip(step));
  // FP8's delayed scaling moves its amax history at every step's end: a re-run would move
  // it twice, so FP8 runs judge the first result as it is.
  if (std::string why = guard_->suspicious(a.loss, a.grad_norm); !why.empty() && cfg_.rerun_suspicious && !fp8)
    a = settle_suspicious(step, a, why);
  s.loss = a.loss, s.tokens = a.tokens, s.grad_norm = a.grad_norm;
  if (cfg_.diag_every > 0 && (optim_->steps_taken() + 1) % cfg_.diag_every == 0)
    last_block_grad_norms_ = block_grad_norms(*grid_, model_->params(), *sync_, model_cfg_.num_layers);
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm))  // the same on every rank (all-reduced)
    throw CollectiveError(absl::StrCat("training diverged at step ", optim_->steps_taken() + 1, ": loss ", s.loss,
                                       ", gradient norm ", s.grad_norm, "; nothing was saved. Likely cause: --lr=",
                                       cfg_.lr, " too large (lower it or set --grad_clip), or the data"));
  guard_->accept(s.loss, s.grad_norm);
  if (ln_free_schedule_) ln_free_schedule_->record_loss(ln_free_, s.loss);
  sync_->scale(clip_factor(s.grad_norm, cfg_.grad_clip));
  optim_->step(static_cast<float>(s.lr));
  sync_->gather_params();
  device_synchronize(cfg_.device);  // the step's time includes its queued GPU work
  s.step = optim_->steps_taken();
  s.seconds = now_seconds() - t0;
  stragglers_->add_step(s.seconds, CommActivity::process().wait_seconds() - wait0);
  if (watchdog_) watchdog_->step_done(s.seconds);
  if (startup_.first_step == 0) startup_.first_step = s.seconds;
  last_step_comm_ = grid_->comm_counts();
  for (size_t g = 0; g < last_step_comm_.size(); ++g) last_step_comm_[g].second = last_step_comm_[g].second - comm_before[g].second;
  if (VLOG_IS_ON(1)) {
    std::string line;
    for (const auto& [kind, bytes] : comm_bytes_by_kind(last_step_comm_)) absl::StrAppend(&line, " ", kind, "=", bytes);
    VLOG(1) << "rank " << grid_->rank << " step " << s.step << " sent bytes:" << line;
  }
  return s;
}

void Trainer::gather_master_weights() { sync_->gather_master(); }

// Collective. Every rank checks its host copies of the weights and its AdamW moments
// (after download()); if any rank finds inf or NaN, every rank throws the same
// CollectiveError naming the likely cause.
void Trainer::check_finite_state() {
  const ParamSet& ps = model_->params();
  std::string where;
  for (int i = 0; i < ps.size() && where.empty(); ++i) {
    const Tensor t = ps.host_param(i);
    if (first_non_finite(t.f32(), t.numel()) >= 0) where = "weight '" + ps.info(i).name + "'";
  }
  for (const Tensor& m : {optim_->exp_avg(), optim_->exp_avg_sq()})
    if (where.empty() && first_non_finite(m.f32(), m.numel()) >= 0) where = "AdamW moments";
  double bad = where.empty() ? 0 : 1;
  grid_->world().all_reduce(&bad, 1, ReduceOp::Max);
  if (bad == 0) return;
  const std::string cause =
      cfg_.adam.eps < 1e-12f
          ? absl::StrCat("--adam_eps=", cfg_.adam.eps, " is too small (AdamW divides by sqrt(v) + eps)")
          : absl::StrCat("--lr=", cfg_.lr, " too large for this model, or data that drives the loss to extremes");
  throw CollectiveError(absl::StrCat(
      "step ", optim_->steps_taken(), " left non-finite training state (",
      where.empty() ? "a weight or moment on another rank" : where,
      " holds inf or NaN); nothing was saved and checkpoints/latest still names the last good checkpoint. ",
      "Likely cause: ", cause));
}

// The FP8 health of the step's every linear (all stages, gathered on rank 0): one log
// line with the worst tensors, and on rank 0 the metrics record (one row per layer and
// tensor, for plots against depth). Collective over the world.
EvalStats Trainer::evaluate() { return evaluator_ ? evaluator_->evaluate() : EvalStats{}; }

std::vector<LayerDiagnostics> Trainer::diagnostics(bool grads) {
  std::vector<LayerDiagnostics> d = diag_->diagnostics(1);
  if (grads)
    for (size_t l = 0; l < d.size() && l < last_block_grad_norms_.size(); ++l)
      d[l].grad_norm = last_block_grad_norms_[l];
  return d;
}

void Trainer::dump_step_state(const std::string& path) {
  gather_master_weights();  // a dump after ZeRO steps starts from every current weight
  const int64_t B = cfg_.micro_batch, T = cfg_.seq_len, V = model_cfg_.vocab_size;
  const ShardRange vs = model_->vocab_shard();
  OwnedTensor logits;
  if (grid_->last_stage()) logits = OwnedTensor(DType::F32, {num_micro_ * B, T, vs.stored});
  const float loss = static_cast<float>(run_global_batch([&](int m, Tensor l) {
                                          // keep the logits before backward overwrites them
                                          const std::vector<float> h = to_host_f32(l);
                                          std::memcpy(logits.f32() + m * B * T * vs.stored, h.data(), h.size() * 4);
                                        }).loss);
  sync_->reduce(/*full=*/true);
  model_->params().download(/*grads=*/true);

  // Gather the logical tensors on rank 0: gradients from dp rank 0, the batch and
  // the logits from every dp rank's share.
  std::vector<TensorPiece> pieces;
  const int64_t rows = num_micro_ * B, row0 = grid_->coords.dp * rows, G = cfg_.global_batch;
  if (grid_->coords.dp == 0)
    for (int i = 0; i < model_->params().size(); ++i) {
      TensorPiece p;
      if (!param_piece(model_->params(), i, /*grads=*/true, grid_->coords.tp, &p)) continue;
      p.name = "grad." + p.name;
      pieces.push_back(p);
    }
  if (grid_->first_stage() && grid_->coords.tp == 0) {
    pieces.push_back({"inputs", {G, T}, {row0, 0}, {rows, T}, inputs_});
    pieces.push_back({"targets", {G, T}, {row0, 0}, {rows, T}, targets_});
  }
  if (grid_->last_stage()) pieces.push_back({"logits", {G, T, V}, {row0, 0, vs.begin}, {rows, T, vs.valid}, logits});
  const auto all = gather_to_root(grid_->world(), pieces);
  if (!is_root()) return;
  SafetensorsWriter w;
  for (const auto& [name, t] : all) w.add(name, t.t);
  w.add_f32("loss", {}, &loss);
  w.set_metadata("format", "lns-step-state-v1");
  w.set_metadata("config", model_cfg_.to_json().dump());
  w.set_metadata("seq_len", std::to_string(T));
  w.set_metadata("global_batch_size", std::to_string(G));
  w.set_metadata("layout", grid_->layout.brief());
  w.write(path);
  LOG(INFO) << "first batch: loss " << loss << "; wrote step state to " << path;
}

// Where this run's records go, on rank 0: metrics.jsonl and TensorBoard's event files,
// each cut back to the resumed checkpoint's step first (one record per step: those after
// it are about to be redone).
void Trainer::open_metrics(Metrics& metrics) {
  if (!is_root()) return;
  const int64_t from = std::max<int64_t>(resumed_step_, 0);
  if (!cfg_.out_dir.empty()) {
    const std::string path = cfg_.out_dir + "/metrics.jsonl";
    if (const int64_t dropped = truncate_metrics(path, from); dropped > 0)
      LOG(INFO) << "metrics.jsonl: dropped " << dropped << " record(s) after step " << from
                << " (the checkpoint this run continues from)";
    metrics.add(make_jsonl_sink(path));
  }
  if (!cfg_.tensorboard_dir.empty()) {
    const std::string run = tensorboard_run_id(cfg_.out_dir.empty() ? cfg_.tensorboard_dir : cfg_.out_dir);
    if (const int64_t dropped = truncate_tensorboard(cfg_.tensorboard_dir, from, run); dropped > 0)
      LOG(INFO) << "tensorboard: dropped " << dropped << " event(s) after step " << from
                << " (the checkpoint this run continues from)";
    metrics.add(make_tensorboard_sink(cfg_.tensorboard_dir, from, run));
  }
}

void Trainer::log_plan() const {
  if (!is_root()) return;
  LOG(INFO) << absl::StrFormat(
      "training %d steps of %d sequences x %d tokens (%d micro-batches of %d per data-parallel "
      "rank), %.1f GFLOP per step",
      cfg_.steps, cfg_.global_batch, cfg_.seq_len, num_micro_, cfg_.micro_batch,
      double(flops_per_token()) * cfg_.global_batch * cfg_.seq_len / 1e9);
  if (grid_->layout.pp > 1) {
    const Layout& l = grid_->layout;
    LOG(INFO) << absl::StrFormat(
        "pipeline: %s over %d stages x %d micro-batches: idle fraction (bubble) (P-1)/(V*M) = %.3f",
        l.virtual_stages > 1 ? absl::StrFormat("interleaved 1F1B, %d chunks per stage,", l.virtual_stages) : "1F1B",
        l.pp, num_micro_, pipeline_bubble(num_micro_, l.pp, l.virtual_stages));
  }
}

// The step's record and training line (StepLog), and what only the trainer knows: the
// records queued during the step (LN-free events, re-runs), LN-free progress, the
// bytes of step 1, the memory peak at the first and last step (a collective).
void Trainer::report_step(const StepStats& s, bool first, StepLog& log, Metrics& metrics, double start) {
  for (const nlohmann::json& r : ln_free_records_) metrics.write(r);
  ln_free_records_.clear();
  for (const nlohmann::json& r : fault_records_) metrics.write(r);
  fault_records_.clear();
  log.add(s);
  // On logged steps the record carries the memory peak so far (a collective max).
  const bool line_due = log.line_due(s.step);
  const double peak = line_due ? peak_memory_bytes() : -1;
  if (is_root()) {
    const auto comm = comm_bytes_by_kind(last_step_comm_);
    nlohmann::json j = log.record(s, now_seconds(), first ? &startup_ : nullptr, comm);
    if (peak >= 0) j["peak_memory_bytes"] = peak;
    if (ln_free_schedule_)
      j["ln_free_fixed"] = ln_free_.norms.size(), j["ln_free_next_event"] = ln_free_.progress.next_event;
    if (train_data_->weighted()) {  // each source's samples so far (docs/data.md)
      const std::vector<uint64_t> n = train_sampler_->samples_by_source();
      for (int k = 0; k < train_data_->size(); ++k) j["samples_by_source"][train_data_->name(k)] = n[k];
    }
    if (s.step == 1 && !comm.empty()) {
      std::string line;
      double total = 0;
      for (const auto& [kind, bytes] : comm) absl::StrAppend(&line, " | ", kind, " ", absl::StrFormat("%.0f", bytes)), total += bytes;
      LOG(INFO) << absl::StrFormat("bytes sent by rank 0 in step 1: %.0f", total) << line
                << " (ring model, docs/parallelism.md)";
    }
    metrics.write(j);
  }
  if (!line_due) return;
  std::string extra;
  if (ln_free_schedule_)
    extra = absl::StrFormat(" | ln_free %d/%d events, %d norms fixed", ln_free_.progress.next_event,
                            ln_free_schedule_->events().size(), ln_free_.norms.size());
  const std::string line = log.line(s, now_seconds(), extra);
  if (is_root()) LOG(INFO) << line;
  if ((s.step == 1 || s.step == cfg_.steps) && is_root())
    LOG(INFO) << absl::StrFormat("memory: peak %.2f MiB held by lns buffers on the busiest rank (%s)",
                                 peak / 1048576.0, cfg_.device == Device::CPU ? "host allocator" : "device high-water mark");
}

// Validation (every --eval_every steps and at the end), on the log and in the metrics.
void Trainer::run_eval(int64_t step, Metrics& metrics, double start) {
  if (!val_data_) return;
  section(Section::Eval, step);
  const double t0 = now_seconds();
  const EvalStats e = evaluate();
  if (!is_root()) return;
  LOG(INFO) << absl::StrFormat("eval  step %6d | val_loss %.4f | val_ppl %.2f | %d tokens | %.1f s",
                               step, e.loss, e.ppl, e.tokens, now_seconds() - t0);
  nlohmann::json rec = {{"step", step}, {"val_loss", e.loss}, {"val_ppl", e.ppl},
                        {"val_tokens", e.tokens}, {"elapsed_s", now_seconds() - start}};
  if (!e.by_source.empty()) {  // a weighted --val_data
    rec["val_loss_by_source"] = nlohmann::json::object();
    for (const SourceEval& s : e.by_source) {
      LOG(INFO) << absl::StrFormat("eval  step %6d | %s: val_loss %.4f | %d tokens", step, s.name, s.loss, s.tokens);
      rec["val_loss_by_source"][s.name] = s.loss;
    }
  }
  metrics.write(rec);
}

// What runs between steps on its own schedule: FP8 health, validation, straggler
// windows, depth diagnostics. Collective.
void Trainer::between_steps(const StepStats& s, const StepLog& log, Metrics& metrics, double start) {
  if (model_->fp8() && log.line_due(s.step))
    metrics.write(fp8_health_record(*grid_, *model_->fp8(), model_cfg_.num_layers, s.step));
  if (cfg_.eval_every > 0 && s.step % cfg_.eval_every == 0 && s.step != cfg_.steps) run_eval(s.step, metrics, start);
  if (stragglers_->due(s.step)) {
    const nlohmann::json rec = stragglers_->end_window(grid_->world(), s.step);
    if (is_root()) metrics.write(rec);
  }
  if (cfg_.diag_every > 0 && s.step % cfg_.diag_every == 0) {
    section(Section::Eval, s.step);
    const auto d = diagnostics(/*grads=*/true);
    if (is_root()) {
      nlohmann::json rows = nlohmann::json::array();
      for (const LayerDiagnostics& l : d)
        rows.push_back({{"layer", l.layer}, {"variance", l.variance}, {"mean_norm", l.mean_norm},
                        {"angular_distance", l.angular}, {"angular_distance_last", l.angular_last},
                        {"grad_norm", l.grad_norm}});
      metrics.write({{"step", s.step}, {"diag", rows}});
    }
  }
}

bool Trainer::run() {
  Metrics metrics;
  open_metrics(metrics);
  if (resumed_step_ >= cfg_.steps) {
    if (is_root()) LOG(INFO) << "nothing to do: resumed at step " << resumed_step_ << ", --steps=" << cfg_.steps;
    return false;
  }
  log_plan();
  checkpoints_->record_to(&metrics, is_root());
  struct Detach {  // `metrics` ends with run(); a later save is not recorded
    CheckpointManager* c;
    ~Detach() { c->record_to(nullptr, false); }
  } detach{checkpoints_.get()};
  const double start = now_seconds();
  StepLog log({cfg_.steps, cfg_.log_every, cfg_.global_batch * cfg_.seq_len, flops_per_token(), cfg_.peak_tflops,
               grid_->world_size()},
              start);
  for (bool first = true; optim_->steps_taken() < cfg_.steps; first = false) {
    const StepStats s = train_step();
    if (first && is_root()) LOG(INFO) << startup_.line();
    report_step(s, first, log, metrics, start);
    between_steps(s, log, metrics, start);
    if (checkpoints_->async()) {  // collective: commits the save in flight once every rank's file is written
      section(Section::Save, s.step);
      checkpoints_->poll(s.step);
    }
    // A signal may reach some ranks only; all agree before anyone saves.
    double stop = stop_requested();
    grid_->world().all_reduce(&stop, 1, ReduceOp::Max);
    if (stop > 0) {
      if (is_root()) LOG(WARNING) << "received signal " << int(stop) << ": saving and stopping at step " << s.step;
      if (checkpoints_->saves()) save_checkpoint();
      return true;
    }
    if (checkpoints_->due(s.step)) {
      const std::string dir = save_checkpoint(/*allow_async=*/true);
      if (is_root())
        metrics.write({{"step", s.step}, {"checkpoint", dir}, {"save_stall_s", last_save_stall_s_},
                       {"async", checkpoints_->async()}});
    }
  }
  run_eval(optim_->steps_taken(), metrics, start);
  if (checkpoints_->saves()) {
    save_checkpoint();
  } else {  // nothing is saved, but a run that ends non-finite still fails
    gather_master_weights();
    model_->params().download();
    optim_->download();
    check_finite_state();
  }
  return false;
}

}  // namespace lns
