// A small line-plot writer for the apps' training curves: axes with "nice" ticks, tick labels,
// a title, axis labels and a legend, drawn into an RGB image with a built-in 3x5 bitmap font and
// written as a PNG (image.h) (atomically, Note [Atomic writes] in io/file.h). No plotting
// library is needed, so every machine that builds the apps can draw their curves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/common/image.h"

namespace evenflow::apps {

// One curve: points (x[i], y[i]) joined by lines, with a marker at each point.
struct Series {
  std::string label = {};
  std::vector<double> x = {}, y = {};
  Rgb color = {};
};

struct LinePlot {
  std::string title = {};
  std::string x_label = {}, y_label = {};
  std::vector<Series> series = {};
  int width = 800, height = 500;
};

// Draws the plot (both axes span every series' points; the y axis includes 0) and writes the
// PNG. Throws ef::Error when a series' x and y differ in length or the file cannot be written.
void write_line_plot_png(const std::string& path, const LinePlot& plot);

}  // namespace evenflow::apps
