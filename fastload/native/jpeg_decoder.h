// Crop-and-scale JPEG decoding on libjpeg-turbo, with no Python or torch in sight.
//
// Everything here is plain C-style code on purpose: libjpeg reports errors by longjmp, and a longjmp
// across a C++ object with a destructor is undefined behaviour. Callers own every buffer.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastload {

// Status codes shared with Python (fastload/ops.py maps them to exceptions).
enum Status : int32_t {
  kOk = 0,
  kNotJpeg = 1,      // bytes do not start with a JPEG SOI marker
  kCorrupt = 2,      // libjpeg error, or a corrupt-data warning in strict mode
  kTooLarge = 3,     // pixel count over the limit: refused before any allocation
  kBadWindow = 4,    // window outside the image or downscale not in {1,2,4,8}: a caller bug
  kUnsupported = 5,  // valid JPEG we cannot turn into RGB (e.g. 2 components)
  kNoRoom = 6,       // caller's output buffer too small
  kNotDecoded = 7,   // batch slot never reached (another error stopped the batch)
  kUnreadable = 8,   // the file could not be read (missing, permissions, I/O error) or is over the byte limit
  kInternal = 9,     // the native worker failed (e.g. out of memory: std::bad_alloc), reported per sample
  kNoResources = 10, // the file could not be opened or read for want of descriptors or memory (EMFILE, ENOMEM)
};
// A kOk status may come with a message: "warning: ..." names the libjpeg warnings let through (harmless ones
// under strict; any with strict=false). See warning_harms_pixels in jpeg_errors.h for which are harmless.

struct Limits {
  int64_t max_pixels = 178956970;  // Pillow's DecompressionBombError threshold (2 * MAX_IMAGE_PIXELS)
  int max_scans = 500;             // progressive scans; libjpeg-turbo 3's TJPARAM_SCANLIMIT default
  bool strict = true;              // warnings that mean "pixels may be wrong" count as errors
  // With strict: after the window, entropy-decode the rest of the scan and read to EOI, so the verdict is a
  // full decode's. Damaged entropy data often decodes to plausible values and is only noticed where the stream
  // ends early (libjpeg's "premature end of data segment"), so a window above the damage's detection point
  // would otherwise come out wrong without a word. The loader asks for it on a sample's first decode.
  bool whole_scan = false;
};

struct JpegHeader {
  int32_t height = 0, width = 0, components = 0;
  int32_t color_space = 0;  // J_COLOR_SPACE of the file (1 gray, 2 RGB, 3 YCbCr, 4 CMYK, 5 YCCK)
  int32_t h_samp = 0, v_samp = 0;  // luma sampling factors: 2,2 = 4:2:0; 2,1 = 4:2:2; 1,2 = 4:4:0; 1,1 = 4:4:4
  bool chroma_1x1 = true;           // every other component sampled 1x1 (what the named subsamplings mean)
  bool progressive = false, arithmetic = false, adobe = false;
};

// JPEG stores its height and width in 16 bits: a window reaching past this is outside every image.
constexpr int64_t kMaxSide = 65535;

// A window in original-image pixels plus the DCT downscale (1, 2, 4 or 8).
struct Window {
  int64_t top = 0, left = 0, height = 0, width = 0;
  int32_t downscale = 1;
  // The image's size as the caller's index has it (0: not checked). A JPEG of another size is refused (kCorrupt):
  // a window planned from a stale size still fits a larger image and would crop the wrong part without a word.
  int64_t image_height = 0, image_width = 0;
};

// Whether a window could be inside some JPEG: non-empty, non-negative, within kMaxSide. scaled_extent and the
// byte count of its output cannot overflow for such a window; check this before calling them on caller input.
inline bool window_in_range(const Window& w) {
  return w.top >= 0 && w.left >= 0 && w.height > 0 && w.width > 0 && w.top <= kMaxSide - w.height &&
         w.left <= kMaxSide - w.width;
}

// Shape of the decoded region for a window: rows [top/d, ceil((top+h)/d)) of the 1/d-scaled image, same for
// columns. A pure function of the window, so callers can lay out a ragged batch before decoding anything.
inline void scaled_extent(const Window& w, int64_t* out_h, int64_t* out_w) {
  const int64_t d = w.downscale;
  *out_h = (w.top + w.height + d - 1) / d - w.top / d;
  *out_w = (w.left + w.width + d - 1) / d - w.left / d;
}

// Reads the header only (no entropy decoding beyond the first SOF). Returns a Status; message gets the reason.
int read_header(const uint8_t* data, size_t size, JpegHeader* out, const Limits& limits, char* message,
                size_t message_size);

// Entropy-decodes the whole file (IDCT and colour conversion of its last row only) and, under strict, reads it
// to EOI, with the decoder's error and warning policy: kOk exactly when decoding the whole image would succeed.
int verify_jpeg(const uint8_t* data, size_t size, const Limits& limits, char* message, size_t message_size);

// Decodes the window at 1/downscale into out (RGB, HWC, rows of scaled_extent's width). out_capacity must
// be at least 3 * h * w of scaled_extent; otherwise kNoRoom. On error out may hold a partial image.
// Files with usable restart markers are first cut down to the window's region (jpeg_regions.h): same pixels.
int decode_window(const uint8_t* data, size_t size, const Window& window, uint8_t* out, size_t out_capacity,
                  const Limits& limits, char* message, size_t message_size);

}  // namespace fastload
