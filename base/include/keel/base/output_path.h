// Output files that never destroy what the user had (Note [Outputs never destroy inputs]): one
// guard every command runs on an output path before anything is opened for writing, and a file
// that replaces its target only once it is complete. Header-only (POSIX stat/rename), used by the
// keel tool's commands, capture's recording runs and the studio.
#pragma once
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "keel/base/error.h"
#include "keel/base/non_copyable.h"
#include "keel/base/text.h"

namespace keel {

// Note [Outputs never destroy inputs]
// An output is checked before any input is read or the output is touched:
// - it must not be an input: the same file by device and inode (a hard link, a symlink or
//   `./x` for `x` are all caught), so `keel record --config C.json -o C.json` is refused;
// - if it exists it must be a regular file: a directory, a character or block device, a FIFO or
//   a socket is refused (writing would delete the node and put a file in its place; as root
//   `-o /dev/null` would delete /dev/null). Commands that can write to stdout take "-".
// Exports and traces then write to a temporary file beside the output and rename it over the
// output once it is complete (ReplaceOnCommit), so a failed write keeps the old file. A
// recording that replaces an existing one is written the same way (capture::RecordingRun); a new
// recording is written in place, so a killed run keeps its committed steps where it was asked.

// A file's identity: (device, inode) of what the path names after symlinks.
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileIdentity&) const = default;
};

inline std::optional<FileIdentity> fileIdentity(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileIdentity{st.st_dev, st.st_ino};
}

// An input the output is checked against: what it is ("the config") and its path ("" none).
struct NamedInput {
  std::string what;
  std::string path;
};

// Whether `path` (existing or not) is the directory `dir` or anywhere below it, symlinks and
// `..` resolved; false when `dir` is empty or not a directory.
inline bool isInsideDirectory(const std::string& path, const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return false;
  const std::filesystem::path d = std::filesystem::canonical(dir, ec);
  if (ec) return false;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  if (ec) return false;
  auto at = p.begin();
  for (auto part = d.begin(); part != d.end(); ++part, ++at)
    if (at == p.end() || *at != *part) return false;
  return true;
}

// Throws keel::Error (one line naming `option`) when `output` may not be written: empty, an
// existing non-regular file, or the same file as one of `inputs` (Note [Outputs never destroy
// inputs]). Touches nothing.
inline void checkOutputPath(const std::string& option, const std::string& output,
                            const std::vector<NamedInput>& inputs) {
  if (output.empty()) throw Error(option + ": expected a file name, got an empty one");
  if (const std::string kind = nonRegularKind(output); !kind.empty())
    throw Error(option + " " + output + " is " + kind + ", not a regular file; refusing to " +
                "write over it");
  // An input that is a directory (a corpus of documents) holds every file below it, existing or
  // new: writing there would replace a document or add one to the next run's data.
  for (const NamedInput& in : inputs)
    if (isInsideDirectory(output, in.path))
      throw Error(option + " " + output + " is inside " + in.what + " (the directory " + in.path +
                  "); refusing to write among the inputs");
  const std::optional<FileIdentity> out = fileIdentity(output);
  if (!out) return;  // a new file
  for (const NamedInput& in : inputs)
    if (!in.path.empty() && fileIdentity(in.path) == out)
      throw Error(option + " " + output + " is " + in.what + " (" + in.path +
                  "); refusing to overwrite an input");
}

// A recording's output that already exists must be a recording (an SQLite file) or empty: a
// recording replaces it, and `keel record -o train.py` replaced the user's script. Throws
// keel::Error naming `option` otherwise; a path that does not exist or cannot be read passes
// (opening it for writing says why).
inline void checkReplacesOnlyARecording(const std::string& option, const std::string& output);

