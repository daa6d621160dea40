// libFuzzer target for the IDX reader (data/idx.h), raw and gzip. read_idx reads a path through
// zlib, so each input is written to an in-memory file (memfd) and read by its /proc path, once
// with the default dtype and once converted to each dtype. Every input must end in a tensor or in
// an ef::Error that names the file; a crash, another exception type, an internal error, a leak or
// undefined behaviour is a finding (scripts/fuzz.sh).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "evenflow/data/idx.h"

namespace {

volatile unsigned char sink = 0;  // keeps the reads of the tensors' bytes from being optimized away

// The in-memory file, made once and rewritten for each input.
int input_fd() {
  static const int fd = [] {
    const int made = ::memfd_create("fuzz-idx", 0);
    if (made < 0) {
      std::perror("fuzz_idx: memfd_create");
      std::abort();
    }
    return made;
  }();
  return fd;
}

void write_input(const uint8_t* data, size_t size) {
  const int fd = input_fd();
  if (::ftruncate(fd, 0) != 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
}

// An ef::Error is the reader refusing the input, unless it reports a bug of ours or does not say
// which file it is about.
void check_error(const evenflow::Error& e, const std::string& path) {
  const std::string what = e.what();
  if (what.rfind("internal error", 0) == 0 || what.rfind("read_idx " + path + ": ", 0) != 0) {
    std::fprintf(stderr, "fuzz_idx: unexpected ef::Error: %s\n", what.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_input(data, size);
  const std::string path = "/proc/self/fd/" + std::to_string(input_fd());
  for (const std::optional<evenflow::DType> dtype :
       {std::optional<evenflow::DType>(), std::optional(evenflow::kFloat32), std::optional(evenflow::kFloat64),
        std::optional(evenflow::kInt64)}) {
    evenflow::Tensor t;
    try {
      t = evenflow::data::read_idx(path, dtype);
    } catch (const evenflow::Error& e) {
      check_error(e, path);
      continue;
    }
    // Every byte must be there: AddressSanitizer checks each read against the tensor's storage.
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    const size_t n = static_cast<size_t>(t.numel()) * evenflow::dtype_size(t.dtype());
    for (size_t i = 0; i < n; ++i) sink = static_cast<unsigned char>(sink + bytes[i]);
  }
  return 0;
}
