/// @file
/// Files for io/: reading byte ranges of a file, and writing a file atomically (Note [Atomic
/// writes]) so that a crash or a failure in the middle of a save leaves the previous file intact.
/// Every error is an ef::Error naming the path and, where the system reported one, the errno text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace evenflow::io {

/// A file opened for reading by byte ranges. Not copyable; read_at may be called from several
/// threads at once (it uses pread, which keeps no file position).
class InputFile {
 public:
  /// Opens `path` read-only and records its size; throws ef::Error naming the path (and the errno
  /// text) when it cannot be opened or is a directory.
  explicit InputFile(std::string path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }  ///< The path it was opened with.
  uint64_t size() const { return size_; }            ///< Its size in bytes when it was opened.
  /// Reads exactly n bytes starting at byte `offset`; throws if the file ends first.
  void read_at(uint64_t offset, void* dst, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// The sequential writer write_file_atomically hands to its callback.
class OutputFile {
 public:
  /// Writes to `file` (not owned: write_file_atomically opens and closes it).
  explicit OutputFile(std::FILE* file) : file_(file) {}
  /// Appends the n bytes at `data`; throws ef::Error with the errno text and the bytes written so
  /// far if the write fails.
  void write(const void* data, size_t n);

 private:
  std::FILE* file_ = nullptr;
  uint64_t written_ = 0;
};

/// Writes the file `path` through `fill`, atomically: readers see the old file or the new one.
///
/// Note [Atomic writes]
/// The callback writes the contents into `<path>.tmp.<pid>` in the target's directory (same
/// filesystem, so the rename below is atomic). Then: fflush and fsync the file, rename it over
/// `path`, fsync the directory so the rename itself is durable. If anything fails (the callback
/// throws, a write, flush, sync or the rename fails) the temporary file is removed, `path` is left
/// as it was, and an ef::Error names `path` and the reason. Readers therefore see either the old
/// file or the complete new one, never a partial file, even if the process dies mid-save. (Two
/// saves to one path at the same time from one process would share the temporary file: don't.)
void write_file_atomically(const std::string& path, const std::function<void(OutputFile&)>& fill);

/// Cleans up after write_file_atomically calls of processes that were killed.
///
/// Removes the temporaries `<name>.tmp.<pid>` in `dir` (not below it) that a process killed in the
/// middle of write_file_atomically left behind: those whose process no longer runs. Returns how many
/// it removed. A missing `dir` has none.
int remove_stale_temporaries(const std::string& dir);

}  // namespace evenflow::io
