// EventWriter: refuses a folder it cannot write and images it cannot describe, naming them; frames
// every event as a TFRecord. (The events' contents are checked with TensorBoard's own reader by the
// programs' tests: tests/train/app_runner.h, check_tensorboard.)
#include <doctest/doctest.h>

#include <cstring>

#include "evenflow/io/event_file.h"
#include "tests/io/test_files.h"
#include "tests/testing/helpers.h"

using evenflow::io::EventWriter;
using evenflow::testing::error_of;
using evenflow::testing::read_bytes;
using evenflow::testing::TempDir;

TEST_CASE("event file: records are framed end to end, and bad folders and images are refused by name") {
  TempDir dir;
  std::string path;
  {
    EventWriter w(dir.path() / "run");
    path = w.path().string();
    CHECK(w.path().filename().string().rfind("events.out.tfevents.", 0) == 0);
    w.scalar("loss", 0.5, 1);
    w.image("samples", "\x89PNG fake", 2, 3, 3, 1);
    w.restart(2);
    CHECK(error_of([&] { w.image("samples", "x", 0, 3, 3, 1); }).find("image samples has size 0x3") !=
          std::string::npos);
    CHECK(error_of([&] { w.image("samples", "x", 2, 3, 2, 1); }).find("2 channels") != std::string::npos);
  }
  // Four records (the version, the scalar, the image, the restart): each its length, 4 bytes of
  // checksum, the event, 4 bytes of checksum, back to back to the end of the file.
  const std::string bytes = read_bytes(path);
  size_t at = 0, records = 0;
  while (at + 12 <= bytes.size()) {
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    at += 12 + length + 4;
    ++records;
  }
  CHECK(at == bytes.size());
  CHECK(records == 4);
  CHECK(bytes.find("brain.Event:2") != std::string::npos);

  const std::string blocked = dir.file("a_file");
  { std::ofstream(blocked) << "x"; }
  CHECK(error_of([&] { EventWriter w(std::filesystem::path(blocked) / "run"); }).find(blocked) != std::string::npos);
}
