#include "lns/checkpoint/async_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "lns/core/errors.h"
#include "lns/core/exit_status.h"

namespace lns {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// dst[0, n) = src[0, n), in chunks over the OpenMP threads (one thread leaves most of a
// socket's memory bandwidth unused, and this copy is the whole stall).
void parallel_copy(float* dst, const float* src, int64_t n) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk, e = std::min(n, b + kChunk);
    std::memcpy(dst + b, src + b, sizeof(float) * size_t(e - b));
  }
}

}  // namespace

// One save in flight: the copy of the state, the writer thread and its outcome.
struct AsyncCheckpointer::Flight {
  Fp8States fp8;
  ShardData data;
  LlamaConfig cfg;
  Layout layout;
  RunState state;
  OptimizerRecord optim;
  std::string tmp_dir, final_dir;
  std::thread writer;
  std::atomic<int> status{0};  // 0 running, 1 written, -1 failed
  std::string error;           // set by the writer before status = -1
  nlohmann::json shard;        // set by the writer before status = 1
  double write_s = 0;
};

AsyncCheckpointer::AsyncCheckpointer(std::string out_dir, Communicator& world, int keep, int pause_ms)
    : out_dir_(std::move(out_dir)), world_(world), keep_(keep), pause_ms_(pause_ms) {}

void AsyncCheckpointer::reserve(int64_t params, int64_t optim_range) {
  LNS_CHECK(!flight_) << "the buffers of a save in flight are being written";
  // resize() writes every element: the pages are the process's from here on.
  if (int64_t(params_.size()) != params) params_.assign(size_t(params), 0.0f);
  if (int64_t(exp_avg_.size()) != optim_range) exp_avg_.assign(size_t(optim_range), 0.0f);
  if (int64_t(exp_avg_sq_.size()) != optim_range) exp_avg_sq_.assign(size_t(optim_range), 0.0f);
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (flight_ && flight_->writer.joinable()) flight_->writer.join();
}

std::string AsyncCheckpointer::start(const ParamSet& params, const AdamW& optim, const LlamaConfig& cfg,
                                     const Layout& layout, RankCoords at, const RunState& state,
                                     const Fp8States& fp8) {
  finish();  // at most one in flight
  const double t0 = seconds_now();
  auto f = std::make_unique<Flight>();
  f->cfg = cfg, f->layout = layout, f->state = state, f->fp8 = fp8;
  f->optim = OptimizerRecord{optim.config(), optim.steps_taken()};
  f->final_dir = (std::filesystem::path(out_dir_) / "checkpoints" / absl::StrFormat("step_%07d", state.step)).string();
  f->tmp_dir = f->final_dir + ".tmp";
  if (world_.rank() == 0) prepare_save_dir(out_dir_, state.step);
  world_.barrier();  // the directory exists before anyone writes into it
  // The copy (the stall): the host buffers as they are at this step boundary, into
  // buffers kept from one save to the next (reserve(): no page is first touched here).
  const float* p = params.size() > 0 ? params.host_param(0).f32() - params.info(0).offset : nullptr;
  const Tensor m = optim.exp_avg(), v = optim.exp_avg_sq();
  reserve(params.numel(), m.numel());
  parallel_copy(params_.data(), p, params.numel());
  parallel_copy(exp_avg_.data(), m.f32(), m.numel());
  parallel_copy(exp_avg_sq_.data(), v.f32(), v.numel());
  f->data = ShardData{params_.data(), exp_avg_.data(), exp_avg_sq_.data(), optim.begin(), optim.end(), true};
  Flight* raw = f.get();
  const int pause = pause_ms_;
  f->writer = std::thread([raw, &params, at, pause] {
    const double w0 = seconds_now();
    try {
      raw->shard = write_rank_shard(raw->tmp_dir, params, raw->data, raw->layout, at, raw->fp8);
      if (pause > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause));
      raw->write_s = seconds_now() - w0;
      raw->status = 1;
    } catch (...) {
      raw->error = current_exception_message();
      raw->status = -1;
    }
  });
  flight_ = std::move(f);
  stall_s_ = seconds_now() - t0;
  return flight_->final_dir;
}

std::string AsyncCheckpointer::commit() {
  Flight& f = *flight_;
  f.writer.join();
  if (f.status == -1) LOG(ERROR) << "checkpoint " << f.final_dir << ": this rank's file failed: " << f.error;
  double failed = f.status == -1 ? 1 : 0;
  world_.all_reduce(&failed, 1, ReduceOp::Max);
  if (failed > 0) {
    const std::string dir = f.final_dir;
    flight_.reset();
    throw FaultError(kExitSaveFault, absl::StrCat("checkpoint ", dir, ": a rank failed to write its file (its log says ",
                                                  "why); checkpoints/latest still names the previous checkpoint"));
  }
  const std::string text = f.shard.dump();
  const auto all = world_.gather_bytes(std::vector<char>(text.begin(), text.end()));
  std::string dir = f.final_dir;
  if (world_.rank() == 0) {
    std::vector<nlohmann::json> shards;
    for (const auto& b : all) shards.push_back(nlohmann::json::parse(std::string(b.begin(), b.end())));
    dir = commit_save(out_dir_, shards, f.cfg, f.layout, f.state, f.optim, keep_);
  }
  write_s_ = f.write_s;
  flight_.reset();
  return dir;
}

std::string AsyncCheckpointer::poll() {
  if (!flight_) return "";
  // Every rank says whether its writer is done (failed counts as done: commit reports it).
  double waiting = flight_->status == 0 ? 1 : 0;
  world_.all_reduce(&waiting, 1, ReduceOp::Max);
  return waiting > 0 ? "" : commit();
}

std::string AsyncCheckpointer::finish() { return flight_ ? commit() : ""; }

}  // namespace lns
