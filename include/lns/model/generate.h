// Text generation from a model: the next token's distribution (greedy, temperature,
// top-k, top-p), seeded draws, and the loop over LlamaStage's key/value-cache decode
// path (lns/model/stage.h: start_decode, decode). lns_generate is the app; docs/generation.md.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace lns {

class LlamaStage;

struct SamplingConfig {
  float temperature = 1.0f;  // 0: greedy (the most likely token)
  int top_k = 0;             // keep the k most likely tokens; 0: all
  float top_p = 1.0f;        // then the smallest set of most likely tokens whose probability reaches p; 1: all
  uint64_t seed = 0;         // draw i of a sequence is uniform_at(rng_key(seed, "generate"), i)
};
// UserError naming --temperature, --top_k or --top_p when a value is out of range.
void check_sampling(const SamplingConfig& c);

// The distribution the next token is drawn from, [V] (sums to 1): softmax(logits /
// temperature), restricted to the top_k most likely tokens and renormalised, then to
// the smallest run of most likely tokens whose probability reaches top_p and
// renormalised (the order Hugging Face's warpers apply them). Ties in likelihood go to
// the lower id. Greedy (temperature 0): all the mass on the most likely token, the
// lowest id among equals (torch.argmax's choice).
std::vector<double> sampling_distribution(const std::vector<float>& logits, const SamplingConfig& c);
// The token at u in (0, 1) of sampling_distribution's cumulative sum, in id order.
int32_t sample_token(const std::vector<float>& logits, const SamplingConfig& c, float u);

struct GenerateOptions {
  int64_t max_new_tokens = 100;
  std::vector<int32_t> stop_ids;  // generation ends after producing one of these
  SamplingConfig sampling;
};
// Continues `prompt` (at least one token) on `stage` (the whole model on one rank):
// start_decode for prompt + max_new_tokens positions, the prompt in one pass, then one
// token at a time. Returns the new tokens (a stop token, when one ended it, is the
// last); on_token sees each as it is drawn. Routed blocks: UserError (start_decode).
std::vector<int32_t> generate(LlamaStage& stage, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace lns
