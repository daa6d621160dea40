// RGB images for the apps: sample grids (wgan_gp), predictions next to ground truth (segment), and
// the PNG encoder the line plots use too. Written with libpng, atomically (io/file.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "evenflow/engine/tensor.h"

namespace evenflow::apps {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // row-major, 3 bytes a pixel

  RgbImage(int w, int h, Rgb background = {255, 255, 255});
  void set(int x, int y, Rgb c);  // ignores points outside
};

// The image as PNG bytes (ef::Error if libpng fails).
std::vector<uint8_t> encode_png(const RgbImage& image);
// Writes it atomically.
void write_png(const std::string& path, const RgbImage& image);

// Text in a 3x5 bitmap font, each dot 2x2 pixels (lower case drawn as upper case; characters
// without a glyph as blanks): its top left corner at (x, y), clipped to the image.
void draw_text(RgbImage& image, int x, int y, const std::string& text, Rgb c);
int text_width(const std::string& text);  // in pixels
inline constexpr int kTextHeight = 10;    // in pixels

// Images [N, C, H, W] (C = 1 grey, or 3 RGB; any device and float dtype) with values in [lo, hi]
// tiled in rows of `columns`, each pixel drawn `scale` x `scale`, 2-pixel white gaps. With
// `titles`, one per column, a band above the grid names the columns (each title cut to its
// column's width). ef::Error for other images, a bad layout, or titles not one per column.
RgbImage image_grid(const Tensor& images, int columns, double lo, double hi, int scale = 1,
                    const std::vector<std::string>& titles = {});

}  // namespace evenflow::apps
