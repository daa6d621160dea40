// Safetensors: round trips of every dtype and layout, the file's exact layout, each kind of bad
// file the loader must refuse (crafted here byte by byte), atomic saves that leave the previous
// file intact when they fail, load_into's checks, generator states, and PyTorch interoperability
// (a committed fixture written by safetensors.torch, and a live cross-check when it is installed).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "evenflow/engine/ops.h"
#include "evenflow/io/safetensors.h"
#include "tests/io/test_files.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::io;
using evenflow::testing::error_of;
using evenflow::testing::read_bytes;
using evenflow::testing::TempDir;
using evenflow::testing::vals;
using evenflow::testing::write_bytes;

namespace {

// The twin of expected() in scripts/io_check_safetensors.py.
NamedTensors cross_check_tensors() {
  return {
      {"f32", arange(0, 24).reshape({2, 3, 4}) * 0.25 - 3.0},
      {"f64", from_vector({1.0 / 3.0, -2.5e-300, 1e300, -0.0}, {2, 2}, {.dtype = kFloat64})},
      {"i64", from_int_vector({std::numeric_limits<int64_t>::min(), -1, 0, std::numeric_limits<int64_t>::max()}, {4})},
      {"scalar", scalar_tensor(3.5, {.dtype = kFloat64})},
      {"empty", zeros({0, 3})},
      {"bf16", from_vector({1.0, -2.5, 3.140625, -0.0, std::ldexp(1.0, 100), 65280.0}, {6}).to(kBFloat16)},
      {"transposed", arange(0, 6).reshape({2, 3}).t()},
  };
}

// Same names, dtypes, shapes and bits (so -0.0 differs from 0.0, and int64 extremes are exact).
void check_same_tensors(const NamedTensors& got, const NamedTensors& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& wanted : want) {
    const std::string& name = wanted.first;
    const Tensor& w = wanted.second;
    CAPTURE(name);
    const auto it = std::find_if(got.begin(), got.end(), [&](const auto& nt) { return nt.first == name; });
    REQUIRE(it != got.end());
    const Tensor& g = it->second;
    CHECK(g.dtype() == w.dtype());
    CHECK(g.shape() == w.shape());
    CHECK(g.device() == cpu());
    const Tensor wc = w.contiguous();
    REQUIRE(g.numel() == w.numel());
    CHECK(std::memcmp(g.data_ptr(), wc.data_ptr(), static_cast<size_t>(g.numel()) * dtype_size(g.dtype())) == 0);
  }
}

// A file with this header text (padded to 8 bytes unless told otherwise) and data.
std::string file_bytes(const std::string& header, const std::string& data, bool pad = true) {
  std::string h = header;
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xFF);
  return out + h + data;
}

std::string load_error(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  return error_of([&] { load_safetensors(path); });
}

bool only_file_in(const std::filesystem::path& dir, const std::string& name) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.path().filename() == name ? 1 : 100;
  return n == 1;
}

}  // namespace

TEST_CASE("safetensors: round trip of float32, float64, int64, 0-d, empty, strided and offset views") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const Tensor base = arange(0, 24, 1, {.dtype = kFloat64}).reshape({4, 6});
  NamedTensors tensors = cross_check_tensors();
  tensors.emplace_back("slice_offset", base.slice(0, 1, 3).slice(1, 2, 6, 2));   // offset 8, strides [6, 2]
  tensors.emplace_back("expanded", from_vector({1, 2}, {2, 1}).expand({2, 3}));  // stride 0
  tensors.emplace_back("on_cpu1", from_vector({7, 8, 9}, {3}, {.device = "cpu:1"}));
  tensors.emplace_back("needs_grad", ones({2}, {.requires_grad = true}));
  const std::map<std::string, std::string> metadata{{"step", "1200"}, {"note", "ünïcode ✓"}};
  save_safetensors(path, tensors, metadata);

  const SafetensorsFile f = load_safetensors(path);
  check_same_tensors(f.tensors, tensors);
  CHECK(f.metadata == metadata);
  CHECK(vals(f.at("slice_offset")) == std::vector<double>{8, 10, 14, 16});
  CHECK(vals(f.at("expanded")) == std::vector<double>{1, 1, 1, 2, 2, 2});
  CHECK(f.contains("on_cpu1"));
  CHECK_FALSE(f.contains("nope"));
  CHECK(error_of([&] { f.at("nope"); }).find("no tensor named 'nope'") != std::string::npos);
  // Tensors come back in file order: the order they were given.
  for (size_t i = 0; i < tensors.size(); ++i) CHECK(f.tensors[i].first == tensors[i].first);
  CHECK(only_file_in(dir.path(), "model.safetensors"));  // no temporary file left behind

  // Saving nothing at all is a valid file too.
  save_safetensors(path, {});
  CHECK(load_safetensors(path).tensors.empty());
}

