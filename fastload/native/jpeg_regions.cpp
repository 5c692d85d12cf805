// See jpeg_regions.h. Plain byte parsing: every read is bounds-checked against size, nothing allocates.
#include "jpeg_regions.h"

#include <algorithm>
#include <cstring>

namespace fastload {
namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline unsigned be16(const uint8_t* p) { return (static_cast<unsigned>(p[0]) << 8) | p[1]; }

// Whether libjpeg upsamples some component along x / y when decoding at 1/d: it first scales a subsampled
// component's IDCT up by powers of 2 while that divides out its ratio (jdmaster.c), so 4:2:0 at 1/2 and 1/4 needs
// no upsampling at all; and it upsamples with neighbours (fancy) only above 1/8.
void upsampled_axes(const RestartLayout& L, int64_t d, bool* along_x, bool* along_y) {
  *along_x = *along_y = false;
  if (L.components < 2 || d >= 8) return;
  const int h_max = static_cast<int>(L.mcu_w / 8), v_max = static_cast<int>(L.mcu_h / 8);  // interleaved MCU
  const int scaled = static_cast<int>(8 / d);
  for (int c = 0; c < L.components; ++c) {
    int size = scaled;
    while (size < 8 && (h_max * scaled) % (L.h_samp[c] * size * 2) == 0 &&
           (v_max * scaled) % (L.v_samp[c] * size * 2) == 0)
      size *= 2;
    *along_x = *along_x || h_max * scaled > L.h_samp[c] * size;
    *along_y = *along_y || v_max * scaled > L.v_samp[c] * size;
  }
}

}  // namespace

bool parse_restart_layout(const uint8_t* data, size_t size, RestartLayout* out) {
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return false;
  size_t pos = 2;
  int components = 0, h_max = 0, v_max = 0;
  bool have_sof = false;
  for (;;) {
    if (pos >= size || data[pos] != 0xFF) return false;
    while (pos < size && data[pos] == 0xFF) ++pos;  // fill bytes
    if (pos + 3 > size) return false;
    const unsigned marker = data[pos++];
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD9)) return false;  // no standalone markers here
    const size_t length = be16(data + pos);
    if (length < 2 || pos + length > size) return false;
    const uint8_t* body = data + pos + 2;
    const size_t body_size = length - 2;
    if (marker == 0xC0 || marker == 0xC1) {  // baseline / extended sequential, Huffman
      if (have_sof || body_size < 6 || body[0] != 8) return false;
      components = body[5];
      if (components < 1 || components > 4 || body_size != 6 + 3 * static_cast<size_t>(components)) return false;
      out->height = be16(body + 1);
      out->width = be16(body + 3);
      out->sof_dims_at = pos + 3;
      for (int c = 0; c < components; ++c) {
        const int h = body[6 + 3 * c + 1] >> 4, v = body[6 + 3 * c + 1] & 15;
        if (h < 1 || h > 4 || v < 1 || v > 4) return false;
        out->h_samp[c] = h;
        out->v_samp[c] = v;
        h_max = std::max(h_max, h);
        v_max = std::max(v_max, v);
      }
      have_sof = true;
    } else if ((marker >= 0xC2 && marker <= 0xCF) && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
      return false;  // progressive, lossless or arithmetic: no slicing
    } else if (marker == 0xDD) {  // DRI
      if (body_size != 2) return false;
      out->interval = be16(body);
    } else if (marker == 0xDC) {
      return false;  // DNL: the height comes after the data
    } else if (marker == 0xDA) {  // SOS: must hold every component (one interleaved scan)
      if (!have_sof || body_size < 1 || body[0] != components) return false;
      out->entropy_at = pos + length;
      break;
    }
    pos += length;
  }
  if (out->height == 0 || out->width == 0 || out->interval == 0) return false;
  out->components = components;
  // A one-component scan is not interleaved: its MCU is one 8x8 block whatever the sampling factors.
  out->mcu_h = components == 1 ? 8 : 8 * v_max;
  out->mcu_w = components == 1 ? 8 : 8 * h_max;
  out->mcus_per_row = ceil_div(out->width, out->mcu_w);
  out->mcu_rows = ceil_div(out->height, out->mcu_h);
  return out->mcus_per_row % out->interval == 0 || out->interval % out->mcus_per_row == 0;
}

