// The metrics log of a training run (metrics.csv): named columns, one row per logging point (an
// evaluation, a generator step), a "step" column among them. The file is rewritten whole and
// atomically at each save, and read back when a run resumes, keeping the rows up to the
// checkpoint's step (Note [Save order] in run.h). An empty cell is a value not measured at that row
// (NaN in memory); every other cell is a finite number.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace evenflow::apps {

class MetricsLog {
 public:
  // ef::Error unless `columns` holds "step" once and no name twice.
  explicit MetricsLog(std::vector<std::string> columns);

  const std::vector<std::string>& columns() const { return columns_; }
  // Appends a row; `values` by name (columns not given are NaN: empty cells). ef::Error naming a
  // column the log does not have, or a row without its step.
  void append(const std::vector<std::pair<std::string, double>>& values);
  size_t size() const { return rows_.size(); }
  // Row i's value of `column` (NaN where empty). ef::Error for an unknown column.
  double at(size_t i, const std::string& column) const;
  // The log as CSV: the header, then the rows (%.9g, empty for NaN).
  std::string csv() const;
  // Writes csv() to `path` atomically.
  void write(const std::string& path) const;
  // Replaces the rows with `path`'s up to `step` (a save writes the metrics before the checkpoint,
  // so rows past it come from a run killed between the two). ef::Error naming the path and line for
  // a missing file, another header, a cell that is not a finite number, or a history that does not
  // reach `step` (0: none needed).
  void read_up_to(const std::string& path, int64_t step);

 private:
  size_t column(const std::string& name) const;
  std::vector<std::string> columns_;
  size_t step_column_ = 0;
  std::vector<std::vector<double>> rows_;
};

}  // namespace evenflow::apps
