// Token corpora and the samplers that cut them into training sequences.
//
// A TokenCorpus is a memory-mapped stream of token ids with document boundaries,
// read from our own token file (docs/data.md) or a Megatron indexed dataset
// (PREFIX.bin + PREFIX.idx). Samplers turn it into [B, T] inputs and targets:
//  - packed (default): sample i is tokens [i*T, i*T + T + 1) of the stream; documents
//    are concatenated (prepare_data.py ends each with an end-of-document token);
//  - document (the paper's setup): sample i is one document, truncated to T + 1
//    tokens or padded, with the loss masked (-100) on padding.
// The order is a fresh permutation per epoch drawn from --seed. The sampler's whole
// state is one counter (samples consumed), which a checkpoint stores.
//
// A weighted blend (--data=0.7:A,0.3:B) is several corpora, each with its own
// BatchSampler, interleaved by a BlendIndex: which source stream position i reads,
// and which of that source's samples, is a pure function of i and the weights, so a
// resume under any layout reads the same samples (docs/data.md).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lns/core/tensor.h"

namespace lns {

class TokenCorpus {
 public:
  // PATH is a token file, a Megatron prefix (PATH.bin and PATH.idx exist), a
  // comma-separated list of those, a glob (data/c4/shard_*.tok), or the index.json
  // that prepare_data.py writes next to sharded output. Several files read as one
  // corpus, in the order given (globs sorted).
  static std::unique_ptr<TokenCorpus> open(const std::string& path);
  static std::unique_ptr<TokenCorpus> open_one(const std::string& path);
  // In-memory uniform random tokens (--data=random): a synthetic corpus for
  // debugging and benchmarks, one document.
  static std::unique_ptr<TokenCorpus> random(int64_t vocab_size, int64_t num_tokens, uint64_t seed);
  virtual ~TokenCorpus() = default;

  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_docs() const { return static_cast<int64_t>(doc_starts_.size()) - 1; }
  int64_t doc_begin(int64_t d) const { return doc_starts_[d]; }
  int64_t doc_end(int64_t d) const { return doc_starts_[d + 1]; }
  // Vocabulary size recorded by the writer; 0 when the format does not record it.
  int64_t vocab_size() const { return vocab_size_; }
  // tokens [begin, begin + n) into out.
  virtual void read(int64_t begin, int64_t n, int32_t* out) const;

 protected:
  std::string path_;
  const uint8_t* tokens_ = nullptr;  // into a mapping owned by the subclass
  int token_bytes_ = 2;              // 2 (uint16) or 4 (uint32 / int32)
  int64_t num_tokens_ = 0;
  int64_t vocab_size_ = 0;
  std::vector<int64_t> doc_starts_;  // num_docs + 1 token offsets
};

// Writes our token file format (used by tests and tools; prepare_data.py writes the
// same bytes). doc_starts: num_docs + 1 offsets, first 0, last tokens.size().
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens,
                      const std::vector<int64_t>& doc_starts, int token_bytes, int64_t vocab_size);

enum class SampleMode { Packed, Document };
SampleMode parse_sample_mode(const std::string& s);  // "packed" | "document"

class BatchSampler {
 public:
  // vocab_size: every token read is checked against it (UserError naming the file).
  BatchSampler(const TokenCorpus& corpus, SampleMode mode, int64_t seq_len, uint64_t seed,
               bool shuffle, int64_t vocab_size);

  int64_t samples_per_epoch() const { return num_samples_; }
  // Sample `index` of the endless stream (epoch = index / samples_per_epoch):
  // inputs[T], targets[T] (-100 on padding). Returns the number of unmasked targets.
  int64_t fill(uint64_t index, int32_t* inputs, int32_t* targets);
  // The next global batch of `global_batch` samples; this data-parallel rank takes
  // its contiguous share [rank*n, (rank+1)*n), n = global_batch / dp_size, into
  // inputs/targets [n, T]. Advances the state by the whole global batch.
  void next_batch(int64_t global_batch, int dp_rank, int dp_size, Tensor inputs, Tensor targets);

  uint64_t consumed() const { return consumed_; }
  // The sample of the epoch that position `index` of the endless stream reads (its
  // document, or its window, in the order of the data file); logged for a bad batch.
  int64_t sample_of(uint64_t index) { return sample_id(index); }
  void set_consumed(uint64_t c) { consumed_ = c; }

 private:
  int64_t sample_id(uint64_t index);  // position in the stream -> sample of the epoch
  void check_tokens(const int32_t* t, int64_t n, int64_t at) const;

  const TokenCorpus& corpus_;
  SampleMode mode_;
  int64_t T_;
  uint64_t seed_;
  bool shuffle_;
  int64_t vocab_size_;
  int64_t num_samples_ = 0;
  std::vector<int64_t> docs_;  // document mode: documents with >= 2 tokens
  uint64_t consumed_ = 0;
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;
};

// The data-parallel rule of a global batch: of the global batch that starts at stream
// position `first`, this dp rank reads positions [first + dp_rank*n, first + (dp_rank+1)*n),
// n = global_batch / dp_size, into rows of inputs/targets [n, T] with
// fill(position, inputs_row, targets_row). The union over ranks is the one-rank batch.
void fill_dp_share(uint64_t first, int64_t global_batch, int dp_rank, int dp_size, Tensor inputs,
                   Tensor targets, const std::function<void(uint64_t, int32_t*, int32_t*)>& fill);

