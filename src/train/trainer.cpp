#include "lns/trainer.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <absl/strings/str_format.h>

#include "lns/errors.h"
#include "lns/param_io.h"
#include "lns/step_state.h"

namespace lns {
namespace {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

int64_t count_valid(const int32_t* targets, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += targets[i] != kIgnoreIndex;
  return c;
}

// Appends one JSON object per line; flushed so a crash loses at most the last line.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path) {
    if (path.empty()) return;
    out_.open(path, std::ios::app);
    if (!out_) fail(path, ": cannot open metrics file for writing");
  }
  void write(const nlohmann::json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

}  // namespace

void TrainConfig::validate() const {
  LNS_REQUIRE(seq_len > 0, "--seq_len must be positive, got ", seq_len);
  LNS_REQUIRE(micro_batch > 0, "--micro_batch_size must be positive, got ", micro_batch);
  LNS_REQUIRE(global_batch > 0, "--global_batch_size must be positive, got ", global_batch);
  LNS_REQUIRE(global_batch % micro_batch == 0, "--global_batch_size=", global_batch,
              " must be a multiple of --micro_batch_size=", micro_batch);
  LNS_REQUIRE(steps >= 0, "--steps must be >= 0, got ", steps);
  LNS_REQUIRE(lr > 0, "--lr must be positive, got ", lr);
  LNS_REQUIRE(min_lr_ratio >= 0 && min_lr_ratio <= 1, "--min_lr_ratio must be in [0, 1], got ",
              min_lr_ratio);
  LNS_REQUIRE(warmup_steps >= 0, "--warmup_steps must be >= 0, got ", warmup_steps);
  LNS_REQUIRE(adam.beta1 >= 0 && adam.beta1 < 1 && adam.beta2 >= 0 && adam.beta2 < 1,
              "--beta1 and --beta2 must be in [0, 1)");
  LNS_REQUIRE(grad_clip >= 0, "--grad_clip must be >= 0 (0 = off), got ", grad_clip);
  LNS_REQUIRE(log_every > 0, "--log_every must be positive, got ", log_every);
  LNS_REQUIRE(eval_every >= 0, "--eval_every must be >= 0 (0 = only at the end), got ", eval_every);
  LNS_REQUIRE(eval_tokens > 0, "--eval_tokens must be positive, got ", eval_tokens);
}

Trainer::~Trainer() = default;

Trainer::Trainer(const LlamaConfig& model_cfg, const TrainConfig& cfg)
    : model_cfg_(model_cfg), cfg_(cfg) {
  cfg_.validate();
  model_cfg_.validate();
  schedule_ = {cfg_.lr, cfg_.min_lr_ratio, cfg_.warmup_steps, std::max<int64_t>(cfg_.steps, 1)};
  // Data first: a missing file should fail before gigabytes are allocated.
  if (cfg_.data == "random") {
    train_data_ = TokenCorpus::random(model_cfg_.vocab_size,
                                      std::max<int64_t>(1024, cfg_.global_batch) * cfg_.seq_len + 1,
                                      cfg_.seed);
  } else {
    train_data_ = TokenCorpus::open(cfg_.data);
  }
  train_sampler_ = std::make_unique<BatchSampler>(*train_data_, cfg_.data_mode, cfg_.seq_len,
                                                  cfg_.seed, /*shuffle=*/cfg_.data != "random",
                                                  model_cfg_.vocab_size);
  if (!cfg_.val_data.empty()) {
    val_data_ = TokenCorpus::open(cfg_.val_data);
    BatchSampler check(*val_data_, cfg_.data_mode, cfg_.seq_len, 0, false, model_cfg_.vocab_size);
  }
  model_ = std::make_unique<LlamaStage>(model_cfg_, StageSpec::whole(model_cfg_), cfg_.micro_batch,
                                        cfg_.seq_len);
  if (cfg_.init_from.empty()) {
    model_->init_weights(cfg_.seed);
  } else {
    load_params(model_->params(), SafetensorsReader(cfg_.init_from));
    LOG(INFO) << "loaded weights from " << cfg_.init_from;
  }
  optim_ = std::make_unique<AdamW>(model_->params(), cfg_.adam);
  inputs_ = OwnedTensor(DType::I32, {cfg_.global_batch, cfg_.seq_len});
  targets_ = OwnedTensor(DType::I32, {cfg_.global_batch, cfg_.seq_len});
}

int64_t Trainer::flops_per_token() const {
  // 6 FLOPs per parameter per token (forward 2, backward 4) for every matrix the
  // tokens pass through, plus attention scores and values: 12 * L * C * T (as in
  // PaLM's accounting, causal masking not subtracted). The embedding lookup is free.
  int64_t matmul_params = 0;
  const ParamSet& ps = model_->params();
  for (const ParamInfo& p : ps.infos())
    if (p.decays() && p.kind != ParamKind::Embedding) matmul_params += p.shape.numel();
  if (model_cfg_.tie_embeddings)
    matmul_params += int64_t{model_cfg_.vocab_size} * model_cfg_.hidden_size;
  return 6 * matmul_params +
         12 * int64_t{model_cfg_.num_layers} * model_cfg_.hidden_size * cfg_.seq_len;
}

double Trainer::compute_gradients(int64_t* tokens_out) {
  const int64_t B = cfg_.micro_batch, T = cfg_.seq_len, accum = cfg_.accum_steps();
  train_sampler_->next_batch(cfg_.global_batch, /*dp_rank=*/0, /*dp_size=*/1, inputs_, targets_);
  // One normaliser for the whole global batch: the loss is the mean over every
  // unmasked target, however the batch is cut into micro-batches.
  const int64_t valid = count_valid(targets_.i32(), cfg_.global_batch * T);
  const float grad_scale = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;
  model_->params().zero_grads();
  double loss_sum = 0.0;
  for (int64_t k = 0; k < accum; ++k) {
    const Tensor in = inputs_.t.rows(k * B, (k + 1) * B), tg = targets_.t.rows(k * B, (k + 1) * B);
    model_->forward(in);
    loss_sum += model_->loss(tg.view({B * T}));
    model_->backward({}, grad_scale);
  }
  if (tokens_out) *tokens_out = valid;
  return valid > 0 ? loss_sum / valid : 0.0;
}

StepStats Trainer::train_step() {
  const double t0 = now_seconds();
  StepStats s;
  s.lr = schedule_.at(optim_->steps_taken());
  s.loss = compute_gradients(&s.tokens);
  s.grad_norm = grad_norm(model_->params());
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm))
    fail("training diverged at step ", optim_->steps_taken() + 1, ": loss ", s.loss,
         ", gradient norm ", s.grad_norm, " (lower --lr or set --grad_clip)");
  clip_grads(model_->params(), s.grad_norm, cfg_.grad_clip);
  optim_->step(static_cast<float>(s.lr));
  s.step = optim_->steps_taken();
  s.seconds = now_seconds() - t0;
  return s;
}

