// Reading byte ranges and atomic writes (Note [Atomic writes] in file.h), with the POSIX calls the
// standard library lacks: pread, fsync of a file and of a directory.
#include "evenflow/io/file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "evenflow/engine/error.h"

namespace evenflow::io {

namespace {

// "<what>: <strerror(err)>", for messages about failed system calls.
std::string errno_message(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

}  // namespace

// --- InputFile ---------------------------------------------------------------------------------

InputFile::InputFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) EF_ERROR(errno_message("cannot open " + path_, errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    EF_ERROR(errno_message("cannot stat " + path_, err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd_);
    EF_ERROR("cannot read ", path_, ": it is a directory");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* dst, size_t n) const {
  EF_CHECK(offset <= size_ && n <= size_ - offset, path_, ": reading bytes [", offset, ", ", offset + n,
           ") but the file has only ", size_, " bytes");
  char* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) EF_ERROR(errno_message("reading " + path_, errno));
    EF_CHECK(r > 0, path_, ": file ended at byte ", offset + done, " while reading bytes [", offset, ", ", offset + n,
             ") (was it truncated while being read?)");
    done += static_cast<size_t>(r);
  }
}

// --- Atomic writes -------------------------------------------------------------------------------

void OutputFile::write(const void* data, size_t n) {
  if (n == 0) return;
  if (std::fwrite(data, 1, n, file_) != n)
    EF_ERROR(errno_message("write failed after " + std::to_string(written_) + " bytes", errno));
  written_ += n;
}

namespace {

// Syncs the directory holding `path`, so that a rename into it survives a crash. Filesystems that
// cannot sync directories say EINVAL; there is nothing more to do on those.
void sync_directory_of(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = std::filesystem::current_path();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) EF_ERROR(errno_message("opening its directory " + dir.string() + " to sync it", errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) EF_ERROR(errno_message("syncing its directory " + dir.string(), err));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(OutputFile&)>& fill) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) EF_ERROR(errno_message("cannot write " + path + ": cannot create " + tmp, errno));
  // Until the rename succeeds, leaving this scope (by any exception) closes and removes tmp.
  bool renamed = false;
  struct RemoveUnlessRenamed {
    std::FILE*& file;
    const std::string& name;
    const bool& done;
    ~RemoveUnlessRenamed() {
      if (file != nullptr) std::fclose(file);
      if (!done) std::remove(name.c_str());
    }
  } cleanup{f, tmp, renamed};
  try {
    OutputFile out(f);
    fill(out);
    if (std::fflush(f) != 0) EF_ERROR(errno_message("flushing " + tmp, errno));
    if (::fsync(::fileno(f)) != 0) EF_ERROR(errno_message("syncing " + tmp, errno));
    const int rc = std::fclose(f);
    f = nullptr;
    if (rc != 0) EF_ERROR(errno_message("closing " + tmp, errno));
    if (std::rename(tmp.c_str(), path.c_str()) != 0) EF_ERROR(errno_message("renaming " + tmp + " to " + path, errno));
    renamed = true;
  } catch (const std::exception& e) {
    EF_ERROR("cannot write ", path, ": ", e.what(), " (", path, " was left unchanged)");
  }
  try {
    sync_directory_of(path);
  } catch (const std::exception& e) {
    EF_ERROR(path, " was written, but may not survive a crash: ", e.what());
  }
}

int remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return 0;
  int removed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t mark = name.rfind(".tmp.");
    if (mark == std::string::npos || mark + 5 == name.size() || !entry.is_regular_file(ec)) continue;
    const std::string digits = name.substr(mark + 5);
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const auto pid = static_cast<pid_t>(std::stol(digits));
    // kill(pid, 0) probes without signalling; ESRCH: no such process, so nobody is writing it.
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (std::filesystem::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

}  // namespace evenflow::io
