// Region decoding through restart markers.
//
// Huffman-coded JPEG data has no random access: to reach a window, libjpeg must entropy-decode every MCU before
// it, including whole rows left and right of the window. Restart markers (RSTn) cut the data into segments that
// each start from a clean decoder state. When they fall at regular MCU positions, the segments covering a
// window, renumbered and put behind a copy of the header with smaller dimensions, form a valid JPEG of just
// that region: libjpeg then decodes the window's MCUs only. The region keeps one MCU of context on a side where
// the window comes within fancy upsampling's reach of its MCUs' edge (and the image goes on), and is at least two
// MCUs across, so the upsampling is the same and sees the same neighbours: the window's pixels are identical to a
// full decode. `fastload pack --seekable` adds such markers losslessly (jpeg_transcode.h); camera files often
// carry them already.
#pragma once
#include <cstddef>
#include <cstdint>

#include "jpeg_decoder.h"

namespace fastload {

struct RestartLayout {
  int64_t height = 0, width = 0;
  int64_t mcu_h = 0, mcu_w = 0;              // MCU size in pixels
  int64_t mcus_per_row = 0, mcu_rows = 0;
  int64_t interval = 0;                      // MCUs per restart segment
  size_t sof_dims_at = 0;                    // offset of the SOF's 16-bit height (width follows)
  size_t entropy_at = 0;                     // first byte after the SOS header
  int components = 0;
  int h_samp[4] = {}, v_samp[4] = {};        // each component's sampling factors
};

// Reads the markers up to SOS (header bytes only). True when the file can be sliced: baseline or extended
// Huffman, 8-bit, one scan with every component, height in the SOF, and a restart interval that divides a row
// of MCUs or is a whole number of rows.
bool parse_restart_layout(const uint8_t* data, size_t size, RestartLayout* out);

// Writes the JPEG of the region around `window` (original pixels, inside the image) into out, which needs
// `size + 2` bytes; sets sub_window to the same window in the region's pixels. Returns the region's size, or
// 0 when slicing does not apply (the region would be the whole image, or the markers are not where the layout
// says: out of sequence, or not the layout's count in the whole scan; damaged data then goes the normal way and
// gets the normal error).
size_t build_region(const uint8_t* data, size_t size, const RestartLayout& layout, const Window& window,
                    uint8_t* out, size_t capacity, Window* sub_window);

}  // namespace fastload