EvalStats Trainer::evaluate() {
  EvalStats e;
  if (!val_data_) return e;
  const int64_t B = cfg_.micro_batch, T = cfg_.seq_len;
  BatchSampler val(*val_data_, cfg_.data_mode, T, 0, /*shuffle=*/false, model_cfg_.vocab_size);
  const int64_t num_seq = (cfg_.eval_tokens + T - 1) / T;
  OwnedTensor in(DType::I32, {B, T}), tg(DType::I32, {B, T});
  double sum = 0.0;
  for (int64_t s0 = 0; s0 < num_seq; s0 += B) {
    for (int64_t b = 0; b < B; ++b) {
      int32_t* tgt = tg.i32() + b * T;
      val.fill(static_cast<uint64_t>(s0 + b) % val.samples_per_epoch(), in.i32() + b * T, tgt);
      // Exactly eval_tokens target positions count: mask the rest of the last batch.
      for (int64_t t = 0; t < T; ++t)
        if ((s0 + b) * T + t >= cfg_.eval_tokens) tgt[t] = kIgnoreIndex;
    }
    model_->forward(in);
    sum += model_->loss(tg.t.view({B * T}));
    e.tokens += count_valid(tg.i32(), B * T);
  }
  e.loss = e.tokens > 0 ? sum / e.tokens : 0.0;
  e.ppl = std::exp(e.loss);
  return e;
}

