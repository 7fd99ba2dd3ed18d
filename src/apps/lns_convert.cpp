// lns_convert: checkpoints between layouts and formats.
//
//   lns_convert reshard       --in=CKPT --out=DIR --tp=T --pp=P [--pp_layers=a,b] [--dp=D [--zero=false]]
//   lns_convert merge         --in=CKPT --out=DIR
//   lns_convert export-hf     --in=CKPT --out=HFDIR [--tokenizer=FILE|DIR] [--max_position_embeddings=N]
//   lns_convert import-hf     --in=HFDIR --out=DIR [--tp=T --pp=P] [--norm_scheme=lns]
//                             [--repo_norm_type=NORM_TYPE [--repo_post_num=N]]
//   lns_convert export-repo   --in=CKPT --out=DIR [--tokenizer=FILE|DIR] [--max_position_embeddings=N]
//   lns_convert retrofit      --in=CKPT --out=DIR --norm_scheme=lns [--tp=T --pp=P]
//   lns_convert remove-layers --in=CKPT --out=DIR --layers=3,7 [--tp=T --pp=P]
//   lns_convert fold-norms    --in=CKPT --out=DIR [--tp=T --pp=P]
//   lns_convert export-folded --in=CKPT --out=DIR
//
// fold-norms multiplies the constant norms of an LN-free checkpoint into the linears
// they feed and writes the model without norms (lns/checkpoint/fold_norms.h, docs/ln_free.md);
// export-folded writes such a model for tools/reference/llama_nonorm.py (export-hf
// refuses it: a Hugging Face LLaMA always normalises).
//
// import-hf --repo_norm_type reads a checkpoint saved by the LayerNorm-Scaling
// repository's model, run there with NORM_TYPE=<name> and POST_NUM=<N>; export-repo writes
// one for it (config.json then names both, so import-hf needs no flag for it).
// docs/model.md lists the names and what each computes.
//
// retrofit and import-hf --norm_scheme=lns turn a Pre-LN model into an LNS one with the
// same weights (lns/checkpoint/retrofit.h): a different function, so they warn and record it in
// the manifest's "conversions".
//
// Every subcommand reads any layout and prints what it wrote. Checkpoint outputs are
// complete checkpoints (manifest, CRC32s) that lns_train --resume=DIR and lns_eval read.
// --out must not exist or be empty, and may not lie inside --in: the output is staged next to it and moved into
// place whole. --overwrite replaces an existing checkpoint (or an earlier export-hf
// output) there atomically, and nothing else.
#include <gflags/gflags.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <set>

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>

#include "lns/checkpoint/checkpoint.h"
#include "lns/core/errors.h"
#include "lns/checkpoint/fold_norms.h"
#include "lns/checkpoint/hf_llama.h"
#include "lns/checkpoint/layer_removal.h"
#include "lns/train/ln_free_schedule.h"
#include "lns/model/model_layout.h"
#include "lns/core/progress.h"
#include "lns/checkpoint/retrofit.h"
#include "lns/model/stage.h"
#include "lns/train/train_flags.h"

DEFINE_string(in, "", "Input checkpoint directory (or Hugging Face directory for import-hf).");
DEFINE_string(out, "", "Output directory: must not exist or be empty (see --overwrite).");
DEFINE_bool(overwrite, false,
            "Replace --out when it is an lns checkpoint (export-hf: an earlier export-hf output) holding "
            "nothing else; the new output replaces it atomically. Anything else is never replaced.");
DEFINE_int32(dp, 1, "reshard: data-parallel size of the target layout (with dp > 1 the optimizer state is "
                   "sharded over it unless --zero=false).");
DEFINE_string(layers, "", "remove-layers: 0-based layer indices to remove, e.g. 3,7.");
DEFINE_string(tokenizer, "", "export-hf, export-repo: tokenizer file or directory to copy next to the weights.");
DEFINE_int32(max_position_embeddings, 2048, "export-hf, export-repo: max_position_embeddings in config.json.");
DEFINE_string(repo_norm_type, "",
              "import-hf: --in was saved by the LayerNorm-Scaling repository's model run with NORM_TYPE=this "
              "(pre, scale_pre, post, deeppost, sandwich, post_pre, scale_post_pre, scale_res_pre_norm, mono, "
              "mono_reverse, pre_post, pre_sandwich, post_pre_post_pre); docs/model.md.");
DEFINE_int32(repo_post_num, 1, "import-hf --repo_norm_type: the repository's POST_NUM (its default is 1).");
DECLARE_string(pp_layers);
DECLARE_bool(zero);
DECLARE_string(norm_scheme);  // retrofit, import-hf: lns (the LNS retrofit)

