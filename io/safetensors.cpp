// Safetensors reading and writing (format in safetensors.h). The loader trusts nothing in the
// file: the header length, the JSON (its nesting before it is parsed), every entry's dtype, shape
// and offsets, and the coverage of the data buffer are checked before a byte of tensor data is
// read, and each failure names the file and the key or offset concerned.
#include "evenflow/io/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/ops.h"
#include "evenflow/io/file.h"

namespace evenflow::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data: a big-endian host needs byte swapping in save and load");

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kMetadataKey = "__metadata__";
constexpr uint64_t kLengthBytes = 8;               // the header length that opens the file
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr int64_t kMaxHeaderDepth = 64;            // Note [Header nesting]
constexpr size_t kShownChars = 80;                 // of a name or JSON value quoted in an error

struct DtypeCode {
  const char* code = "";
  DType dtype = kFloat32;
};
constexpr std::array<DtypeCode, 4> kDtypeCodes{
    {{"F32", kFloat32}, {"F64", kFloat64}, {"I64", kInt64}, {"BF16", kBFloat16}}};

const char* dtype_code(DType t) {
  for (const DtypeCode& c : kDtypeCodes)
    if (c.dtype == t) return c.code;
  EF_ASSERT(false, "no safetensors code for dtype ", dtype_name(t));
}

std::optional<DType> dtype_from_code(const std::string& code) {
  for (const DtypeCode& c : kDtypeCodes)
    if (code == c.code) return c.dtype;
  return std::nullopt;
}

// One tensor's entry of the header, checked.
struct Entry {
  std::string name = {};
  DType dtype = kFloat32;
  Shape shape = {};
  uint64_t begin = 0, end = 0;  // [begin, end) in the data buffer
};

std::string offsets_str(uint64_t begin, uint64_t end) {
  return detail::str_cat("[", begin, ", ", end, ")");
}

// Text from the file quoted in an error: at most kShownChars bytes (cut at a UTF-8 character
// boundary) and the full length, so a hostile header of 100 MB cannot make a message as large.
std::string shown(const std::string& text) {
  if (text.size() <= kShownChars) return text;
  size_t n = kShownChars;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return detail::str_cat(text.substr(0, n), "... (", text.size(), " bytes)");
}

// A JSON value in an error. The parser only produces valid UTF-8, so `replace` never acts; it
// keeps dump() from throwing a second exception in the middle of reporting the first.
std::string shown(const Json& v) {
  return shown(v.dump(-1, ' ', false, Json::error_handler_t::replace));
}

uint64_t json_unsigned(const std::string& where, const std::string& what, const Json& v) {
  EF_CHECK(v.is_number_unsigned(), where, what, " must be a non-negative integer, got ", shown(v));
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& where, const std::string& name, const Json& v) {
  const std::string in = "tensor '" + shown(name) + "'";
  EF_CHECK(v.is_object(), where, in, ": expected an object {dtype, shape, data_offsets}, got ", shown(v));
  for (const auto& [field, value] : v.items())
    EF_CHECK(field == "dtype" || field == "shape" || field == "data_offsets", where, in, " has an unknown field '",
             shown(field), "'");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    EF_CHECK(v.contains(field), where, in, " has no '", field, "'");

  Entry e;
  e.name = name;
  const Json& dtype = v["dtype"];
  EF_CHECK(dtype.is_string(), where, in, ": dtype must be a string, got ", shown(dtype));
  const std::optional<DType> t = dtype_from_code(dtype.get<std::string>());
  EF_CHECK(t.has_value(), where, in, " has dtype ", shown(dtype),
           ", which evenflow does not read (F32, F64, I64, BF16)");
  e.dtype = *t;

  const Json& shape = v["shape"];
  EF_CHECK(shape.is_array(), where, in, ": shape must be an array, got ", shown(shape));
  EF_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), where, in, " has ", shape.size(), " dims; at most ", kMaxDims,
           " are supported");
  // The engine computes strides and element counts as products of sizes in int64, also for an
  // empty tensor (strides of [0, 2^62, 4] overflow), so the product of the nonzero sizes, in
  // bytes, must fit in int64 even where a zero size leaves no byte to read.
  uint64_t reach = dtype_size(e.dtype);
  bool has_zero = false;
  for (const Json& d : shape) {
    const uint64_t size = json_unsigned(where, in + ": shape entry", d);
    EF_CHECK(!__builtin_mul_overflow(reach, std::max<uint64_t>(size, 1), &reach) &&
                 reach <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             where, in, " has shape ", shown(shape), ", too large to address");
    e.shape.push_back(static_cast<int64_t>(size));
    has_zero = has_zero || size == 0;
  }
  const uint64_t bytes = has_zero ? 0 : reach;

  const Json& offsets = v["data_offsets"];
  EF_CHECK(offsets.is_array() && offsets.size() == 2, where, in, ": data_offsets must be [begin, end], got ",
           shown(offsets));
  e.begin = json_unsigned(where, in + ": data_offsets[0]", offsets[0]);
  e.end = json_unsigned(where, in + ": data_offsets[1]", offsets[1]);
  EF_CHECK(e.begin <= e.end, where, in, " has data_offsets ", shown(offsets), " with begin after end");
  EF_CHECK(e.end - e.begin == bytes, where, in, " has shape ", shape_str(e.shape), " ", dtype_name(e.dtype), " (",
           bytes, " bytes) but data_offsets ", offsets_str(e.begin, e.end), " hold ", e.end - e.begin, " bytes");
  return e;
}

