// libjpeg-turbo decoding of one window of one JPEG. See jpeg_decoder.h for why this file is C-style.
//
// setjmp rules followed here (the usual copy-paste examples break at least one):
//  * setjmp is called in the function that owns the jpeg_decompress_struct and that destroys it, and that
//    function has returned to nowhere when longjmp fires: the jmp_buf is never stale.
//  * No object with a destructor lives in a frame that longjmp unwinds: every temporary buffer comes from
//    libjpeg's own pool (JPOOL_IMAGE) and is freed by jpeg_destroy_decompress.
//  * Locals written after setjmp and read after the longjmp are volatile.
//  * error_exit formats the message *before* jumping; output_message is silenced (libjpeg would print to
//    stderr from a worker thread).
#include "jpeg_decoder.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include <jpeglib.h>

#include "jpeg_errors.h"
#include "jpeg_regions.h"

namespace fastload {
namespace {

using namespace detail;

// Everything that must happen between jpeg_create_decompress and reading pixels, shared by both entry
// points. Must be called inside the setjmp-protected region.
int open_header(j_decompress_ptr cinfo, const uint8_t* data, size_t size, const Limits& limits,
                char* message, size_t message_size) {
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  read_header_marked(cinfo);
  const int64_t pixels = static_cast<int64_t>(cinfo->image_width) * cinfo->image_height;
  if (pixels > limits.max_pixels) {
    std::snprintf(message, message_size, "image is %ux%u = %lld pixels, over the limit of %lld",
                  cinfo->image_width, cinfo->image_height, static_cast<long long>(pixels),
                  static_cast<long long>(limits.max_pixels));
    return kTooLarge;
  }
  const int nc = cinfo->num_components;
  if (!(nc == 1 || nc == 3 || nc == 4)) {
    std::snprintf(message, message_size, "JPEG with %d components is not supported", nc);
    return kUnsupported;
  }
  if (cinfo->data_precision != 8) {  // libjpeg-turbo 2.x refuses these in jpeg_read_header already; 3.x does not
    std::snprintf(message, message_size, "unsupported: %d-bit JPEG", cinfo->data_precision);
    return kUnsupported;
  }
  return kOk;
}

// The colour space the decoder asks libjpeg for (RGB, or gray/CMYK that it expands to RGB itself), and its
// component count; kUnsupported for a combination libjpeg would refuse to convert. Shared by decode and verify
// so that both accept exactly the same files.
int output_space(j_decompress_ptr cinfo, J_COLOR_SPACE* space, int* components, char* message, size_t message_size) {
  const J_COLOR_SPACE in = cinfo->jpeg_color_space;
  const int nc = cinfo->num_components;
  if (in == JCS_GRAYSCALE && nc == 1) *space = JCS_GRAYSCALE, *components = 1;
  else if ((in == JCS_CMYK || in == JCS_YCCK) && nc == 4) *space = JCS_CMYK, *components = 4;
  else if ((in == JCS_YCbCr || in == JCS_RGB) && nc == 3) *space = JCS_RGB, *components = 3;
  else {
    std::snprintf(message, message_size, "unsupported: JPEG colour space %d with %d components", static_cast<int>(in),
                  nc);
    return kUnsupported;
  }
  return kOk;
}

// Whether jpeg_crop_scanline gives the columns a full-width decode gives. libjpeg-turbo 2.1's column crop with DCT
// scaling 1/2 or 1/4 returns other pixels (and reads memory it never wrote: they change from call to call) for
// legal but unusual sampling layouts, e.g. luma 1x4 with a 2x1 chroma plane (found by fuzzing with cjpeg -sample);
// the layouts named 4:4:4, 4:2:2, 4:4:0, 4:2:0 and 4:1:1 (chroma 1x1) and grayscale decode exactly. The others
// decode whole rows and copy the window's columns out.
bool crop_is_exact(j_decompress_ptr cinfo, int downscale) {
  if (downscale == 1 || downscale == 8 || cinfo->num_components == 1) return true;
  const int h = cinfo->comp_info[0].h_samp_factor, v = cinfo->comp_info[0].v_samp_factor;
  if (!((h == 1 || h == 2) && (v == 1 || v == 2)) && !(h == 4 && v == 1)) return false;
  for (int c = 1; c < cinfo->num_components; ++c)
    if (cinfo->comp_info[c].h_samp_factor != 1 || cinfo->comp_info[c].v_samp_factor != 1) return false;
  return true;
}

void fill_header(j_decompress_ptr cinfo, JpegHeader* out) {
  out->height = static_cast<int32_t>(cinfo->image_height);
  out->width = static_cast<int32_t>(cinfo->image_width);
  out->components = cinfo->num_components;
  out->color_space = cinfo->jpeg_color_space;
  out->h_samp = cinfo->comp_info[0].h_samp_factor;
  out->v_samp = cinfo->comp_info[0].v_samp_factor;
  out->chroma_1x1 = true;
  for (int c = 1; c < cinfo->num_components; ++c)
    out->chroma_1x1 &= cinfo->comp_info[c].h_samp_factor == 1 && cinfo->comp_info[c].v_samp_factor == 1;
  out->progressive = cinfo->progressive_mode;
  out->arithmetic = cinfo->arith_code;
  out->adobe = cinfo->saw_Adobe_marker;
}

// Pillow's cmyk2rgb (Convert.c), so CMYK files decode to the same RGB as Image.convert("RGB").
inline uint8_t clip8(int v) { return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v)); }
inline int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

