// lns_train: trains a LLaMA-family model with the chosen normalization scheme.
//   lns_train --flagfile=configs/tiny_lns.flags [--flag=value ...]
#include <gflags/gflags.h>
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lns/cpu_info.h"
#include "lns/errors.h"
#include "lns/model_flags.h"
#include "lns/train_flags.h"
#include "lns/trainer.h"

namespace lns {
namespace {

// "[12:34:56 r0] message": short, and says which rank spoke.
void log_prefix(std::ostream& s, const google::LogMessageInfo& m, void*) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "[%02d:%02d:%02d %c] ", m.time.hour(), m.time.min(), m.time.sec(),
                m.severity[0]);
  s << buf;
}

int run() {
  const LlamaConfig model_cfg = config_from_flags();
  const TrainConfig cfg = train_config_from_flags();
  const std::string flags = resolved_flags();
  LOG(INFO) << "configuration:\n" << flags;
  LOG(INFO) << "CPU backend: " << cpu_blas_info();
  if (const std::string w = cpu_blas_warning(); !w.empty()) LOG(WARNING) << w;
  if (!cfg.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.out_dir, ec);
    if (ec) fail("--out_dir=", cfg.out_dir, ": cannot create directory: ", ec.message());
    std::ofstream(cfg.out_dir + "/config.flags") << flags;
    std::ofstream(cfg.out_dir + "/model_config.json") << model_cfg.to_json().dump(2) << "\n";
  }
  Trainer trainer(model_cfg, cfg);
  if (!dump_step_state_flag().empty()) {
    trainer.dump_step_state(dump_step_state_flag());
    return 0;
  }
  trainer.run();
  if (!cfg.out_dir.empty()) LOG(INFO) << "metrics: " << cfg.out_dir << "/metrics.jsonl";
  return 0;
}

}  // namespace
}  // namespace lns

int main(int argc, char** argv) {
  gflags::SetUsageMessage("lns_train --flagfile=configs/tiny_lns.flags [--flag=value ...]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0], &lns::log_prefix);
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    code = lns::run();
  } catch (const lns::UserError& e) {
    std::fprintf(stderr, "lns_train: error: %s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