// ---- weighted blends ------------------------------------------------------------------

// One source of --data / --val_data as written.
struct BlendSource {
  std::string path;   // any form TokenCorpus::open reads (shards joined by ',')
  double weight = 1;  // as written; DataBlend normalises
};

// The parsed --data text. "0.7:A,0.3:B" is weighted: an item WEIGHT:PATH starts a
// source (an item is weighted when it has a ':' with no '/' before it), and items
// without a weight after it add shards to that source ("0.7:a1.tok,a2.tok,0.3:b.tok").
// Anything without a weight is one unweighted source, the whole text, read exactly as
// before blends existed (a comma-separated list of shards stays one corpus).
// UserError naming `flag` for a weight that is not a positive finite number, a weight
// without a path, a path before the first weight, a source given twice.
struct BlendSpec {
  bool weighted = false;
  std::vector<BlendSource> sources;
};
BlendSpec parse_blend_spec(const std::string& spec, const std::string& flag);

// Which source each position of the blended stream reads, and which of that source's
// own samples: built once from the weights, greedily by weight error over a period of
// kPeriod positions (position j of a period goes to the source furthest below its
// share, w_k * (j + 1) - picks_k so far, the lowest index on a tie), in integer
// arithmetic so every machine builds the same table. The period repeats, each source
// continuing its own count, so at(i) is O(1) for any i: a resume at any step and any
// data-parallel rank find the same sample without replaying the stream. Over any
// prefix each source's count is within one sample per period of its share.
class BlendIndex {
 public:
  static constexpr int64_t kPeriod = int64_t{1} << 16;
  static constexpr int kMaxSources = 4096;
  // weights: positive, finite (parse_blend_spec checks). A source whose share draws no
  // sample in a period is a UserError naming `flag` and `names[k]`.
  BlendIndex(const std::vector<double>& weights, const std::vector<std::string>& names,
             const std::string& flag);

  int sources() const { return static_cast<int>(per_period_.size()); }
  struct Pick {
    int source;
    uint64_t index;  // the source's own stream position
  };
  Pick at(uint64_t position) const;
  // How many of positions [0, position) read `source`.
  uint64_t count_before(int source, uint64_t position) const;
  // Positions of `source` in one period (its share is this / kPeriod).
  int64_t per_period(int source) const { return per_period_[source]; }

 private:
  std::vector<uint16_t> source_;               // [kPeriod] source of each position
  std::vector<uint32_t> rank_;                 // [kPeriod] picks of that source before it
  std::vector<std::vector<uint32_t>> where_;   // per source: its positions in a period, ascending
  std::vector<int64_t> per_period_;            // per source: picks per period
};

// The corpora of --data or --val_data: a weighted blend, or one unweighted source (a
// plain path, shard list, glob or index.json, as before; or --data=random).
class DataBlend {
 public:
  // UserError naming `flag` for a bad weight; a source that cannot be opened names the
  // flag, the source and the file.
  static std::unique_ptr<DataBlend> open(const std::string& spec, const std::string& flag);
  // One unweighted source (--data=random).
  explicit DataBlend(std::unique_ptr<TokenCorpus> corpus);

  int size() const { return static_cast<int>(corpora_.size()); }
  bool weighted() const { return weighted_; }
  // The source as written (its key in metrics.jsonl).
  const std::string& name(int k) const { return names_[k]; }
  double weight(int k) const { return weights_[k]; }  // normalised: they sum to 1
  const TokenCorpus& corpus(int k) const { return *corpora_[k]; }
  const BlendIndex& index() const { return *index_; }

 private:
  DataBlend() = default;
  bool weighted_ = false;
  std::vector<std::string> names_;
  std::vector<double> weights_;
  std::vector<std::unique_ptr<TokenCorpus>> corpora_;
  std::unique_ptr<BlendIndex> index_;
};

// The training stream of a DataBlend: position i reads sample index().at(i).index of
// source index().at(i).source, from that source's own BatchSampler (seeded with
// seed + (k << 32), so source 0 of a blend, and an unweighted --data, read exactly what
// a BatchSampler with --seed reads). The whole state is the samples consumed.
class BlendedSampler {
 public:
  BlendedSampler(const DataBlend& data, SampleMode mode, int64_t seq_len, uint64_t seed, bool shuffle,
                 int64_t vocab_size);

  const DataBlend& data() const { return data_; }
  // Position `index` of the blended stream (BatchSampler::fill of its source).
  int64_t fill(uint64_t index, int32_t* inputs, int32_t* targets);
  // As BatchSampler::next_batch (fill_dp_share), over the blended stream.
  void next_batch(int64_t global_batch, int dp_rank, int dp_size, Tensor inputs, Tensor targets);
  uint64_t consumed() const { return consumed_; }
  void set_consumed(uint64_t c) { consumed_ = c; }
  // The source position `index` reads, and its sample there (BatchSampler::sample_of).
  int source_of(uint64_t index) const { return data_.index().at(index).source; }
  int64_t sample_of(uint64_t index);
  // Samples each source has given to the positions consumed so far: [sources].
  std::vector<uint64_t> samples_by_source() const;

 private:
  const DataBlend& data_;
  std::vector<std::unique_ptr<BatchSampler>> samplers_;  // one per source
  uint64_t consumed_ = 0;
};

}  // namespace lns
