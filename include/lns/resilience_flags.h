// The fault-handling flags (src/train/resilience_flags.cpp; docs/resilience.md).
#pragma once
#include "lns/trainer.h"
#include "parallel/watchdog.h"

namespace lns {

// Timeouts and heartbeat period; rank, world, host and run_dir are the caller's.
WatchdogConfig watchdog_config_from_flags();
bool watchdog_flag();
// Stragglers, re-runs, --async_save and --inject_fault into the trainer's config.
void add_resilience_flags(TrainConfig& c);

}  // namespace lns
