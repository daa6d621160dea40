// IDX files, raw and gzip-compressed, written here byte by byte: every element type decodes
// exactly, and damaged files (bad magic, type, dims, truncated or trailing data, corrupt gzip)
// fail with an ef::Error naming the file and what was wrong.
#include <doctest/doctest.h>
#include <zlib.h>

#include <limits>

#include "evenflow/data/idx.h"
#include "tests/io/test_files.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using evenflow::data::read_idx;
using evenflow::testing::big_endian32;
using evenflow::testing::error_of;
using evenflow::testing::idx_bytes;
using evenflow::testing::TempDir;
using evenflow::testing::vals;
using evenflow::testing::write_bytes;

namespace {

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

}  // namespace

TEST_CASE("read_idx: ubyte images, raw and gzip, as int64 or converted") {
  TempDir dir;
  const std::string data{'\x00', '\x01', '\x7f', '\x80', '\xfe', '\xff'};
  const std::string bytes = idx_bytes(0x08, {2, 3}, data);
  write_bytes(dir.file("raw-idx3-ubyte"), bytes);
  write_gzip(dir.file("packed-idx3-ubyte.gz"), bytes);
  for (const std::string name : {"raw-idx3-ubyte", "packed-idx3-ubyte.gz"}) {
    CAPTURE(name);
    const Tensor t = read_idx(dir.file(name));
    CHECK(t.dtype() == kInt64);
    CHECK(t.shape() == Shape{2, 3});
    CHECK(t.to_int_vector() == std::vector<int64_t>{0, 1, 127, 128, 254, 255});
    const Tensor f = read_idx(dir.file(name), kFloat32);
    CHECK(f.dtype() == kFloat32);
    CHECK(vals(f) == std::vector<double>{0, 1, 127, 128, 254, 255});
  }
}

TEST_CASE("read_idx: every element type, big-endian") {
  TempDir dir;
  const std::string path = dir.file("x.idx");
  write_bytes(path, idx_bytes(0x09, {3}, std::string{'\xff', '\x80', '\x05'}));
  CHECK(read_idx(path).to_int_vector() == std::vector<int64_t>{-1, -128, 5});
  write_bytes(path, idx_bytes(0x0B, {2}, std::string{'\xff', '\xfe', '\x01', '\x02'}));
  CHECK(read_idx(path).to_int_vector() == std::vector<int64_t>{-2, 258});
  write_bytes(path, idx_bytes(0x0C, {1, 2}, big_endian32(0xFFFFFFFF) + big_endian32(0x01020304)));
  CHECK(read_idx(path).to_int_vector() == std::vector<int64_t>{-1, 0x01020304});
  write_bytes(path, idx_bytes(0x0D, {2}, big_endian32(0x3FC00000) + big_endian32(0xC0200000)));  // 1.5f, -2.5f
  const Tensor f = read_idx(path);
  CHECK(f.dtype() == kFloat32);
  CHECK(vals(f) == std::vector<double>{1.5, -2.5});
  write_bytes(path, idx_bytes(0x0E, {1}, big_endian32(0x3FD55555) + big_endian32(0x55555555)));  // 1/3
  const Tensor d = read_idx(path);
  CHECK(d.dtype() == kFloat64);
  CHECK(d.item() == 1.0 / 3.0);
  write_bytes(path, idx_bytes(0x08, {0, 5}, ""));
  CHECK(read_idx(path).shape() == Shape{0, 5});
}

TEST_CASE("read_idx: damaged files name the file and the problem") {
  TempDir dir;
  const std::string path = dir.file("bad-idx1-ubyte");
  const auto error_for = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    return error_of([&] { read_idx(path); });
  };
  const auto has = [&](const std::string& error, const std::string& part) {
    INFO(error);
    CHECK(error.find("read_idx " + path + ": ") == 0);
    CHECK(error.find(part) != std::string::npos);
  };
  has(error_for(""), "shorter than the 4-byte IDX magic");
  has(error_for(std::string{'\x1f', '\x00', '\x08', '\x01'} + big_endian32(1) + "x"),
      "bad magic: the first two bytes are 31, 0 instead of 0, 0");
  has(error_for(idx_bytes(0x0A, {1}, "x")), "unknown IDX type byte 10");
  has(error_for(idx_bytes(0x08, {}, "")), "the magic says 0 dims; 1 to 8 are supported");
  has(error_for(idx_bytes(0x08, {1, 1, 1, 1, 1, 1, 1, 1, 1}, "x")), "9 dims");
  has(error_for(idx_bytes(0x08, {2, 3}, "").substr(0, 9)), "the file ends inside the 2 dim sizes");
  has(error_for(idx_bytes(0x08, {2, 3}, "abcd")),
      "the data ends after 4 of the 6 bytes that dims [2, 3] of ubyte need");
  has(error_for(idx_bytes(0x0B, {2}, "abcde")), "the file has data after the 4 bytes that dims [2] of short need");
  has(error_for(idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, "")), "are too large");
  // A header that claims 4 GB fails at the end of the data, without allocating 4 GB.
  has(error_for(idx_bytes(0x08, {0xFFFFFFFF}, "abc")), "the data ends after 3 of the 4294967295 bytes");

  // gzip: cut short, and corrupted in the middle (zlib's checks catch both).
  std::string big;
  for (int i = 0; i < 5000; ++i) big += static_cast<char>((i * 7919) % 251);
  write_gzip(path, idx_bytes(0x08, {5000}, big));
  CHECK(read_idx(path).numel() == 5000);
  std::string gz = evenflow::testing::read_bytes(path);
  has(error_for(gz.substr(0, gz.size() / 2)), "the gzip data is damaged or truncated");
  gz[gz.size() / 2] = static_cast<char>(gz[gz.size() / 2] ^ 0x55);
  has(error_for(gz), "damaged or truncated");

  CHECK(error_of([&] { read_idx(dir.file("nope.gz")); }).find("cannot open: No such file or directory") !=
        std::string::npos);
}

