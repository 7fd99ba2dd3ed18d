// Evaluation: the sweep's "block k skipped" equals evaluating the checkpoint that
// lns_convert remove-layers writes; its intact entry equals plain evaluation; the
// depth diagnostics equal an independent computation from truncated models.
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "lns/checkpoint.h"
#include "lns/evaluator.h"
#include "lns/layer_removal.h"
#include "lns/trainer.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

std::string corpus_path() {
  const std::string p = ::testing::TempDir() + "/lns_eval_corpus_" + std::to_string(::getpid()) + ".tok";
  std::vector<int32_t> toks;
  for (int i = 0; i < 900; ++i) toks.push_back((i * 17 + i / 7) % 53);
  write_token_file(p, toks, {0, 900}, 2, 53);
  return p;
}

struct Loaded {
  LlamaStage stage;
  std::unique_ptr<ProcessGrid> grid = ProcessGrid::single();
  PipelineSchedule1F1B pipeline;
  std::unique_ptr<TokenCorpus> data;
  Evaluator ev;
  Loaded(const LlamaConfig& c, const TensorSource& src, const std::string& corpus, EvalOptions o)
      : stage(c, StageSpec::whole(c), o.micro_batch, o.seq_len), pipeline(*grid, stage, 1),
        data(TokenCorpus::open(corpus)), ev(*grid, stage, pipeline, *data, o) {
    load_from_source(src, stage.params(), nullptr);
  }
};

std::string trained_checkpoint(NormScheme s, const std::string& name) {
  TrainConfig t;
  t.data = corpus_path(), t.seq_len = 8, t.micro_batch = 2, t.global_batch = 4, t.steps = 3;
  t.out_dir = ::testing::TempDir() + "/lns_eval_" + std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(t.out_dir);
  Trainer tr(small_model(s), t);
  for (int i = 0; i < 3; ++i) tr.train_step();
  return tr.save_checkpoint();
}

TEST(Eval, SweepEqualsRemovedLayersAndPlainEvaluation) {
  const EvalOptions opt{8, 3, 100, SampleMode::Packed};  // 100 tokens: a partial last batch
  for (NormScheme s : {NormScheme::LNS, NormScheme::Mix}) {
    const Checkpoint ck(trained_checkpoint(s, norm_scheme_name(s)));
    Loaded full(ck.config(), ck, corpus_path(), opt);
    const EvalStats plain = full.ev.evaluate();
    EXPECT_EQ(plain.tokens, 100);
    const auto sweep = full.ev.sweep({0, 1, 2, 3, 4});
    EXPECT_EQ(sweep[0].loss, plain.loss);  // the intact entry is plain evaluation
    for (int k = 0; k < 5; ++k) {
      const LayerRemoval plan = plan_layer_removal(ck.config(), {k});
      const RemovedLayers src(ck, plan.kept);
      Loaded cut(plan.config, src, corpus_path(), opt);
      const EvalStats e = cut.ev.evaluate();
      EXPECT_EQ(sweep[k + 1].loss, e.loss) << norm_scheme_name(s) << " block " << k;
      EXPECT_EQ(sweep[k + 1].tokens, 100);
      EXPECT_NE(e.loss, plain.loss);
    }
  }
}

TEST(Eval, DiagnosticsMatchAnIndependentComputation) {
  const Checkpoint ck(trained_checkpoint(NormScheme::LNS, "diag"));
  const LlamaConfig c = ck.config();
  const EvalOptions opt{8, 2, 16, SampleMode::Packed};  // exactly one micro-batch
  Loaded full(c, ck, corpus_path(), opt);
  const auto d = full.ev.diagnostics(0);
  ASSERT_EQ(d.size(), 5u);
  // The same batch through truncated models: the input and output of block k.
  std::vector<int32_t> ids(16);
  TokenCorpus::open(corpus_path())->read(0, 16, ids.data());  // packed sample 0 = tokens 0..7,
  std::vector<int32_t> batch = {ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7]};
  std::vector<int32_t> second(8);
  TokenCorpus::open(corpus_path())->read(8, 8, second.data());  // sample 1 = tokens 8..15
  batch.insert(batch.end(), second.begin(), second.end());
  auto hidden_after = [&](int layers) {
    LlamaStage s(c, {0, layers, true, false}, 2, 8);
    load_from_source(ck, s.params(), nullptr);
    const Tensor h = s.forward(view(batch, {2, 8}));
    return std::vector<double>(h.f32(), h.f32() + h.numel());
  };
  for (int k = 0; k < 5; ++k) {
    const auto in = hidden_after(k), out = hidden_after(k + 1);
    const int C = c.hidden_size, N = 16;
    double sum = 0, sq = 0, norm = 0, ang = 0, ang_last = 0;
    for (int n = 0; n < N; ++n) {
      double dot = 0, a2 = 0, b2 = 0;
      for (int j = 0; j < C; ++j) {
        const double a = in[n * C + j], b = out[n * C + j];
        dot += a * b, a2 += a * a, b2 += b * b, sum += b;
      }
      sq += b2;
      norm += std::sqrt(b2);
      const double t = std::acos(std::clamp(dot / std::sqrt(a2 * b2), -1.0, 1.0)) / M_PI;
      ang += t;
      if (n % 8 == 7) ang_last += t;
    }
    const double mean = sum / (N * C);
    EXPECT_NEAR(d[k].variance, sq / (N * C) - mean * mean, 1e-9 * d[k].variance) << k;
    EXPECT_NEAR(d[k].mean_norm, norm / N, 1e-9 * d[k].mean_norm) << k;
    EXPECT_NEAR(d[k].angular, ang / N, 1e-9) << k;
    EXPECT_NEAR(d[k].angular_last, ang_last / 2, 1e-9) << k;
  }
}

}  // namespace
}  // namespace lns
