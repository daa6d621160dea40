// IDX reading through zlib's gz* functions, which decompress gzip files and pass raw files
// through unchanged. The data is read in chunks that grow with what the file has delivered, so a
// corrupt header that claims terabytes fails at "the data ends" instead of allocating them.
// tests/fuzz/fuzz_idx.cpp fuzzes it.
#include "evenflow/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "evenflow/engine/error.h"

namespace evenflow::data {

namespace {

struct IdxType {
  uint8_t code = 0;
  const char* name = "";
  size_t bytes = 0;
  DType dtype = kInt64;  // what read_idx returns by default
};
constexpr std::array<IdxType, 6> kIdxTypes{{{0x08, "ubyte", 1, kInt64},
                                            {0x09, "byte", 1, kInt64},
                                            {0x0B, "short", 2, kInt64},
                                            {0x0C, "int", 4, kInt64},
                                            {0x0D, "float", 4, kFloat32},
                                            {0x0E, "double", 8, kFloat64}}};

// A gzip or raw file read through zlib.
class GzFile {
 public:
  GzFile(const std::string& path, const std::string& where) : where_(where) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) EF_ERROR(where_, "cannot open: ", errno != 0 ? std::strerror(errno) : "out of memory");
    gzbuffer(file_, 1 << 17);
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; fewer only where the data ends. A damaged or truncated gzip stream throws.
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(file_, static_cast<char*>(dst) + done, chunk);
      check_stream();
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  // zlib reports a truncated gzip stream only through gzerror (Z_BUF_ERROR), not gzread's result.
  void check_stream() {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code == Z_ERRNO) EF_ERROR(where_, "read error: ", std::strerror(errno));
    EF_CHECK(code == Z_OK, where_, "the gzip data is damaged or truncated (zlib: ", message, ")");
  }

  gzFile file_ = nullptr;
  std::string where_;
};

// Converts n big-endian values of type T (stored as the unsigned U of its size) into `out`.
// Floats become integers by truncation toward zero; one the integer type cannot hold (NaN, an
// infinity, beyond 2^63 in magnitude) is an error, since converting it is undefined behaviour.
template <typename T, typename U>
void decode(const std::string& where, const char* type_name, const unsigned char* src, int64_t n, const Tensor& out) {
  EF_DISPATCH_ALL(out.dtype(), "read_idx", [&] {
    scalar_t* dst = out.data<scalar_t>();
    for (int64_t i = 0; i < n; ++i) {
      const unsigned char* p = src + static_cast<size_t>(i) * sizeof(U);
      U u = 0;
      for (size_t b = 0; b < sizeof(U); ++b) u = static_cast<U>((static_cast<uint64_t>(u) << 8) | p[b]);
      const T v = std::bit_cast<T>(u);
      if constexpr (std::is_floating_point_v<T> && std::is_same_v<scalar_t, int64_t>) {
        EF_CHECK(v >= -0x1p63 && v < 0x1p63, where, type_name, " value ", v, " at index ", i,
                 " cannot be converted to ", dtype_name(out.dtype()));
      }
      dst[i] = static_cast<scalar_t>(v);
    }
  });
}

}  // namespace