std::map<std::string, std::string> parse_metadata(const std::string& where, const Json& v) {
  EF_CHECK(v.is_object(), where, "__metadata__ must be an object of strings, got ", shown(v));
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    EF_CHECK(value.is_string(), where, "__metadata__ value of '", shown(key), "' must be a string, got ", shown(value));
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// Note [Header nesting]
// A safetensors header is 3 levels deep ({name: {"shape": [sizes]}}), but JSON allows any depth,
// and nlohmann's dump() (used for error messages) recurses once per level: a header of 200000 '['
// overflowed the stack. So the header's text is scanned before it is parsed, and one nested more
// than kMaxHeaderDepth levels is refused; nothing recursive ever sees a deeper tree. The scan
// follows JSON's string syntax (a '"' outside a string opens one; inside, '\' escapes the next
// character and '"' closes it), so brackets inside strings do not count: on valid JSON it finds
// the true depth, and on invalid JSON the parser stops at the first error, before any point
// deeper than the scan saw.
void check_nesting(const std::string& where, const std::string& text) {
  int64_t depth = 0, deepest = 0;
  size_t too_deep_at = 0;  // the header byte (from 1, as the parser counts) where level kMaxHeaderDepth + 1 opens
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (depth == kMaxHeaderDepth + 1 && too_deep_at == 0) too_deep_at = i + 1;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  EF_CHECK(deepest <= kMaxHeaderDepth, where, "the header nests arrays and objects ", deepest, " levels deep; at most ",
           kMaxHeaderDepth, " are read (a safetensors header has 3): level ", kMaxHeaderDepth + 1,
           " opens at header byte ", too_deep_at, " (file offset ", kLengthBytes + too_deep_at - 1, ")");
}

// Parses the header, refusing invalid JSON (naming the byte) and duplicate keys at any depth,
// which nlohmann::json would otherwise resolve silently by keeping one of them.
Json parse_header(const std::string& where, const std::string& text) {
  check_nesting(where, text);
  struct Object {
    std::string name = {};
    std::set<std::string> keys = {};
  };
  std::vector<Object> open;
  std::string last_key;
  std::string duplicate;
  const Json::parser_callback_t check_keys = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open.push_back({last_key, {}});
    } else if (event == Json::parse_event_t::object_end) {
      open.pop_back();
    } else if (event == Json::parse_event_t::key) {
      last_key = parsed.get<std::string>();
      if (!open.back().keys.insert(last_key).second && duplicate.empty())
        duplicate = open.size() > 1 ? detail::str_cat("'", shown(last_key), "' in '", shown(open.back().name), "'")
                                    : detail::str_cat("'", shown(last_key), "'");
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, check_keys);
  } catch (const Json::parse_error& e) {
    EF_ERROR(where, "invalid JSON header at header byte ", e.byte, " (file offset ", kLengthBytes + e.byte - 1,
             "): ", e.what());
  } catch (const Json::exception& e) {
    // The parser reports some errors with other types (a number like 1e400 is out_of_range).
    EF_ERROR(where, "invalid JSON header: ", e.what());
  }
  EF_CHECK(duplicate.empty(), where, "the header has a duplicate key ", duplicate);
  EF_CHECK(header.is_object(), where, "the header must be a JSON object, got ", header.type_name());
  return header;
}

