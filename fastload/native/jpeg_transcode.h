// Lossless re-encoding with restart markers, for `fastload pack --seekable` (see jpeg_regions.h for why).
//
// The DCT coefficients are copied as they are (jpeg_read_coefficients -> jpeg_write_coefficients, what
// jpegtran does), so every decoder produces exactly the same pixels as from the original file. What changes:
// a sequential baseline scan (progressive files too), optimised Huffman tables (which usually pay for the
// markers), and a restart marker every few MCUs. APPn and COM markers are kept.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "jpeg_decoder.h"

namespace fastload {

// MCUs per restart segment for a row of mcus_per_row MCUs of mcu_w pixels: a divisor of the row near 32
// pixels (16..64), so a window's columns can be cut out; a whole row when none is (vertical cuts only).
// Finer costs ~2.5 bytes per segment; coarser decodes more MCUs beside the window.
int64_t choose_restart_interval(int64_t mcus_per_row, int64_t mcu_w);

// Re-encodes data into *out. Returns kOk, or kUnsupported for files it leaves alone (colour spaces other
// than YCbCr and grayscale, whose markers the encoder would rewrite; progressive files with incomplete scans,
// which decoders smooth), or the decoder's error for broken files.
int add_restart_markers(const uint8_t* data, size_t size, const Limits& limits, std::vector<uint8_t>* out,
                        char* message, size_t message_size);

}  // namespace fastload
