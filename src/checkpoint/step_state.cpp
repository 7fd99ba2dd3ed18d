#include "lns/step_state.h"

#include <nlohmann/json.hpp>

#include "lns/safetensors.h"

namespace lns {

void write_step_state(const std::string& path, const LlamaConfig& cfg, const ParamSet& params,
                      const StepState& st) {
  SafetensorsWriter w;
  w.add("inputs", st.inputs);
  w.add("targets", st.targets);
  w.add("logits", st.logits);
  w.add_f32("loss", {}, &st.loss);
  for (int i = 0; i < params.size(); ++i) {
    const std::string name = "grad." + params.info(i).name;
    w.add(name, params.grad(i));
  }
  w.set_metadata("format", "lns-step-state-v1");
  w.set_metadata("config", cfg.to_json().dump());
  w.set_metadata("seq_len", std::to_string(st.inputs.dim(1)));
  w.set_metadata("micro_batch_size", std::to_string(st.inputs.dim(0)));
  w.write(path);
}

}  // namespace lns
