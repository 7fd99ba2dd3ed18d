// The fault-handling flags (src/train/resilience_flags.cpp; docs/resilience.md).
#pragma once
#include "lns/train/trainer.h"
#include "parallel/watchdog.h"

namespace lns {

// Timeouts and heartbeat period; rank, world, host and run_dir are the caller's.
// stretch: multiplies the timeouts left at their defaults (the emulator's programs pass
// 20: their "GPU" runs hundreds of times slower, and a slow CI step is not a hang).
WatchdogConfig watchdog_config_from_flags(double stretch = 1);
bool watchdog_flag();
// Stragglers, re-runs, --async_save and --inject_fault into the trainer's config.
void add_resilience_flags(TrainConfig& c);

}  // namespace lns
