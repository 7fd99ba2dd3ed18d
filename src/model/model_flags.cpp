#include "lns/model/model_flags.h"

#include <gflags/gflags.h>

#include "lns/core/errors.h"

DEFINE_int32(vocab_size, 32000, "Vocabulary size (rows of the embedding and the LM head).");
DEFINE_int32(hidden_size, 768, "Model width C.");
DEFINE_int32(intermediate_size, 2048, "SwiGLU inner width F.");
DEFINE_int32(num_layers, 12, "Number of transformer blocks L.");
DEFINE_int32(num_heads, 12, "Attention query heads; must divide --hidden_size.");
DEFINE_int32(num_kv_heads, 12, "Key/value heads (grouped-query attention); must divide --num_heads.");
DEFINE_double(rope_theta, 10000.0, "Rotary embedding base.");
DEFINE_double(norm_eps, 1e-5, "Epsilon inside RMSNorm / LayerNorm.");
DEFINE_string(norm_type, "rmsnorm", "rmsnorm or layernorm.");
DEFINE_string(attention, "auto",
              "Attention on CUDA: fused (tensor-core FlashAttention-style kernels, head dim 64 or 128, "
              "memory linear in T), cudnn (cuDNN's fused attention, loaded at run time; head dims "
              "multiples of 8 up to 128; deterministic backward), cudnn_nondeterministic (the same with "
              "cuDNN's faster atomic backward), materialized (cuBLASLt through score chunks, any head dim) or "
              "auto (fused where it applies). Chosen once per model and logged.");
DEFINE_string(recompute, "none",
              "Activation recomputation: none, selective (the attention core and the SwiGLU product "
              "are recomputed in backward) or full (a layer keeps only its output and re-runs its "
              "forward in backward). Exact: the step is unchanged. docs/parallelism.md.");
DEFINE_int32(recompute_layers, 0,
             "--recompute=full: only the first N layers of each pipeline stage recompute; 0 = all.");
DEFINE_string(norm_scheme, "lns",
              "The block's normalization scheme: pre, lns (LayerNorm Scaling), post, mix (Mix-LN), sandwich, "
              "deepnorm, scaled_init, the reference repository's variants as it computes them (deeppost, "
              "scale_post_pre, scale_res_pre_norm, mono, mono_reverse, and corrected forms), hybrid (per layer, "
              "--layer_schemes) and routed. docs/model.md says what each computes; a bad value lists every name.");
DEFINE_int32(post_layers, 1,
             "mix, scale_post_pre: layers with 0-based index below this use Post-LN (the reference "
             "repository's POST_NUM, whose default is 1).");
DEFINE_string(layer_schemes, "",
              "--norm_scheme=hybrid: block form per layer, FORM[:COUNT],...[,*], e.g. pre:7,post or "
              "pre:3,post,* (every 4th layer post); docs/model.md.");
DEFINE_bool(tie_embeddings, false, "Share the embedding matrix with the LM head.");
DEFINE_bool(folded_norms, false,
            "The model has no norms: an LN-free model whose constant norms lns_convert fold-norms folded into "
            "its linears (docs/ln_free.md). Set it to fine-tune such a checkpoint (--resume).");
DEFINE_string(fp8, "none",
              "FP8 linear layers: none, or delayed (q/k/v/o and gate/up/down GEMMs on E4M3 inputs "
              "and weights and E5M2 gradients, per-tensor scales from an amax history; "
              "docs/fp8.md). On CUDA every GEMM dimension must be a multiple of 16.");
DEFINE_int32(fp8_amax_history, 1024, "--fp8=delayed: steps of amax history a scale is computed from.");
DEFINE_int32(fp8_margin, 0, "--fp8=delayed: binades of headroom below the format's largest value.");
DEFINE_string(fp8_amax_compute, "max",
              "--fp8=delayed: the amax a scale is computed from: max (of the history) or most_recent.");
DEFINE_double(init_std, 0.02, "Std of the normal init of linear weights (schemes may rescale).");
DEFINE_double(embed_init_std, 0.02, "Std of the normal init of the token embedding.");

namespace lns {

LlamaConfig config_from_flags() {
  LlamaConfig c;
  c.vocab_size = FLAGS_vocab_size;
  c.hidden_size = FLAGS_hidden_size;
  c.intermediate_size = FLAGS_intermediate_size;
  c.num_layers = FLAGS_num_layers;
  c.num_heads = FLAGS_num_heads;
  c.num_kv_heads = FLAGS_num_kv_heads;
  c.rope_theta = FLAGS_rope_theta;
  c.norm_eps = static_cast<float>(FLAGS_norm_eps);
  c.norm_type = parse_norm_type(FLAGS_norm_type);
  c.norm_scheme = parse_norm_scheme(FLAGS_norm_scheme);
  c.attention = parse_attention_impl(FLAGS_attention);
  c.recompute = parse_recompute_mode(FLAGS_recompute);
  c.fp8 = parse_fp8_mode(FLAGS_fp8);
  c.fp8_scaling.history = FLAGS_fp8_amax_history;
  c.fp8_scaling.margin = FLAGS_fp8_margin;
  LNS_REQUIRE(FLAGS_fp8_amax_compute == "max" || FLAGS_fp8_amax_compute == "most_recent", "--fp8_amax_compute=",
              FLAGS_fp8_amax_compute, ": expected max or most_recent");
  c.fp8_scaling.most_recent = FLAGS_fp8_amax_compute == "most_recent";
  c.recompute_layers = FLAGS_recompute_layers;
  c.post_layers = FLAGS_post_layers;
  c.layer_schemes = FLAGS_layer_schemes;
  c.tie_embeddings = FLAGS_tie_embeddings;
  c.folded_norms = FLAGS_folded_norms;
  c.init_std = static_cast<float>(FLAGS_init_std);
  c.embed_init_std = static_cast<float>(FLAGS_embed_init_std);
  c.validate();
  return c;
}

}  // namespace lns