TEST_CASE("safetensors: bfloat16 tensors are written as BF16, two little-endian bytes each, and read back") {
  TempDir dir;
  const std::string path = dir.file("bf16.safetensors");
  const Tensor x = from_vector({1.0, -2.5, 0x1.c4p127}, {3}).to(kBFloat16);
  save_safetensors(path, {{"x", x}});
  const std::string bytes = read_bytes(path);
  CHECK(bytes.find("\"dtype\":\"BF16\"") != std::string::npos);
  CHECK(bytes.substr(bytes.size() - 6) == std::string("\x80\x3f\x20\xc0\x62\x7f", 6));
  const SafetensorsFile back = load_safetensors(path);
  CHECK(back.at("x").dtype() == kBFloat16);
  CHECK(vals(back.at("x")) == vals(x));
}

TEST_CASE("safetensors: the file layout (length, padded header, contiguous offsets)") {
  TempDir dir;
  const std::string path = dir.file("layout.safetensors");
  save_safetensors(path, {{"a", from_vector({1, 2, 3}, {3})}, {"b", from_int_vector({5}, {1})}}, {{"k", "v"}});
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (size_t i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  CHECK((8 + n) % 8 == 0);
  const std::string header = bytes.substr(8, n);
  CHECK(header.rfind(R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                     R"("b":{"dtype":"I64","shape":[1],"data_offsets":[12,20]}})",
                     0) == 0);
  CHECK(header.find_first_not_of(' ', header.find_last_of('}') + 1) == std::string::npos);
  CHECK(bytes.size() == 8 + n + 20);
  float a[3];
  std::memcpy(a, bytes.data() + 8 + n, sizeof(a));
  CHECK(a[2] == 3.0f);
}

TEST_CASE("safetensors: a file written by PyTorch loads exactly (committed fixture)") {
  const SafetensorsFile f = load_safetensors(EF_SOURCE_DIR "/tests/fixtures/io/torch_written.safetensors");
  check_same_tensors(f.tensors, cross_check_tensors());
  CHECK(f.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"written_by", "torch"}});
}

TEST_CASE("safetensors: live cross-check with safetensors.torch (scripts/io_check_safetensors.py)") {
  // EF_PYTHON, else scripts/setup.sh --safetensors's venv where the build found it, else Debian's.
  const char* env = std::getenv("EF_PYTHON");
#ifdef EF_SAFETENSORS_PYTHON
  const std::string found = EF_SAFETENSORS_PYTHON;
#else
  const std::string found = "/usr/bin/python3";
#endif
  const std::string python = env ? env : found;
  if (std::system((python + " -c 'import torch, safetensors.torch' >/dev/null 2>&1").c_str()) != 0) {
    EF_SKIP_TEST(python << " cannot import torch and safetensors (pip install --target /tmp/st "
                        << "safetensors; PYTHONPATH=/tmp/st; EF_PYTHON picks the interpreter)");
    return;
  }
  TempDir dir;
  const std::string ours = dir.file("ours.safetensors"), theirs = dir.file("theirs.safetensors");
  save_safetensors(ours, cross_check_tensors(), {{"written_by", "evenflow"}, {"format", "pt"}});
  const std::string cmd = python + " " EF_SOURCE_DIR "/scripts/io_check_safetensors.py check " + ours + " " + theirs;
  REQUIRE(std::system(cmd.c_str()) == 0);
  const SafetensorsFile f = load_safetensors(theirs);
  check_same_tensors(f.tensors, cross_check_tensors());
  CHECK(f.metadata.at("written_by") == "torch");
}