namespace lns {
namespace {

Layout target_layout() {
  Layout l;
  l.tp = tp_flag(), l.pp = pp_flag(), l.dp = FLAGS_dp;
  l.set_zero(FLAGS_zero);  // on by default, as in lns_train; nothing to shard at dp = 1
  LNS_REQUIRE(l.tp >= 1 && l.pp >= 1 && l.dp >= 1, "--tp, --pp and --dp must be >= 1");
  return l;
}

AdamWConfig adam_of(const Checkpoint& ck) {
  return ck.has_optimizer_state() ? ck.info().optimizer->adam : AdamWConfig{};
}

int64_t optim_steps(const Checkpoint& ck) {
  return ck.has_optimizer_state() ? ck.info().optimizer->steps_taken : 0;
}

void print(const std::string& what, const std::vector<std::string>& lines) {
  std::printf("lns_convert: %s\n", what.c_str());
  for (const std::string& l : lines) std::printf("  %s\n", l.c_str());
}

// The writers' reads of a source, as progress: each weight a target rank loads (or an
// export reads) is one unit; a bar on a terminal, a line per tenth when piped
// (lns/core/progress.h). Moments ride along with their weight.
class ProgressSource : public TensorSource {
 public:
  ProgressSource(const TensorSource& src, const std::string& what, int64_t total)
      : src_(src), total_(total), bar_("lns_convert: " + what, total) {}
  ~ProgressSource() override {  // the last line, whatever was counted; none when the write failed
    if (std::uncaught_exceptions() == 0) bar_.update(total_);
  }
  bool has(const std::string& name, const std::string& kind) const override { return src_.has(name, kind); }
  std::vector<float> logical(const std::string& name, const std::string& kind) const override {
    std::vector<float> v = src_.logical(name, kind);
    if (kind == "param") bar_.update(std::min(++done_, total_), name);
    return v;
  }
  std::vector<int64_t> logical_shape(const std::string& name) const override { return src_.logical_shape(name); }
  std::string where() const override { return src_.where(); }

 private:
  const TensorSource& src_;
  int64_t total_;
  mutable int64_t done_ = 0;
  mutable ProgressBar bar_;
};

// The weights the ranks of a checkpoint for `target` hold, all of them: what
// write_checkpoint_from_source reads.
int64_t weights_to_write(const LlamaConfig& cfg, const Layout& target, const std::string& pp_layers) {
  const Layout l = layout_for_model(cfg, target, pp_layers);
  int64_t n = 0;
  for (int r = 0; r < l.world_size(); ++r) {
    const RankCoords at = l.coords_of(r);
    n += LlamaStage::stage_params(cfg, stage_spec(l, at.pp), {at.tp, l.tp, nullptr}).size();
  }
  return n;
}

// write_checkpoint_from_source with progress.
std::vector<std::string> write_checkpoint(const std::string& what, const TensorSource& src, const LlamaConfig& cfg,
                                          const Layout& target, const std::string& pp_layers, const RunState& state,
                                          const AdamWConfig& adam, int64_t optim_steps) {
  const ProgressSource p(src, what, weights_to_write(cfg, target, pp_layers));
  return write_checkpoint_from_source(p, cfg, target, pp_layers, state, adam, optim_steps, FLAGS_out, FLAGS_overwrite);
}

int64_t model_weights(const LlamaConfig& cfg) { return static_cast<int64_t>(LlamaStage::model_params(cfg).size()); }

// --norm_scheme as the user gave it, or "" when left at its default (lns_train's).
std::string norm_scheme_flag() {
  return gflags::GetCommandLineFlagInfoOrDie("norm_scheme").is_default ? "" : FLAGS_norm_scheme;
}

// A tool never writes into its input: --out (resolved, links included) may not lie
// inside --in. (--out=--in itself is StagedDir's case: refused unless --overwrite
// finds nothing but a replaceable output there.)
void check_out_outside_in() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto resolve = [&](const std::string& p) {
    fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec).lexically_normal();
    return r.has_filename() ? r : r.parent_path();  // "dir/" is "dir"
  };
  const fs::path in = resolve(FLAGS_in), out = resolve(FLAGS_out);
  if (ec) return;  // the reader / writer names the bad path
  const auto mismatch = std::mismatch(in.begin(), in.end(), out.begin(), out.end());
  LNS_REQUIRE(mismatch.first != in.end() || mismatch.second == out.end(), "--out=", FLAGS_out, " lies inside --in=", FLAGS_in,
              "; write the output elsewhere (a tool never writes into its input)");
}

