// TensorBoard event files written while the trainer runs: a MetricsSink that turns each
// metrics record into TensorBoard scalars (docs/training.md, "TensorBoard" has the tags).
//
// An event file is a sequence of TFRecord-framed records, each a serialized Event
// (protobuf, src/train/tensorboard_event.proto):
//   u64 length | u32 masked_crc32c(length bytes) | payload | u32 masked_crc32c(payload)
// little-endian, with CRC-32C (Castagnoli) from Boost.CRC.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lns/train/metrics.h"

namespace lns {

// ---- record framing -------------------------------------------------------------------
uint32_t crc32c(const void* data, size_t n);
// TFRecord stores CRCs rotated right by 15 bits plus a constant, so that a CRC of data
// that itself holds CRCs does not degenerate.
uint32_t mask_crc32c(uint32_t crc);
std::string frame_record(std::string_view payload);
// The payloads of the whole records at the start of `bytes`; stops at the first record
// that is cut short or whose CRCs do not match, and sets *valid_end (when given) to the
// byte after the last good record.
std::vector<std::string> read_records(std::string_view bytes, size_t* valid_end = nullptr);

// ---- what a metrics record becomes ----------------------------------------------------
struct TensorBoardScalar {
  std::string tag;
  double value;  // TensorBoard stores it as float32
};
// Every numeric (and boolean, as 0/1) field of the record, under the tag the table in
// docs/training.md gives its record kind; strings and identifiers (sample ids) are left
// out. The record's "step" is the event's step, not a scalar.
std::vector<TensorBoardScalar> tensorboard_scalars(const nlohmann::json& record);

// ---- the files ------------------------------------------------------------------------
// lns names its event files events.out.tfevents.<unix time>.<host>.<pid>.<run id>.lns, the
// run id being tensorboard_run_id of the run directory: a run cuts back only its own
// files, never another run's or another writer's in the same directory.
bool is_lns_event_file(const std::string& name);
std::string event_file_run_id(const std::string& name);  // "" when not an lns file
// 8 hex digits: the CRC-32C of the directory's absolute, normalised path.
std::string tensorboard_run_id(const std::string& run_dir);
// Cuts this run's event files in `dir` back to the events with step <= keep_through (the
// checkpoint a resumed run continues from; 0 for a fresh start), each rewritten atomically
// (a new file renamed over the old) and removed when nothing of it is left; a record cut
// short by a crash goes too. Returns the number of summary events dropped.
int64_t truncate_tensorboard(const std::string& dir, int64_t keep_through, const std::string& run_id);
// Creates `dir` if needed and opens a new event file in it that sorts after every lns file
// there, starting with the file version and a SessionLog START at step keep_through + 1
// (a TensorBoard already showing the old events drops those from that step on). Each
// record's scalars are then one event, flushed at once. Warns when the directory also
// holds other runs' event files. UserError naming `flag` when the directory or file
// cannot be created.
std::unique_ptr<MetricsSink> make_tensorboard_sink(const std::string& dir, int64_t keep_through,
                                                   const std::string& run_id,
                                                   const std::string& flag = "--tensorboard_dir");

// --tensorboard_dir resolved against the run directory: "" (the default) is
// <out_dir>/tensorboard, or nothing without an --out_dir; "none" turns it off.
std::string tensorboard_dir_from_flags(const std::string& out_dir);

}  // namespace lns
