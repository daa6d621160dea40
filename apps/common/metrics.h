// The per-evaluation metrics an app logs while training (metrics.csv): one row each time the test
// set is evaluated (the end of each epoch, and the end of a run stopped mid-epoch). The file is
// rewritten whole and atomically at each row, and read back when a run resumes, so an interrupted
// run's log continues where it stopped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace evenflow::apps {

struct MetricsRow {
  double epoch = 0;       // epochs done, fractional when the run stopped mid-epoch
  int64_t step = 0;       // optimizer steps done
  double train_loss = 0;  // mean training loss over the steps since the previous row
  double test_loss = 0;
  double test_accuracy = 0;  // in [0, 1]
  double seconds = 0;        // training time since the previous row (evaluation excluded)
  double images_per_s = 0;   // training images per second over those seconds
};

inline constexpr const char* kMetricsHeader = "epoch,step,train_loss,test_loss,test_accuracy,seconds,images_per_s";

// Writes the header and the rows (atomically).
void write_metrics_csv(const std::string& path, const std::vector<MetricsRow>& rows);
// Reads a file write_metrics_csv wrote. Throws ef::Error naming the path (and line) when it is
// missing, or the header or a row is malformed or holds a number that is not finite.
std::vector<MetricsRow> read_metrics_csv(const std::string& path);

}  // namespace evenflow::apps
