// lns_train: trains a LLaMA-family model with the chosen normalization scheme.
//   mpirun -np 8 lns_train --flagfile=configs/tiny_lns.flags --tp=2 --pp=2
#include <gflags/gflags.h>
#include <mpi.h>

#include <csignal>
#include <cstdlib>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lns/model/block_plan.h"
#include "lns/cpu/cpu_info.h"
#include "lns/core/errors.h"
#include "lns/core/exit_status.h"
#include "lns/core/files.h"
#include "lns/model/model_layout.h"
#include "lns/model/model_flags.h"
#include "lns/train/resilience_flags.h"
#include "lns/train/run_dir.h"
#include "lns/train/train_flags.h"
#include "lns/train/trainer.h"
#include "lns/core/device.h"
#include "parallel/process_grid.h"
#include "parallel/watchdog.h"

DECLARE_int32(exit_code_on_signal);
DECLARE_string(out_dir);
DEFINE_bool(print_block_plan, false,
            "Print every layer's block plan (its scheme, the norms it owns, their LNS scales, its residual) "
            "as JSON from the model flags and exit, starting nothing: what tools/perf's models read.");

namespace lns {
namespace {

std::string g_command_line;

// The source tree's revision at launch ("unknown" outside a git checkout).
std::string source_revision() {
  FILE* p = ::popen("git -C " LNS_SOURCE_DIR " describe --always --dirty --abbrev=12 2>/dev/null", "r");
  if (!p) return "unknown";
  char buf[128] = {};
  const bool ok = std::fgets(buf, sizeof(buf), p) != nullptr;
  ::pclose(p);
  std::string s = ok ? buf : "unknown";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "unknown" : s;
}

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

// A restart by a launcher (launch/restart_policy.sh sets LNS_RESTART_*): which attempt
// this is, why the last one ended, and the watchdog's reports it left in OUT_DIR/faults
// (moved to faults/attempt_K/ once recorded). Rank 0, before run.json is rewritten.
nlohmann::json restart_entry(const std::string& out_dir, const std::string& when) {
  const char* count = std::getenv("LNS_RESTART_COUNT");
  if (!count || std::atoi(count) <= 0) return nullptr;
  const char* cause = std::getenv("LNS_RESTART_CAUSE");
  const char* status = std::getenv("LNS_RESTART_STATUS");
  nlohmann::json e = {{"attempt", std::atoi(count)}, {"started", when},
                      {"cause", cause ? cause : "?"}, {"exit_status", status ? std::atoi(status) : -1}};
  nlohmann::json reports = nlohmann::json::array();
  namespace fs = std::filesystem;
  const fs::path faults = fs::path(out_dir) / "faults";
  std::error_code ec;
  if (fs::is_directory(faults, ec)) {
    const fs::path done = faults / ("attempt_" + std::string(count));
    for (const auto& f : fs::directory_iterator(faults, ec)) {
      const std::string name = f.path().filename().string();
      if (!f.is_regular_file() || name.rfind("rank_", 0) != 0) continue;
      try {
        reports.push_back(parse_json_file(f.path().string(), 1 << 20, "watchdog report"));
      } catch (const UserError&) {
        continue;
      }
      fs::create_directories(done, ec);
      fs::rename(f.path(), done / name, ec);
    }
  }
  e["faults"] = reports;
  return e;
}

// run.json: what ran, from which source, where. Collective (gathers every rank's
// host); the record on rank 0. A restarted run keeps the earlier attempts' record of
// restarts and adds its own.
nlohmann::json run_record(ProcessGrid& grid, const std::string& out_dir) {
  const std::string mine = host_name();
  const auto all = grid.world().gather_bytes(std::vector<char>(mine.begin(), mine.end()));
  if (grid.rank != 0) return {};
  nlohmann::json layout = grid.layout.to_json();  // as in a checkpoint's manifest, plus the world
  layout["world"] = grid.world_size();
  nlohmann::json hosts = nlohmann::json::array();
  for (const auto& h : all) hosts.push_back(std::string(h.begin(), h.end()));
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json rec = {{"source_revision", source_revision()},
                        {"command", g_command_line},
                        {"started", when},
                        {"layout", layout},
                        {"hosts", hosts}};
  if (out_dir.empty()) return rec;
  nlohmann::json restarts = nlohmann::json::array();
  try {
    const std::string path = out_dir + "/run.json";
    if (std::filesystem::exists(path)) {
      const nlohmann::json old = parse_json_file(path, 1 << 24, "run record");
      if (old.is_object() && old.contains("restarts") && old["restarts"].is_array()) restarts = old["restarts"];
      if (old.is_object() && old.contains("first_started")) rec["first_started"] = old["first_started"];
      else if (old.is_object() && old.contains("started")) rec["first_started"] = old["started"];
    }
  } catch (const UserError& e) {
    LOG(WARNING) << "run.json of the earlier attempt is unreadable (" << e.what() << "); starting its record afresh";
  }
  if (const nlohmann::json e = restart_entry(out_dir, when); !e.is_null()) {
    restarts.push_back(e);
    LOG(WARNING) << "restart " << e["attempt"] << " after: " << e["cause"].get<std::string>() << " ("
                 << e["faults"].size() << " watchdog report(s) recorded in run.json)";
  }
  if (!restarts.empty()) rec["restarts"] = restarts;
  return rec;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// "[12:34:56 I r3] message": short, and says which rank spoke.
void log_prefix(std::ostream& s, const google::LogMessageInfo& m, void*) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "[%02d:%02d:%02d %c] ", m.time.hour(), m.time.min(), m.time.sec(),
                m.severity[0]);
  s << buf;
}

int run() {
  std::unique_ptr<ProcessGrid> grid;
  std::unique_ptr<Watchdog> watchdog;  // hang detection from set-up to the end (parallel/watchdog.h)
  std::unique_ptr<RunDirLock> lock;  // rank 0 holds the run directory for the whole run
  std::unique_ptr<Trainer> trainer;
  LlamaConfig model_cfg;
  TrainConfig cfg;
  std::string error, flags;
  try {
    model_cfg = config_from_flags();
    cfg = train_config_from_flags();
    grid = ProcessGrid::create_mpi(tp_flag(), pp_flag());
    if (watchdog_flag()) {
#ifdef LNS_CUDA_SIM
      WatchdogConfig w = watchdog_config_from_flags(/*stretch=*/20);  // an emulated GPU: far slower steps
#else
      WatchdogConfig w = watchdog_config_from_flags();
#endif
      w.rank = grid->rank, w.world = grid->world_size(), w.host = host_name(), w.run_dir = cfg.out_dir;
      w.stage = grid->coords.pp;
      watchdog = std::make_unique<Watchdog>(w);
      watchdog->enter(Section::Setup, 0);
    }
    grid->layout.virtual_stages = cfg.virtual_stages;
    grid->layout = layout_for_model(model_cfg, grid->layout, cfg.pp_layers);
    grid->layout.sequence_parallel = cfg.sequence_parallel;  // printed below; the Trainer checks --seq_len
    if (cfg.device == Device::CUDA) {
      const int gpu = bind_local_gpu(local_rank_from_env());
      (void)comm_flag();  // a bad --comm fails here, on every rank
      VLOG(1) << "rank " << grid->rank << ": GPU " << gpu << ", " << current_gpu_description();
      if (grid->rank == 0) LOG(INFO) << "CUDA backend: " << current_gpu_description();
    }
    if (grid->rank == 0) {
      flags = resolved_flags();
      LOG(INFO) << "configuration:\n" << flags;
      LOG(INFO) << "layout: " << grid->layout.describe();
      if (cfg.device == Device::CPU) {
        LOG(INFO) << "CPU backend: " << cpu_blas_info();
        if (const std::string w = cpu_blas_warning(); !w.empty()) LOG(WARNING) << w;
      }
      // One run per directory; refused here, on every rank, before anything is read.
      if (!cfg.out_dir.empty()) lock = std::make_unique<RunDirLock>(cfg.out_dir);
    }
  } catch (...) {
    error = current_exception_message();
  }
  if (!all_ranks_started("lns_train", error)) return 1;
  // Device communicators (NCCL starts collectively) only once every rank has its GPU,
  // then the model; each phase agrees before the next, so a failing rank never
  // leaves the others waiting inside a collective.
  try {
    if (cfg.device == Device::CUDA) {
      grid->use_device_communicators(comm_flag());
      // A hung NCCL kernel never returns by itself: ncclCommAbort from the watchdog's
      // thread frees it, and the main thread ends the job (FaultError, kExitHang).
      if (watchdog) {
        watchdog->add_abort_hook([g = grid.get()] { g->abort_communicators(); });
        watchdog->add_probe([g = grid.get()] { return g->communicator_error(); });
      }
    }
    trainer = std::make_unique<Trainer>(model_cfg, cfg, grid.get(), watchdog.get());
  } catch (...) {
    error = current_exception_message();
  }
  if (!all_ranks_started("lns_train", error)) return 1;
  // The run is accepted (its resume checked against the flags): only now does the run
  // directory change. Collective first: every rank has started and is listening.
  const nlohmann::json record = run_record(*grid, cfg.out_dir);
  try {
    if (grid->rank == 0 && !cfg.out_dir.empty()) {
      write_file_atomically(cfg.out_dir + "/config.flags", flags);
      write_file_atomically(cfg.out_dir + "/model_config.json", model_cfg.to_json().dump(2) + "\n");
      write_file_atomically(cfg.out_dir + "/run.json", record.dump(2) + "\n");
    }
  } catch (...) {
    error = current_exception_message();
  }
  if (!all_ranks_started("lns_train", error)) return 1;
  if (watchdog) watchdog->start_heartbeats();  // the run directory may change now

  if (!dump_step_state_flag().empty()) {
    trainer->dump_step_state(dump_step_state_flag());
    return 0;
  }
  // SLURM sends SIGTERM (or the --signal of the job) before pre-emption or the time
  // limit: finish the step, save, exit cleanly.
  std::signal(SIGTERM, request_stop);
  std::signal(SIGUSR1, request_stop);
  const bool stopped = trainer->run();
  if (watchdog) watchdog->enter(Section::None, 0);
  if (stopped) {
    if (grid->rank == 0)
      LOG(WARNING) << "stopped early after a signal; resume with --resume=auto (exit status "
                   << FLAGS_exit_code_on_signal << ")";
    return FLAGS_exit_code_on_signal;
  }
  if (grid->rank == 0 && !cfg.out_dir.empty()) LOG(INFO) << "metrics: " << cfg.out_dir << "/metrics.jsonl";
  return 0;
}

}  // namespace
}  // namespace lns

