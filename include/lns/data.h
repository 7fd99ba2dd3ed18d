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
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lns/tensor.h"

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

}  // namespace lns