int run(const std::string& cmd) {
  LNS_REQUIRE(!FLAGS_in.empty() && !FLAGS_out.empty(), cmd, ": --in and --out are required");
  check_out_outside_in();
  if (cmd == "fold-norms") {
    const Checkpoint ck(FLAGS_in);
    const FoldedNorms folded(ck);
    const auto lines = write_checkpoint(cmd, folded, folded.config(), target_layout(), FLAGS_pp_layers,
                                        folded.run_state(), AdamWConfig{}, 0);
    print(absl::StrFormat("wrote %s: %s with its %d constant norms folded into the linears they feed (no norms, "
                          "no optimizer state; lns_eval --checkpoint=%s evaluates it, lns_train --resume=%s "
                          "--folded_norms fine-tunes it, export-folded exports it)",
                          FLAGS_out, FLAGS_in, ck.run_state().ln_free.norms.size(), FLAGS_out, FLAGS_out),
          lines);
    return 0;
  }
  if (cmd == "export-folded") {
    const Checkpoint ck(FLAGS_in);
    const auto lines = export_folded(ProgressSource(ck, cmd, model_weights(ck.config())), ck.config(), FLAGS_out,
                                     FLAGS_overwrite);
    print(absl::StrFormat("exported %s (%d layers, folded norms) for tools/reference/llama_nonorm.py to %s",
                          FLAGS_in, ck.config().num_layers, FLAGS_out),
          lines);
    return 0;
  }
  if (cmd == "reshard" || cmd == "merge") {
    const Checkpoint ck(FLAGS_in);
    const Layout l = cmd == "merge" ? Layout{} : target_layout();
    const auto lines = write_checkpoint(cmd, ck, ck.config(), l, cmd == "merge" ? "" : FLAGS_pp_layers,
                                        ck.run_state(), adam_of(ck), optim_steps(ck));
    print(absl::StrFormat("wrote %s (%s, step %d) from %s", FLAGS_out, l.brief(), ck.run_state().step, FLAGS_in),
          lines);
    return 0;
  }
  if (cmd == "export-hf") {
    const Checkpoint ck(FLAGS_in);
    LNS_REQUIRE(ck.run_state().ln_free.norms.empty(), FLAGS_in, ": ", ck.run_state().ln_free.norms.size(),
                " norms divide by constants (LN-free, docs/ln_free.md); a Hugging Face LLaMA always normalises, so "
                "export-hf would change what the model computes");
    const auto lines = export_hf(ProgressSource(ck, cmd, model_weights(ck.config())), ck.config(), FLAGS_out,
                                 FLAGS_tokenizer, FLAGS_max_position_embeddings, FLAGS_overwrite);
    print(absl::StrFormat("exported %s (%s, %d layers%s) as a Hugging Face LlamaForCausalLM to %s",
                          FLAGS_in, norm_scheme_name(ck.config().norm_scheme), ck.config().num_layers,
                          ck.config().norm_scheme == NormScheme::LNS ? ", LNS scales folded into the norm gains" : "",
                          FLAGS_out),
          lines);
    return 0;
  }
  if (cmd == "export-repo") {
    const Checkpoint ck(FLAGS_in);
    LNS_REQUIRE(ck.run_state().ln_free.norms.empty(), FLAGS_in, ": ", ck.run_state().ln_free.norms.size(),
                " norms divide by constants (LN-free, docs/ln_free.md); the repository's model always normalises");
    const RepoNormType r = repo_norm_type_of(ck.config());
    const auto lines = export_repo(ProgressSource(ck, cmd, model_weights(ck.config())), ck.config(), FLAGS_out,
                                   FLAGS_tokenizer, FLAGS_max_position_embeddings, FLAGS_overwrite);
    print(absl::StrFormat("exported %s (%s, %d layers) for the LayerNorm-Scaling repository's LlamaForCausalLM to "
                          "%s; run it there with NORM_TYPE=%s POST_NUM=%d",
                          FLAGS_in, norm_scheme_name(ck.config().norm_scheme), ck.config().num_layers, FLAGS_out,
                          r.norm_type, r.post_num),
          lines);
    return 0;
  }
  if (cmd == "import-hf") {
    const HfDirectory hf(FLAGS_in, FLAGS_repo_norm_type, FLAGS_repo_post_num);
    LlamaConfig cfg = hf.config();
    RunState state;
    const std::string scheme = norm_scheme_flag();
    if (!scheme.empty() && scheme != "pre") {
      const Retrofit r = plan_lns_retrofit(cfg, scheme, "import-hf", FLAGS_in);
      std::fprintf(stderr, "lns_convert: %s\n", r.warning.c_str());
      cfg = r.config;
      state.conversions.push_back(r.record);
    }
    const auto lines = write_checkpoint(cmd, hf, cfg, target_layout(), FLAGS_pp_layers, state, AdamWConfig{}, 0);
    std::string scheme_flags = absl::StrCat("--norm_scheme=", norm_scheme_name(cfg.norm_scheme));
    if (cfg.norm_scheme == NormScheme::Mix || cfg.norm_scheme == NormScheme::ScalePostPre)
      absl::StrAppend(&scheme_flags, " --post_layers=", cfg.post_layers);
    if (cfg.norm_scheme == NormScheme::Hybrid) absl::StrAppend(&scheme_flags, " --layer_schemes=", cfg.layer_schemes);
    print(absl::StrFormat("imported %s (%d layers, hidden %d) to %s; resume or evaluate it with %s and its shape "
                          "flags",
                          FLAGS_in, cfg.num_layers, cfg.hidden_size, FLAGS_out, scheme_flags),
          lines);
    return 0;
  }
  if (cmd == "retrofit") {
    const std::string scheme = norm_scheme_flag();
    LNS_REQUIRE(!scheme.empty(), "retrofit: --norm_scheme is required (lns: the LNS retrofit)");
    const Checkpoint ck(FLAGS_in);
    const Retrofit r = plan_lns_retrofit(ck.config(), scheme, "retrofit", FLAGS_in);
    std::fprintf(stderr, "lns_convert: %s\n", r.warning.c_str());
    RunState state = ck.run_state();
    state.conversions.push_back(r.record);
    const auto lines = write_checkpoint(cmd, ck, r.config, target_layout(), FLAGS_pp_layers, state, adam_of(ck),
                                        optim_steps(ck));
    print(absl::StrFormat("wrote %s: %s as --norm_scheme=lns (same weights; fine-tune it with lns_train "
                          "--resume=%s --norm_scheme=lns)",
                          FLAGS_out, FLAGS_in, FLAGS_out),
          lines);
    return 0;
  }
  if (cmd == "remove-layers") {
    const Checkpoint ck(FLAGS_in);
    const LlamaConfig old = ck.config();
    // The remaining blocks keep the depth they were trained at (LNS scale, Mix-LN role).
    const LayerRemoval plan =
        plan_layer_removal(old, parse_layer_list(FLAGS_layers, old.num_layers, "--layers"));
    const LlamaConfig& cfg = plan.config;
    const RemovedLayers src(ck, plan.kept);
    RunState state = ck.run_state();
    // LN-free norms keep their constants under their new layer numbers; a schedule still
    // running names the old layers, so it must have finished.
    const LnFreeProgress& lf = state.ln_free.progress;
    LNS_REQUIRE(lf.schedule.empty() ||
                    lf.next_event >= static_cast<int>(parse_ln_free_schedule(lf.schedule, old, state.ln_free.eot_token).size()),
                FLAGS_in, ": the LN-free schedule '", lf.schedule, "' has events left (next: ", lf.next_event + 1,
                "); finish it before removing layers");
    state.ln_free = ln_free_for_kept_layers(state.ln_free, plan.kept, old.num_layers);
    const auto lines = write_checkpoint(cmd, src, cfg, target_layout(), FLAGS_pp_layers, state, adam_of(ck),
                                        optim_steps(ck));
    print(absl::StrFormat("wrote %s: %d of %d layers (removed %s), each keeping its trained depth "
                          "(layer_depths %s)",
                          FLAGS_out, cfg.num_layers, old.num_layers, FLAGS_layers,
                          absl::StrJoin(cfg.layer_depths, ",")),
          lines);
    return 0;
  }
  fail("unknown subcommand '", cmd, "'; expected reshard, merge, export-hf, export-repo, import-hf, retrofit, ",
       "remove-layers, fold-norms or export-folded");
}

}  // namespace
}  // namespace lns

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "lns_convert reshard|merge|export-hf|export-repo|import-hf|retrofit|remove-layers|fold-norms|export-folded "
      "--in=... "
      "--out=... [flags]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (argc != 2) {
    std::fprintf(stderr, "lns_convert: error: expected one subcommand (reshard, merge, export-hf, export-repo, "
                         "import-hf, retrofit, remove-layers, fold-norms, export-folded); see --help\n");
    return 1;
  }
  return lns::main_guard("lns_convert", [&] { return lns::run(argv[1]); });
}
