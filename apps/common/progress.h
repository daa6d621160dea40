// A training progress bar on a stream (stderr by default): what is running (an epoch, the
// generator steps), step/total in the program's unit, loss, images/s and the ETA. On a terminal one line is redrawn in
// place; otherwise (a log file, a pipe, CI) a plain line is printed at most every few seconds and at the end of each
// epoch, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace evenflow::apps {

class ProgressBar {
 public:
  explicit ProgressBar(std::FILE* out = stderr, double plain_interval_s = 5.0);

  // A new stretch of `total` steps, named by `title` ("epoch 2/10", "generator steps"), whose first
  // step to run is `first` (1-based; > 1 on a resume).
  void start(std::string title, int64_t total, int64_t first = 1);
  // Step `step` of the stretch is done (1-based), with that step's loss and the images per second so far.
  void update(int64_t step, double loss, double images_per_s);
  // Ends the current line (after the last update of an epoch or of a stopped run).
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  void print(int64_t step, double loss, double images_per_s, bool final_line);

  std::FILE* out_;
  bool tty_;
  double plain_interval_s_;
  std::string title_;
  int64_t total_ = 0, first_ = 1, last_step_ = 0;
  double last_loss_ = 0, last_rate_ = 0;
  bool open_ = false;  // a line is pending (tty) or the epoch has unprinted progress
  Clock::time_point epoch_start_ = {}, last_print_ = {};
};

}  // namespace evenflow::apps
