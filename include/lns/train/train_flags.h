// The trainer's flags (data, batch, optimizer, schedule, evaluation, output).
#pragma once
#include <string>

#include "lns/train/trainer.h"
#include "parallel/communicator.h"

namespace lns {

TrainConfig train_config_from_flags();
std::string dump_step_state_flag();
int tp_flag();
int pp_flag();
CommKind comm_flag();  // --comm, for CUDA runs
// Every lns flag (those defined in *_flags.cpp) as "--name=value" lines: the
// resolved configuration, itself a valid --flagfile.
std::string resolved_flags();

}  // namespace lns
