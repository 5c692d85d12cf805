// libFuzzer target for fastload's native JPEG core (fastload/native/jpeg_decoder.cpp): read_header and
// decode_window, one window or a batch of windows decoded concurrently on 2 threads (as decode_crops does);
// with bit 7, also the lossless re-encoder of `fastload pack --seekable` (jpeg_transcode.cpp).
//
// Input: a few control bytes, then the JPEG bytes.
//   byte 0        flags: bit 0 strict, bits 1-2 downscale (1, 2, 4, 8), bit 3 raw window, bit 4 batch of 2 on
//                 2 threads, bit 5 output buffer one byte short, bit 6 differential check, bit 7 transcode
//   bytes 1-8     window A as 4 x u16 (top, left, height, width), each a fraction (v / 65535) of the image's
//                 size, so most inputs get a window inside the image
//   bytes 9-16    window B, same encoding (batch mode only uses it, but it is always consumed)
//   raw window    (bit 3) then 4 x i64 little-endian: window A exactly as given, negative or huge included
// Checks, beyond what ASan/UBSan see: statuses are in range, messages are terminated, an OK decode wrote
// nothing past its buffer (canary), and (bit 6, strict) a window equals the same rows/columns of a decode of
// the whole image at the same scale: a window decode must never yield a silently different image.
// Bit 7 (strict or not, per bit 0): add_restart_markers on the JPEG bytes; a failure has a status and a message,
// and where pack would store the result (the original passes verify_jpeg, strict) the output has the same size
// and decodes (strict, whole image, scale 1) to exactly the original's pixels: a re-encoded file that decodes
// differently would silently corrupt a store.
// Memory is bounded by the harness's pixel limit (4 Mpx); libjpeg's own allocations by -rss_limit_mb.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "jpeg_decoder.h"
#include "jpeg_transcode.h"

using namespace fastload;

namespace {

constexpr int64_t kMaxPixels = int64_t(1) << 22;
constexpr size_t kCanary = 64;
constexpr uint8_t kCanaryByte = 0xA5;
constexpr size_t kMessage = 200;

// A message buffer as the bindings hand it over: empty, its tail garbage (a call must terminate what it writes,
// and on success leaves it as it was).
void reset(char (&message)[kMessage]) {
  std::memset(message, 'x', sizeof(message));
  message[0] = '\0';
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_decode: invariant broken: %s\n", what);
    std::abort();
  }
}

// Callers start with an empty message and read it on failure: it must be terminated and, on failure, say why.
void check_message(const char* message, int status) {
  check(std::memchr(message, '\0', kMessage) != nullptr, "message not terminated");
  if (status != kOk) check(message[0] != '\0', "failure without a message");
}

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

