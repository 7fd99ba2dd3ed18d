#include <algorithm>

#include "lns/data/data.h"
#include "lns/core/errors.h"
#include "lns/core/ops.h"
#include "lns/core/rng.h"

namespace lns {

SampleMode parse_sample_mode(const std::string& s) {
  if (s == "packed") return SampleMode::Packed;
  if (s == "document") return SampleMode::Document;
  fail("--data_mode=", s, " is not a sampling mode; expected packed or document");
}

BatchSampler::BatchSampler(const TokenCorpus& corpus, SampleMode mode, int64_t seq_len,
                           uint64_t seed, bool shuffle, int64_t vocab_size)
    : corpus_(corpus), mode_(mode), T_(seq_len), seed_(seed), shuffle_(shuffle),
      vocab_size_(vocab_size) {
  if (corpus.vocab_size() > vocab_size)
    fail(corpus.path(), ": was tokenized with a vocabulary of ", corpus.vocab_size(),
         " tokens, larger than the model's ", vocab_size, " (--vocab_size)");
  if (mode == SampleMode::Packed) {
    num_samples_ = std::max<int64_t>(0, (corpus.num_tokens() - 1) / T_);
  } else {
    for (int64_t d = 0; d < corpus.num_docs(); ++d)
      if (corpus.doc_end(d) - corpus.doc_begin(d) >= 2) docs_.push_back(d);
    num_samples_ = static_cast<int64_t>(docs_.size());
  }
  if (num_samples_ == 0)
    fail(corpus.path(), ": too small for one sequence of --seq_len=", T_, " (", corpus.num_tokens(),
         " tokens", mode == SampleMode::Document ? ", no document of 2 or more tokens" : "", ")");
}

int64_t BatchSampler::sample_id(uint64_t index) {
  const int64_t epoch = static_cast<int64_t>(index / num_samples_);
  const int64_t i = static_cast<int64_t>(index % num_samples_);
  if (!shuffle_) return i;
  if (epoch != perm_epoch_) {  // Fisher-Yates with the epoch's own random stream
    perm_.resize(num_samples_);
    for (int64_t k = 0; k < num_samples_; ++k) perm_[k] = k;
    const uint64_t key = rng_key(seed_ + static_cast<uint64_t>(epoch), "data.shuffle");
    for (int64_t k = num_samples_ - 1; k > 0; --k) {
      const uint64_t r = splitmix64(key ^ splitmix64(static_cast<uint64_t>(k)));
      std::swap(perm_[k], perm_[r % static_cast<uint64_t>(k + 1)]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[i];
}

void BatchSampler::check_tokens(const int32_t* t, int64_t n, int64_t at) const {
  for (int64_t i = 0; i < n; ++i)
    if (t[i] < 0 || t[i] >= vocab_size_)
      fail(corpus_.path(), ": token id ", t[i], " at position ", at + i,
           " is outside the model's vocabulary [0, ", vocab_size_, ") (--vocab_size)");
}

int64_t BatchSampler::fill(uint64_t index, int32_t* inputs, int32_t* targets) {
  const int64_t id = sample_id(index);
  thread_local std::vector<int32_t> buf;
  buf.resize(T_ + 1);
  int64_t begin, len;
  if (mode_ == SampleMode::Packed) {
    begin = id * T_;
    len = T_ + 1;
  } else {
    const int64_t d = docs_[id];
    begin = corpus_.doc_begin(d);
    len = std::min<int64_t>(corpus_.doc_end(d) - begin, T_ + 1);
  }
  corpus_.read(begin, len, buf.data());
  check_tokens(buf.data(), len, begin);
  for (int64_t t = 0; t < T_; ++t) {
    const bool real = t + 1 < len;
    inputs[t] = t < len ? buf[t] : 0;  // padding input: any valid id; its target is masked
    targets[t] = real ? buf[t + 1] : kIgnoreIndex;
  }
  return len - 1;
}

void BatchSampler::next_batch(int64_t global_batch, int dp_rank, int dp_size, Tensor inputs,
                              Tensor targets) {
  LNS_CHECK(inputs.numel() * dp_size == global_batch * T_);
  fill_dp_share(consumed_, global_batch, dp_rank, dp_size, inputs, targets,
                [&](uint64_t i, int32_t* in, int32_t* tg) { fill(i, in, tg); });
  consumed_ += global_batch;
}

}  // namespace lns
