/// @file
/// TensorBoard event files: what `tensorboard --logdir` reads. An EventWriter appends scalars and
/// images to one file, `events.out.tfevents.<time>.<host>.<pid>.evenflow`, in a folder. The format
/// is TFRecord framing (length, masked CRC-32C of the length, payload, masked CRC-32C of the payload)
/// around TensorFlow's `Event` protocol buffers, encoded here by hand (Note [Event encoding] in
/// event_file.cpp): evenflow links no protobuf library, because Ray's C++ library, which a program
/// may load for preprocessing, carries its own, and two copies in one process are a known source of
/// clashes.
///
///   io::EventWriter events("runs/x");
///   events.scalar("train_loss", 0.53, step);
///   events.flush();
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace evenflow::io {

/// An event file being written (see the file's description). One thread writes to it.
class EventWriter {
 public:
  /// Creates a new event file in `folder` (created if missing) and writes its first event, the file
  /// version. ef::Error naming the path when it cannot be created.
  explicit EventWriter(const std::filesystem::path& folder);
  ~EventWriter();  ///< flushes and closes the file
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  /// A scalar (stored as float32, as TensorBoard keeps every scalar) at `step`.
  void scalar(const std::string& tag, double value, int64_t step);
  /// An image at `step`: `png` holds a PNG file of height x width pixels with `channels` channels
  /// (1 grey, 3 RGB, 4 RGBA). ef::Error for sizes that are not positive or another channel count.
  void image(const std::string& tag, const std::string& png, int64_t height, int64_t width, int channels, int64_t step);
  /// Text at `step`, shown by TensorBoard's text dashboard as Markdown (a run's settings).
  void text(const std::string& tag, const std::string& markdown, int64_t step);
  /// Marks a restart at `step` (a resumed run's first step): TensorBoard drops what earlier files of
  /// the folder logged at `step` and after, the steps a killed run logged past its last checkpoint.
  void restart(int64_t step);
  /// Pushes what was written to the file (TensorBoard reads it while the run goes on).
  void flush();
  /// The file's path.
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_event(const std::string& event);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace evenflow::io
