// Leak check for fastload's native JPEG core: thousands of failing decodes (every error path: truncation at
// many points, flipped bytes, windows outside the image, a buffer too small, a pixel limit below the image, a
// progressive scan limit) and re-encodes (add_restart_markers: its output buffer must be freed after a libjpeg
// error too), then exit: LeakSanitizer (ASan's, on by default) reports anything not freed.
//
//   leak_check SEED_DIR   (files made by fuzz/make_seeds.py: 17 control bytes, then a JPEG)
// Prints how many decodes failed with each status; exits non-zero when there were too few failures to mean
// anything, or (through LSan) when memory leaked.
#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "jpeg_decoder.h"
#include "jpeg_transcode.h"

using namespace fastload;

namespace {

constexpr size_t kControl = 17;  // the fuzz harness's control bytes in front of each seed

std::vector<uint8_t> read_file(const std::string& path) {
  std::vector<uint8_t> data;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.insert(data.end(), buf, buf + n);
    std::fclose(f);
  }
  return data;
}

long counts[kUnreadable + 1];

bool in_range(const Window& w) {  // a window whose output size this program can compute without overflow
  return w.top >= 0 && w.left >= 0 && w.height > 0 && w.width > 0 && w.top <= 65535 - w.height &&
         w.left <= 65535 - w.width;
}

void decode(const uint8_t* data, size_t size, Window w, const Limits& limits, int64_t capacity_delta = 0) {
  JpegHeader h;
  char message[200] = "";
  const int hs = read_header(data, size, &h, limits, message, sizeof(message));
  counts[hs]++;
  if (hs != kOk) return;
  if (w.height == 0) w = Window{0, 0, h.height, h.width, w.downscale};
  int64_t oh = 0, ow = 0;
  if (in_range(w)) scaled_extent(w, &oh, &ow);
  std::vector<uint8_t> out(static_cast<size_t>(oh * ow * 3 + capacity_delta > 0 ? oh * ow * 3 + capacity_delta : 0));
  counts[decode_window(data, size, w, out.data(), out.size(), limits, message, sizeof(message))]++;
}

void transcode(const uint8_t* data, size_t size, const Limits& limits) {
  std::vector<uint8_t> out;
  char message[200] = "";
  counts[add_restart_markers(data, size, limits, &out, message, sizeof(message))]++;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
    return 2;
  }
  std::vector<std::vector<uint8_t>> jpegs;
  if (DIR* dir = opendir(argv[1])) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::vector<uint8_t> f = read_file(std::string(argv[1]) + "/" + e->d_name);
      // One of each file (the seeds repeat each JPEG under several control prefixes): keep strict-mode ones.
      if (f.size() > kControl && (f[0] & 0x41) == 0x41 && ((f[0] >> 1) & 3) == 0)
        jpegs.emplace_back(f.begin() + kControl, f.end());
    }
    closedir(dir);
  }
  Limits strict, lenient, tiny, few_scans;
  lenient.strict = false;
  tiny.max_pixels = 100;
  few_scans.max_scans = 1;
  for (const auto& jpeg : jpegs) {
    const uint8_t* d = jpeg.data();
    const size_t n = jpeg.size();
    decode(d, n, Window{0, 0, 0, 0, 1}, strict);  // the good file, whole
    for (int k = 1; k <= 40; ++k) {  // truncated at 40 points, strict and lenient, two scales
      const size_t cut = n * k / 41;
      decode(d, cut, Window{0, 0, 0, 0, 1}, strict);
      decode(d, cut, Window{0, 0, 0, 0, 2}, lenient);
      transcode(d, cut, k % 2 ? strict : lenient);
    }
    for (int k = 0; k < 40; ++k) {  // one byte flipped at 40 places
      std::vector<uint8_t> bad(jpeg);
      bad[(n * (2 * k + 1) / 80) % n] ^= static_cast<uint8_t>(0x5A + k);
      decode(bad.data(), n, Window{0, 0, 0, 0, 1}, strict);
      transcode(bad.data(), n, strict);
    }
    decode(d, n, Window{0, 0, 1 << 20, 8, 1}, strict);       // window outside the image
    decode(d, n, Window{-1, 0, 8, 8, 1}, strict);            // negative
    decode(d, n, Window{0, 0, 8, 8, 3}, strict);             // bad downscale
    decode(d, n, Window{0, 0, 0, 0, 1}, strict, -1);         // buffer one byte short
    decode(d, n, Window{0, 0, 0, 0, 1}, tiny);               // over the pixel limit
    decode(d, n, Window{0, 0, 0, 0, 1}, few_scans);          // over the scan limit (progressive files)
    transcode(d, n, tiny);
    transcode(d, n, few_scans);
    decode(d, n, Window{INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, 1}, strict);  // absurd window
  }
  long failures = 0, total = 0;
  for (int s = 0; s <= kUnreadable; ++s) {
    total += counts[s];
    if (s != kOk) failures += counts[s];
    std::printf("status %d: %ld\n", s, counts[s]);
  }
  std::printf("leak_check: %zu files, %ld calls, %ld failed; LeakSanitizer reports at exit if anything leaked\n",
              jpegs.size(), total, failures);
  return failures >= 1000 ? 0 : 1;
}