// The file an output path names once a symlink in its last component is followed (a chain of
// them, a relative link read from the link's directory; a dangling link gives the path it points
// at, which is then created). Outputs are written at that path: renaming a finished file over the
// link itself would replace the user's link with a regular file and leave the file it pointed to
// as it was (`-o /dev/stdout` redirected to a file names that file).
inline std::string followOutputLink(std::string path) {
  for (int hop = 0; hop < 40; ++hop) {
    struct stat st {};
    if (path.empty() || ::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
    std::error_code ec;
    std::filesystem::path to = std::filesystem::read_symlink(path, ec);
    if (ec) return path;
    if (to.is_relative()) to = std::filesystem::path(path).parent_path() / to;
    path = to.string();
  }
  throw Error("output " + path + ": too many levels of symbolic links");
}

// What an existing output a command writes may be, so that it is replaced: a file whose first
// bytes are `prefix` and whose first 4 KiB hold every one of `markers` -- what the command itself
// writes, told apart from the user's files of the same format (a trace from a model config that
// also starts with `{`, an SVG Keel drew from any other XML document).
struct OutputSignature {
  std::string_view prefix;
  std::vector<std::string_view> markers = {};
};

// Throws keel::Error naming `option` when `output` exists, is not empty and matches none of
// `kinds` (`what` names what it may be, "a CSV export"); a path that does not exist or
// cannot be read passes (opening it for writing says why). Touches nothing.
inline void checkReplacesOnly(const std::string& option, const std::string& output,
                              const std::vector<OutputSignature>& kinds, const std::string& what) {
  std::FILE* f = std::fopen(followOutputLink(output).c_str(), "rb");
  if (!f) return;
  std::string head(4096, '\0');
  head.resize(std::fread(head.data(), 1, head.size(), f));
  std::fclose(f);
  if (head.empty()) return;
  for (const OutputSignature& k : kinds)
    if (head.starts_with(k.prefix) &&
        std::all_of(k.markers.begin(), k.markers.end(),
                    [&](std::string_view m) { return head.find(m) != std::string::npos; }))
      return;
  throw Error(option + " " + output + " exists and is not " + what +
              "; refusing to replace it (remove it first, or choose another name)");
}

// The same for one kind told by its first bytes (`magic`): `what` names the kind in the error
// ("a PNG picture").
inline void checkReplacesOnly(const std::string& option, const std::string& output,
                              std::string_view magic, const std::string& what) {
  checkReplacesOnly(option, output, std::vector<OutputSignature>{{magic}}, what);
}

inline void checkReplacesOnlyARecording(const std::string& option, const std::string& output) {
  checkReplacesOnly(option, output, std::string_view("SQLite format 3", 16), "a recording");
}

// An existing output must be writable by this process: a replacement renamed over a read-only
// file (or one of another user's, in a directory this user may write) would replace what the
// user protected, where `>` says "Permission denied". Throws keel::Error "cannot write OUTPUT:
// Permission denied"; a path that does not exist passes.
inline void checkWritable(const std::string& output) {
  const std::string file = followOutputLink(output);
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return;
  if (::faccessat(AT_FDCWD, file.c_str(), W_OK, AT_EACCESS) != 0)
    throw Error("cannot write " + output + ": " + std::strerror(errno));
}

// The temporary name beside `target` a replacement is written under (same directory, so the
// final rename is atomic): `.NAME.TAG-PID`.
inline std::string replacementPath(const std::string& target, const char* tag = "partial") {
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : target.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? target : target.substr(slash + 1);
  return dir + "." + name + "." + tag + "-" + std::to_string(::getpid());
}

// Renames `from` over `to` (same directory); throws keel::Error naming both on failure. A file
// `to` that exists passes on its permission bits (and, where this process may, its owner) to
// `from` first: a private 0600 file stays private, not the new file's umask default.
inline void renameOver(const std::string& from, const std::string& to) {
  struct stat st {};
  if (::stat(to.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    if (::chown(from.c_str(), st.st_uid, st.st_gid) != 0) {
      // (only root may give a file away; the user's own file keeps its owner anyway)
    }
    ::chmod(from.c_str(), st.st_mode & 07777);
  }
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw Error("cannot replace " + to + " with the new file " + from + ": " +
                std::strerror(errno));
}

// A file written under a temporary name beside `target` and renamed over it by commit(); never
// committed (an error, an exception), the temporary file is removed and `target` is untouched.
// An existing `target` must be writable (checkWritable: refused in the constructor), and the
// file that replaces it keeps its permission bits (renameOver).
class ReplaceOnCommit : NonCopyable {
 public:
  explicit ReplaceOnCommit(const std::string& target)
      : target_(followOutputLink(target)), temp_(replacementPath(target_)) {
    checkWritable(target_);
  }
  ~ReplaceOnCommit() {
    if (!committed_) std::remove(temp_.c_str());
  }

  const std::string& path() const { return temp_; }  // write here
  const std::string& target() const { return target_; }
  // path() created and opened for writing ("wb"), with the target's permission bits from the
  // start where it exists (a private file's replacement is never readable by others); nullptr
  // and errno on failure.
  std::FILE* open() const {
    struct stat st {};
    const mode_t mode = ::stat(target_.c_str(), &st) == 0 ? (st.st_mode & 0777) : 0666;
    const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return nullptr;
    std::FILE* f = ::fdopen(fd, "wb");
    if (!f) ::close(fd);
    return f;
  }
  void commit() {
    renameOver(temp_, target_);
    committed_ = true;
  }

 private:
  std::string target_, temp_;
  bool committed_ = false;
};

// The lock file beside `output` that OutputLock holds.
inline std::string lockPath(const std::string& output) {
  const size_t slash = output.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : output.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? output : output.substr(slash + 1);
  return dir + "." + name + ".lock";
}

// An exclusive lock on an output for as long as it is written (flock on `.NAME.lock` beside the
// file it names, symlinks followed, so two names for one file share one lock; it holds the
// writer's pid): a second process given the same output is refused in one line
// instead of interleaving into one damaged file. Released (and the lock file removed) on
// destruction; a crashed writer's lock goes with its process.
class OutputLock : NonCopyable {
 public:
  explicit OutputLock(const std::string& output)
      : OutputLock(lockPath(followOutputLink(output)), "output " + output, output) {}

  // A folder written for a whole run (keel train's --ckpt-dir): the lock file is inside it,
  // `DIR/.keel.lock` (the folder is written, so it is writable; its parent may not be), and the
  // errors name the folder as `label` does ("--ckpt-dir ck is being written by another process
  // (pid 7); ..."). The folder must exist.
  static OutputLock insideFolder(const std::string& dir, const std::string& label) {
    return OutputLock((std::filesystem::path(dir) / ".keel.lock").string(), label, dir);
  }
  OutputLock(OutputLock&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}

 private:
  // `label` names the output in errors ("output r.db"), `output` is its path.
  OutputLock(std::string lockFile, const std::string& label, const std::string& output)
      : path_(std::move(lockFile)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {  // said of the output: the lock file's name says nothing of the real problem
      const int err = errno;
      const size_t slash = path_.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash);
      struct stat st {};
      if (err == ENOENT && ::stat(dir.c_str(), &st) != 0)
        throw Error(label + ": the directory " + dir + " does not exist");
      // /proc: the directory exists and takes no new file (ENOENT, not "does not exist").
      throw Error("cannot write " + output + ": " +
                  (err == ENOENT ? "the directory " + dir + " takes no new files"
                                 : std::string(std::strerror(err))));
    }
    // A reader probing the lock (outputLockHeld) holds it shared for an instant: a few tries.
    bool locked = false;
    for (int attempt = 0; attempt < 5 && !locked; ++attempt) {
      locked = ::flock(fd_, LOCK_EX | LOCK_NB) == 0;
      if (!locked && errno == EWOULDBLOCK && attempt < 4) ::usleep(10000);
    }
    if (!locked) {
      char pid[32] = {};
      const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
      ::close(fd_);
      fd_ = -1;
      throw Error(label + " is being written by another process" +
                  (n > 0 ? std::string(" (pid ") + std::string(pid, size_t(n)) + ")" : "") +
                  "; refusing to write it at the same time");
    }
    const std::string me = std::to_string(::getpid());
    if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
      // (the pid is informative only)
    }
  }

 public:
  ~OutputLock() {
    if (fd_ < 0) return;
    ::unlink(path_.c_str());
    ::close(fd_);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// Whether a live process holds `output`'s OutputLock (it is writing the file now). A recording
// whose status still says "running" while nobody holds its lock ended without closing: its
// process was killed or crashed (the lock file stays behind, its flock goes with the process).
// Only a lock file that is missing, or that opens and locks, says "not held": where the probe
// cannot tell (no permission to read it, a file system without flock), it answers "held", so
// that no live writer is called dead.
inline bool lockFileHeld(const std::string& lockFile) {
  const int fd = ::open(lockFile.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
  ::close(fd);  // closing releases a shared lock taken here
  return held;
}
inline bool outputLockHeld(const std::string& output) {
  return lockFileHeld(lockPath(followOutputLink(output)));
}
// The same for a folder's OutputLock::insideFolder.
inline bool folderLockHeld(const std::string& dir) {
  return lockFileHeld((std::filesystem::path(dir) / ".keel.lock").string());
}

// Writes `n` bytes to `f` and flushes; throws keel::Error naming `what` on a short write or a
// flush error (ENOSPC, EIO, EPIPE with SIGPIPE ignored, EFBIG with SIGXFSZ ignored).
inline void writeAll(std::FILE* f, const void* data, size_t n, const std::string& what) {
  errno = 0;
  if ((n && std::fwrite(data, 1, n, f) != n) || std::fflush(f) != 0 || std::ferror(f))
    throw Error("cannot write " + what + ": " + (errno ? std::strerror(errno) : "write error"));
}

}  // namespace keel