// Pillow reads every CMYK JPEG as Adobe's inverted CMYK (raw mode "CMYK;I"), with or without an Adobe marker (so
// one whose marker is damaged or missing decodes as the intact file does there): undone here too.
void cmyk_to_rgb(const uint8_t* in, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i, in += 4, out += 3) {
    const int c = 255 - in[0], m = 255 - in[1], y = 255 - in[2], k = 255 - in[3];
    const int nk = 255 - k;
    out[0] = clip8(nk - muldiv255(c, nk));
    out[1] = clip8(nk - muldiv255(m, nk));
    out[2] = clip8(nk - muldiv255(y, nk));
  }
}

void gray_to_rgb(const uint8_t* in, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i, out += 3) out[0] = out[1] = out[2] = in[i];
}

}  // namespace

int read_header(const uint8_t* data, size_t size, JpegHeader* out, const Limits& limits, char* message,
                size_t message_size) {
  if (!looks_like_jpeg(data, size)) return not_jpeg(size, message, message_size);
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  cinfo.err = install_error_manager(&err, limits.strict);
  volatile bool created = false;
  if (setjmp(err.jump)) {
    if (created) jpeg_destroy_decompress(&cinfo);
    set_message(message, message_size, err.message);
    return err.status;
  }
  jpeg_create_decompress(&cinfo);
  created = true;
  int status = open_header(&cinfo, data, size, limits, message, message_size);
  fill_header(&cinfo, out);  // also on kTooLarge: the caller may want to report the size
  if (status == kOk) report_warnings(err, message, message_size);
  jpeg_destroy_decompress(&cinfo);
  return status;
}

