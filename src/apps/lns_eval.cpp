// lns_eval: held-out perplexity, the layer-removal sweep and depth diagnostics of a
// checkpoint (any layout, any scheme) or a Hugging Face LLaMA directory.
//
//   lns_eval --checkpoint=runs/x/checkpoints/step_0000300 --data=data/fortunes.val.tok
//   lns_eval --checkpoint=... --data=... --drop_layers=sweep --out=runs/x/eval
//   lns_eval --hf_dir=/path/to/llama --data=... --diag
//   mpirun -np 4 lns_eval --checkpoint=... --data=... --tp=2 --pp=2
#include <gflags/gflags.h>
#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <absl/strings/str_format.h>
#include <nlohmann/json.hpp>

#include "lns/checkpoint/checkpoint.h"
#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/train/evaluator.h"
#include "lns/core/files.h"
#include "lns/checkpoint/hf_llama.h"
#include "lns/checkpoint/layer_removal.h"
#include "lns/model/model_layout.h"
#include "lns/core/progress.h"
#include "lns/train/train_flags.h"

DEFINE_string(checkpoint, "", "Checkpoint directory to evaluate (any layout).");
DEFINE_string(hf_dir, "", "Or: a Hugging Face LLaMA directory (read through the import path).");
DEFINE_string(drop_layers, "",
              "'sweep': evaluate intact and with each block skipped in turn; or a list of blocks "
              "to skip together, e.g. 3,7. Skipped blocks are the identity; the others keep "
              "their trained depth.");
DEFINE_bool(diag, false, "Per-block depth diagnostics over the evaluation tokens.");
DEFINE_string(out, "", "Output prefix: OUT.json (always), OUT.csv and OUT.png for a sweep.");
DECLARE_int32(seq_len);
DEFINE_bool(plot, true, "Draw the sweep's PNG with tools/plot_layer_drop.py (needs matplotlib).");
DECLARE_string(data);
DECLARE_string(data_mode);
DECLARE_int32(micro_batch_size);
DECLARE_int64(eval_tokens);
DECLARE_bool(eval_spread);
DECLARE_string(device);

namespace lns {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Result {
  nlohmann::json json;
  std::string csv;
  std::vector<std::string> lines;
};

bool is_rank0() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

void warn(const std::string& w) {
  if (is_rank0()) std::fprintf(stderr, "lns_eval: warning: %s\n", w.c_str());
}

// --out's directory exists (created) and takes files, checked before the evaluation.
void check_output_prefix(const std::string& out) {
  if (out.empty()) return;
  const std::filesystem::path parent =
      std::filesystem::path(out).parent_path().empty() ? "." : std::filesystem::path(out).parent_path();
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) fail("--out=", out, ": cannot create ", parent.string(), ": ", ec.message());
  if (!std::filesystem::is_directory(parent, ec) || ::access(parent.c_str(), W_OK) != 0)
    fail("--out=", out, ": cannot write into ", parent.string());
}

// The sequence length and sampling mode: the checkpoint's training values unless the
// flags say otherwise (docs/evaluation.md).
EvalOptions eval_options(const Checkpoint* ck) {
  EvalOptions opt{FLAGS_seq_len, FLAGS_micro_batch_size, FLAGS_eval_tokens, parse_sample_mode(FLAGS_data_mode),
                  FLAGS_eval_spread};
  if (!ck) return opt;
  const bool seq_default = gflags::GetCommandLineFlagInfoOrDie("seq_len").is_default;
  const bool mode_default = gflags::GetCommandLineFlagInfoOrDie("data_mode").is_default;
  const TrainingRecord& t = ck->run_state().training;
  if (t.seq_len == 0) {
    if (seq_default)
      warn(absl::StrCat(ck->dir(), " does not record the sequence length it was trained at (an older or imported ",
                        "checkpoint); evaluating at --seq_len=", opt.seq_len));
    return opt;
  }
  if (seq_default) opt.seq_len = t.seq_len;
  else if (opt.seq_len > t.seq_len)
    warn(absl::StrCat("--seq_len=", opt.seq_len, " is longer than the ", t.seq_len,
                      " the checkpoint was trained at: positions past ", t.seq_len, " were never trained"));
  if (mode_default) opt.mode = parse_sample_mode(t.data_mode);
  return opt;
}

