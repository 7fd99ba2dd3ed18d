#include "lns/train/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <boost/crc.hpp>

#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "tensorboard_event.pb.h"

namespace lns {
namespace fs = std::filesystem;

// ---- record framing -----------------------------------------------------------------------

uint32_t crc32c(const void* data, size_t n) {
  // CRC-32C: polynomial 0x1EDC6F41, reflected in and out, initial and final XOR all ones.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  return crc.checksum();
}

uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string frame_record(std::string_view payload) {
  std::string len;
  put_le(len, payload.size(), 8);
  std::string out = len;
  put_le(out, mask_crc32c(crc32c(len.data(), len.size())), 4);
  out.append(payload);
  put_le(out, mask_crc32c(crc32c(payload.data(), payload.size())), 4);
  return out;
}

std::vector<std::string> read_records(std::string_view bytes, size_t* valid_end) {
  std::vector<std::string> out;
  size_t at = 0;
  while (bytes.size() - at >= 12) {
    const char* p = bytes.data() + at;
    const uint64_t n = get_le(p, 8);
    if (uint32_t(get_le(p + 8, 4)) != mask_crc32c(crc32c(p, 8))) break;
    if (n > bytes.size() - at - 12 || bytes.size() - at - 12 - n < 4) break;  // cut short
    if (uint32_t(get_le(p + 12 + n, 4)) != mask_crc32c(crc32c(p + 12, n))) break;
    out.emplace_back(p + 12, n);
    at += 12 + n + 4;
  }
  if (valid_end) *valid_end = at;
  return out;
}

// ---- metrics record -> scalars ----------------------------------------------------------------

namespace {

using nlohmann::json;
using Scalars = std::vector<TensorBoardScalar>;

bool scalar_value(const json& v, double* out) {
  if (v.is_boolean()) return *out = v.get<bool>() ? 1.0 : 0.0, true;
  if (v.is_number()) return *out = v.get<double>(), true;
  return false;
}

// The name of one row of a per-layer or per-rank table: layer_07 followed by the row's
// string fields in the order of their names (fp8: layer_07.down_proj.grad_output), or
// rank_3, or the row's index.
std::string row_name(const json& row, size_t index) {
  if (row.contains("layer") && row["layer"].is_number_integer()) {
    std::string name = absl::StrFormat("layer_%02d", row["layer"].get<int64_t>());
    for (const auto& [k, v] : row.items())  // nlohmann::json keeps keys sorted
      if (v.is_string()) absl::StrAppend(&name, ".", v.get<std::string>());
    return name;
  }
  if (row.contains("rank") && row["rank"].is_number_integer()) return absl::StrCat("rank_", row["rank"].get<int64_t>());
  return absl::StrCat(index);
}

// Numbers and booleans under `prefix`; objects add /key; arrays of numbers add /index;
// arrays of rows (objects) give prefix/<field>/<row name> for each numeric field.
void flatten(Scalars& out, const std::string& prefix, const json& v) {
  double x;
  if (scalar_value(v, &x)) {
    out.push_back({prefix, x});
  } else if (v.is_object()) {
    for (const auto& [k, sub] : v.items()) flatten(out, prefix + "/" + k, sub);
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      const json& e = v[i];
      if (!e.is_object()) {
        flatten(out, absl::StrCat(prefix, "/", i), e);
        continue;
      }
      const std::string name = row_name(e, i);
      for (const auto& [k, f] : e.items())
        if (k != "layer" && k != "rank" && scalar_value(f, &x)) out.push_back({prefix + "/" + k + "/" + name, x});
    }
  }
}

// The step record's fields, grouped as a reader looks for them.
std::string step_tag(const std::string& key, const json& v) {
  static const char* const kPerf[] = {"tokens_per_s", "step_time_s", "elapsed_s", "mfu", "peak_memory_bytes"};
  for (const char* p : kPerf)
    if (key == p) return "perf/" + key;
  if (absl::StartsWith(key, "ln_free_")) return "ln_free/" + key.substr(8);
  if (v.is_object()) return key;  // startup_s/..., comm_bytes/...: a group of their own
  return "train/" + key;
}

}  // namespace