TEST_CASE("safetensors: bad files are refused, naming the key or offset") {
  TempDir dir;
  const auto has = [](const std::string& error, const std::string& part) {
    INFO(error);
    CHECK(error.find(part) != std::string::npos);
  };
  const std::string f8 = std::string(8, '\0');  // 8 data bytes: two float32
  const std::string entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

  has(error_of([&] { load_safetensors(dir.file("missing.safetensors")); }), "No such file or directory");
  has(load_error(dir, "abc"), "the file has 3 bytes, fewer than the 8-byte header length");
  has(load_error(dir, std::string("\xff\x00\x00\x00\x00\x00\x00\x00", 8) + "{}"), "the header length 255 goes beyond");
  {
    // A header length within the file (sparse, so cheap) but beyond the format's 100 MB limit.
    const std::string huge = dir.file("huge.safetensors");
    write_bytes(huge, std::string("\x08\xe1\xf5\x05\x00\x00\x00\x00", 8));  // 100000008
    std::filesystem::resize_file(huge, 100'000'100);
    has(error_of([&] { load_safetensors(huge); }), "the header length 100000008 exceeds the format's limit");
  }
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32",)", "")), "invalid JSON header at header byte");
  has(load_error(dir, file_bytes(R"({"w": nope})", "")), "invalid JSON header at header byte 8 (file offset 15)");
  has(load_error(dir, file_bytes("[1, 2]", "")), "the header must be a JSON object, got array");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", "1234")),
      R"(tensor 'w' has dtype "F16", which evenflow does not read (F32, F64, I64, BF16))");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"X","shape":[2],"data_offsets":[0,8]}})", f8)), R"(dtype "X")");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f8)),
      "tensor 'w' has shape [3] float32 (12 bytes) but data_offsets [0, 8) hold 8 bytes");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f8)),
      "tensor 'w': shape entry must be a non-negative integer, got -2");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", f8)),
      "must be a non-negative integer, got 2.0");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", f8)),
      "data_offsets must be [begin, end]");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", f8)),
      "with begin after end");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", f8)), "tensor 'w' has no 'data_offsets'");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", f8)),
      "tensor 'w' has an unknown field 'x'");
  has(load_error(dir, file_bytes(R"({"w":[1]})", f8)), "tensor 'w': expected an object");
  has(load_error(dir, file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                 std::string(12, '\0'))),
      "tensor 'b' at data offsets [4, 12) overlaps tensor 'a' at [0, 8)");
  has(load_error(dir, file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                 std::string(12, '\0'))),
      "gap of 4 bytes at data offset 4 before tensor 'b'");
  has(load_error(dir, file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f8)),
      "gap of 4 bytes at data offset 0 before tensor 'a'");
  has(load_error(dir, file_bytes("{" + entry + "}", "1234")),
      "tensor 'w' at data offsets [0, 8) extends beyond the 4 data bytes in the file");
  has(load_error(dir, file_bytes("{" + entry + "}", f8 + "xyz")), "3 bytes after the last tensor at data offset 8");
  has(load_error(dir, file_bytes("{" + entry + "," + entry + "}", f8)), "duplicate key 'w'");
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f8)),
      "duplicate key 'dtype' in 'w'");
  has(load_error(dir, file_bytes(R"({"__metadata__":{"a":1},)" + entry + "}", f8)),
      "__metadata__ value of 'a' must be a string, got 1");
  has(load_error(dir, file_bytes(R"({"__metadata__":[],)" + entry + "}", f8)), "__metadata__ must be an object");
  // Unpadded headers and empty files of tensors are valid.
  const std::string ok = dir.file("ok.safetensors");
  write_bytes(ok, file_bytes("{" + entry + "}", f8, false));
  CHECK(load_safetensors(ok).at("w").shape() == Shape{2});

  // A good file cut short: the last tensor's bytes are missing.
  save_safetensors(ok, {{"a", ones({4})}, {"b", ones({4})}});
  std::string good = read_bytes(ok);
  has(load_error(dir, good.substr(0, good.size() - 3)), "tensor 'b' at data offsets [16, 32) extends beyond");
  has(load_error(dir, good.substr(0, 20)), "goes beyond the end of the file");
}

