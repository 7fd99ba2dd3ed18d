// LlamaStage: a contiguous range [first_layer, last_layer) of the global model, plus
// the token embedding when it is the first stage and the final norm and LM head when
// it is the last. The single-process model is the stage that holds everything.
// Under the interleaved pipeline a stage holds several such ranges, its model chunks
// (StageSpec::chunks): forward/backward run one chunk, the embedding before chunk 0,
// the head after the last; parameters stay in one flat buffer, in layer order.
//
// Every depth-dependent choice (LNS scale, Mix-LN role, parameter names) is made from
// the global layer index through block_plan(), so splitting the model into stages
// never changes what a layer computes.
//
// Activations are planned at construction for `num_slots` micro-batches in flight
// (the pipeline schedule keeps several); nothing is allocated in forward/backward.
//
// Under tensor parallelism (tp.size > 1) the stage holds this rank's shard: its
// query/key-value heads, its slice of the FFN width and of the vocabulary (padded by
// the rule of parallel/shard.h), and replicated norms. It all-reduces
// after o_proj and down_proj, after the input gradients of q/k/v and gate/up, in the
// embedding and in the loss; the logits it returns are its vocabulary columns.
//
// With sequence parallelism (tp.sequence_parallel) the norms, residual adds and the
// hidden states between stages hold only this rank's N/tp tokens (hidden_tokens());
// the all-reduces after o_proj, down_proj and the embedding become reduce-scatters,
// and the inputs of q/k/v, gate/up and the head are all-gathered (again in backward,
// instead of being kept). Gradients of replicated parameters (norms) then cover this
// rank's tokens only: GradientSync sums them over tp.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "lns/model/block_plan.h"
#include "lns/model/ln_free.h"
#include "lns/model/param_set.h"
#include "lns/model/rope.h"
#include "parallel/tensor_parallel.h"

namespace lns {

class Fp8State;
struct Fp8Linear;

struct StageSpec {
  StageSpec() = default;
  StageSpec(int first, int last, bool embedding, bool head)
      : first_layer(first), last_layer(last), has_embedding(embedding), has_head(head) {}
  int first_layer = 0, last_layer = 0;  // global layer range [first, last) (of chunk 0)
  bool has_embedding = true;  // before chunk 0
  bool has_head = true;  // final norm + LM head + loss, after the last chunk
  // Interleaved pipeline: the global layer ranges of every model chunk this stage
  // holds, in order (chunks[0] = [first_layer, last_layer)); empty for one chunk.
  std::vector<std::pair<int, int>> chunks;
  static StageSpec whole(const LlamaConfig& cfg) { return {0, cfg.num_layers, true, true}; }
  // chunks, or the one range [first_layer, last_layer).
  std::vector<std::pair<int, int>> chunk_ranges() const {
    return chunks.empty() ? std::vector<std::pair<int, int>>{{first_layer, last_layer}} : chunks;
  }
  int num_chunks() const { return chunks.empty() ? 1 : static_cast<int>(chunks.size()); }
  // Whether global layer g is in one of the stage's chunks.
  bool holds_layer(int g) const {
    for (const auto& [first, last] : chunk_ranges())
      if (g >= first && g < last) return true;
    return false;
  }
};

class LlamaStage {
 public:
  // device: where parameters and activations live (lns/core/device.h for the dtypes).
  // num_slots activation slots for every chunk.
  LlamaStage(const LlamaConfig& cfg, StageSpec spec, int64_t micro_batch, int64_t seq_len,
             int num_slots = 1, TensorParallel tp = {}, Device device = Device::CPU);
  // chunk_slots[c] activation slots for chunk c (one entry per chunk of spec).
  LlamaStage(const LlamaConfig& cfg, StageSpec spec, int64_t micro_batch, int64_t seq_len,
             const std::vector<int>& chunk_slots, TensorParallel tp = {}, Device device = Device::CPU);
  ~LlamaStage();

  // Names and logical shapes of every parameter of the whole model, in order,
  // without allocating it (the same registration code as a real stage).
  static std::vector<ParamInfo> model_params(const LlamaConfig& cfg);
  // The parameters of one stage / tensor-parallel shard, registered but not allocated
  // (call finalize()): what a rank of that layout holds.
  static ParamSet stage_params(const LlamaConfig& cfg, StageSpec spec, TensorParallel tp);

