// The progress bar (see progress.h).
#include "apps/common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <string>

namespace evenflow::apps {

namespace {

std::string clock_str(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::FILE* out, double plain_interval_s)
    : out_(out), tty_(::isatty(::fileno(out)) != 0), plain_interval_s_(plain_interval_s) {}

void ProgressBar::start(std::string title, int64_t total, int64_t first) {
  finish();
  title_ = std::move(title);
  total_ = total;
  first_ = first;
  last_step_ = first - 1;
  epoch_start_ = last_print_ = Clock::now();
}

void ProgressBar::update(int64_t step, double loss, double images_per_s) {
  last_step_ = step;
  last_loss_ = loss;
  last_rate_ = images_per_s;
  open_ = true;
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_print_).count();
  if (tty_ ? since >= 0.1 || step == total_ : since >= plain_interval_s_) {
    print(step, loss, images_per_s, false);
    last_print_ = now;
  }
}

void ProgressBar::finish() {
  if (!open_) return;
  print(last_step_, last_loss_, last_rate_, true);
  open_ = false;
}

void ProgressBar::print(int64_t step, double loss, double images_per_s, bool final_line) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - epoch_start_).count();
  const int64_t done = step - first_ + 1;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - step) : 0.0;
  char stats[160];
  std::snprintf(stats, sizeof(stats), "%lld/%lld  loss %.4f  %.0f img/s  %s %s", static_cast<long long>(step),
                static_cast<long long>(total_), loss, images_per_s, step == total_ ? "time" : "ETA",
                clock_str(step == total_ ? elapsed : eta).c_str());
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * step / total_) : kWidth;
    const std::string bar =
        std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(out_, "\r\033[K%s [%s] %s%s", title_.c_str(), bar.c_str(), stats, final_line ? "\n" : "");
  } else {
    std::fprintf(out_, "%s  %s\n", title_.c_str(), stats);
  }
  std::fflush(out_);
}

}  // namespace evenflow::apps