TEST_CASE("safetensors: a header nested deeper than any safetensors header is refused before it is parsed") {
  // 200000 levels overflowed the stack (nlohmann's recursive dump() of the value for the error
  // message); the loader must refuse the header from a scan of its text instead.
  TempDir dir;
  const size_t levels = 200000;
  const std::string deep = std::string(levels, '[') + std::string(levels, ']');
  const std::string e = load_error(dir, file_bytes(R"({"w":)" + deep + "}", ""));
  INFO(e);
  CHECK(e.find("load_safetensors " + dir.file("bad.safetensors") + ": ") == 0);
  CHECK(e.find("the header nests arrays and objects 200001 levels deep; at most 64 are read (a safetensors header "
               "has 3)") != std::string::npos);
  CHECK(e.find("level 65 opens at header byte 69") != std::string::npos);

  // Brackets inside strings (escaped quotes included) are text, not nesting: a key of 200000 '['
  // is only too long to show in full.
  const std::string key = R"(\"[)" + std::string(levels, '[');
  const std::string in_string = load_error(dir, file_bytes(R"({")" + key + R"(":{"dtype":"F32"}})", ""));
  INFO(in_string);
  CHECK(in_string.find("tensor '\"[[[[") != std::string::npos);
  CHECK(in_string.find("has no 'shape'") != std::string::npos);
  CHECK(in_string.size() < 1000);

  // 64 levels are read, and a value too large to quote is cut short in the message.
  const std::string ok_depth = R"({"w":)" + std::string(63, '[') + std::string(63, ']') + "}";
  const std::string at_limit = load_error(dir, file_bytes(ok_depth, ""));
  INFO(at_limit);
  CHECK(at_limit.find("tensor 'w': expected an object {dtype, shape, data_offsets}, got [[[[") != std::string::npos);
  CHECK(at_limit.find("... (126 bytes)") != std::string::npos);
  std::string long_shape = "[1";
  for (int i = 0; i < 100000; ++i) long_shape += ",1";
  const std::string many = load_error(
      dir, file_bytes(R"({"w":{"dtype":"F32","shape":)" + long_shape + R"(],"data_offsets":[0,4]}})", "1234"));
  INFO(many.substr(0, 300));
  CHECK(many.find("tensor 'w' has 100001 dims; at most 8 are supported") != std::string::npos);
  CHECK(many.size() < 1000);
}

TEST_CASE("safetensors: numbers and shapes beyond what the engine holds are refused, naming the tensor") {
  TempDir dir;
  const auto has = [](const std::string& error, const std::string& part) {
    INFO(error);
    CHECK(error.find(part) != std::string::npos);
  };
  // A number beyond double's range: nlohmann throws out_of_range, not parse_error, which escaped
  // the loader as a foreign exception.
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}})", "1234")),
      "invalid JSON header: [json.exception.out_of_range.406] number overflow parsing '1e400'");
  // No byte to read, but the strides of [0, 2^62, 4] (products of the later sizes) overflow int64:
  // undefined behaviour in the engine before it checked sizes, and now refused here naming the file.
  has(load_error(dir,
                 file_bytes(R"({"w":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", "")),
      "tensor 'w' has shape [0,4611686018427387904,4], too large to address");
  // Large sizes around a zero that stay addressable are an empty tensor.
  const std::string ok = dir.file("empty.safetensors");
  write_bytes(ok, file_bytes(R"({"w":{"dtype":"F64","shape":[1099511627776,0,524288],"data_offsets":[0,0]}})", ""));
  CHECK(load_safetensors(ok).at("w").shape() == Shape{1099511627776, 0, 524288});
  // More dims than the engine's tensors have, named here instead of by the engine.
  has(load_error(dir, file_bytes(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", "1234")),
      "tensor 'w' has 9 dims; at most 8 are supported");
}

TEST_CASE("safetensors: load_safetensors_bytes reads a file's bytes from memory, with the same checks") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, cross_check_tensors(), {{"k", "v"}});
  const std::string bytes = read_bytes(path);
  const SafetensorsFile f = load_safetensors_bytes(bytes, "model bytes");
  check_same_tensors(f.tensors, cross_check_tensors());
  CHECK(f.metadata == std::map<std::string, std::string>{{"k", "v"}});
  CHECK(error_of([&] {
          load_safetensors_bytes(bytes.substr(0, bytes.size() - 1), "model bytes");
        }).find("load_safetensors model bytes: tensor 'transposed' at data offsets") == 0);
  CHECK(error_of([] { load_safetensors_bytes(""); }).find("load_safetensors (bytes): the file has 0 bytes") == 0);
}

