// EventWriter: Event protocol buffers encoded by hand, framed as TFRecords.
#include "evenflow/io/event_file.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>

#include "evenflow/engine/error.h"

namespace evenflow::io {

namespace {

// Note [Event encoding]
// The messages, from TensorFlow's event.proto and summary.proto (field number: type):
//   Event      { wall_time 1: double; step 2: int64; file_version 3: string; summary 5: Summary;
//                session_log 7: SessionLog }
//   Summary    { value 1: repeated Value }
//   Value      { tag 1: string; simple_value 2: float; image 4: Image }
//   Image      { height 1: int32; width 2: int32; colorspace 3: int32; encoded_image_string 4: bytes }
//   SessionLog { status 1: enum, START = 1 }
// In the wire format each field is a key (field number << 3 | wire type) as a varint, then a
// varint (type 0), 8 little-endian bytes (type 1), a varint length and the bytes (type 2: strings,
// bytes, nested messages) or 4 little-endian bytes (type 5). Each event is one TFRecord: its
// length (uint64), the masked CRC-32C of those 8 bytes, the event, the masked CRC-32C of the event;
// TensorBoard's reader checks both.

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void key(std::string& out, int field, int wire_type) {
  varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}

void int_field(std::string& out, int field, int64_t v) {
  key(out, field, 0);
  varint(out, static_cast<uint64_t>(v));
}

void bytes_field(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

template <typename T>
void fixed_field(std::string& out, int field, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  key(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

std::string event_header(int64_t step) {
  std::string e;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  fixed_field(e, 1, now);
  int_field(e, 2, step);
  return e;
}

std::string summary_event(const std::string& value, int64_t step) {
  std::string summary;
  bytes_field(summary, 1, value);
  std::string e = event_header(step);
  bytes_field(e, 5, summary);
  return e;
}

uint32_t crc32c(const char* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli, reflected
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ static_cast<uint8_t>(data[i])) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc(const char* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

}  // namespace

EventWriter::EventWriter(const std::filesystem::path& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  char host[256] = "host";
  ::gethostname(host, sizeof(host) - 1);
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  // The pid keeps two writers of one second apart; TensorBoard reads every file with "tfevents" in its name.
  path_ = folder / ("events.out.tfevents." + std::to_string(seconds) + "." + host + "." + std::to_string(::getpid()) +
                    ".evenflow");
  file_ = std::fopen(path_.c_str(), "wb");
  EF_CHECK(file_ != nullptr, "EventWriter: cannot create ", path_.string(), ": ", std::strerror(errno));
  std::string e = event_header(0);
  bytes_field(e, 3, "brain.Event:2");
  write_event(e);
  flush();
}

EventWriter::~EventWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  bytes_field(v, 1, tag);
  fixed_field(v, 2, static_cast<float>(value));
  write_event(summary_event(v, step));
}

void EventWriter::image(const std::string& tag, const std::string& png, int64_t height, int64_t width, int channels,
                        int64_t step) {
  EF_CHECK(height > 0 && width > 0 && height <= INT32_MAX && width <= INT32_MAX, "EventWriter: image ", tag,
           " has size ", height, "x", width);
  EF_CHECK(channels == 1 || channels == 3 || channels == 4, "EventWriter: image ", tag, " has ", channels,
           " channels (1, 3 or 4)");
  std::string image;
  int_field(image, 1, height);
  int_field(image, 2, width);
  int_field(image, 3, channels);
  bytes_field(image, 4, png);
  std::string v;
  bytes_field(v, 1, tag);
  bytes_field(v, 4, image);
  write_event(summary_event(v, step));
}

void EventWriter::text(const std::string& tag, const std::string& markdown, int64_t step) {
  // Summary.Value: tag (1), the tensor (8) -- a DT_STRING (7) scalar (an empty shape, 2) whose
  // string_val (8) is the text -- and metadata (9) naming the text plugin (plugin_data.plugin_name).
  std::string tensor;
  int_field(tensor, 1, 7);
  bytes_field(tensor, 2, "");
  bytes_field(tensor, 8, markdown);
  std::string plugin;
  bytes_field(plugin, 1, "text");
  std::string metadata;
  bytes_field(metadata, 1, plugin);
  std::string v;
  bytes_field(v, 1, tag);
  bytes_field(v, 8, tensor);
  bytes_field(v, 9, metadata);
  write_event(summary_event(v, step));
}

void EventWriter::restart(int64_t step) {
  std::string log;
  int_field(log, 1, 1);  // START
  std::string e = event_header(step);
  bytes_field(e, 7, log);
  write_event(e);
}

void EventWriter::flush() {
  EF_CHECK(std::fflush(file_) == 0, "EventWriter: cannot write ", path_.string(), ": ", std::strerror(errno));
}

void EventWriter::write_event(const std::string& event) {
  std::string record;
  const uint64_t length = event.size();
  char len[8];
  std::memcpy(len, &length, 8);
  record.append(len, 8);
  const uint32_t len_crc = masked_crc(len, 8);
  record.append(reinterpret_cast<const char*>(&len_crc), 4);
  record += event;
  const uint32_t data_crc = masked_crc(event.data(), event.size());
  record.append(reinterpret_cast<const char*>(&data_crc), 4);
  EF_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(), "EventWriter: cannot write ",
           path_.string(), ": ", std::strerror(errno));
}

}  // namespace evenflow::io
