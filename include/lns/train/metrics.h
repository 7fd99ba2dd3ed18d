// Metrics: where the trainer's records go (docs/training.md lists them). One JSON object
// per record; a Metrics fans each out to its sinks (metrics.jsonl; more writers, such as
// TensorBoard's, register as sinks). Rank 0 holds the sinks, so write() is a no-op on
// the other ranks and with none.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lns {

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void write(const nlohmann::json& record) = 0;
};

// Appends one line per record to `path` and flushes it, so a crash loses at most the
// last line. UserError naming the file when it cannot be opened.
std::unique_ptr<MetricsSink> make_jsonl_sink(const std::string& path);

class Metrics {
 public:
  void add(std::unique_ptr<MetricsSink> sink) { sinks_.push_back(std::move(sink)); }
  void write(const nlohmann::json& record) {
    for (auto& s : sinks_) s->write(record);
  }
  bool empty() const { return sinks_.empty(); }

 private:
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
};

}  // namespace lns