TEST_CASE("safetensors: bad arguments to save") {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  CHECK(error_of([&] {
          save_safetensors(path, {{"a", ones({1})}, {"a", ones({1})}});
        }).find("two tensors are named 'a'") != std::string::npos);
  CHECK(error_of([&] {
          save_safetensors(path, {{"a", Tensor()}});
        }).find("tensor 'a' is undefined") != std::string::npos);
  CHECK(error_of([&] {
          save_safetensors(path, {{"__metadata__", ones({1})}});
        }).find("invalid tensor name") != std::string::npos);
  CHECK(error_of([&] {
          save_safetensors(path, {{"bad\xff", ones({1})}});
        }).find("not valid UTF-8") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("safetensors: a failing save leaves the previous file byte-identical") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, {{"w", from_vector({1, 2, 3}, {3})}}, {{"step", "1"}});
  const std::string before = read_bytes(path);
  const auto unchanged = [&] {
    CHECK(read_bytes(path) == before);
    CHECK(only_file_in(dir.path(), "ckpt.safetensors"));
  };

  SUBCASE("a tensor that throws while the file is being written") {
    // The first tensor is written, then the second cannot be copied to the host contiguously: the
    // engine's tensors for copies have at most 8 dims, and this 9-d view is not contiguous.
    const Tensor nine_d = make_view(zeros({2, 2}), {2, 1, 1, 1, 1, 1, 1, 1, 2}, {1, 1, 1, 1, 1, 1, 1, 1, 2}, 0);
    const std::string e = error_of([&] { save_safetensors(path, {{"ok", ones({1000})}, {"bad", nine_d}}); });
    CHECK(e.find("cannot write " + path) != std::string::npos);
    INFO(e);
    CHECK(e.find("more than 8 dims") != std::string::npos);
    CHECK(e.find("was left unchanged") != std::string::npos);
    unchanged();
  }
  SUBCASE("the disk fills up (file size limit) mid-write") {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    rlimit small = saved;
    small.rlim_cur = 64 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    const std::string e = error_of([&] { save_safetensors(path, {{"big", ones({100000})}}); });
    ::setrlimit(RLIMIT_FSIZE, &saved);
    ::signal(SIGXFSZ, SIG_DFL);
    CHECK(e.find("cannot write " + path) != std::string::npos);
    CHECK(e.find("File too large") != std::string::npos);
    unchanged();
  }
  SUBCASE("the directory is not writable") {
    if (::geteuid() == 0) {
      MESSAGE("skipped the read-only directory case: running as root, permissions do not stop writes");
      return;
    }
    std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_write,
                                 std::filesystem::perm_options::remove);
    const std::string e = error_of([&] { save_safetensors(path, {{"w", ones({3})}}); });
    std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
    CHECK(e.find("cannot write " + path) != std::string::npos);
    CHECK(e.find("Permission denied") != std::string::npos);
    unchanged();
  }
  SUBCASE("the rename fails (a directory is in the way)") {
    const std::string blocked = dir.file("blocked");
    std::filesystem::create_directories(blocked + "/inside");
    const std::string e = error_of([&] { save_safetensors(blocked, {{"w", ones({3})}}); });
    CHECK(e.find("renaming " + blocked + ".tmp.") != std::string::npos);
    CHECK(std::filesystem::is_directory(blocked + "/inside"));
    std::filesystem::remove_all(blocked);
    unchanged();
  }
  SUBCASE("the directory does not exist") {
    const std::string e = error_of([&] { save_safetensors(dir.file("no/such/dir.safetensors"), {}); });
    CHECK(e.find("No such file or directory") != std::string::npos);
    unchanged();
  }
}