size_t build_region(const uint8_t* data, size_t size, const RestartLayout& L, const Window& window,
                    uint8_t* out, size_t capacity, Window* sub_window) {
  if (capacity < size + 2 || L.entropy_at >= size) return 0;
  // MCU rows and columns holding the window, and one MCU of context on a side where the window comes near the
  // MCU's edge. libjpeg takes the region's edges for the image's: fancy upsampling of chroma subsampled 2:1 then
  // repeats the edge sample instead of reading its neighbour, which changes output pixels within one chroma
  // sample (2 pixels of the 1/d image) of the edge. A window whose first pixel lies at least 2 pixels of the 1/d
  // image inside its MCU (2d here), and whose last lies at least 2 before the MCU's end (3d here: its end is
  // rounded up at scale 1/d), sees no difference; one MCU of context is always enough (at least 2 pixels at
  // every scale with fancy upsampling, which libjpeg turns off at 1/8); where it does not upsample, none is
  // needed.
  // Context left out is entropy decoding saved (a loader crop's decode: -7% on the dev machine, bench/RESULTS.md).
  const int64_t d = std::max<int64_t>(1, window.downscale);
  bool context_x, context_y;  // only along an axis where libjpeg upsamples at this scale
  upsampled_axes(L, d, &context_x, &context_y);
  const auto around = [d](bool context, int64_t start, int64_t length, int64_t mcu, int64_t size, int64_t* first,
                          int64_t* end) {
    *first = start / mcu;
    if (context && start - *first * mcu < 2 * d && *first > 0) --*first;
    *end = ceil_div(start + length, mcu);
    if (context && *end * mcu - (start + length) < 3 * d && *end * mcu < size) ++*end;
    *end = std::min(*end, ceil_div(size, mcu));
  };
  int64_t r0, r1, c0, c1;
  around(context_y, window.top, window.height, L.mcu_h, L.height, &r0, &r1);
  around(context_x, window.left, window.width, L.mcu_w, L.width, &c0, &c1);
  // libjpeg picks fancy upsampling only for chroma more than 2 samples wide (jdsample.c), from the image it is
  // given: a region one MCU across (a last, partial MCU column; one MCU at 1/4) would be upsampled by
  // replication instead. Two MCUs are always wider. Rows too, in case a libjpeg decides by height.
  const auto two_wide = [](int64_t* first, int64_t* end, int64_t count) {
    if (*end - *first >= 2) return;
    if (*first > 0) --*first;
    else if (*end < count) ++*end;
  };
  two_wide(&r0, &r1, L.mcu_rows);
  two_wide(&c0, &c1, L.mcus_per_row);
  // Segments in a grid: rows x per_row, each `interval` MCUs wide, or `rows_per` MCU rows tall.
  const bool in_row = L.mcus_per_row % L.interval == 0;
  const int64_t per_row = in_row ? L.mcus_per_row / L.interval : 1;
  const int64_t rows_per = in_row ? 1 : L.interval / L.mcus_per_row;
  r0 = r0 / rows_per * rows_per;
  r1 = std::min(L.mcu_rows, ceil_div(r1, rows_per) * rows_per);
  const int64_t s0 = in_row ? c0 / L.interval : 0;
  const int64_t s1 = in_row ? ceil_div(c1, L.interval) : 1;
  if (r0 == 0 && r1 == L.mcu_rows && s0 == 0 && s1 == per_row) return 0;  // the whole image: nothing to gain
  const int64_t x0 = s0 * L.interval * L.mcu_w;
  const int64_t sub_w = (in_row ? std::min(L.width, s1 * L.interval * L.mcu_w) : L.width) - x0;
  const int64_t sub_h = std::min(L.height, r1 * L.mcu_h) - r0 * L.mcu_h;

  std::memcpy(out, data, L.entropy_at);
  out[L.sof_dims_at] = static_cast<uint8_t>(sub_h >> 8);
  out[L.sof_dims_at + 1] = static_cast<uint8_t>(sub_h);
  out[L.sof_dims_at + 2] = static_cast<uint8_t>(sub_w >> 8);
  out[L.sof_dims_at + 3] = static_cast<uint8_t>(sub_w);
  size_t n = L.entropy_at;

  // Walk the entropy-coded data segment by segment (0xFF00 is a stuffed byte, 0xFFFF fill, 0xFFD0-D7 RSTn),
  // copying the wanted ones and renumbering their markers, then on to the end of the scan to count the rest.
  // Sequence numbers alone do not place a segment: a file that lost 8 markers in a row (a multiple of 8, in
  // general) numbers on in sequence, and every segment after the loss would be read as the MCUs 8 segments
  // earlier, clean data decoding to the wrong pixels. So the scan must hold exactly the layout's count of
  // segments, or the slicer steps aside (the plain decode then meets the damage where it reads it). Counting to
  // the end costs a memchr over the rest of the scan, a few us against the region's decode. A file that lost
  // markers and gained as many elsewhere is left to the decoder, which reports it where it reads the damage.
  const int64_t total = in_row ? L.mcu_rows * per_row : ceil_div(L.mcu_rows, rows_per);
  const int64_t first = (r0 / rows_per) * per_row + s0;
  const int64_t last = ((r1 - 1) / rows_per) * per_row + (s1 - 1);
  int64_t segment = 0, copied = 0;
  const uint8_t* p = data + L.entropy_at;
  const uint8_t* start = p;
  const uint8_t* end = data + size;
  bool scan_ended = false;
  while (!scan_ended) {
    const uint8_t* ff = static_cast<const uint8_t*>(std::memchr(p, 0xFF, static_cast<size_t>(end - p)));
    if (ff == nullptr || ff + 1 >= end) return 0;  // truncated
    const unsigned b = ff[1];
    if (b == 0x00) { p = ff + 2; continue; }
    if (b == 0xFF) { p = ff + 1; continue; }
    const bool restart = b >= 0xD0 && b <= 0xD7;
    if (restart && static_cast<int64_t>(b - 0xD0) != segment % 8) return 0;  // out of sequence
    if (!restart && segment < last) return 0;  // EOI (or anything else) before the segments we need
    scan_ended = !restart;
    const int64_t col = segment % per_row;
    if (segment >= first && segment <= last && col >= s0 && col < s1) {
      const size_t length = static_cast<size_t>(ff - start);
      if (n + 2 + length + 2 > capacity) return 0;  // cannot happen (each kept segment lost its own marker)
      if (copied > 0) {  // RSTn between segments, numbered from 0 in the region
        out[n++] = 0xFF;
        out[n++] = static_cast<uint8_t>(0xD0 + (copied - 1) % 8);
      }
      std::memcpy(out + n, start, length);
      n += length;
      ++copied;
    }
    ++segment;
    p = start = ff + 2;
  }
  if (segment != total) return 0;  // markers lost or added: the segments are not where the layout puts them
  out[n++] = 0xFF;
  out[n++] = 0xD9;  // EOI
  sub_window->top = window.top - r0 * L.mcu_h;
  sub_window->left = window.left - x0;
  sub_window->height = window.height;
  sub_window->width = window.width;
  sub_window->downscale = window.downscale;
  return n;
}

}  // namespace fastload