Result evaluate_all(ProcessGrid& grid) {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<HfDirectory> hf;
  LNS_REQUIRE(FLAGS_checkpoint.empty() != FLAGS_hf_dir.empty(), "give exactly one of --checkpoint and --hf_dir");
  if (!FLAGS_checkpoint.empty()) ck = std::make_unique<Checkpoint>(FLAGS_checkpoint);
  else hf = std::make_unique<HfDirectory>(FLAGS_hf_dir);
  const TensorSource& src = ck ? static_cast<const TensorSource&>(*ck) : *hf;
  const LlamaConfig cfg = ck ? ck->config() : hf->config();
  LNS_REQUIRE(FLAGS_data != "random" && !FLAGS_data.empty(), "--data: give the evaluation token file");
  LNS_REQUIRE(FLAGS_seq_len > 0 && FLAGS_micro_batch_size > 0, "--seq_len and --micro_batch_size must be positive");
  grid.layout = layout_for_model(cfg, grid.layout, "");
  const auto corpus = TokenCorpus::open(FLAGS_data);
  std::vector<int> sweep;
  std::set<int> skip_set;
  if (FLAGS_drop_layers == "sweep") {
    for (int l = 0; l < cfg.num_layers; ++l) sweep.push_back(l);
  } else if (!FLAGS_drop_layers.empty()) {
    skip_set = parse_layer_list(FLAGS_drop_layers, cfg.num_layers, "--drop_layers");
  }
  const EvalOptions opt = eval_options(ck.get());
  LlamaStage stage(cfg, stage_spec(grid.layout, grid.coords.pp), opt.micro_batch,
                   opt.seq_len, 1, grid.tensor_parallel(), parse_device(FLAGS_device));
  load_from_source(src, stage.params(), nullptr);
  for (int i = 0; i < stage.params().size(); ++i) {  // the host copies load_from_source wrote
    const Tensor w = stage.params().host_param(i);
    if (first_non_finite(w.f32(), w.numel()) >= 0)
      fail(src.where(), ": weight '", stage.params().info(i).name, "' holds inf or NaN; this model cannot be ",
           "evaluated (was it saved by a run that diverged?)");
  }
  // An LN-free checkpoint computes with constant divisors (docs/ln_free.md).
  if (ck) apply_ln_free(ck->run_state().ln_free, stage);
  PipelineSchedule1F1B pipeline(grid, stage, 1);
  Evaluator ev(grid, stage, pipeline, *corpus, opt);
  if (ev.requested_tokens() > 0)
    warn(absl::StrCat("--eval_tokens=", opt.eval_tokens, " is more than ", FLAGS_data, " holds; evaluating all of ",
                      "it once: ", ev.eval_tokens(), " target positions"));

  Result r;
  const std::string model = ck ? FLAGS_checkpoint : FLAGS_hf_dir;
  r.json = {{"model", model}, {"data", FLAGS_data}, {"norm_scheme", norm_scheme_name(cfg.norm_scheme)},
            {"num_layers", cfg.num_layers}, {"seq_len", opt.seq_len},
            {"layout", grid.layout.brief()}};
  double t0 = now();
  const EvalStats intact = ev.evaluate();
  if (!std::isfinite(intact.loss) || !std::isfinite(intact.ppl))
    fail("the perplexity on ", FLAGS_data, " is not finite (loss ", intact.loss, "): the model's outputs overflow on ",
         "this data; no perplexity to report");
  if (cfg.folded_norms) {
    r.json["folded_norms"] = true;
    r.lines.push_back("folded: no norms, their constants are in the linears (lns_convert fold-norms, docs/ln_free.md)");
  }
  if (ck && !ck->run_state().ln_free.norms.empty()) {
    const size_t n = ck->run_state().ln_free.norms.size();
    r.json["ln_free_fixed_norms"] = n;
    r.lines.push_back(absl::StrFormat("LN-free: %d norms with constant divisors (docs/ln_free.md)", n));
  }
  r.json["tokens"] = intact.tokens;
  r.json["data_mode"] = opt.mode == SampleMode::Packed ? "packed" : "document";
  r.json["eval_spread"] = opt.spread;  // which samples: the first ones, or spread over the file
  r.json["loss"] = intact.loss;
  r.json["ppl"] = intact.ppl;
  r.lines.push_back(absl::StrFormat("perplexity %.4f (loss %.6f) over %d tokens of %s at --seq_len=%d (%.1f s)",
                                    intact.ppl, intact.loss, intact.tokens, FLAGS_data, opt.seq_len, now() - t0));
  if (!skip_set.empty()) {
    stage.set_skipped_layers({skip_set.begin(), skip_set.end()});
    const EvalStats e = ev.evaluate();
    stage.set_skipped_layers({});
    r.json["skipped"] = {{"layers", std::vector<int>(skip_set.begin(), skip_set.end())}, {"loss", e.loss},
                         {"ppl", e.ppl}, {"loss_delta", e.loss - intact.loss},
                         {"relative_drop", (e.ppl - intact.ppl) / intact.ppl}};
    r.lines.push_back(absl::StrFormat("without blocks %s: perplexity %.4f (loss %+.6f, %+.2f%%)",
                                      FLAGS_drop_layers, e.ppl, e.loss - intact.loss,
                                      100 * (e.ppl - intact.ppl) / intact.ppl));
  }
  if (!sweep.empty()) {
    t0 = now();
    // A bar on a terminal, a line per tenth when piped (lns/core/progress.h); rank 0 says it.
    std::unique_ptr<ProgressBar> bar;
    if (is_rank0()) bar = std::make_unique<ProgressBar>("lns_eval: sweep", 0);
    const auto res = ev.sweep(sweep, [&](int64_t done, int64_t total) {
      if (!bar) return;
      bar->set_total(total);
      bar->update(done, grid.layout.pp > 1 ? "configurations" : "batches");
    });
    bar.reset();
    const double secs = now() - t0;
    nlohmann::json rows = nlohmann::json::array();
    r.csv = "layer,ppl,loss,loss_delta,relative_drop\n";
    r.csv += absl::StrFormat("intact,%.6f,%.8f,0,0\n", res[0].ppl, res[0].loss);
    for (size_t i = 0; i < sweep.size(); ++i) {
      const EvalStats& e = res[i + 1];
      const double delta = e.loss - res[0].loss, rel = (e.ppl - res[0].ppl) / res[0].ppl;
      rows.push_back({{"layer", sweep[i]}, {"ppl", e.ppl}, {"loss", e.loss}, {"loss_delta", delta},
                      {"relative_drop", rel}});
      r.csv += absl::StrFormat("%d,%.6f,%.8f,%.8f,%.8f\n", sweep[i], e.ppl, e.loss, delta, rel);
      r.lines.push_back(absl::StrFormat("  skip block %2d: perplexity %10.4f  loss %+9.5f  %+8.2f%%", sweep[i],
                                        e.ppl, delta, 100 * rel));
    }
    r.json["sweep"] = {{"intact", {{"ppl", res[0].ppl}, {"loss", res[0].loss}}}, {"layers", rows},
                       {"seconds", secs},
                       {"reused_intact_activations", grid.layout.pp == 1}};
    r.lines.push_back(absl::StrFormat("sweep of %d blocks: %.1f s%s", sweep.size(), secs,
                                      grid.layout.pp == 1 ? " (blocks before each skipped one reused from the intact pass)"
                                                   : " (pipeline: every configuration evaluated in full)"));
  }
  if (FLAGS_diag) {
    const auto d = ev.diagnostics(0);
    nlohmann::json rows = nlohmann::json::array();
    r.lines.push_back("  block  variance      mean_norm   angular_dist  angular_last");
    for (const LayerDiagnostics& l : d) {
      rows.push_back({{"layer", l.layer}, {"variance", l.variance}, {"mean_norm", l.mean_norm},
                      {"angular_distance", l.angular}, {"angular_distance_last", l.angular_last}});
      r.lines.push_back(absl::StrFormat("  %5d  %-12.6g  %-10.5g  %-12.5f  %.5f", l.layer, l.variance,
                                        l.mean_norm, l.angular, l.angular_last));
    }
    r.json["diag"] = rows;
  }
  return r;
}

