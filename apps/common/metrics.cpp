// metrics.csv (see metrics.h).
#include "apps/common/metrics.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "evenflow/engine/error.h"
#include "evenflow/io/file.h"

namespace evenflow::apps {

void write_metrics_csv(const std::string& path, const std::vector<MetricsRow>& rows) {
  std::string text = std::string(kMetricsHeader) + "\n";
  for (const MetricsRow& r : rows) {
    char line[256];
    std::snprintf(line, sizeof(line), "%.6g,%" PRId64 ",%.9g,%.9g,%.6f,%.3f,%.1f\n", r.epoch, r.step, r.train_loss,
                  r.test_loss, r.test_accuracy, r.seconds, r.images_per_s);
    text += line;
  }
  io::write_file_atomically(path, [&](io::OutputFile& f) { f.write(text.data(), text.size()); });
}

std::vector<MetricsRow> read_metrics_csv(const std::string& path) {
  std::vector<MetricsRow> rows;
  std::ifstream in(path);
  EF_CHECK(in.good(), "cannot read ", path, ": it holds the run's history up to its checkpoint");
  std::string line;
  EF_CHECK(std::getline(in, line) && line == kMetricsHeader, path, ": line 1 is not the header \"", kMetricsHeader,
           "\"");
  for (int n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    MetricsRow r;
    char end = 0;
    const int got = std::sscanf(line.c_str(), "%lf,%" SCNd64 ",%lf,%lf,%lf,%lf,%lf%c", &r.epoch, &r.step, &r.train_loss,
                                &r.test_loss, &r.test_accuracy, &r.seconds, &r.images_per_s, &end);
    EF_CHECK(got == 7, path, ": line ", n, " is not a row of 7 numbers: \"", line, "\"");
    for (double v : {r.epoch, r.train_loss, r.test_loss, r.test_accuracy, r.seconds, r.images_per_s})
      EF_CHECK(std::isfinite(v), path, ": line ", n, " holds a number that is not finite: \"", line, "\"");
    rows.push_back(r);
  }
  return rows;
}

}  // namespace evenflow::apps