namespace {

// The window straight from libjpeg: every MCU above the window, and beside it in its rows, is entropy-decoded.
int decode_with_libjpeg(const uint8_t* data, size_t size, const Window& window, uint8_t* out, size_t out_capacity,
                        const Limits& limits, char* message, size_t message_size) {
  const int d = window.downscale;
  if (!(d == 1 || d == 2 || d == 4 || d == 8)) {
    std::snprintf(message, message_size, "downscale must be 1, 2, 4 or 8, got %d", d);
    return kBadWindow;
  }
  if (window.top < 0 || window.left < 0 || window.height <= 0 || window.width <= 0) {
    std::snprintf(message, message_size, "window (top=%lld, left=%lld, height=%lld, width=%lld) is empty or negative",
                  static_cast<long long>(window.top), static_cast<long long>(window.left),
                  static_cast<long long>(window.height), static_cast<long long>(window.width));
    return kBadWindow;
  }
  if (!window_in_range(window)) {  // also keeps scaled_extent below from overflowing
    std::snprintf(message, message_size, "window (top=%lld, left=%lld, height=%lld, width=%lld) is outside any JPEG "
                  "(sides are at most %lld)", static_cast<long long>(window.top), static_cast<long long>(window.left),
                  static_cast<long long>(window.height), static_cast<long long>(window.width),
                  static_cast<long long>(kMaxSide));
    return kBadWindow;
  }
  int64_t out_h = 0, out_w = 0;
  scaled_extent(window, &out_h, &out_w);
  if (static_cast<size_t>(out_h) * static_cast<size_t>(out_w) * 3 > out_capacity) {
    set_message(message, message_size, "output buffer too small for the window");
    return kNoRoom;
  }
  if (!looks_like_jpeg(data, size)) return not_jpeg(size, message, message_size);

  jpeg_decompress_struct cinfo;
  ErrorManager err;
  ProgressMonitor progress;
  cinfo.err = install_error_manager(&err, limits.strict);
  volatile bool created = false;
  if (setjmp(err.jump)) {
    if (created) jpeg_destroy_decompress(&cinfo);
    set_message(message, message_size, err.message);
    return err.status;
  }
  jpeg_create_decompress(&cinfo);
  created = true;
  install_progress(&progress, &cinfo, limits.max_scans);

  int status = open_header(&cinfo, data, size, limits, message, message_size);
  if (status != kOk) {
    jpeg_destroy_decompress(&cinfo);
    return status;
  }
  if (window.image_height > 0 &&
      (cinfo.image_height != window.image_height || cinfo.image_width != window.image_width)) {
    std::snprintf(message, message_size,
                  "its JPEG is %ux%u (height x width) but the dataset's heights/widths say %lldx%lld: the index "
                  "does not describe this file", cinfo.image_height, cinfo.image_width,
                  static_cast<long long>(window.image_height), static_cast<long long>(window.image_width));
    jpeg_destroy_decompress(&cinfo);
    return kCorrupt;
  }
  if (window.top + window.height > cinfo.image_height || window.left + window.width > cinfo.image_width) {
    std::snprintf(message, message_size,
                  "window (top=%lld, left=%lld, height=%lld, width=%lld) is outside the %ux%u image",
                  static_cast<long long>(window.top), static_cast<long long>(window.left),
                  static_cast<long long>(window.height), static_cast<long long>(window.width),
                  cinfo.image_height, cinfo.image_width);
    jpeg_destroy_decompress(&cinfo);
    return kBadWindow;
  }

  J_COLOR_SPACE space;
  int nc = 0;
  status = output_space(&cinfo, &space, &nc, message, message_size);
  if (status != kOk) {
    jpeg_destroy_decompress(&cinfo);
    return status;
  }
  cinfo.out_color_space = space;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned int>(d);
  cinfo.dct_method = JDCT_ISLOW;  // Pillow's default: needed for bit-identical output
  cinfo.do_fancy_upsampling = TRUE;

  jpeg_start_decompress(&cinfo);

  const JDIMENSION row0 = static_cast<JDIMENSION>(window.top / d);
  const JDIMENSION col0 = static_cast<JDIMENSION>(window.left / d);
  const JDIMENSION rows = static_cast<JDIMENSION>(out_h), cols = static_cast<JDIMENSION>(out_w);
  if (row0 + rows > cinfo.output_height || col0 + cols > cinfo.output_width) {
    // Cannot happen for a window inside the image; a guard against arithmetic drift, never a silent clip.
    set_message(message, message_size, "scaled window exceeds the scaled image");
    jpeg_destroy_decompress(&cinfo);
    return kBadWindow;
  }
  // Crop to whole iMCU columns around the window; libjpeg widens xoffset/width to its boundaries. Fancy
  // upsampling of subsampled chroma treats the crop's edges as image edges, which changes the outermost
  // pixels: one extra iMCU of context on each side keeps the window bit-identical to a full decode.
#if JPEG_LIB_VERSION >= 70  // libjpeg-turbo built with the jpeg-7/8 API (e.g. Ubuntu's libjpeg.so.8)
  const int dct_scaled = cinfo.min_DCT_h_scaled_size;
#else
  const int dct_scaled = cinfo.min_DCT_scaled_size;
#endif
  JDIMENSION context =
      cinfo.max_h_samp_factor > 1 ? static_cast<JDIMENSION>(cinfo.max_h_samp_factor * dct_scaled) : 0;
  // A progressive file whose scans stop early (e.g. after the DC scan) is block-smoothed over 5x5 blocks, and
  // libjpeg takes the crop's left edge for the image's: two iMCUs of context keep such windows identical too.
  if (cinfo.progressive_mode) context = static_cast<JDIMENSION>(2 * cinfo.max_h_samp_factor * dct_scaled);
  JDIMENSION xoffset = col0 > context ? col0 - context : 0;
  JDIMENSION crop_width = std::min<JDIMENSION>(col0 + cols + context, cinfo.output_width) - xoffset;
  if (crop_width < cinfo.output_width && crop_is_exact(&cinfo, d)) jpeg_crop_scanline(&cinfo, &xoffset, &crop_width);
  else xoffset = 0;
  const JDIMENSION skip_cols = col0 - xoffset;
  if (row0 > 0 && jpeg_skip_scanlines(&cinfo, row0) != row0) {
    set_message(message, message_size, "could not skip to the window's first row");
    jpeg_destroy_decompress(&cinfo);
    return kCorrupt;
  }

  const size_t out_stride = static_cast<size_t>(cols) * 3;
  // RGB rows go straight into the output: libjpeg's row is the window's row plus `before` bytes of context on
  // its left and `after` on its right, which land on the previous row's tail (saved and put back) and the next
  // row's head (overwritten by that row later). Only a row whose spill would leave this sample's output (the
  // first with context on the left, the last with context on the right) goes through one pooled row and a copy.
  // Copying every row made the crop decode ~1.3x slower on the 2-core dev machine (bench/RESULTS.md, "JPEG decode
  // per core").
  const size_t before = static_cast<size_t>(skip_cols) * nc;
  const size_t after = (static_cast<size_t>(cinfo.output_width) - skip_cols - cols) * nc;
  JSAMPARRAY scratch = (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                                  cinfo.output_width * nc, 1);
  JSAMPARRAY saved = before > 0 ? (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                                              static_cast<JDIMENSION>(before), 1)
                                : nullptr;
  const size_t end = static_cast<size_t>(rows) * out_stride;
  for (JDIMENSION r = 0; r < rows; ++r) {
    uint8_t* dst = out + r * out_stride;
    const size_t at = r * out_stride;
    const bool in_place = nc == 3 && at >= before && at + out_stride + after <= end;
    if (in_place && before > 0) std::memcpy(saved[0], dst - before, before);
    JSAMPROW row = in_place ? dst - before : scratch[0];
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
      set_message(message, message_size, "decoder returned no scanline (suspended input)");
      jpeg_destroy_decompress(&cinfo);
      return kCorrupt;
    }
    if (in_place) {
      if (before > 0) std::memcpy(dst - before, saved[0], before);
      continue;
    }
    const uint8_t* src = scratch[0] + before;
    if (nc == 3) std::memcpy(dst, src, out_stride);
    else if (nc == 1) gray_to_rgb(src, dst, cols);
    else cmyk_to_rgb(src, dst, cols);
  }
  // Rows below the window are not decoded (jpeg_destroy_decompress aborts the rest cleanly) unless whole_scan
  // asks for a full decode's verdict: they are then entropy-decoded without IDCT (jpeg_skip_scanlines), all but
  // the last, which is decoded. A window that reaches the last row has read the whole scan. Under strict, such a
  // decode finishes: it reads up to EOI, where libjpeg reports leftover corrupt data (e.g. "extraneous bytes
  // before marker") that must not pass.
  // (A progressive file needs none: jpeg_start_decompress has read all its scans, to EOI.)
  if (limits.strict && limits.whole_scan && !cinfo.progressive_mode && cinfo.output_scanline < cinfo.output_height) {
    // Skipping to the very end returns at once without reading (libjpeg-turbo's shortcut for the bottom of the
    // image), so skip to the last row and decode that one, as verify_jpeg does.
    const JDIMENSION last = cinfo.output_height - 1;
    const JDIMENSION skip = last - cinfo.output_scanline;
    JSAMPROW row = scratch[0];
    if ((skip > 0 && jpeg_skip_scanlines(&cinfo, skip) != skip) || jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
      set_message(message, message_size, "could not read the scan to its end");
      jpeg_destroy_decompress(&cinfo);
      return kCorrupt;
    }
  }
  if (limits.strict && cinfo.output_scanline == cinfo.output_height) jpeg_finish_decompress(&cinfo);
  report_warnings(err, message, message_size);
  jpeg_destroy_decompress(&cinfo);
  return kOk;
}

}  // namespace

