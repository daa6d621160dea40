#include "apps/common/image.h"

#include <png.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>

#include "evenflow/engine/error.h"
#include "evenflow/engine/ops.h"
#include "evenflow/io/file.h"

namespace evenflow::apps {

namespace {

// A 3x5 font: five rows per glyph, top first, three bits per row (4 = left column, 1 = right).
// Lower-case letters are drawn as upper-case; characters without a glyph as blanks.
struct Glyph {
  char c;
  std::array<uint8_t, 5> rows;
};
constexpr std::array<Glyph, 50> kFont{{
    {'0', {7, 5, 5, 5, 7}}, {'1', {2, 6, 2, 2, 7}}, {'2', {7, 1, 7, 4, 7}}, {'3', {7, 1, 7, 1, 7}},
    {'4', {5, 5, 7, 1, 1}}, {'5', {7, 4, 7, 1, 7}}, {'6', {7, 4, 7, 5, 7}}, {'7', {7, 1, 1, 2, 2}},
    {'8', {7, 5, 7, 5, 7}}, {'9', {7, 5, 7, 1, 7}}, {'A', {2, 5, 7, 5, 5}}, {'B', {6, 5, 6, 5, 6}},
    {'C', {3, 4, 4, 4, 3}}, {'D', {6, 5, 5, 5, 6}}, {'E', {7, 4, 6, 4, 7}}, {'F', {7, 4, 6, 4, 4}},
    {'G', {3, 4, 5, 5, 3}}, {'H', {5, 5, 7, 5, 5}}, {'I', {7, 2, 2, 2, 7}}, {'J', {1, 1, 1, 5, 2}},
    {'K', {5, 5, 6, 5, 5}}, {'L', {4, 4, 4, 4, 7}}, {'M', {5, 7, 7, 5, 5}}, {'N', {6, 5, 5, 5, 5}},
    {'O', {2, 5, 5, 5, 2}}, {'P', {6, 5, 6, 4, 4}}, {'Q', {2, 5, 5, 6, 3}}, {'R', {6, 5, 6, 5, 5}},
    {'S', {3, 4, 2, 1, 6}}, {'T', {7, 2, 2, 2, 2}}, {'U', {5, 5, 5, 5, 7}}, {'V', {5, 5, 5, 5, 2}},
    {'W', {5, 5, 7, 7, 5}}, {'X', {5, 5, 2, 5, 5}}, {'Y', {5, 5, 2, 2, 2}}, {'Z', {7, 1, 2, 4, 7}},
    {'.', {0, 0, 0, 0, 2}}, {'-', {0, 0, 7, 0, 0}}, {':', {0, 2, 0, 2, 0}}, {'%', {5, 1, 2, 4, 5}},
    {'/', {1, 1, 2, 4, 4}}, {'(', {1, 2, 2, 2, 1}}, {')', {4, 2, 2, 2, 4}}, {'+', {0, 2, 7, 2, 0}},
    {',', {0, 0, 0, 2, 4}}, {'_', {0, 0, 0, 0, 7}}, {'=', {0, 7, 0, 7, 0}}, {'[', {3, 2, 2, 2, 3}},
    {']', {6, 2, 2, 2, 6}}, {' ', {0, 0, 0, 0, 0}},
}};
constexpr int kScale = 2;           // pixels per font dot
constexpr int kCharW = 4 * kScale;  // 3 dots and a space

const Glyph* glyph(char c) {
  const char up = c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
  for (const Glyph& g : kFont)
    if (g.c == up) return &g;
  return nullptr;
}

}  // namespace

void draw_text(RgbImage& image, int x, int y, const std::string& text, Rgb c) {
  for (char ch : text) {
    if (const Glyph* g = glyph(ch))
      for (int row = 0; row < 5; ++row)
        for (int col = 0; col < 3; ++col)
          if (g->rows[static_cast<size_t>(row)] & (4 >> col))
            for (int dy = 0; dy < kScale; ++dy)
              for (int dx = 0; dx < kScale; ++dx) image.set(x + col * kScale + dx, y + row * kScale + dy, c);
    x += kCharW;
  }
}

int text_width(const std::string& text) {
  return text.empty() ? 0 : static_cast<int>(text.size()) * kCharW - kScale;
}

RgbImage::RgbImage(int w, int h, Rgb background) : width(w), height(h) {
  EF_CHECK(w > 0 && h > 0, "RgbImage: size must be positive, got ", w, "x", h);
  pixels.resize(static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  for (size_t i = 0; i < pixels.size(); i += 3) {
    pixels[i] = background.r;
    pixels[i + 1] = background.g;
    pixels[i + 2] = background.b;
  }
}

void RgbImage::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3;
  pixels[i] = c.r;
  pixels[i + 1] = c.g;
  pixels[i + 2] = c.b;
}

namespace {
void append_bytes(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

// Runs libpng's writer; false when libpng reported an error (it longjmps back to the setjmp here,
// which is why this function modifies no local after it).
bool run_png_writer(png_structp png, png_infop info, png_bytepp rows, int w, int h, std::vector<uint8_t>* out) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_write_fn(png, out, append_bytes, nullptr);
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  return true;
}
}  // namespace

// Encodes into memory, so that no C++ exception crosses libpng.
std::vector<uint8_t> encode_png(const RgbImage& image) {
  std::vector<uint8_t> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  EF_CHECK(png != nullptr, "encode_png: png_create_write_struct failed");
  png_infop info = png_create_info_struct(png);
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (int y = 0; y < image.height; ++y)
    rows[static_cast<size_t>(y)] =
        const_cast<png_bytep>(image.pixels.data() + static_cast<size_t>(y) * static_cast<size_t>(image.width) * 3);
  const bool ok = info != nullptr && run_png_writer(png, info, rows.data(), image.width, image.height, &out);
  png_destroy_write_struct(&png, &info);
  EF_CHECK(ok, "encode_png: libpng failed to encode the image");
  return out;
}

void write_png(const std::string& path, const RgbImage& image) {
  const std::vector<uint8_t> bytes = encode_png(image);
  io::write_file_atomically(path, [&](io::OutputFile& f) { f.write(bytes.data(), bytes.size()); });
}

RgbImage image_grid(const Tensor& images, int columns, double lo, double hi, int scale,
                    const std::vector<std::string>& titles) {
  EF_CHECK(images.defined() && images.dim() == 4 && (images.size(1) == 1 || images.size(1) == 3),
           "image_grid: expected images [N, 1 or 3, H, W], got ",
           images.defined() ? shape_str(images.shape()) : "undefined");
  EF_CHECK(columns > 0 && scale > 0 && hi > lo, "image_grid: bad layout (columns ", columns, ", scale ", scale,
           ", range [", lo, ", ", hi, "])");
  const int n = static_cast<int>(images.size(0)), c = static_cast<int>(images.size(1));
  const int h = static_cast<int>(images.size(2)), w = static_cast<int>(images.size(3));
  const int cols = std::min(columns, std::max(n, 1)), rows = (n + cols - 1) / cols;
  EF_CHECK(titles.empty() || static_cast<int>(titles.size()) == cols, "image_grid: ", titles.size(), " titles for ",
           cols, " columns");
  constexpr int kGap = 2;
  const int band = titles.empty() ? 0 : kTextHeight + 2 * kGap;  // the titles' band above the grid
  RgbImage out(kGap + cols * (w * scale + kGap), band + kGap + std::max(rows, 1) * (h * scale + kGap));
  for (size_t col = 0; col < titles.size(); ++col) {
    std::string title = titles[col];
    while (!title.empty() && text_width(title) > w * scale) title.pop_back();
    const int x0 = kGap + static_cast<int>(col) * (w * scale + kGap);
    draw_text(out, x0 + (w * scale - text_width(title)) / 2, kGap, title, Rgb{0, 0, 0});
  }
  const std::vector<double> v = images.to(cpu()).to(kFloat64).contiguous().to_vector();
  auto byte = [&](double x) {
    return static_cast<uint8_t>(std::lround(255.0 * std::clamp((x - lo) / (hi - lo), 0.0, 1.0)));
  };
  for (int i = 0; i < n; ++i) {
    const int x0 = kGap + (i % cols) * (w * scale + kGap), y0 = band + kGap + (i / cols) * (h * scale + kGap);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        auto at = [&](int ch) {
          return v[((static_cast<size_t>(i) * static_cast<size_t>(c) + static_cast<size_t>(ch)) *
                        static_cast<size_t>(h) +
                    static_cast<size_t>(y)) *
                       static_cast<size_t>(w) +
                   static_cast<size_t>(x)];
        };
        const Rgb px = c == 1 ? Rgb{byte(at(0)), byte(at(0)), byte(at(0))} : Rgb{byte(at(0)), byte(at(1)), byte(at(2))};
        for (int dy = 0; dy < scale; ++dy)
          for (int dx = 0; dx < scale; ++dx) out.set(x0 + x * scale + dx, y0 + y * scale + dy, px);
      }
    }
  }
  return out;
}

}  // namespace evenflow::apps