Tensor read_idx(const std::string& path, std::optional<DType> dtype) {
  const std::string where = "read_idx " + path + ": ";
  GzFile file(path, where);

  std::array<unsigned char, 4> magic{};
  EF_CHECK(file.read(magic.data(), magic.size()) == magic.size(), where,
           "the file is shorter than the 4-byte IDX magic");
  EF_CHECK(magic[0] == 0 && magic[1] == 0, where, "bad magic: the first two bytes are ", int{magic[0]}, ", ",
           int{magic[1]}, " instead of 0, 0 (not an IDX file)");
  const auto type =
      std::find_if(kIdxTypes.begin(), kIdxTypes.end(), [&](const IdxType& t) { return t.code == magic[2]; });
  EF_CHECK(type != kIdxTypes.end(), where, "unknown IDX type byte ", int{magic[2]},
           " (expected 8 ubyte, 9 byte, 11 short, 12 int, 13 float or 14 double)");
  const int ndims = magic[3];
  EF_CHECK(ndims >= 1 && ndims <= kMaxDims, where, "the magic says ", ndims, " dims; 1 to ", kMaxDims,
           " are supported");

  std::vector<unsigned char> dims_be(static_cast<size_t>(ndims) * 4);
  EF_CHECK(file.read(dims_be.data(), dims_be.size()) == dims_be.size(), where, "the file ends inside the ", ndims,
           " dim sizes of its header");
  // The engine computes strides, element and byte counts as products of sizes in int64, also for
  // an empty tensor (the strides of [0, 2^32-1, 2^32-1, 2^32-1] overflow), so the product of the
  // nonzero dims, times the wider of the file's and the tensor's element sizes, must fit in int64
  // even where a zero dim leaves no byte to read.
  const DType out_dtype = dtype.value_or(type->dtype);
  const uint64_t widest = std::max<uint64_t>(type->bytes, dtype_size(out_dtype));
  Shape shape;
  uint64_t reach = widest;
  bool has_zero = false;
  for (int d = 0; d < ndims; ++d) {
    const unsigned char* p = &dims_be[static_cast<size_t>(d) * 4];
    const uint32_t size = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    EF_CHECK(!__builtin_mul_overflow(reach, uint64_t{std::max<uint32_t>(size, 1)}, &reach) &&
                 reach <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             where, "dims ", shape_str(shape), " and ", size, " are too large: the product of the nonzero dims, times ",
             widest, " bytes per element, overflows int64");
    shape.push_back(size);
    has_zero = has_zero || size == 0;
  }
  const uint64_t bytes = has_zero ? 0 : reach / widest * type->bytes;

  // Chunks double from 64 KB to 64 MB: memory stays within a small multiple of what the file
  // really holds (a 10-byte file claiming 4 GB costs 64 KB, not 64 MB), and large files take few
  // reads.
  std::vector<unsigned char> data;
  constexpr uint64_t kFirstChunk = uint64_t{64} << 10, kMaxChunk = uint64_t{64} << 20;
  for (uint64_t chunk = kFirstChunk; data.size() < bytes; chunk = std::min(2 * chunk, kMaxChunk)) {
    const size_t have = data.size();
    data.resize(have + static_cast<size_t>(std::min<uint64_t>(chunk, bytes - have)));
    const size_t got = file.read(data.data() + have, data.size() - have);
    EF_CHECK(got == data.size() - have, where, "the data ends after ", have + got, " of the ", bytes,
             " bytes that dims ", shape_str(shape), " of ", type->name, " need");
  }
  unsigned char extra = 0;
  EF_CHECK(file.read(&extra, 1) == 0, where, "the file has data after the ", bytes, " bytes that dims ",
           shape_str(shape), " of ", type->name, " need");

  Tensor out = empty(shape, {.dtype = out_dtype, .device = cpu()});
  const int64_t n = out.numel();
  switch (type->code) {
    case 0x08:
      decode<uint8_t, uint8_t>(where, type->name, data.data(), n, out);
      break;
    case 0x09:
      decode<int8_t, uint8_t>(where, type->name, data.data(), n, out);
      break;
    case 0x0B:
      decode<int16_t, uint16_t>(where, type->name, data.data(), n, out);
      break;
    case 0x0C:
      decode<int32_t, uint32_t>(where, type->name, data.data(), n, out);
      break;
    case 0x0D:
      decode<float, uint32_t>(where, type->name, data.data(), n, out);
      break;
    case 0x0E:
      decode<double, uint64_t>(where, type->name, data.data(), n, out);
      break;
    default:
      EF_ASSERT(false, "IDX type ", int{type->code}, " has no decoder");
  }
  return out;
}

}  // namespace evenflow::data
