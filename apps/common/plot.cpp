// Line plots as PNG (see plot.h): a canvas with lines, markers and bitmap text, and libpng.
#include "apps/common/plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "evenflow/engine/error.h"

namespace evenflow::apps {

namespace {

constexpr Rgb kBlack{0, 0, 0}, kGrey{220, 220, 220}, kWhite{255, 255, 255};

class Canvas {
 public:
  Canvas(int w, int h) : image_(w, h) {}

  void set(int x, int y, Rgb c) { image_.set(x, y, c); }
  void rect(int x, int y, int w, int h, Rgb c) {
    for (int j = y; j < y + h; ++j)
      for (int i = x; i < x + w; ++i) set(i, j, c);
  }
  // Bresenham, `thick` pixels wide.
  void line(int x0, int y0, int x1, int y1, Rgb c, int thick = 1) {
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
      rect(x0 - thick / 2, y0 - thick / 2, thick, thick, c);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }
  void text(int x, int y, const std::string& s, Rgb c) { draw_text(image_, x, y, s, c); }
  static int text_width(const std::string& s) { return apps::text_width(s); }

  RgbImage& image() { return image_; }

 private:
  RgbImage image_;
};

// `c` mixed with white: a light tint of it, for the raw points behind a smoothed curve.
Rgb tint(Rgb c) {
  const auto mix = [](uint8_t v) { return static_cast<uint8_t>(v + (255 - v) * 3 / 4); };
  return {mix(c.r), mix(c.g), mix(c.b)};
}

// The centred moving average of y over `window` points (fewer at the ends), by prefix sums.
std::vector<double> moving_average(const std::vector<double>& y, size_t window) {
  std::vector<double> prefix(y.size() + 1, 0.0);
  for (size_t i = 0; i < y.size(); ++i) prefix[i + 1] = prefix[i] + y[i];
  std::vector<double> out(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    const size_t lo = i >= window / 2 ? i - window / 2 : 0, hi = std::min(y.size(), i + window / 2 + 1);
    out[i] = (prefix[hi] - prefix[lo]) / static_cast<double>(hi - lo);
  }
  return out;
}

// About `target` ticks at multiples of 1, 2 or 5 times a power of ten covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 6) {
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + 1e-9 * step; t += step)
    ticks.push_back(std::abs(t) < 1e-12 * step ? 0.0 : t);
  return ticks;
}

std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

RgbImage draw_line_plot(const LinePlot& plot) {
  double x_lo = 0, x_hi = -INFINITY, y_lo = 0, y_hi = -INFINITY;  // both axes include 0
  for (const Series& s : plot.series) {
    EF_CHECK(s.x.size() == s.y.size(), "write_line_plot_png: series \"", s.label, "\" has ", s.x.size(),
             " x values and ", s.y.size(), " y values");
    for (size_t i = 0; i < s.x.size(); ++i) {
      x_lo = std::min(x_lo, s.x[i]);
      x_hi = std::max(x_hi, s.x[i]);
      y_lo = std::min(y_lo, s.y[i]);
      y_hi = std::max(y_hi, s.y[i]);
    }
  }
  if (!(x_hi > x_lo)) x_hi = x_lo + 1;  // no points, or all at x = 0
  if (!(y_hi > y_lo)) y_hi = y_lo + 1;
  const std::vector<double> xt = nice_ticks(x_lo, x_hi), yt = nice_ticks(y_lo, y_hi);
  x_lo = std::min(x_lo, xt.front()), x_hi = std::max(x_hi, xt.back());
  y_lo = std::min(y_lo, yt.front()), y_hi = std::max(y_hi, yt.back());

  Canvas c(plot.width, plot.height);
  const int left = 80, right = plot.width - 30, top = 50, bottom = plot.height - 60;
  auto px = [&](double x) { return left + static_cast<int>(std::lround((x - x_lo) / (x_hi - x_lo) * (right - left))); };
  auto py = [&](double y) {
    return bottom - static_cast<int>(std::lround((y - y_lo) / (y_hi - y_lo) * (bottom - top)));
  };

  for (double t : xt) {  // grid, ticks, labels
    const std::string l = tick_label(t);
    c.line(px(t), top, px(t), bottom, kGrey);
    c.line(px(t), bottom, px(t), bottom + 5, kBlack);
    c.text(px(t) - Canvas::text_width(l) / 2, bottom + 10, l, kBlack);
  }
  for (double t : yt) {
    const std::string l = tick_label(t);
    c.line(left, py(t), right, py(t), kGrey);
    c.line(left - 5, py(t), left, py(t), kBlack);
    c.text(left - 10 - Canvas::text_width(l), py(t) - kTextHeight / 2, l, kBlack);
  }
  c.line(left, top, left, bottom, kBlack);
  c.line(left, bottom, right, bottom, kBlack);
  c.text((plot.width - Canvas::text_width(plot.title)) / 2, 15, plot.title, kBlack);
  c.text((left + right - Canvas::text_width(plot.x_label)) / 2, bottom + 35, plot.x_label, kBlack);
  c.text(10, top - 25, plot.y_label, kBlack);

  // Note [Curves at any number of points]: markers where the points are far apart; a plain line
  // where they are a few pixels apart; where they are denser than 2 pixels apart (a loss at every
  // step of a long run), the raw line in a light tint and a moving average over about 1% of the
  // points on it, so that noise reads as a light band around a curve, not as a solid band.
  const auto polyline = [&](const std::vector<double>& x, const std::vector<double>& y, Rgb color, int thick) {
    for (size_t i = 0; i + 1 < x.size(); ++i) c.line(px(x[i]), py(y[i]), px(x[i + 1]), py(y[i + 1]), color, thick);
  };
  for (const Series& s : plot.series) {
    const double pixels_apart = s.x.size() > 1 ? (right - left) / static_cast<double>(s.x.size() - 1) : right - left;
    if (pixels_apart < 2) {
      polyline(s.x, s.y, tint(s.color), 1);
      polyline(s.x, moving_average(s.y, std::max<size_t>(5, s.x.size() / 100)), s.color, 2);
      continue;
    }
    polyline(s.x, s.y, s.color, 2);
    if (pixels_apart >= 12)
      for (size_t i = 0; i < s.x.size(); ++i) c.rect(px(s.x[i]) - 3, py(s.y[i]) - 3, 7, 7, s.color);
  }

  // Legend, top right, on a white box.
  int legend_w = 0;
  for (const Series& s : plot.series) legend_w = std::max(legend_w, Canvas::text_width(s.label));
  const int lx = right - legend_w - 50, ly = top + 10, row_h = kTextHeight + 8;
  c.rect(lx - 8, ly - 6, legend_w + 50, static_cast<int>(plot.series.size()) * row_h + 6, kWhite);
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const int y = ly + static_cast<int>(i) * row_h;
    c.line(lx, y + kTextHeight / 2, lx + 24, y + kTextHeight / 2, plot.series[i].color, 3);
    c.text(lx + 32, y, plot.series[i].label, kBlack);
  }

  return std::move(c.image());
}

void write_line_plot_png(const std::string& path, const LinePlot& plot) {
  write_png(path, draw_line_plot(plot));
}

}  // namespace evenflow::apps