int main(int argc, char** argv) {
  lns::line_buffered_stdout();
  gflags::SetUsageMessage("lns_train --flagfile=configs/tiny_lns.flags [--flag=value ...]");
  for (int i = 0; i < argc; ++i) absl::StrAppend(&lns::g_command_line, i ? " " : "", argv[i]);
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_print_block_plan) {  // a question about the model flags: no MPI, no logs, no run directory
    try {
      std::printf("%s\n", lns::block_plans_json(lns::config_from_flags()).dump(1).c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lns_train: error: %s\n", e.what());
      return 1;
    }
  }
  FLAGS_logtostderr = true;
  if (!FLAGS_out_dir.empty()) {  // every rank's log also goes to OUT_DIR/logs/
    std::error_code ec;
    std::filesystem::create_directories(FLAGS_out_dir + "/logs", ec);
    if (!ec) {
      FLAGS_log_dir = FLAGS_out_dir + "/logs";
      FLAGS_logtostderr = false;
      FLAGS_alsologtostderr = true;
    }
  }
  google::InitGoogleLogging(argv[0], &lns::log_prefix);
  MPI_Init(&argc, &argv);
  int code = 0;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string rank_note = world > 1 ? absl::StrCat(" (rank ", lns::world_rank(), ")") : "";
  try {
    code = lns::run();
  } catch (const lns::FaultError& e) {
    // A fault of the machine (a failed communicator, a failed checkpoint write): its own
    // exit status, so that the launchers restart the job (lns/core/exit_status.h).
    std::fprintf(stderr, "lns_train: fault: %s%s (exit status %d)\n", e.what(), rank_note.c_str(), e.status());
    std::fflush(stderr);
    if (world > 1) MPI_Abort(MPI_COMM_WORLD, e.status());
    code = e.status();
  } catch (const lns::CollectiveError& e) {
    // Every rank found the same fault at the same point (e.g. non-finite weights after
    // an all-reduce): one line, and every rank exits cleanly with status 1.
    if (lns::world_rank() == 0) std::fprintf(stderr, "lns_train: error: %s\n", e.what());
    code = 1;
  } catch (...) {
    // A failure after start-up on some ranks (bad data mid-run, a full disk): the others
    // may be inside a collective, so end them all.
    std::fprintf(stderr, "lns_train: error: %s%s\n", lns::current_exception_message().c_str(), rank_note.c_str());
    std::fflush(stderr);
    if (world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    code = 1;
  }
  MPI_Finalize();
  return code;
}