// The entries sorted by offset must tile [0, data_bytes) exactly: no gap, no overlap, no byte
// beyond the end and none left over.
void check_coverage(const std::string& where, std::vector<Entry>& entries, uint64_t data_bytes) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    EF_CHECK(previous == nullptr || e.begin >= expected, where, "tensor '", shown(e.name), "' at data offsets ",
             offsets_str(e.begin, e.end), " overlaps tensor '", shown(previous->name), "' at ",
             offsets_str(previous->begin, previous->end));
    EF_CHECK(e.begin == expected, where, "gap of ", e.begin - expected, " bytes at data offset ", expected,
             " before tensor '", shown(e.name), "'");
    EF_CHECK(e.end <= data_bytes, where, "tensor '", shown(e.name), "' at data offsets ", offsets_str(e.begin, e.end),
             " extends beyond the ", data_bytes, " data bytes in the file, by ", e.end - data_bytes,
             " bytes: the file is truncated");
    expected = e.end;
    previous = &e;
  }
  EF_CHECK(expected == data_bytes, where, data_bytes - expected, " bytes after the last tensor at data offset ",
           expected, " belong to no tensor");
}

}  // namespace

// --- SafetensorsFile -------------------------------------------------------------------------------

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& nt) { return nt.first == name; });
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  EF_ERROR("safetensors: no tensor named '", name, "' (the file has ", tensors.size(), " tensors)");
}

// --- Save --------------------------------------------------------------------------------------------

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = "save_safetensors " + path + ": ";
  Json header = Json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    EF_CHECK(!name.empty() && name != kMetadataKey, where, "invalid tensor name '", name, "'");
    EF_CHECK(!header.contains(name), where, "two tensors are named '", name, "'");
    EF_CHECK(t.defined(), where, "tensor '", name, "' is undefined");
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
    header[name] = {{"dtype", dtype_code(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    EF_ERROR(where, "a tensor name or metadata string is not valid UTF-8: ", e.what());
  }
  text.append((kLengthBytes - text.size() % kLengthBytes) % kLengthBytes, ' ');

  write_file_atomically(path, [&](OutputFile& out) {
    std::array<unsigned char, kLengthBytes> length{};
    for (size_t i = 0; i < kLengthBytes; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));
    out.write(length.data(), length.size());
    out.write(text.data(), text.size());
    NoGradGuard no_grad;
    for (const auto& [name, t] : tensors) {
      // One tensor at a time on the host, so saving needs memory for the largest tensor only.
      const Tensor host = (t.device().is_cpu() ? t : t.to(cpu())).contiguous();
      out.write(host.data_ptr(), static_cast<size_t>(host.numel()) * dtype_size(host.dtype()));
    }
  });
}

// --- Load --------------------------------------------------------------------------------------------

namespace {

// Reads exactly n bytes at `offset` of the file or bytes being loaded; the loader checks that
// they lie within the source's size first.
using ReadAt = std::function<void(uint64_t offset, void* dst, size_t n)>;

SafetensorsFile load_from(const std::string& where, uint64_t size, const ReadAt& read_at) {
  EF_CHECK(size >= kLengthBytes, where, "the file has ", size,
           " bytes, fewer than the 8-byte header length that opens a safetensors file");
  std::array<unsigned char, kLengthBytes> length{};
  read_at(0, length.data(), length.size());
  uint64_t header_bytes = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) header_bytes |= static_cast<uint64_t>(length[i]) << (8 * i);
  EF_CHECK(header_bytes <= size - kLengthBytes, where, "the header length ", header_bytes,
           " goes beyond the end of the file (", size - kLengthBytes, " bytes follow the length)");
  EF_CHECK(header_bytes <= kMaxHeaderBytes, where, "the header length ", header_bytes,
           " exceeds the format's limit of ", kMaxHeaderBytes, " bytes");