  const LlamaConfig& config() const { return cfg_; }
  const StageSpec& spec() const { return spec_; }
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }
  int64_t tokens() const { return B_ * T_; }
  // Tokens of the hidden states this rank takes and returns (and of the residual
  // stream): tokens() / tp under sequence parallelism, tokens() otherwise.
  int64_t hidden_tokens() const { return NL_; }
  Device device() const { return device_; }
  // The attention implementation this model runs (config().attention resolved for
  // the device and head dim; logged at construction on CUDA).
  AttentionImpl attention_impl() const { return attn_; }
  // dtype of the hidden states a stage takes and returns (and of the logits).
  DType activation_dtype() const { return act_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  // This rank's vocabulary columns of the logits: [vocab_shard().begin, + valid).
  const ShardRange& vocab_shard() const { return vshard_; }

  // Blocks (global indices) that act as the identity in forward and backward; the
  // others keep their depth. For layer-removal studies without rewriting weights.
  void set_skipped_layers(const std::vector<int>& global_layers);

  // Layer-removal sweep without recomputing the unchanged prefix: after forward() of
  // the intact stage (one stage holding every layer), forward_skipping(k) returns the
  // logits with block k skipped, starting from the intact pass's input to block k.
  // Call it for k in decreasing order: each call overwrites the activations of the
  // blocks after k only, and the next (smaller) k reads a block before them.
  Tensor forward_skipping(int global_layer, int slot = 0);

  // Per-block statistics of the last forward() of `slot` (of every chunk), for this
  // stage's layers (curse-of-depth diagnostics). Sums over tokens, so batches and ranks add up.
  struct LayerStats {
    int layer = 0;             // global index
    double tokens = 0;         // tokens summed
    double sum = 0, sum_sq = 0;  // of the output's elements (variance = E[x^2] - E[x]^2)
    double elements = 0;
    double norm = 0;           // sum over tokens of ||output||
    double angle = 0;          // sum over tokens of arccos(cos(input, output)) / pi
    double angle_last = 0;     // the same at each sequence's last token
    double sequences = 0;
  };
  std::vector<LayerStats> layer_stats(int slot = 0) const;

  // LN-free fine-tuning (docs/ln_free.md): the pre-norm of sublayer `which` (0 attention,
  // 1 MLP) of global layer `global_layer` of this stage, or the final norm
  // (global_layer = num_layers, last stage), divides by constants (pos0 at sequence
  // position 0, rest elsewhere) instead of its measured divisor. Only pre-norms and the
  // final norm; bad constants or a slot without a pre-norm are a UserError.
  // which = 0 fixes the attention pre-norm for q/k and v alike.
  void set_fixed_divisor(int global_layer, int which, float pos0, float rest);
  // The same for one LN-free slot (lns/model/ln_free.h): the attention pre-norm as seen by q/k
  // (attn_qk) and by v (attn_v) may use different divisors; the first time they differ
  // the block keeps a second normalised copy of the attention input for v. With
  // eot_token >= 0, rows whose token is eot_token divide by pos0 as position 0 does
  // (the stage then needs the token ids on every stage: set_token_ids()).
  void set_fixed_divisor(int global_layer, DivisorSlot slot, float pos0, float rest, int32_t eot_token = -1);
  // True when a fixed norm of this stage has the end-of-text case: a stage that does
  // not hold the embedding then needs set_token_ids() before each forward().
  bool needs_token_ids() const;
  // The token ids [B,T] i32 of the micro-batch the next forward() of `slot` runs (the
  // first stage takes them from forward()'s input).
  void set_token_ids(Tensor ids, int slot = 0, int chunk = 0);
  // LN-free calibration: after forward() of `slot` in every model chunk of the stage,
  // adds the measured divisors of each pre-norm of the stage's layers and of the final
  // norm (last stage) over this rank's tokens (its share under --sequence_parallel) to
  // `sums`, indexed globally as divisor_sums_index (resized to 2*num_layers + 1 as
  // needed); each {sum at position 0, count, sum at positions > 0, count} as
  // norm_divisor_sums. Sums from several batches and ranks add; the constant is
  // sum / count. Entries of norms not here stay 0. CPU and CUDA.
  void add_divisor_sums(DivisorSums& sums, int slot = 0) const;

  // Routed blocks (mono, mono_reverse; lns/model/block_plan.h): the Gumbel noise of the next
  // forward() of `slot`. Training draws it for the micro-batch whose first sequence is
  // sample `first_sample` of the training stream (gate_noise()); a forward without it
  // (evaluation) runs with no noise, i.e. the router's argmax. Noise lasts one forward.
  // With several chunks, for the routed layers of `chunk` in its `slot`.
  void set_gate_noise(uint64_t seed, uint64_t first_sample, int slot = 0, int chunk = 0);
  // Given noise [B,2] for one routed layer (tests against the reference's noise).
  void set_gate_noise(int global_layer, const std::vector<float>& noise, int slot = 0);
  bool has_routed_layers() const;

  // Initialises every parameter by its scheme's rule. Each tensor draws from its own
  // named random stream, so any layout gets the single-rank model's weights.
  void init_weights(uint64_t seed);

  // input: token ids [B,T] i32 on the first stage (host or device memory), hidden states
  // [B,T,C] of activation_dtype() on device() otherwise ([hidden_tokens(), C], this
  // rank's tokens, under sequence parallelism). Returns the hidden states leaving the
  // stage (the same shape), or logits [B,T,V_local] on the last (this rank's
  // vocabulary columns, padding columns included), on device(). With several chunks,
  // `chunk` picks one: ids go into chunk 0 of the first stage, logits leave the last
  // chunk of the last stage, hidden states everywhere else.
  Tensor forward(Tensor input, int slot = 0, int chunk = 0);
  // Last stage, after forward (of the last chunk): per-token losses [B*T] f32 on device() (0 where
  // ignored) and their sum. targets [B*T] i32 may be host or device memory.
  double loss(Tensor targets, int slot = 0);
  // The same without reading anything back: the per-token losses [B*T] f32 on device(),
  // valid until this slot's next loss. Training sums them once per step (no host
  // synchronisation per micro-batch); targets on the device avoid one more.
  Tensor loss_tokens(Tensor targets, int slot = 0);
  Tensor losses(int slot = 0) const;
  // Gradients of parameters are accumulated into params().grad(). On the last stage
  // `dout` is ignored and d(loss)/d(logits) = grad_scale * (softmax - onehot) is used;
  // elsewhere dout is the gradient of this stage's output [B,T,C]. Returns the
  // gradient of the stage input [B,T,C] (empty on the first stage). The logits are
  // overwritten by their gradient. `chunk` as in forward().
  Tensor backward(Tensor dout, float grad_scale, int slot = 0, int chunk = 0);
  int num_chunks() const { return static_cast<int>(chunk_begin_.size()) - 1; }
  // Called during backward() each time the gradients of every parameter at flat
  // offsets >= from are complete for this micro-batch (the head, then each layer
  // from the last, then the embedding at from = 0): for overlapping their reduction.
  void set_grad_ready_hook(std::function<void(int64_t from)> hook) { grad_ready_ = std::move(hook); }

  // ---- generation with a key/value cache (src/model/stage_decode.cpp; lns_generate) ----
  // For a stage that holds the whole model on one rank (no tensor parallelism). The
  // same blocks as forward() (every scheme of the block plan, LN-free divisors, folded
  // norms, skipped layers), run a few positions at a time: each layer keeps the rotated
  // keys and the values of every position so far, [max_len, Hkv, D] each, and a new
  // token attends over them. Routed blocks are refused (UserError): their gate reads
  // the mean over the whole sequence, future tokens included, which decoding does not
  // have. start_decode allocates the cache and buffers for chunks of up to `chunk`
  // tokens (a longer prompt is run in chunks); it forgets any earlier sequence.
  void start_decode(int64_t max_len, int64_t chunk = 64);
  int64_t decode_capacity() const;  // max_len of start_decode (0 before it)
  // ids [n] (host) are the tokens at positions pos..pos+n-1, pos the number of tokens
  // decoded so far for this sequence (0 starts a new one). Returns the logits of the last
  // of them, [vocab_size] f32 on the host; all_logits, when given, receives every
  // new token's row ([n, vocab_size], row-major). UserError when pos + n > max_len.
  std::vector<float> decode(const std::vector<int32_t>& ids, int64_t pos, std::vector<float>* all_logits = nullptr);

  // The FP8 scaling state of the stage's linears under --fp8 (lns/model/fp8_state.h); null
  // without it. The trainer ends each optimizer step with fp8()->end_step().
  Fp8State* fp8() { return fp8_.get(); }
  const Fp8State* fp8() const { return fp8_.get(); }

 private:
  struct Layer;
  struct Sublayer;
  struct NormUse;
  struct Slot;
  struct Scratch;
  struct Workspace;
  struct Stream;
  struct DecodeState;

  struct ParamsOnly {};
  LlamaStage(const LlamaConfig& cfg, StageSpec spec, TensorParallel tp, ParamsOnly);
  void init_dims();
  void register_params();
  // The activation buffers (src/model/stage_buffers.cpp): every chunk's slots, the
  // workspace and the scratch gradients, planned once.
  void plan_buffers(const std::vector<int>& chunk_slots);
  void bind_layer_acts(int local, Slot& slot);
  // Binds one path's activations (the layer's, or a routed block's twin's) by `mode`.
  void bind_path_acts(const Layer& path, RecomputeMode mode, Slot& slot);
  void recompute_path(Layer& path, Slot& s, Tensor in);
  void norm_fwd(const NormUse& n, Slot& s, Tensor out, Tensor x);
  void norm_bwd(const NormUse& n, Slot& s, Tensor dx, Tensor dres, Tensor dout, Tensor x);
  void settle(Stream& x);
  Tensor gather_tokens(Tensor local);
  Tensor partial_out(Tensor local);
  void reduce_tokens(Tensor local);
  void stream_norm_fwd(const NormUse& n, Slot& s, Tensor out, Stream& x);
  Stream sublayer_forward(Layer& layer, int which, Slot& s, Stream x);
  Stream block_forward(Layer& layer, Slot& s, Stream x);
  void block_backward(Layer& layer, Slot& s, Tensor dy, Tensor dx);
  // A layer's activations in `s` (path 1 of a routed block: the twin's). Defined in
  // stage.cpp, where Slot is: the return type is deduced there.
  static auto& acts(const Layer& layer, Slot& s);
  Tensor head_forward(Slot& s, Stream x);
  Tensor layer_output(int local, const Slot& s) const;
  Slot& slot_at(int i, int chunk) const;
  int local_of(int global_layer) const;  // index into layers_, -1 when not held
  void sublayer_backward(Layer& layer, int which, Slot& s, Tensor dy, Tensor dx);
  void attention_fwd(Layer& layer, Slot& s, Tensor u, Tensor uv, Tensor f);
  void split_value_norm(Layer& layer);
  NormUse final_use() const;
  void attention_bwd(Layer& layer, Slot& s, Tensor df, Tensor du);
  void mlp_fwd(Layer& layer, Slot& s, Tensor u, Tensor f);
  void mlp_bwd(Layer& layer, Slot& s, Tensor df, Tensor du);
  // The decode path's pieces (stage_decode.cpp): a norm on n rows, a sublayer, a chunk.
  void decode_norm(const NormUse& n, Tensor out, Tensor x, int64_t pos);
  Tensor decode_sublayer(const Layer& layer, int which, Tensor x, Tensor spare, int64_t pos);
  void decode_chunk(const int32_t* ids, int64_t n, int64_t pos, float* logits_rows);
  std::vector<Fp8Linear> fp8_linears(const std::vector<int>& weights) const;  // fp8_->linear of each
  void lin_fwd(const std::vector<int>& weights, const std::vector<Tensor>& ys, Tensor x);
  void lin_bwd(const std::vector<int>& weights, Tensor dx, const std::vector<Tensor>& dys, Tensor x,
               bool accumulate_dx);

  LlamaConfig cfg_;
  StageSpec spec_;
  int64_t B_, T_;
  int64_t NL_ = 0;  // hidden_tokens()
  TensorParallel tp_;
  // Local sizes: query/kv heads, their widths, FFN and vocabulary shards.
  int64_t Hq_, Hkv_, QD_, KD_;
  ShardRange fshard_, vshard_;
  ParamSet params_;
  RopeTable rope_;           // host tables
  Tensor rope_cos_, rope_sin_;  // the tables on device()
  OwnedTensor rope_dev_[2];     // device copies (CUDA)
  Device device_ = Device::CPU;
  DType act_ = DType::F32;
  AttentionImpl attn_ = AttentionImpl::Materialized;  // resolved once (choose_attention_impl)
  std::vector<Layer> layers_;
  std::vector<bool> skipped_;  // per local layer
  std::vector<int> chunk_begin_;  // chunk c holds layers_[chunk_begin_[c], chunk_begin_[c+1])
  std::vector<std::vector<std::unique_ptr<Slot>>> slots_;  // [chunk][slot]
  std::unique_ptr<Scratch> scratch_;
  std::unique_ptr<Workspace> ws_;  // recompute buffers (lns/model/recompute.h)
  int embed_ = -1, final_gain_ = -1, final_bias_ = -1, head_ = -1;
  float final_fixed_[2] = {0.0f, 0.0f};  // LN-free divisors of the final norm (0: live)
  int32_t final_eot_ = -1;               // its end-of-text id (-1: none)
  int final_stat_ = -1;                  // its index in each Slot's mean/rstd
  std::function<void(int64_t)> grad_ready_;
  std::unique_ptr<Fp8State> fp8_;  // --fp8 only
  std::unique_ptr<DecodeState> dec_;  // start_decode()
};

}  // namespace lns