int64_t i64(const uint8_t* p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  int64_t out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

// A window inside an h x w image from 4 fractions (height and width at least 1).
Window window_from(const uint8_t* p, int64_t h, int64_t w, int d) {
  Window win;
  win.top = u16(p) * (h - 1) / 65535;
  win.left = u16(p + 2) * (w - 1) / 65535;
  win.height = 1 + u16(p + 4) * (h - win.top - 1) / 65535;
  win.width = 1 + u16(p + 6) * (w - win.left - 1) / 65535;
  win.downscale = d;
  return win;
}

struct Result {
  int status = -1;
  std::vector<uint8_t> pixels;  // the window's pixels on kOk
};

// Decodes one window into an exactly sized buffer followed by a canary.
void decode(const uint8_t* data, size_t size, const Window& win, const Limits& limits, bool short_by_one,
            Result* result) {
  int64_t h = 0, w = 0;
  size_t need = 0;
  if (win.top >= 0 && win.left >= 0 && win.height > 0 && win.width > 0 && win.height <= kMaxPixels &&
      win.width <= kMaxPixels && win.top <= kMaxPixels && win.left <= kMaxPixels) {
    scaled_extent(win, &h, &w);
    need = static_cast<size_t>(h) * static_cast<size_t>(w) * 3;
  }
  if (need > static_cast<size_t>(kMaxPixels) * 3) need = 0;  // cannot fit an image under the limit anyway
  const size_t capacity = short_by_one && need > 0 ? need - 1 : need;
  std::vector<uint8_t> out(capacity + kCanary, kCanaryByte);
  char message[kMessage];
  reset(message);
  result->status = decode_window(data, size, win, out.data(), capacity, limits, message, sizeof(message));
  check(result->status >= kOk && result->status <= kUnreadable, "decode_window status out of range");
  check_message(message, result->status);
  for (size_t k = capacity; k < out.size(); ++k) check(out[k] == kCanaryByte, "decode_window wrote past out_capacity");
  if (result->status == kOk) {
    check(!short_by_one, "decode_window accepted a buffer one byte short");
    check(need > 0, "decode_window decoded a window the harness thought empty");
    out.resize(capacity);
    result->pixels.swap(out);
  }
}

// The re-encoder (`fastload pack --seekable`) on data, under the harness's limits.
void check_transcode(const uint8_t* data, size_t size, const Limits& limits) {
  std::vector<uint8_t> out;
  char message[kMessage];
  reset(message);
  const int ts = add_restart_markers(data, size, limits, &out, message, sizeof(message));
  check(ts >= kOk && ts <= kUnreadable, "add_restart_markers status out of range");
  check_message(message, ts);
  if (ts != kOk) {
    check(out.empty(), "add_restart_markers failed but filled its output");
    return;
  }
  check(!out.empty(), "add_restart_markers: OK with no output");
  // Pack stores the re-encoded file of a JPEG that passed its strict checks: verify_jpeg (or a whole decode).
  // Only those carry the promise of identical pixels; a broken file decoded leniently has no pixels to keep.
  Limits strict = limits;
  strict.strict = true;
  reset(message);
  const int vs = verify_jpeg(data, size, strict, message, sizeof(message));
  check(vs >= kOk && vs <= kUnreadable, "verify_jpeg status out of range");
  check_message(message, vs);
  if (vs != kOk) return;
  JpegHeader h0, h1;
  check(read_header(data, size, &h0, strict, message, sizeof(message)) == kOk, "verify_jpeg OK, read_header not");
  check(read_header(out.data(), out.size(), &h1, strict, message, sizeof(message)) == kOk,
        "re-encoded file: read_header fails");
  check(h1.height == h0.height && h1.width == h0.width && h1.components == h0.components,
        "re-encoded file: different size or components");
  const Window whole{0, 0, h0.height, h0.width, 1};
  Result r0, r1;
  decode(data, size, whole, strict, false, &r0);
  check(r0.status == kOk, "verify_jpeg OK, the whole image's decode not");
  decode(out.data(), out.size(), whole, strict, false, &r1);
  check(r1.status == kOk, "re-encoded file does not decode");
  check(r1.pixels == r0.pixels, "re-encoded file decodes to different pixels");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t input_size) {
  if (input_size < 17) return 0;
  const uint8_t flags = input[0];
  const bool strict = flags & 1, raw = flags & 8, batch = flags & 16, short_by_one = flags & 32,
             differential = flags & 64, transcode = flags & 128;
  const int d = 1 << ((flags >> 1) & 3);
  const uint8_t* win_a = input + 1;
  const uint8_t* win_b = input + 9;
  size_t offset = 17;
  Window raw_window;
  if (raw) {
    if (input_size < offset + 32) return 0;
    const uint8_t* p = input + offset;
    raw_window = {i64(p), i64(p + 8), i64(p + 16), i64(p + 24), d};
    offset += 32;
  }
  const uint8_t* data = input + offset;
  const size_t size = input_size - offset;

  Limits limits;
  limits.max_pixels = kMaxPixels;
  limits.strict = strict;

  JpegHeader header;
  char message[kMessage];
  reset(message);
  const int hs = read_header(data, size, &header, limits, message, sizeof(message));
  check(hs >= kOk && hs <= kUnreadable, "read_header status out of range");
  check_message(message, hs);
  if (hs == kOk) {
    check(header.height > 0 && header.width > 0, "read_header: OK with an empty image");
    check(int64_t(header.height) * header.width <= kMaxPixels, "read_header: OK over the pixel limit");
  }
  if (transcode) check_transcode(data, size, limits);
  if (!raw && hs != kOk) {
    // Still drive decode_window on bytes whose header fails: it must fail the same way, never decode.
    Result r;
    decode(data, size, Window{0, 0, 1, 1, d}, limits, false, &r);
    check(r.status != kOk, "decode_window decoded what read_header refused");
    return 0;
  }

  const Window a = raw ? raw_window : window_from(win_a, header.height, header.width, d);
  Result ra, rb;
  if (batch && hs == kOk) {
    const Window b = window_from(win_b, header.height, header.width, 1 << ((win_b[0] >> 1) & 3));
    std::thread other([&] { decode(data, size, b, limits, false, &rb); });
    decode(data, size, a, limits, short_by_one, &ra);
    other.join();
  } else {
    decode(data, size, a, limits, short_by_one, &ra);
  }

  if (differential && strict && !raw && ra.status == kOk) {
    // The same rows and columns of the whole image decoded at the same scale.
    const Window whole{0, 0, header.height, header.width, d};
    Result rf;
    decode(data, size, whole, limits, false, &rf);
    if (rf.status == kOk) {
      int64_t fh = 0, fw = 0, wh = 0, ww = 0;
      scaled_extent(whole, &fh, &fw);
      scaled_extent(a, &wh, &ww);
      const int64_t r0 = a.top / d, c0 = a.left / d;
      check(r0 + wh <= fh && c0 + ww <= fw, "window extent outside the scaled image");
      for (int64_t r = 0; r < wh; ++r)
        check(std::memcmp(ra.pixels.data() + r * ww * 3, rf.pixels.data() + ((r0 + r) * fw + c0) * 3, ww * 3) == 0,
              "window decode differs from the whole image's decode");
    }
  }
  return 0;
}