TEST_CASE("read_idx: dims whose strides overflow are refused even when a zero dim empties the tensor") {
  // Found by tests/fuzz/fuzz_idx.cpp: [0, 2^32-1, 2^32-1, 2^32-1] holds no byte, but its strides
  // (products of the later sizes) overflow int64 in the engine.
  TempDir dir;
  const std::string path = dir.file("empty-idx4-ubyte");
  write_bytes(path, idx_bytes(0x08, {0, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, ""));
  const std::string e = error_of([&] { read_idx(path); });
  INFO(e);
  CHECK(e.find("read_idx " + path +
               ": dims [0, 4294967295] and 4294967295 are too large: the product of the nonzero dims, times 8 "
               "bytes per element, overflows int64") == 0);
  // Large nonzero dims around a zero that stay addressable are an empty tensor.
  write_bytes(path, idx_bytes(0x0E, {0xFFFFFFFF, 0, 0xFFFFFF}, ""));
  const Tensor t = read_idx(path);
  CHECK(t.shape() == Shape{0xFFFFFFFF, 0, 0xFFFFFF});
  CHECK(t.numel() == 0);

  // The tensor's element size counts too (found by the fuzzer in a second run): ubyte dims
  // [0, 2^32-1, 2^29] span under 2^61 bytes in the file, and as many float32 fit in int64 bytes,
  // but not as many int64.
  write_bytes(path, idx_bytes(0x08, {0, 0xFFFFFFFF, 1u << 29}, ""));
  CHECK(read_idx(path, kFloat32).shape() == Shape{0, 0xFFFFFFFF, 1 << 29});
  const std::string wide = error_of([&] { read_idx(path); });
  INFO(wide);
  CHECK(wide.find("dims [0, 4294967295] and 536870912 are too large: the product of the nonzero dims, times 8 bytes "
                  "per element, overflows int64") != std::string::npos);
}

TEST_CASE("read_idx: float data converted to int64 truncates, and refuses values int64 cannot hold") {
  // Found by tests/fuzz/fuzz_idx.cpp: converting NaN, an infinity or 1e30 to int64 was undefined
  // behaviour (UBSan: "outside the range of representable values").
  TempDir dir;
  const std::string path = dir.file("x-idx1-float");
  write_bytes(path, idx_bytes(0x0D, {4},
                              big_endian32(0x402CCCCD) + big_endian32(0xC02CCCCD) +       // 2.7f, -2.7f
                                  big_endian32(0xDF000000) + big_endian32(0x5EFFFFFF)));  // -2^63, below 2^63
  CHECK(read_idx(path, kInt64).to_int_vector() ==
        std::vector<int64_t>{2, -2, std::numeric_limits<int64_t>::min(), 9223371487098961920});
  const auto refused = [&](uint32_t bits, const std::string& shown) {
    write_bytes(path, idx_bytes(0x0D, {2}, big_endian32(0x3F800000) + big_endian32(bits)));
    const std::string e = error_of([&] { read_idx(path, kInt64); });
    INFO(e);
    CHECK(e.find("read_idx " + path + ": float value " + shown + " at index 1 cannot be converted to int64") == 0);
    CHECK(vals(read_idx(path)).size() == 2);  // as float32 it reads
  };
  refused(0x7FC00000, "nan");
  refused(0xFF800000, "-inf");
  refused(0x5F000000, "9.22337e+18");  // 2^63
  refused(0x7149F2CA, "1e+30");
  write_bytes(path, idx_bytes(0x0E, {1}, big_endian32(0x7FF00000) + big_endian32(0)));
  CHECK(error_of([&] { read_idx(path, kInt64); }).find("double value inf at index 0 cannot be converted to int64") !=
        std::string::npos);
}
