// Whole directories that a tool writes (lns_convert's --out) and the one rule for what
// may ever be deleted: what this process created, or, when the user asks for it
// (--overwrite), a directory that is provably an output of ours and holds nothing
// else. A tool never deletes a directory it has not looked inside.
#pragma once
#include <functional>
#include <optional>
#include <set>
#include <string>

namespace lns {

// The plain file names a directory written by one of our tools consists of (a
// checkpoint: manifest.json and the files it lists), or nullopt with the reason in
// *why when `dir` is not such a directory.
using DirInventory =
    std::function<std::optional<std::set<std::string>>(const std::string& dir, std::string* why)>;

// "" when `dir` holds nothing but regular files named in `names`; otherwise the first
// entry that is something else.
std::string unexpected_entry(const std::string& dir, const std::set<std::string>& names);

// Removes the files `names` from `dir` and then `dir` itself, provided it holds nothing
// else (checked first). Returns false, touching nothing, when it holds anything else.
bool remove_owned_dir(const std::string& dir, const std::set<std::string>& names);

// Renames `dir` to a fresh sibling "<dir>.<tag>-XXXXXX" and returns that path: a way
// to get a directory out of the way without deleting anything.
std::string move_aside(const std::string& dir, const std::string& tag);

// A directory written next to its target (under a unique name this process creates)
// and moved into place whole by commit(): a failure at any point leaves the target as
// it was, and the partial output is removed.
class StagedDir {
 public:
  // The target may be absent or an empty directory. A non-empty one is refused with a
  // UserError naming `flag`, unless `overwrite` and `replaceable` recognises it (and
  // it holds nothing but that inventory); `what` names such a directory in errors
  // ("an lns checkpoint").
  StagedDir(const std::string& target, const std::string& flag, bool overwrite,
            const DirInventory& replaceable, const std::string& what);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  const std::string& path() const { return staging_; }
  const std::string& target() const { return target_; }
  // Moves the staged directory to the target. An overwritten target is exchanged
  // atomically (renameat2 RENAME_EXCHANGE where the filesystem has it) and its old
  // files, checked again against the inventory, are then removed.
  void commit();

 private:
  std::set<std::string> replaceable_files(const std::string& dir) const;  // UserError if not
  std::string target_, flag_, what_, shown_, staging_;  // shown_: the target as the user wrote it
  DirInventory replaceable_;
  bool replace_ = false, committed_ = false;
};

}  // namespace lns