std::vector<TensorBoardScalar> tensorboard_scalars(const json& r) {
  Scalars out;
  if (!r.is_object()) return out;
  auto rest = [&](const std::string& prefix, std::initializer_list<const char*> skip) {
    for (const auto& [k, v] : r.items())
      if (k != "step" && std::none_of(skip.begin(), skip.end(), [&](const char* s) { return k == s; }))
        flatten(out, prefix + "/" + k, v);
  };
  if (r.contains("diag")) {
    Scalars rows;
    flatten(rows, "diag", r["diag"]);
    for (TensorBoardScalar& s : rows)  // -1: the block's gradient norm was not computed
      if (!(absl::StartsWith(s.tag, "diag/grad_norm/") && s.value < 0)) out.push_back(std::move(s));
  } else if (r.contains("fp8")) {
    flatten(out, "fp8", r["fp8"]);
    // The log line's summary: the worst saturated and flushed fractions, the non-finite count.
    double sat = 0, flush = 0, nonfinite = 0;
    for (const json& row : r["fp8"]) {
      sat = std::max(sat, row.value("saturated", 0.0));
      flush = std::max(flush, row.value("flushed", 0.0));
      nonfinite += row.value("nonfinite", 0.0);
    }
    out.push_back({"fp8/saturated_max", sat});
    out.push_back({"fp8/flushed_max", flush});
    out.push_back({"fp8/nonfinite_total", nonfinite});
  } else if (r.contains("ln_free_event")) {
    flatten(out, "ln_free_event", r["ln_free_event"]);
  } else if (r.contains("rerun")) {
    // "reproduced" (the batch is the cause) or "transient"; the sample ids are identifiers.
    out.push_back({"rerun/reproduced", r["rerun"] == "reproduced" ? 1.0 : 0.0});
    if (r.contains("ranks") && r["ranks"].is_array()) out.push_back({"rerun/ranks_differing", double(r["ranks"].size())});
    rest("rerun", {"rerun", "ranks", "samples"});
  } else if (r.contains("checkpoint") || r.contains("checkpoint_committed")) {
    rest("checkpoint", {});
  } else if (r.contains("compute_s")) {
    rest("straggler", {"stragglers"});
    if (r.contains("stragglers") && r["stragglers"].is_array()) {
      out.push_back({"straggler/stragglers_named", double(r["stragglers"].size())});
      flatten(out, "straggler", r["stragglers"]);
    }
  } else if (r.contains("val_loss")) {
    for (const auto& [k, v] : r.items())
      if (k != "step") flatten(out, "eval/" + (absl::StartsWith(k, "val_") ? k.substr(4) : k), v);
  } else if (r.contains("loss")) {
    for (const auto& [k, v] : r.items())
      if (k != "step") flatten(out, step_tag(k, v), v);
  } else {
    rest("metrics", {});
  }
  return out;
}

// ---- the files ------------------------------------------------------------------------------

namespace {

constexpr char kPrefix[] = "events.out.tfevents.";
constexpr char kSuffix[] = ".lns";

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The <unix time> of an event file's name, or -1.
int64_t file_time(const std::string& name) {
  if (!absl::StartsWith(name, kPrefix)) return -1;
  const std::vector<std::string> parts = absl::StrSplit(name.substr(sizeof(kPrefix) - 1), '.');
  int64_t t;
  return !parts.empty() && absl::SimpleAtoi(parts[0], &t) ? t : -1;
}

// The names of dir's files that pass `keep`, sorted (TensorBoard's reading order).
std::vector<std::string> files_in(const std::string& dir, const std::function<bool(const std::string&)>& keep) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec) && keep(e.path().filename().string())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> run_files(const std::string& dir, const std::string& run_id) {
  return files_in(dir, [&](const std::string& n) { return is_lns_event_file(n) && event_file_run_id(n) == run_id; });
}

class TensorBoardSink : public MetricsSink {
 public:
  TensorBoardSink(const std::string& path, const std::string& flag, int64_t start_step) : path_(path), flag_(flag) {
    out_.open(path, std::ios::binary | std::ios::app);
    if (!out_) fail(flag, "=", fs::path(path).parent_path().string(), ": cannot create the TensorBoard event file ", path);
    tb::Event version;
    version.set_wall_time(wall_time());
    version.set_file_version("brain.Event:2");
    append(version);
    tb::Event start;
    start.set_wall_time(wall_time());
    start.set_step(start_step);
    start.mutable_session_log()->set_status(tb::SessionLog::START);
    append(start);
  }

