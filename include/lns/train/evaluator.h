// Evaluation: perplexity over exactly --eval_tokens target positions (or all the
// data holds, when that is less: no sample is read twice), the layer-removal sweep,
// and the curse-of-depth diagnostics, under any layout.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lns/data/data.h"
#include "lns/train/gradient_sync.h"
#include "lns/train/pipeline_schedule.h"
#include "lns/model/stage.h"
#include "parallel/process_grid.h"

namespace lns {

// One source of a blended --val_data: its name as written and its own result.
struct SourceEval {
  std::string name;
  double loss = 0, ppl = 0;
  int64_t tokens = 0;
};

struct EvalStats {
  double loss = 0, ppl = 0;
  int64_t tokens = 0;
  // A weighted --val_data: each source's result, in the order given; the fields above
  // are then over all their target positions together (the mixture's loss).
  std::vector<SourceEval> by_source;
};

struct EvalOptions {
  int64_t seq_len = 256, micro_batch = 8, eval_tokens = 65536;
  SampleMode mode = SampleMode::Packed;
  // --eval_spread: the evaluated samples are spread evenly over the whole file
  // (sequence i of n takes sample floor(i * S / n) of S) instead of its first n. A file
  // written in source order (tools/experiments/real_corpus.py) then has each source in
  // the sample at its share of the file, not the first sources only (issue 45).
  bool spread = false;
};

// One block's diagnostics (docs/evaluation.md).
struct LayerDiagnostics {
  int layer = 0;
  double variance = 0;          // of the residual stream after the block (all elements)
  double mean_norm = 0;         // mean over tokens of ||x||
  double angular = 0;           // mean over tokens of arccos(cos(in, out)) / pi
  double angular_last = 0;      // the same at each sequence's last token
  double grad_norm = -1;        // of the block's parameters; -1 when not computed
};

class Evaluator {
 public:
  Evaluator(ProcessGrid& grid, LlamaStage& stage, PipelineSchedule1F1B& pipeline,
            const TokenCorpus& data, EvalOptions opt);

  // Every rank gets the result.
  EvalStats evaluate();
  // results[0]: intact; results[i + 1]: layers[i] skipped (the block is the identity,
  // the others keep their depth). With one pipeline stage the intact pass's
  // activations are reused (blocks before the skipped one are not recomputed).
  // progress(done, total), when given, after each unit of work (a batch, or with several
  // pipeline stages a configuration), on every rank.
  std::vector<EvalStats> sweep(const std::vector<int>& layers,
                               const std::function<void(int64_t, int64_t)>& progress = {});
  // Per-block statistics of the residual stream over the first `max_batches`
  // evaluation micro-batches (all of them when 0), for every layer of the model.
  std::vector<LayerDiagnostics> diagnostics(int max_batches = 0);
  // LN-free calibration: the measured divisors of every pre-norm and of the final norm
  // over all evaluation micro-batches, summed over data-parallel ranks (and tp ranks
  // under sequence parallelism) and gathered from every stage and model chunk (the same
  // on every rank), indexed as DivisorSums (lns/model/ln_free.h): 2*layer + {0 attention,
  // 1 MLP}, 2*num_layers the final norm.
  DivisorSums divisor_sums();

  int num_batches() const { return static_cast<int>(batches_); }
  // The sample of the data that evaluation sequence `seq` reads (0 <= seq; the padding
  // sequences of the last micro-batch wrap around and are masked).
  int64_t sample_of(int64_t seq) const;
  // Target positions evaluated: --eval_tokens, or all the data holds when that is
  // less (each sample once); then requested_tokens() is the larger request, else 0.
  int64_t eval_tokens() const { return opt_.eval_tokens; }
  int64_t requested_tokens() const { return requested_tokens_; }

 private:
  int64_t my_batches() const;
  void fill(int j);  // this dp rank's j-th micro-batch into in_/tg_
  EvalStats reduce(double loss_sum, int64_t tokens) const;

  ProcessGrid& grid_;
  LlamaStage& stage_;
  PipelineSchedule1F1B& pipeline_;
  BatchSampler sampler_;
  EvalOptions opt_;
  int64_t batches_;
  int64_t num_seq_ = 0;  // sequences that hold evaluated targets
  int64_t requested_tokens_ = 0;
  OwnedTensor in_, tg_;
};

// Validation on --val_data, which may be a weighted blend (lns/data/data.h): source k is
// evaluated on its weight's share of --eval_tokens (rounded, at least one position;
// an unweighted --val_data is one source with all of them, as before), each by its
// own Evaluator. The mixture's loss is the mean over all those positions, so the
// sources count by their weights, and each source's own loss is reported beside it.
class BlendEvaluator {
 public:
  BlendEvaluator(ProcessGrid& grid, LlamaStage& stage, PipelineSchedule1F1B& pipeline,
                 const DataBlend& data, EvalOptions opt);
  // Every rank gets the result; by_source filled for a weighted blend.
  EvalStats evaluate();
  // The first source's Evaluator (the only one without weights): the sweep and the
  // diagnostics read it.
  Evaluator& first() { return *parts_.front(); }
  // A warning for each source that holds fewer positions than its share asked for
  // (each is then evaluated once, whole); empty when none does.
  std::vector<std::string> shortfalls() const;

 private:
  const DataBlend& data_;
  EvalOptions opt_;
  std::vector<std::unique_ptr<Evaluator>> parts_;
};

// Gradient norm of each block's parameters (after GradientSync::reduce), every
// parameter counted once across tp/pp/dp; size num_layers.
std::vector<double> block_grad_norms(ProcessGrid& grid, const ParamSet& params,
                                     const GradientSync& sync, int num_layers);

}  // namespace lns
