#include "lns/train/metrics.h"

#include <fstream>

#include "lns/core/errors.h"

namespace lns {
namespace {

class JsonlSink : public MetricsSink {
 public:
  explicit JsonlSink(const std::string& path) : out_(path, std::ios::app) {
    if (!out_) fail(path, ": cannot open metrics file for writing");
  }
  void write(const nlohmann::json& record) override {
    out_ << record.dump() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

}  // namespace

std::unique_ptr<MetricsSink> make_jsonl_sink(const std::string& path) { return std::make_unique<JsonlSink>(path); }

}  // namespace lns
