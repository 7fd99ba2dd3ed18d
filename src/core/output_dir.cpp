#include "lns/core/output_dir.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "lns/core/errors.h"
#include "lns/core/files.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

std::string make_unique_dir(const std::string& prefix) {
  std::string tmpl = prefix + "-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  if (!::mkdtemp(name.data())) fail(prefix, "-XXXXXX: cannot create: ", std::strerror(errno));
  return name.data();
}

bool is_empty_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_empty(dir, ec) && !ec;
}

}  // namespace

std::string unexpected_entry(const std::string& dir, const std::set<std::string>& names) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!names.count(n) || !e.is_regular_file() || e.is_symlink()) return n;
  }
  if (ec) return "(unreadable: " + ec.message() + ")";
  return "";
}

bool remove_owned_dir(const std::string& dir, const std::set<std::string>& names) {
  if (!unexpected_entry(dir, names).empty()) return false;
  for (const std::string& n : names) ::unlink((dir + "/" + n).c_str());
  return ::rmdir(dir.c_str()) == 0;
}

std::string move_aside(const std::string& dir, const std::string& tag) {
  const std::string aside = make_unique_dir(dir + "." + tag);
  // rename() replaces the empty directory just created, atomically.
  if (std::rename(dir.c_str(), aside.c_str()) != 0) {
    const int err = errno;
    ::rmdir(aside.c_str());
    fail(dir, ": cannot move it aside to ", aside, ": ", std::strerror(err));
  }
  return aside;
}

StagedDir::StagedDir(const std::string& target, const std::string& flag, bool overwrite,
                     const DirInventory& replaceable, const std::string& what)
    : flag_(flag), what_(what), shown_(target), replaceable_(replaceable) {
  fs::path t = fs::path(target).lexically_normal();
  if (!t.has_filename()) t = t.parent_path();  // "out/" -> "out"
  const std::string name = t.filename().string();
  if (target.empty() || name.empty() || name == "." || name == "..")
    fail(flag, "=", target, ": name the directory to create");
  target_ = t.string();
  struct stat st {};
  if (::lstat(target_.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      fail(flag, "=", target, ": exists and is not a directory; refusing to replace it");
    if (!is_empty_dir(target_)) {
      if (!overwrite)
        fail(flag, "=", target, ": exists and is not empty; refusing to write into it (choose a new ",
             "directory, or add --overwrite to replace ", what, " there)");
      replaceable_files(target_);  // UserError unless it is one of ours and nothing else
      replace_ = true;
    }
  } else if (errno != ENOENT) {
    fail(flag, "=", target, ": ", std::strerror(errno));
  }
  const fs::path parent = t.has_parent_path() ? t.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) fail(flag, "=", target, ": cannot create ", parent.string(), ": ", ec.message());
  staging_ = make_unique_dir(target_ + ".tmp");
}

StagedDir::~StagedDir() {
  if (committed_ || staging_.empty()) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);  // created by this process under a unique name
}

std::set<std::string> StagedDir::replaceable_files(const std::string& dir) const {
  std::string why;
  const auto names = replaceable_(dir, &why);
  if (!names)
    fail(flag_, "=", shown_, ": --overwrite replaces only ", what_, ", and this is not one (", why, ")");
  const std::string odd = unexpected_entry(dir, *names);
  if (!odd.empty())
    fail(flag_, "=", shown_, ": --overwrite replaces only ", what_, " and nothing else, but it also holds '",
         printable(odd), "'");
  return *names;
}

void StagedDir::commit() {
  LNS_CHECK(!committed_);
  fsync_path(staging_);
  const std::string parent = fs::path(target_).has_parent_path() ? fs::path(target_).parent_path().string() : ".";
  if (!replace_) {
    // Onto nothing or an empty directory; fails (ENOTEMPTY) if files appeared meanwhile.
    if (std::rename(staging_.c_str(), target_.c_str()) != 0)
      fail(flag_, "=", shown_, ": cannot move the finished output into place: ", std::strerror(errno));
    committed_ = true;
    fsync_path(parent);
    return;
  }
  const std::set<std::string> old_files = replaceable_files(target_);  // again, right before
  std::string old_dir;
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    old_dir = staging_;  // the exchange left the old output under the staging name
  } else if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
    // A filesystem without atomic exchange: two renames; between them a crash leaves
    // the old output under "<target>.replaced-XXXXXX", never deleted.
    old_dir = move_aside(target_, "replaced");
    if (std::rename(staging_.c_str(), target_.c_str()) != 0) {
      const int err = errno;
      std::rename(old_dir.c_str(), target_.c_str());
      fail(flag_, "=", shown_, ": cannot move the finished output into place: ", std::strerror(err));
    }
  } else {
    fail(flag_, "=", shown_, ": cannot replace it: ", std::strerror(errno));
  }
  committed_ = true;
  fsync_path(parent);
  if (!remove_owned_dir(old_dir, old_files))
    LOG(WARNING) << "the replaced contents of " << target_ << " are left in " << old_dir
                 << " (it held more than " << what_ << ")";
}

}  // namespace lns
