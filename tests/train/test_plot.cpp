// The training curves (apps/common/plot.h, Note [Curves at any number of points]): markers where
// points are few, and at 10,000 noisy points a curve, not a solid band of the series' colour.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "apps/common/image.h"
#include "apps/common/plot.h"
#include "evenflow/engine/ops.h"

using namespace evenflow::apps;

namespace {

constexpr Rgb kRed{200, 30, 30};

// Pixels of exactly colour `c` (the series' own; its light tint does not count).
int64_t pixels_of(const RgbImage& image, Rgb c) {
  int64_t n = 0;
  for (size_t i = 0; i + 2 < image.pixels.size(); i += 3)
    n += image.pixels[i] == c.r && image.pixels[i + 1] == c.g && image.pixels[i + 2] == c.b;
  return n;
}

RgbImage plot_of(int64_t points, bool noisy) {
  Series s{.label = "loss", .color = kRed};
  for (int64_t i = 0; i < points; ++i) {
    s.x.push_back(static_cast<double>(i));
    // A loss falling from 2 to 1, with ±0.5 noise from step to step.
    s.y.push_back(1.0 + std::exp(-static_cast<double>(i) / static_cast<double>(points)) +
                  (noisy ? 0.5 * ((i * 7919) % 13 - 6) / 6.0 : 0.0));
  }
  return draw_line_plot({.title = "t", .x_label = "step", .y_label = "loss", .series = {s}});
}

}  // namespace

TEST_CASE("plot: a few points get markers, many a line, 10,000 noisy ones a smoothed curve over a light band") {
  // The legend's sample line is in the colour too: 24 x 3 pixels.
  const int64_t few = pixels_of(plot_of(5, false), kRed);
  const int64_t line = pixels_of(plot_of(200, false), kRed);
  const int64_t dense = pixels_of(plot_of(10000, true), kRed);
  // Five 7x7 markers and the lines between them; a 2-pixel line across the 690-pixel plot.
  CHECK(few >= 5 * 49 + 690);
  CHECK(line < 3 * 800);
  // The smoothed curve is a line a few pixels thick (its moving average keeps a wiggle of the
  // noise's period); drawn as it is, the noise would cover the band it spans (±0.5 on an axis of
  // 2.5: a fifth of the 390-pixel height, ~80 x 690 pixels).
  CHECK(dense < 8 * 690);
  CHECK(dense > 690);
  // The raw points are there, light.
  const RgbImage image = plot_of(10000, true);
  const int64_t light = pixels_of(image, Rgb{241, 198, 198});
  CHECK(light > 20 * 690);
}

TEST_CASE("image grid: column titles in a band above the columns, cut to fit; a title per column or an error") {
  const evenflow::Tensor images = evenflow::full({4, 1, 8, 8}, 0.5);
  const RgbImage plain = image_grid(images, 2, 0.0, 1.0, 4);
  const RgbImage titled = image_grid(images, 2, 0.0, 1.0, 4, {"input", "a title far wider than its column"});
  CHECK(titled.width == plain.width);
  CHECK(titled.height == plain.height + kTextHeight + 4);
  // Black text in the band, over each column and nowhere past the second column's right edge.
  const auto black_in = [&](int x0, int x1) {
    int n = 0;
    for (int y = 0; y < kTextHeight + 4; ++y)
      for (int x = x0; x < x1; ++x) {
        const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(titled.width) + static_cast<size_t>(x)) * 3;
        n += titled.pixels[i] == 0 && titled.pixels[i + 1] == 0 && titled.pixels[i + 2] == 0;
      }
    return n;
  };
  CHECK(black_in(2, 34) > 0);
  CHECK(black_in(36, 68) > 0);
  CHECK(black_in(68, titled.width) == 0);
  // The grid itself is the untitled one, moved down by the band.
  const size_t band = static_cast<size_t>(kTextHeight + 4) * static_cast<size_t>(titled.width) * 3;
  CHECK(std::vector<uint8_t>(titled.pixels.begin() + static_cast<std::ptrdiff_t>(band), titled.pixels.end()) ==
        plain.pixels);
  CHECK_THROWS_WITH(image_grid(images, 2, 0.0, 1.0, 4, {"one"}), "image_grid: 1 titles for 2 columns");
}