  std::string text(header_bytes, '\0');
  read_at(kLengthBytes, text.data(), text.size());
  const Json header = parse_header(where, text);

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      out.metadata = parse_metadata(where, value);
    } else {
      entries.push_back(parse_entry(where, key, value));
    }
  }
  const uint64_t data_start = kLengthBytes + header_bytes;
  check_coverage(where, entries, size - data_start);

  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, {.dtype = e.dtype, .device = cpu()});
    read_at(data_start + e.begin, t.data_ptr(), e.end - e.begin);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path) {
  const InputFile file(path);
  return load_from("load_safetensors " + path + ": ", file.size(),
                   [&](uint64_t offset, void* dst, size_t n) { file.read_at(offset, dst, n); });
}

SafetensorsFile load_safetensors_bytes(std::string_view bytes, const std::string& name) {
  // An empty tensor's data_ptr() may be null, and memcpy's pointers must not be, even for 0 bytes.
  return load_from("load_safetensors " + name + ": ", bytes.size(), [&](uint64_t offset, void* dst, size_t n) {
    if (n > 0) std::memcpy(dst, bytes.data() + offset, n);
  });
}

// --- Into existing tensors ----------------------------------------------------------------------------

LoadReport load_into(const SafetensorsFile& file, const NamedTensors& targets, bool strict) {
  LoadReport report;
  std::vector<std::string> problems;
  std::set<std::string> wanted;
  for (const auto& [name, target] : targets) {
    EF_CHECK(wanted.insert(name).second, "load_into: two targets are named '", name, "'");
    EF_CHECK(target.defined(), "load_into: target '", name, "' is undefined");
    if (!file.contains(name)) {
      report.missing.push_back(name);
      if (strict) problems.push_back("missing key '" + name + "'");
      continue;
    }
    const Tensor& src = file.at(name);
    if (src.shape() != target.shape() || src.dtype() != target.dtype())
      problems.push_back("'" + name + "': the file has " + shape_str(src.shape()) + " " + dtype_name(src.dtype()) +
                         ", the target is " + shape_str(target.shape()) + " " + dtype_name(target.dtype()));
  }
  for (const auto& [name, src] : file.tensors) {
    if (wanted.count(name) != 0) continue;
    report.unexpected.push_back(name);
    if (strict) problems.push_back("unexpected key '" + name + "'");
  }
  if (!problems.empty()) {
    std::string all;
    for (const std::string& p : problems) all += (all.empty() ? "" : "; ") + p;
    EF_ERROR("load_into: ", problems.size(), problems.size() == 1 ? " problem" : " problems",
             " (nothing was copied): ", all);
  }

  NoGradGuard no_grad;
  for (const auto& [name, target] : targets)
    if (file.contains(name)) target.copy_(file.at(name).to(target.device()));
  return report;
}

// --- Generator states ------------------------------------------------------------------------------

Tensor generator_state_to_tensor(const GeneratorState& state) {
  return from_int_vector({std::bit_cast<int64_t>(state.seed), std::bit_cast<int64_t>(state.offset)}, {2});
}

GeneratorState generator_state_from_tensor(const Tensor& t) {
  EF_CHECK(t.defined() && t.dtype() == kInt64 && t.shape() == Shape{2},
           "generator_state_from_tensor: expected an int64 tensor [2] = {seed, offset}, got ",
           t.defined() ? t.str() : "an undefined tensor");
  const std::vector<int64_t> v = t.to_int_vector();
  return {.seed = std::bit_cast<uint64_t>(v[0]), .offset = std::bit_cast<uint64_t>(v[1])};
}

}  // namespace evenflow::io
