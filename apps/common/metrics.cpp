// The metrics log (see metrics.h).
#include "apps/common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "evenflow/engine/error.h"
#include "evenflow/io/file.h"

namespace evenflow::apps {

MetricsLog::MetricsLog(std::vector<std::string> columns) : columns_(std::move(columns)) {
  const std::set<std::string> names(columns_.begin(), columns_.end());
  EF_CHECK(names.size() == columns_.size() && names.count("step") == 1,
           "MetricsLog: the columns must be distinct and include \"step\"");
  step_column_ = column("step");
}

size_t MetricsLog::column(const std::string& name) const {
  const auto it = std::find(columns_.begin(), columns_.end(), name);
  EF_CHECK(it != columns_.end(), "MetricsLog: no column \"", name, "\"");
  return static_cast<size_t>(it - columns_.begin());
}

void MetricsLog::append(const std::vector<std::pair<std::string, double>>& values) {
  std::vector<double> row(columns_.size(), NAN);
  for (const auto& [name, v] : values) row[column(name)] = v;
  EF_CHECK(!std::isnan(row[step_column_]), "MetricsLog: a row needs its step");
  rows_.push_back(std::move(row));
}

double MetricsLog::at(size_t i, const std::string& name) const {
  return rows_.at(i)[column(name)];
}

std::string MetricsLog::csv() const {
  std::string text;
  for (size_t c = 0; c < columns_.size(); ++c) text += (c ? "," : "") + columns_[c];
  text += "\n";
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) {
      if (c) text += ",";
      if (std::isnan(row[c])) continue;
      char cell[32];
      std::snprintf(cell, sizeof cell, "%.9g", row[c]);
      text += cell;
    }
    text += "\n";
  }
  return text;
}

void MetricsLog::write(const std::string& path) const {
  const std::string text = csv();
  io::write_file_atomically(path, [&](io::OutputFile& f) { f.write(text.data(), text.size()); });
}

void MetricsLog::read_up_to(const std::string& path, int64_t step) {
  std::ifstream in(path);
  EF_CHECK(in.good(), "cannot read ", path, ": it holds the run's history up to its checkpoint");
  std::string header = csv().substr(0, csv().find('\n'));
  std::string line;
  EF_CHECK(std::getline(in, line) && line == header, path, ": line 1 is not the header \"", header, "\"");
  std::vector<std::vector<double>> rows;
  for (int n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    std::vector<double> row;
    std::stringstream cells(line + ",");  // the trailing comma makes a last empty cell a cell
    for (std::string cell; std::getline(cells, cell, ',');) {
      if (cell.empty()) {
        row.push_back(NAN);
        continue;
      }
      char* end = nullptr;
      const double v = std::strtod(cell.c_str(), &end);
      EF_CHECK(end == cell.c_str() + cell.size() && std::isfinite(v), path, ": line ", n, " holds \"", cell,
               "\", which is not a finite number");
      row.push_back(v);
    }
    EF_CHECK(row.size() == columns_.size(), path, ": line ", n, " has ", row.size(), " cells, the header ",
             columns_.size());
    const double s = row[step_column_];
    EF_CHECK(!std::isnan(s) && s >= 0 && s == std::floor(s), path, ": line ", n, " has no step count");
    if (s <= static_cast<double>(step)) rows.push_back(std::move(row));
  }
  EF_CHECK(step == 0 || (!rows.empty() && rows.back()[step_column_] == static_cast<double>(step)), "--resume: ", path,
           " has no row for step ", step, ", the checkpoint's step (its last row is at step ",
           rows.empty() ? 0.0 : rows.back()[step_column_], ")");
  rows_ = std::move(rows);
}

}  // namespace evenflow::apps
