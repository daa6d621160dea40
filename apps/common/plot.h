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

// One curve: points (x[i], y[i]) joined by lines, with a marker at each where they are few, and a
// moving average over them where they are dense (Note [Curves at any number of points], plot.cpp).
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

// Draws the plot: both axes span every series' points, and the y axis includes 0. Throws ef::Error
// when a series' x and y differ in length.
RgbImage draw_line_plot(const LinePlot& plot);
// Draws the plot and writes it as a PNG, atomically; also ef::Error when the file cannot be written.
void write_line_plot_png(const std::string& path, const LinePlot& plot);

}  // namespace evenflow::apps
