#include "lns/async_checkpoint.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "lns/errors.h"
#include "lns/exit_status.h"

namespace lns {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// One save in flight: the copy of the state, the writer thread and its outcome.
struct AsyncCheckpointer::Flight {
  std::vector<float> params, exp_avg, exp_avg_sq;  // [numel], [optim range], [optim range]
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
  // The copy (the stall): the host buffers as they are at this step boundary.
  const float* p = params.size() > 0 ? params.host_param(0).f32() - params.info(0).offset : nullptr;
  f->params.assign(p, p + params.numel());
  const Tensor m = optim.exp_avg(), v = optim.exp_avg_sq();
  f->exp_avg.assign(m.f32(), m.f32() + m.numel());
  f->exp_avg_sq.assign(v.f32(), v.f32() + v.numel());
  f->data = ShardData{f->params.data(), f->exp_avg.data(), f->exp_avg_sq.data(), optim.begin(), optim.end(), true};
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