int run() {
  std::unique_ptr<ProcessGrid> grid;
  Result r;
  std::string error;
  // In phases, as lns_train: every rank binds its GPU before NCCL starts collectively.
  try {
    grid = ProcessGrid::create_mpi(tp_flag(), pp_flag());
    if (parse_device(FLAGS_device) == Device::CUDA) bind_local_gpu(local_rank_from_env());
    if (grid->rank == 0) check_output_prefix(FLAGS_out);
  } catch (...) {
    error = current_exception_message();
  }
  if (!all_ranks_started("lns_eval", error)) return 1;
  try {
    if (parse_device(FLAGS_device) == Device::CUDA) grid->use_device_communicators(comm_flag());
    r = evaluate_all(*grid);
  } catch (...) {
    error = current_exception_message();
  }
  if (!all_ranks_started("lns_eval", error)) return 1;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;
  for (const std::string& l : r.lines) std::printf("%s\n", l.c_str());
  if (!FLAGS_out.empty()) {
    write_file_atomically(FLAGS_out + ".json", r.json.dump(2) + "\n");
    std::printf("wrote %s.json\n", FLAGS_out.c_str());
    if (!r.csv.empty()) {
      write_file_atomically(FLAGS_out + ".csv", r.csv);
      std::printf("wrote %s.csv\n", FLAGS_out.c_str());
      if (FLAGS_plot) {
        const std::string cmd = "python3 " + std::string(LNS_SOURCE_DIR) + "/tools/plot_layer_drop.py " +
                                FLAGS_out + ".json --out " + FLAGS_out + ".png >/dev/null 2>&1";
        if (std::system(cmd.c_str()) == 0)
          std::printf("wrote %s.png\n", FLAGS_out.c_str());
        else
          std::fprintf(stderr, "lns_eval: warning: could not draw %s.png (python3 with matplotlib?)\n",
                       FLAGS_out.c_str());
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace lns

int main(int argc, char** argv) {
  gflags::SetUsageMessage("lns_eval --checkpoint=DIR|--hf_dir=DIR --data=FILE [--drop_layers=sweep|3,7] [--diag]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  MPI_Init(&argc, &argv);
  // Failures on rank 0 after the collective part (writing --out) end up here.
  const int code = lns::main_guard("lns_eval", lns::run);
  MPI_Finalize();
  return code;
}