  void write(const nlohmann::json& record) override {
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) return;
    const std::vector<TensorBoardScalar> scalars = tensorboard_scalars(record);
    if (scalars.empty()) return;
    tb::Event e;
    e.set_wall_time(wall_time());
    e.set_step(record["step"].get<int64_t>());
    for (const TensorBoardScalar& s : scalars) {
      tb::Summary::Value* v = e.mutable_summary()->add_value();
      v->set_tag(s.tag);
      v->set_simple_value(static_cast<float>(s.value));
    }
    append(e);
  }

 private:
  void append(const tb::Event& e) {
    const std::string rec = frame_record(e.SerializeAsString());
    out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
    out_.flush();  // live: TensorBoard sees each step as it ends
    if (!out_) fail(flag_, ": cannot write the TensorBoard event file ", path_);
  }

  std::string path_, flag_;
  std::ofstream out_;
};

}  // namespace

bool is_lns_event_file(const std::string& name) {
  return file_time(name) >= 0 && absl::EndsWith(name, kSuffix) && !event_file_run_id(name).empty();
}

std::string event_file_run_id(const std::string& name) {
  if (!absl::EndsWith(name, kSuffix)) return "";
  const std::string stem = name.substr(0, name.size() - (sizeof(kSuffix) - 1));
  const size_t dot = stem.rfind('.');
  const std::string id = dot == std::string::npos ? "" : stem.substr(dot + 1);
  const bool hex8 = id.size() == 8 && std::all_of(id.begin(), id.end(), [](char c) {
                      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                    });
  return hex8 ? id : "";
}

std::string tensorboard_run_id(const std::string& run_dir) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(run_dir, ec), ec).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();  // "runs/x/" is "runs/x"
  const std::string s = p.string();
  return absl::StrFormat("%08x", crc32c(s.data(), s.size()));
}

int64_t truncate_tensorboard(const std::string& dir, int64_t keep_through, const std::string& run_id) {
  int64_t dropped = 0;
  for (const std::string& name : run_files(dir, run_id)) {
    const std::string path = dir + "/" + name;
    const std::string bytes = read_file(path, uint64_t{1} << 34, "TensorBoard event file");
    size_t end = 0;
    std::string kept;
    int64_t kept_summaries = 0, dropped_here = 0;
    bool cut = false;  // a record cut short, or framed but not an Event: it and what follows go
    for (const std::string& payload : read_records(bytes, &end)) {
      tb::Event e;
      if (!e.ParseFromString(payload)) {
        cut = true;
        break;
      }
      if (e.step() <= keep_through) {
        kept += frame_record(payload);
        kept_summaries += e.has_summary();
      } else {
        dropped_here += e.has_summary();
      }
    }
    if (dropped_here == 0 && !cut && end == bytes.size()) continue;  // nothing to cut
    dropped += dropped_here;
    if (kept_summaries == 0) {
      std::error_code ec;
      fs::remove(path, ec);
    } else {
      write_file_atomically(path, kept);
    }
  }
  return dropped;
}

std::unique_ptr<MetricsSink> make_tensorboard_sink(const std::string& dir, int64_t keep_through,
                                                   const std::string& run_id, const std::string& flag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) fail(flag, "=", dir, ": cannot create the TensorBoard directory");
  const std::vector<std::string> others = files_in(dir, [&](const std::string& n) {
    return absl::StrContains(n, "tfevents") && !(is_lns_event_file(n) && event_file_run_id(n) == run_id);
  });
  if (!others.empty())
    LOG(WARNING) << flag << "=" << dir << " also holds " << others.size() << " event file(s) of another run ("
                 << others[0] << (others.size() > 1 ? ", ..." : "")
                 << "), left as they are: TensorBoard shows a directory as one run, so their curves mix with "
                    "this run's; give each run its own directory (TensorBoard's --logdir may be their parent)";
  // TensorBoard reads a directory's event files in the order of their names: the new
  // one must come after every earlier one, even within the same second.
  int64_t t = static_cast<int64_t>(wall_time());
  for (const std::string& name : files_in(dir, is_lns_event_file)) t = std::max(t, file_time(name) + 1);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string h(host);
  std::replace_if(h.begin(), h.end(), [](char c) { return c == '/' || c < ' '; }, '_');
  const std::string path =
      absl::StrFormat("%s/%s%010d.%s.%d.%s%s", dir, kPrefix, t, h, ::getpid(), run_id, kSuffix);
  return std::make_unique<TensorBoardSink>(path, flag, keep_through + 1);
}

}  // namespace lns
