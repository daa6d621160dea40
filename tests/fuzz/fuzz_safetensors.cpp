// libFuzzer target for the safetensors loader (io/safetensors.h), on the bytes of a whole file.
// Every input must end in a loaded file or in an ef::Error that names the input; a crash, another
// exception type, an internal error, a leak or undefined behaviour is a finding (scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "evenflow/io/safetensors.h"

namespace {

constexpr const char* kName = "fuzz-input";
volatile unsigned char sink = 0;  // keeps the reads of the tensors' bytes from being optimized away

// An ef::Error is the loader refusing the input, unless it reports a bug of ours or does not say
// which file it is about.
void check_error(const evenflow::Error& e) {
  const std::string what = e.what();
  if (what.rfind("internal error", 0) == 0 || what.rfind(std::string("load_safetensors ") + kName + ": ", 0) != 0) {
    std::fprintf(stderr, "fuzz_safetensors: unexpected ef::Error: %s\n", what.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  evenflow::io::SafetensorsFile file;
  try {
    file = evenflow::io::load_safetensors_bytes(std::string_view(reinterpret_cast<const char*>(data), size), kName);
  } catch (const evenflow::Error& e) {
    check_error(e);
    return 0;
  }
  // Every byte of every tensor must be there: AddressSanitizer checks each read against the
  // storage the loader allocated. (The raw bytes, not to_vector(): converting an empty tensor of
  // huge dims to float64 may be refused by the engine, rightly.)
  for (const auto& [name, t] : file.tensors) {
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    const size_t n = static_cast<size_t>(t.numel()) * evenflow::dtype_size(t.dtype());
    for (size_t i = 0; i < n; ++i) sink = static_cast<unsigned char>(sink + bytes[i]);
  }
  return 0;
}