TEST_CASE("safetensors: load_into copies into existing tensors and reports what does not fit") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"w", from_vector({1, 2, 3, 4}, {2, 2})}, {"b", from_vector({5, 6}, {2})}});
  const SafetensorsFile f = load_safetensors(path);

  const Tensor w = zeros({2, 2}, {.device = "cpu:1", .requires_grad = true});
  const Tensor b = zeros({2});
  const LoadReport ok = load_into(f, {{"w", w}, {"b", b}});
  CHECK(ok.missing.empty());
  CHECK(ok.unexpected.empty());
  CHECK(vals(w) == std::vector<double>{1, 2, 3, 4});
  CHECK(w.device() == Device("cpu:1"));
  CHECK(w.requires_grad());
  CHECK(vals(b) == std::vector<double>{5, 6});

  const Tensor c = zeros({3});
  const Tensor w2 = zeros({2, 2});
  const std::string strict = error_of([&] { load_into(f, {{"w", w2}, {"c", c}}); });
  CHECK(strict.find("2 problems (nothing was copied): missing key 'c'; unexpected key 'b'") != std::string::npos);
  CHECK(vals(w2) == std::vector<double>{0, 0, 0, 0});  // nothing copied

  const LoadReport loose = load_into(f, {{"w", w2}, {"c", c}}, /*strict=*/false);
  CHECK(loose.missing == std::vector<std::string>{"c"});
  CHECK(loose.unexpected == std::vector<std::string>{"b"});
  CHECK(vals(w2) == std::vector<double>{1, 2, 3, 4});

  const std::string shape = error_of([&] { load_into(f, {{"w", zeros({4})}, {"b", b}}); });
  CHECK(shape.find("'w': the file has [2, 2] float32, the target is [4] float32") != std::string::npos);
  const std::string dtype = error_of([&] { load_into(f, {{"w", zeros({2, 2}, {.dtype = kFloat64})}}, false); });
  CHECK(dtype.find("'w': the file has [2, 2] float32, the target is [2, 2] float64") != std::string::npos);
  CHECK(error_of([&] { load_into(f, {{"w", w}, {"w", w}}); }).find("two targets are named 'w'") != std::string::npos);
}

TEST_CASE("safetensors: generator states are saved as int64 tensors and restored") {
  TempDir dir;
  const std::string path = dir.file("rng.safetensors");
  const GeneratorState big{.seed = 0xFEDCBA9876543210ull, .offset = 12345};
  const GeneratorState back = generator_state_from_tensor(generator_state_to_tensor(big));
  CHECK(back.seed == big.seed);
  CHECK(back.offset == big.offset);

  manual_seed(cpu(2), 77);
  randn({10}, {.device = "cpu:2"});
  save_safetensors(path, {{"rng.cpu2", generator_state_to_tensor(generator_state(cpu(2)))}});
  const Tensor expected = randn({5}, {.device = "cpu:2"});
  randn({3}, {.device = "cpu:2"});
  set_generator_state(cpu(2), generator_state_from_tensor(load_safetensors(path).at("rng.cpu2")));
  CHECK(vals(randn({5}, {.device = "cpu:2"})) == vals(expected));

  CHECK(error_of([] { generator_state_from_tensor(zeros({2})); }).find("expected an int64 tensor [2]") !=
        std::string::npos);
}
