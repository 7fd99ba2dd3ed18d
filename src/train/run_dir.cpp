#include "lns/train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lns/checkpoint/checkpoint.h"
#include "lns/core/errors.h"
#include "lns/core/files.h"

namespace fs = std::filesystem;

namespace lns {

RunDirLock::RunDirLock(const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail("--out_dir=", out_dir, ": cannot create directory: ", ec.message());
  const std::string path = out_dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("--out_dir=", out_dir, ": cannot open ", path, ": ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      char holder[256] = {};
      const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
      std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
      while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
      ::close(fd_);
      fd_ = -1;
      fail("--out_dir=", out_dir, ": another run is using this directory (", who.empty() ? "its lock" : printable(who),
           " holds ", path, "); wait for it to end, or choose another --out_dir");
    }
    // NFS without lock daemon, Lustre mounted without flock: no lock to be had.
    LOG(WARNING) << "--out_dir=" << out_dir << ": cannot lock " << path << " (" << std::strerror(err)
                 << "); make sure no other run uses this directory";
    ::close(fd_);
    fd_ = -1;
    return;
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    LOG(WARNING) << path << ": could not record this process in the lock file";
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race)
}

void check_fresh_run_dir(const std::string& out_dir) {
  if (out_dir.empty()) return;
  const std::string latest = find_latest_checkpoint(out_dir);
  if (!latest.empty())
    fail("--out_dir=", out_dir, " already holds the checkpoints of a run (newest: ",
         fs::path(latest).filename().string(), "); continue it with --resume=auto, or choose another --out_dir");
  const std::string metrics = out_dir + "/metrics.jsonl";
  std::error_code ec;
  if (fs::exists(metrics, ec) && fs::file_size(metrics, ec) > 0)
    fail("--out_dir=", out_dir, " already holds metrics.jsonl of another run (without a checkpoint); ",
         "--resume=auto starts that run over (its records are replaced), or choose another --out_dir");
}

int64_t truncate_metrics(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return 0;
  std::istringstream in(read_file(path, uint64_t{1} << 34, "metrics file"));
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    bool keep = false;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      keep = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
             j["step"].get<int64_t>() <= step;
    } catch (const nlohmann::json::exception&) {
      keep = false;  // a line the crash cut short
    }
    if (keep) kept += line + "\n";
    else ++dropped;
  }
  if (dropped > 0) write_file_atomically(path, kept);
  return dropped;
}

}  // namespace lns
