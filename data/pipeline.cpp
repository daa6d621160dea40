// make_batch and the batch encoding: magic "EFB1", then per tensor (images, labels) its dtype
// (u32), its number of dims (u32), the dims (i64 each) and the elements, then the CRC-32 (u32) of
// all of it. Integers are little-endian, as on every machine evenflow builds for.
#include "evenflow/data/pipeline.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "evenflow/engine/backend.h"  // kMaxDims
#include "evenflow/engine/error.h"

namespace evenflow::data {

namespace {

constexpr char kMagic[4] = {'E', 'F', 'B', '1'};

uint32_t crc32_of(std::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t at = 0; at < bytes.size();) {  // zlib takes at most 4 GiB per call
    const size_t n = std::min<size_t>(bytes.size() - at, 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at), static_cast<uInt>(n));
    at += n;
  }
  return static_cast<uint32_t>(crc);
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_tensor(std::string& out, const Tensor& t, const char* name) {
  EF_CHECK(t.defined(), "encode_batch: the batch's ", name, " are undefined");
  const Tensor c = t.to(cpu()).contiguous();
  put<uint32_t>(out, static_cast<uint32_t>(c.dtype()));
  put<uint32_t>(out, static_cast<uint32_t>(c.dim()));
  for (int64_t d : c.shape()) put<int64_t>(out, d);
  out.append(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()) * dtype_size(c.dtype()));
}

// Reads the encoding front to back; every read is checked against what is left.
class Reader {
 public:
  Reader(std::string_view bytes, const std::string& what) : bytes_(bytes), what_(what) {}

  template <typename T>
  T get(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }

  Tensor tensor(const char* name) {
    const uint32_t dtype = get<uint32_t>(name);
    EF_CHECK(dtype <= static_cast<uint32_t>(kBFloat16), what_, ": the ", name, " have an unknown dtype code ", dtype);
    const uint32_t dims = get<uint32_t>(name);
    EF_CHECK(dims <= kMaxDims, what_, ": the ", name, " have ", dims, " dims (at most ", kMaxDims, ")");
    Shape shape(dims);
    int64_t numel = 1;
    for (int64_t& d : shape) {
      d = get<int64_t>(name);
      EF_CHECK(d >= 0 && (d == 0 || numel <= (int64_t{1} << 40) / d), what_, ": the ", name, " have a bad size ", d);
      numel *= d;
    }
    const DType t = static_cast<DType>(dtype);
    const size_t n = static_cast<size_t>(numel) * dtype_size(t);
    need(n, name);
    Tensor out = empty(shape, {.dtype = t});
    if (n > 0) std::memcpy(out.data_ptr(), bytes_.data() + at_, n);
    at_ += n;
    return out;
  }

  size_t at() const { return at_; }

 private:
  void need(size_t n, const char* field) const {
    EF_CHECK(bytes_.size() - at_ >= n, what_, ": the bytes end inside the ", field, " (", bytes_.size(), " bytes)");
  }

  std::string_view bytes_;
  const std::string& what_;
  size_t at_ = 0;
};

// What bytes that are not a batch say: their runs of 4 or more printable characters, up to 300 (Ray
// hands some failures over as the result: plain text, or a message inside msgpack framing).
std::string quote(std::string_view bytes) {
  const auto printable = [](char c) {
    return std::isprint(static_cast<unsigned char>(c)) != 0 || c == '\n' || c == '\t';
  };
  std::string text;
  for (size_t i = 0; i < bytes.size() && text.size() < 300; ++i) {
    const size_t start = i;
    while (i < bytes.size() && printable(bytes[i])) ++i;
    if (i - start >= 4) text += (text.empty() ? "" : " ") + std::string(bytes.substr(start, i - start));
  }
  if (text.empty()) return "";
  return ": \"" + text.substr(0, 300) + (text.size() > 300 ? "...\"" : "\"");
}

}  // namespace

Batch make_batch(const Pipeline& pipeline, const std::vector<int64_t>& indices, uint64_t seed, uint64_t epoch) {
  EF_CHECK(pipeline.dataset != nullptr, "make_batch: the pipeline has no dataset");
  Batch b = pipeline.dataset->get_batch(indices);
  SampleStreams streams(seed, epoch, indices);
  for (const auto& t : pipeline.transforms) {
    EF_CHECK(t != nullptr, "make_batch: a transform is null");
    b = (*t)(std::move(b), streams);
  }
  return b;
}

std::string encode_batch(const Batch& batch) {
  std::string out(kMagic, sizeof(kMagic));
  put_tensor(out, batch.images, "images");
  put_tensor(out, batch.labels, "labels");
  put<uint32_t>(out, crc32_of(out));
  return out;
}

Batch decode_batch(std::string_view bytes, const std::string& what) {
  EF_CHECK(bytes.size() >= sizeof(kMagic) + sizeof(uint32_t) && std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0,
           what, ": not an encoded batch (", bytes.size(), " bytes)", quote(bytes));
  const std::string_view body = bytes.substr(0, bytes.size() - sizeof(uint32_t));
  uint32_t crc = 0;
  std::memcpy(&crc, bytes.data() + body.size(), sizeof(crc));
  EF_CHECK(crc == crc32_of(body), what, ": the batch's checksum does not match its ", bytes.size(),
           " bytes (damaged in transit)");
  Reader r(body, what);
  r.get<uint32_t>("magic number");
  Batch b;
  b.images = r.tensor("images");
  b.labels = r.tensor("labels");
  EF_CHECK(r.at() == body.size(), what, ": ", body.size() - r.at(), " bytes follow the batch");
  return b;
}

}  // namespace evenflow::data