void Trainer::dump_step_state(const std::string& path) {
  const int64_t B = cfg_.micro_batch, T = cfg_.seq_len;
  OwnedTensor in(DType::I32, {B, T}), tg(DType::I32, {B, T});
  train_sampler_->next_batch(B, 0, 1, in, tg);
  const int64_t valid = count_valid(tg.i32(), B * T);
  model_->params().zero_grads();
  const Tensor logits = model_->forward(in);
  const float loss = static_cast<float>(model_->loss(tg.t.view({B * T})) / std::max<int64_t>(valid, 1));
  OwnedTensor logits_copy(DType::F32, logits.shape);  // backward overwrites the logits
  std::memcpy(logits_copy.t.data, logits.data, logits.nbytes());
  model_->backward({}, valid > 0 ? 1.0f / valid : 0.0f);
  write_step_state(path, model_cfg_, model_->params(), {in, tg, logits_copy, loss});
  LOG(INFO) << "first batch: loss " << loss << "; wrote step state to " << path;
}

void Trainer::run() {
  MetricsLog metrics(cfg_.out_dir.empty() ? "" : cfg_.out_dir + "/metrics.jsonl");
  const int64_t tokens_per_step = cfg_.global_batch * cfg_.seq_len;
  const double flops_per_step = double(flops_per_token()) * tokens_per_step;
  LOG(INFO) << absl::StrFormat(
      "training %d steps of %d sequences x %d tokens (%d micro-batches of %d), %.2fM parameters, "
      "%.1f GFLOP per step",
      cfg_.steps, cfg_.global_batch, cfg_.seq_len, cfg_.accum_steps(), cfg_.micro_batch,
      model_->params().numel() / 1e6, flops_per_step / 1e9);
  const double start = now_seconds();
  double window_time = 0;
  int64_t window_tokens = 0;
  auto do_eval = [&](int64_t step) {
    if (!val_data_) return;
    const double t0 = now_seconds();
    const EvalStats e = evaluate();
    LOG(INFO) << absl::StrFormat("eval  step %6d | val_loss %.4f | val_ppl %.2f | %d tokens | %.1f s",
                                 step, e.loss, e.ppl, e.tokens, now_seconds() - t0);
    metrics.write({{"step", step}, {"val_loss", e.loss}, {"val_ppl", e.ppl},
                   {"val_tokens", e.tokens}, {"elapsed_s", now_seconds() - start}});
  };
  for (int64_t i = 0; i < cfg_.steps; ++i) {
    const StepStats s = train_step();
    window_time += s.seconds;
    window_tokens += tokens_per_step;
    const double tps = tokens_per_step / s.seconds;
    nlohmann::json j = {{"step", s.step}, {"loss", s.loss}, {"lr", s.lr},
                        {"grad_norm", s.grad_norm}, {"tokens_per_s", tps},
                        {"step_time_s", s.seconds}, {"elapsed_s", now_seconds() - start},
                        {"tokens", s.step * tokens_per_step}};
    if (cfg_.peak_tflops > 0) j["mfu"] = flops_per_step / s.seconds / (cfg_.peak_tflops * 1e12);
    metrics.write(j);
    if (s.step % cfg_.log_every == 0 || s.step == cfg_.steps || s.step == 1) {
      const double avg_tps = window_tokens / window_time;
      std::string mfu;
      if (cfg_.peak_tflops > 0)
        mfu = absl::StrFormat(" | MFU %.1f%%", 100.0 * avg_tps * flops_per_token() / (cfg_.peak_tflops * 1e12));
      LOG(INFO) << absl::StrFormat(
          "step %6d/%d | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s%s | %.1f s", s.step,
          cfg_.steps, s.loss, s.lr, s.grad_norm, avg_tps, mfu, now_seconds() - start);
      window_time = 0;
      window_tokens = 0;
    }
    if (cfg_.eval_every > 0 && s.step % cfg_.eval_every == 0 && s.step != cfg_.steps) do_eval(s.step);
  }
  do_eval(optim_->steps_taken());
}

}  // namespace lns
