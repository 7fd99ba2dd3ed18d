// lns_train: the trainer. This revision runs the debugging entry point: build the
// model from flags, initialise or load it, run one forward/backward on the first
// batch and (with --dump_step_state) write everything it computed.
#include <gflags/gflags.h>

#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "lns/errors.h"
#include "lns/model_flags.h"
#include "lns/param_io.h"
#include "lns/rng.h"
#include "lns/stage.h"
#include "lns/step_state.h"

DEFINE_int32(seq_len, 256, "Tokens per sequence T.");
DEFINE_int32(micro_batch_size, 8, "Sequences per micro-batch B.");
DEFINE_uint64(seed, 1234, "Seed of the weight initialisation and the data order.");
DEFINE_string(data, "random", "Training data: 'random' (uniform token ids from --seed).");
DEFINE_string(init_from, "", "Load all weights from this safetensors file (Hugging Face names).");
DEFINE_string(dump_step_state, "",
              "Write inputs, targets, logits, loss and grad.<param> of the first batch to this "
              "safetensors file, before any optimizer step, then exit.");

namespace lns {
namespace {

// Uniform random tokens [B, T+1] from the seed: inputs are [:, :T], targets [:, 1:].
void random_batch(const LlamaConfig& cfg, int64_t B, int64_t T, uint64_t seed, Tensor inputs,
                  Tensor targets) {
  const uint64_t key = rng_key(seed, "data.random");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t <= T; ++t) {
      const auto tok = static_cast<int32_t>(uniform_at(key, b * (T + 1) + t) * cfg.vocab_size);
      if (t < T) inputs.i32()[b * T + t] = tok;
      if (t > 0) targets.i32()[b * T + t - 1] = tok;
    }
}

int run() {
  const LlamaConfig cfg = config_from_flags();
  LNS_REQUIRE(FLAGS_seq_len > 0, "--seq_len must be positive, got ", FLAGS_seq_len);
  LNS_REQUIRE(FLAGS_micro_batch_size > 0, "--micro_batch_size must be positive, got ",
              FLAGS_micro_batch_size);
  LNS_REQUIRE(FLAGS_data == "random", "--data=", FLAGS_data,
              ": only 'random' is supported by this build");
  const int64_t B = FLAGS_micro_batch_size, T = FLAGS_seq_len;

  LlamaStage model(cfg, StageSpec::whole(cfg), B, T);
  if (FLAGS_init_from.empty()) {
    model.init_weights(FLAGS_seed);
  } else {
    load_params(model.params(), SafetensorsReader(FLAGS_init_from));
    LOG(INFO) << "loaded weights from " << FLAGS_init_from;
  }
  LOG(INFO) << "model: " << cfg.to_json().dump() << ", " << model.params().numel()
            << " parameter floats";

  OwnedTensor inputs(DType::I32, {B, T}), targets(DType::I32, {B, T});
  random_batch(cfg, B, T, FLAGS_seed, inputs, targets);
  model.params().zero_grads();
  const Tensor logits = model.forward(inputs);
  const double loss_sum = model.loss(targets);
  int64_t valid = 0;
  for (int64_t n = 0; n < B * T; ++n) valid += targets.i32()[n] != kIgnoreIndex;
  const float loss = static_cast<float>(loss_sum / std::max<int64_t>(valid, 1));
  OwnedTensor logits_copy(DType::F32, logits.shape);  // backward overwrites the logits
  std::memcpy(logits_copy.t.data, logits.data, logits.nbytes());
  model.backward({}, 1.0f / std::max<int64_t>(valid, 1));
  LOG(INFO) << "first batch: loss " << loss;

  if (!FLAGS_dump_step_state.empty()) {
    write_step_state(FLAGS_dump_step_state, cfg, model.params(),
                     {inputs, targets, logits_copy, loss});
    LOG(INFO) << "wrote step state to " << FLAGS_dump_step_state;
  }
  return 0;
}

}  // namespace
}  // namespace lns

int main(int argc, char** argv) {
  gflags::SetUsageMessage("lns_train --flagfile=configs/tiny_lns.flags [--flag=value ...]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  try {
    return lns::run();
  } catch (const lns::UserError& e) {
    std::fprintf(stderr, "lns_train: error: %s\n", e.what());
    return 1;
  }
}
