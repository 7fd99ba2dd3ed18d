// The FP8 health report (docs/fp8.md): every block linear's amax, scale and the
// fractions of its casts that saturated, flushed to zero or were non-finite, gathered
// over the stages on rank 0 as one metrics record (one row per layer, linear and
// tensor, for plots against depth) and one log line naming the worst tensors.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

namespace lns {

class ProcessGrid;
class Fp8State;

// Collective over the world. fp8: this rank's FP8 state, whose last_health() Fp8State::
// end_step reduced over tp and dp already. Returns the record on rank 0, null elsewhere.
nlohmann::json fp8_health_record(ProcessGrid& grid, const Fp8State& fp8, int num_layers, int64_t step);

}  // namespace lns