int verify_jpeg(const uint8_t* data, size_t size, const Limits& limits, char* message, size_t message_size) {
  // The decoder itself, asked for the last row at full width: libjpeg entropy-decodes every row above it
  // without IDCT or colour conversion (jpeg_skip_scanlines; a progressive file is absorbed whole either way),
  // and under strict reads on to EOI, as a full decode does. So the policy is the decoder's by construction,
  // for strict and non-strict alike (a coefficient-only pass would read markers after the scan that a
  // non-strict decode never reads). The region path is bypassed: it would skip segments.
  JpegHeader header;
  const int status = read_header(data, size, &header, limits, message, message_size);
  if (status != kOk) return status;
  std::vector<uint8_t> row(static_cast<size_t>(header.width) * 3);  // at most 65535 * 3 bytes
  const Window last{header.height - 1, 0, 1, header.width, 1};
  return decode_with_libjpeg(data, size, last, row.data(), row.size(), limits, message, message_size);
}

int decode_window(const uint8_t* data, size_t size, const Window& window, uint8_t* out, size_t out_capacity,
                  const Limits& limits, char* message, size_t message_size) {
  // Slice the file at its restart markers when it has usable ones (jpeg_regions.h). Anything unusual (an
  // invalid window, an image over the pixel limit, markers not where they should be) takes the plain path,
  // which reports it in the original image's terms (an image of another size than the caller's index too).
  // whole_scan wants every segment read, so it decodes the file itself.
  RestartLayout layout;
  if (!(limits.strict && limits.whole_scan) && window_in_range(window) && parse_restart_layout(data, size, &layout) &&
      layout.height * layout.width <= limits.max_pixels && window.top + window.height <= layout.height &&
      window.left + window.width <= layout.width &&
      (window.image_height == 0 || (layout.height == window.image_height && layout.width == window.image_width))) {
    thread_local std::vector<uint8_t> region;  // grows to the largest file this thread has sliced
    if (region.size() < size + 2) region.resize(size + 2);
    Window sub;
    const size_t n = build_region(data, size, layout, window, region.data(), region.size(), &sub);
    if (n > 0) return decode_with_libjpeg(region.data(), n, sub, out, out_capacity, limits, message, message_size);
  }
  return decode_with_libjpeg(data, size, window, out, out_capacity, limits, message, message_size);
}

}  // namespace fastload
