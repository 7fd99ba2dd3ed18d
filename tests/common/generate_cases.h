// The small models of the generation tests (tests/unit/test_generate.cpp on the CPU,
// tests/gpu/test_generate_cuda.cpp on CUDA): a scheme, a norm, and weights whose every
// norm gain, bias and branch scale matters to the logits.
#pragma once
#include <string>
#include <vector>

#include "lns/model/config.h"
#include "lns/model/ln_free.h"
#include "lns/model/stage.h"
#include "tests/common/test_util.h"

namespace lns {

struct DecodeCase {
  std::string name;
  NormScheme scheme;
  NormType norm = NormType::RMSNorm;
  bool tied = false;
  std::string layer_schemes;
  bool ln_free = false;  // constant divisors with an end-of-text case
  bool folded = false;
};

inline LlamaConfig decode_config(const DecodeCase& c) {
  LlamaConfig cfg;
  cfg.vocab_size = 50, cfg.hidden_size = 32, cfg.intermediate_size = 48, cfg.num_layers = 3;
  cfg.num_heads = 4, cfg.num_kv_heads = 2;  // grouped-query attention, head dim 8
  cfg.norm_scheme = c.scheme, cfg.norm_type = c.norm, cfg.tie_embeddings = c.tied;
  cfg.layer_schemes = c.layer_schemes, cfg.folded_norms = c.folded;
  cfg.init_std = 0.1f, cfg.embed_init_std = 0.5f;  // logits of a few units: positions differ visibly
  return cfg;
}

// Weights of the scheme's init, then norm gains, biases and branch scales moved off
// their constant starts so that each one matters to the logits.
inline void init_decode_weights(LlamaStage& st, const DecodeCase& c) {
  st.init_weights(11);
  ParamSet& p = st.params();
  for (int i = 0; i < p.size(); ++i) {
    const ParamInfo& info = p.info(i);
    float* w = p.host_param(i).f32();
    const int64_t n = info.shape.numel();
    const std::vector<float> noise = test::randn(n, 100 + i, 0.2f);
    if (info.kind == ParamKind::NormGain || info.kind == ParamKind::NormBias)
      for (int64_t j = 0; j < n; ++j) w[j] += noise[j];
    if (info.kind == ParamKind::BranchScale) w[0] = 0.7f;
  }
  p.upload();
  if (c.ln_free) {  // every pre-norm and the final norm; v's divisor apart from q/k's in layer 1
    for (int l = 0; l < 3; ++l) {
      st.set_fixed_divisor(l, DivisorSlot::AttnQK, 2.0f, 0.8f, 7);
      st.set_fixed_divisor(l, DivisorSlot::AttnV, l == 1 ? 1.5f : 2.0f, l == 1 ? 0.6f : 0.8f, 7);
      st.set_fixed_divisor(l, DivisorSlot::Mlp, 1.7f, 0.9f, 7);
    }
    st.set_fixed_divisor(3, DivisorSlot::Final, 1.2f, 1.1f, 7);
  }
}

}  // namespace lns
