// CUDA kernel of `fastload::warp_normalize` (schema and CPU twin in warp_cpu.cpp, maths in warp.h).
// Blocks of 32 output columns, grid.z is the sample. Launched on the current stream.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "warp.h"
#include "warp_op.h"

namespace fastload {
namespace {

// Block = 32 columns x 8 row-groups of one sample: a tile of 32 x 32 output pixels (each thread owns one output
// column u and kRows rows), so a warp's threads write consecutive u (coalesced).
constexpr int kBlockX = 32, kBlockY = 8, kRows = 4, kTile = kBlockY * kRows;
constexpr int kThreads = kBlockX * kBlockY;
static_assert(kTile == kBlockX, "the tiled kernel keeps column and row taps in arrays of one size");
constexpr int kMaxTaps = 12;  // x taps kept in shared memory by warp_columns: shrinks up to ~5.5x

// Whether a sample's (h, w, c) image at `off` lies inside data and is indexable with 32-bit ints. Checked by
// division before any product: h*w*c of caller-given sides can wrap int64 into a small positive number.
__device__ __forceinline__ bool image_fits(int64_t h, int64_t w, int64_t c, int64_t off, int64_t data_size) {
  constexpr int64_t kLimit = (int64_t(1) << 31) - 1;
  if (h <= 0 || w <= 0 || c <= 0 || c > kMaxChannels || w > kLimit / c || h > kLimit / (w * c)) return false;
  return off >= 0 && off <= data_size && h * w * c <= data_size - off;
}

// The per-pixel path, for any input: the column's filter taps (the same for every row of an axis-aligned warp)
// are computed once and kept in shared memory ([tap][thread], conflict-free); rotations, shears and large
// shrinks take the full 2-D filter. Output tile (blockIdx.x, tile_y); tap_weight: kMaxTaps x kThreads floats of
// shared memory. No barrier inside: a thread may return early.
template <typename in_t, typename out_t, int CH>
__device__ __forceinline__ void warp_columns(const in_t* __restrict__ data, int64_t data_size, int64_t off,
                                             int64_t h64, int64_t w64, int64_t c_in,
                                             const float* __restrict__ maps, int map_cols,
                                             const float* __restrict__ alpha, const float* __restrict__ beta,
                                             int channels, bool hwc, Fill fill, out_t* __restrict__ out,
                                             int64_t os_b, int64_t os_c, int64_t os_y, int64_t os_x, int out_h,
                                             int out_w, int tile_y, float* tap_weight) {
  const int b = blockIdx.z;
  const int tid = threadIdx.y * kBlockX + threadIdx.x;
  const int u = blockIdx.x * kBlockX + threadIdx.x;
  const int v_first = (tile_y * kBlockY + threadIdx.y) * kRows;
  if (u >= out_w || v_first >= out_h) return;
  const int C = CH > 0 ? CH : channels;
  out_t* o_base = out + b * os_b + u * os_x;
  float fill_value[kMaxChannels];
#pragma unroll
  for (int c = 0; c < kMaxChannels; ++c) fill_value[c] = c < C ? fill[c] * alpha[c] + beta[c] : 0.f;
  const int v_end = min(v_first + kRows, out_h);
  // A malformed sample (never produced by fastload itself) reads nothing and yields fill, never stray memory.
  const bool valid = image_fits(h64, w64, c_in, off, data_size) && c_in == C;
  if (!valid) {
    for (int v = v_first; v < v_end; ++v)
      for (int c = 0; c < C; ++c) o_base[v * os_y + c * os_c] = OutCast<out_t>::apply(fill_value[c]);
    return;
  }
  const int h = static_cast<int>(h64), w = static_cast<int>(w64);
  float m[6];
  const Visible vis = read_map(maps, b, map_cols, h, w, m);
  const int s_c = hwc ? 1 : h * w, s_y = hwc ? w * C : w, s_x = hwc ? C : 1;
  const in_t* img = data + off;
  const float sx = filter_support(m[0], m[1]), sy = filter_support(m[3], m[4]);

  if (m[1] == 0.f && m[3] == 0.f) {  // axis-aligned
    const float cx = m[0] * u + m[2] + 0.5f;
    int x0, x1;
    filter_taps(cx, sx, w, &x0, &x1);
    const int nx = x1 - x0;
    if (nx <= kMaxTaps) {
      const bool inside_x = visible_at(cx, vis.x0, vis.x1);
      float total_x = 0.f;
      for (int k = 0; k < nx; ++k) {
        const float wk = triangle((x0 + k + 0.5f - cx) / sx);
        tap_weight[k * kThreads + tid] = wk;
        total_x += wk;
      }
      for (int v = v_first; v < v_end; ++v) {
        out_t* o = o_base + v * os_y;
        const float cy = m[4] * v + m[5] + 0.5f;
        if (!inside_x || !visible_at(cy, vis.y0, vis.y1)) {
          for (int c = 0; c < C; ++c) o[c * os_c] = OutCast<out_t>::apply(fill_value[c]);
          continue;
        }
        int y0, y1;
        filter_taps(cy, sy, h, &y0, &y1);
        float acc[kMaxChannels] = {0.f, 0.f, 0.f, 0.f};
        float total_y = 0.f;
        for (int y = y0; y < y1; ++y) {
          const float wy = triangle((y + 0.5f - cy) / sy);
          total_y += wy;
          const in_t* p = img + y * s_y + x0 * s_x;
          float part[kMaxChannels] = {0.f, 0.f, 0.f, 0.f};
          for (int k = 0; k < nx; ++k, p += s_x) {
            const float wk = tap_weight[k * kThreads + tid];
#pragma unroll
            for (int c = 0; c < kMaxChannels; ++c)
              if (c < C) part[c] += wk * static_cast<float>(p[c * s_c]);
          }
#pragma unroll
          for (int c = 0; c < kMaxChannels; ++c) acc[c] += wy * part[c];
        }
        const float total = total_x * total_y;
        store_pixel(o, os_c, acc, total > 0.f ? 1.f / total : 0.f, alpha, beta, C);
      }
      return;
    }
  }
  // General affine (rotation, shear, large shrink): the 2-D filter per output pixel.
  const InputView<in_t, int> in{img, h, w, s_c, s_y, s_x};
  for (int v = v_first; v < v_end; ++v)
    warp_pixel_general(in, vis, C, m, sx, sy, u, v, alpha, beta, fill_value, o_base + v * os_y, os_c);
}

template <typename in_t, typename out_t, int CH>
__global__ void __launch_bounds__(kThreads, 4) warp_normalize_kernel(
    const in_t* __restrict__ data, int64_t data_size, const int64_t* __restrict__ offsets,
    const int64_t* __restrict__ shapes, const float* __restrict__ matrices, int map_cols,
    const float* __restrict__ alpha, const float* __restrict__ beta, int channels, bool hwc, Fill fill,
    out_t* __restrict__ out, int64_t os_b, int64_t os_c, int64_t os_y, int64_t os_x, int out_h, int out_w) {
  __shared__ float tap_weight[kMaxTaps * kThreads];
  const int b = blockIdx.z;
  warp_columns<in_t, out_t, CH>(data, data_size, offsets[b], shapes[b * 3], shapes[b * 3 + 1], shapes[b * 3 + 2],
                                matrices, map_cols, alpha, beta, channels, hwc, fill, out, os_b, os_c, os_y, os_x,
                                out_h, out_w, blockIdx.y, tap_weight);
}

// The loader's case (uint8 HWC RGB, axis-aligned, shrink below 3x along both axes): a block owns 32 output columns
// and kBlockRows output rows of one sample. It computes the weights of its columns and rows once, then walks down
// the rows in bands of 32 (16 where 32 could span more input rows than fit). Per band it
//   1. stages the band's input rows in shared memory with 16-byte asynchronous copies (one instruction per row
//      and warp or half warp),
//   2. filters each staged row horizontally into 32 row sums per channel, normalised (warp = row, lane = column),
//   3. filters the row sums vertically into the band's output rows (thread = 4 consecutive values of a row) and
//      stores them with vector stores,
// and the next band's rows are copied in while step 3 runs. Every input byte is read from global memory once per
// band.
//
// The kernel is bound by instruction issue and latency, so the inner loops are straight-line code: every column (row) gets
// the same number of taps K, zero-padded, with K a template argument (3 to 6: supports up to 3), bytes are read
// four at a time and filtered in exact integer arithmetic two taps per instruction (dp2a, kWeightOne), and the
// vertical pass keeps its weights in registers across four pixels.
//
// The limits cover what the loader produces: DCT scales are powers of two, so a crop reaches the kernel up to 2x
// larger than the output along its shorter side, and RandomResizedCrop's aspect ratios (3/4 to 4/3) make the
// other side up to 2.67x. Anything else takes warp_columns.
constexpr int kTileW = 32;          // output columns per block
constexpr int kBandRows = 32;       // output rows per band (16 where 32 could span more than kStagedRows inputs)
constexpr int kBlockRows = 128;     // output rows per block
constexpr int kCols = 4;            // adjacent output columns per thread in the vertical pass
constexpr int kColGroups = kTileW / kCols;
constexpr int kStagedRows = 68;     // input rows of one band: 32 rows of a shrink up to ~2x, 16 rows of up to 3x
constexpr int kRowStride = 336;     // bytes per staged row: 21 16-byte copies, a segment of up to 321 bytes at any
                                    // alignment (32 columns of a shrink below 3)
constexpr int kTileMinTaps = 3, kTileMaxTaps = 6;
static_assert(kThreads == kColGroups * kBandRows, "vertical pass: one thread per 4 pixels of a 32-row band");
static_assert(kRowStride % 16 == 0, "staged rows start on 16-byte boundaries (cp.async)");
static_assert(kBlockRows % kTile == 0, "the fallback covers the block's rows in warp_columns' 32-row tiles");
static_assert(kBlockRows / 32 < kBlockY, "a warp per 32 of the block's rows computes their weights, one more the columns'");

// One band's rows: output rows [v0, v0 + rows_out) read input rows [ya, yb).
struct Band {
  int v0, rows_out, ya, yb;
};

// What every thread of a block needs of its sample and tile, planned once by warp 0 (plan_tile): computed in
// every warp, its loads and range computations cost a tenth of the kernel's instructions.
struct TilePlan {
  uint64_t segment;                       // global address of row 0's segment (its bytes from column xa on)
  float scale[3], bias[3], fill_value[3];  // of the horizontal sums (kWeightOne) and of the fill
  float scale_x, shift_x, scale_y, shift_y, support_x, support_y;  // the axis-aligned matrix and its filter
  Visible vis;                            // the visible box (warp.h): centres outside it are fill
  int h, w, xa, xb, kx, ky, band_rows;    // image size, columns [xa, xb) the tile reads, taps, rows per band
  Band first;                             // the block's first band
  bool tileable;                          // else warp_columns does the block
};

struct TiledShared {
  uint8_t raw[kStagedRows][kRowStride];        // the band's input rows, each from the 16-byte boundary at or
                                               // before its first byte (column xa)
  float rowsum[kStagedRows][3 * kTileW];       // horizontal pass: per input row, 3 x 32 values (row_value)
  uint32_t wx[kTileMaxTaps / 2][kTileW];       // weights 2j, 2j + 1 of each output column (pack_weight_pairs;
                                               // pair-major: a warp reads one pair of 32 columns from 32 banks)
  float wy[kTileMaxTaps][kBlockRows];          // weight k of each of the block's output rows, zero-padded
  int lo_x[kTileW];                            // byte offset of column u's first tap from the segment's start
  int window_y[kBlockRows];                    // input row of row v's first tap (window_start)
  uint32_t inside_y[kBlockRows / 32];          // bit i: the centre of the block's row i maps inside the image
  Band bands[kBlockRows / (kBandRows / 2)];    // the block's bands, from the row windows (the first: plan.first)
  uint32_t bands_inside;                       // bit i: every row of band i maps inside the image
  bool columns_inside;                         // every column of the tile inside the output maps inside
  uint32_t inside_value[3];                    // bit i of word q: row value 32q + i's column maps inside
  TilePlan plan;
};
static_assert(sizeof(float) * kMaxTaps * kThreads <= sizeof(TiledShared::raw), "warp_columns' scratch fits in raw");

// Where channel c of output column u goes in a row of sums: in the output's order, so that the vertical pass
// reads and writes 4 consecutive values of a row at once in either layout.
template <bool kChannelsLast>
__device__ __forceinline__ int row_value(int u, int c) { return kChannelsLast ? 3 * u + c : c * kTileW + u; }

// Input centre (edge coordinates) of output position pos along one axis of an axis-aligned warp.
__device__ __forceinline__ float axis_centre(float scale, float shift, int pos) { return scale * pos + shift + 0.5f; }

// Input range [lo, hi) the taps of output positions [first, last] read along one axis, at least K long (size >= K
// is checked by the caller) so that every position's K-tap window fits inside it. Tap ranges move monotonically
// with the position, so the two ends bound every position's (clamped to the image; an end that maps outside only
// widens the range).
__device__ __forceinline__ void tile_range(float scale, float shift, float support, int size, int first, int last,
                                           int K, int* lo, int* hi) {
  int lo0, hi0, lo1, hi1;
  filter_taps(axis_centre(scale, shift, first), support, size, &lo0, &hi0);
  filter_taps(axis_centre(scale, shift, last), support, size, &lo1, &hi1);
  int a = min(lo0, lo1), b = max(hi0, hi1);
  if (b - a < K) {
    a = max(0, b - K);
    b = min(size, a + K);
  }
  *lo = a;
  *hi = b;
}

// Taps per output pixel along an axis: filter_taps gives at most floor(2 * support + 1).
__device__ __forceinline__ int tile_taps(float support) {
  return max(kTileMinTaps, static_cast<int>(2.f * fminf(support, 64.f) + 1.f));
}

// First index of the K-tap window around centre: the filter's first tap (filter_taps' lo, unclamped) clamped into
// [start, end - K]. The one formula for the weights (axis_weights) and the staged rows (row_window), which must agree.
__device__ __forceinline__ int window_start(float centre, float support, int start, int end, int K) {
  return max(start, min(static_cast<int>(floorf(centre - support + 0.5f)), end - K));
}

// The K weights of output position pos along one axis (wk[k]), normalised, placed where its taps fall in a
// K-window and zero around them. The window starts at the filter's first tap clamped into [start, end - K]
// (end - start >= K), which holds every tap; *window: its first index relative to start. Outside (in_range false,
// or the centre maps outside the visible interval [lo_edge, hi_edge]): zero weights, *inside false (fill).
__device__ __forceinline__ void axis_weights(float scale, float shift, float support, int size, float lo_edge,
                                             float hi_edge, int pos, bool in_range, int start, int end, int K,
                                             float (&wk)[kTileMaxTaps], int* window, bool* inside) {
  const float centre = axis_centre(scale, shift, pos);
  const bool maps_inside = in_range && visible_at(centre, lo_edge, hi_edge);
  int lo = start, hi = start;
  if (maps_inside) {
    filter_taps(centre, support, size, &lo, &hi);
    // Inside [start, end) by construction (tile_range, row_window); clamped anyway, so that a rounding difference between
    // the two computations could only drop an edge tap, never read bytes that were not loaded.
    lo = max(lo, start);
    hi = min(hi, end);
  }
  const int first = window_start(centre, support, start, end, K);  // K taps from here stay inside [start, end)
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kTileMaxTaps; ++k) {
    const int x = first + k;
    wk[k] = k < K && x >= lo && x < hi ? triangle((x + 0.5f - centre) / support) : 0.f;
    total += wk[k];
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
  for (int k = 0; k < kTileMaxTaps; ++k) wk[k] *= inv;
  *window = first - start;
  *inside = maps_inside && hi > lo;
}

// The horizontal pass multiplies bytes by 16-bit integer weights that sum to exactly kWeightOne (2^15), two taps
// per instruction (dp2a), so its sums are exact integers below 2^23: started at the bits of the float 2^23 they
// come out as that float plus the sum, with no conversion instruction. Each weight is rounded to the nearest
// 1/2^15 and the largest absorbs the rounding's total (at most K/2 units), so the weights' errors sum to zero and
// a sum is within 127.5 * K / 2^15 of exact: at most 0.023 in pixel values for K = 6, 4e-4 in ImageNet-normalised
// units, inside the 1e-3 the kernel promises against its CPU twin (and exact on flat regions).
constexpr int kWeightOne = 1 << 15;
constexpr uint32_t kFloatTwo23 = 0x4B000000u;  // bits of 2^23f: 2^23 + n for an integer 0 <= n < 2^23

// Column weights wk (normalised, zero-padded) -> 16-bit fixed point summing to kWeightOne (all zero stays zero),
// taps 2j and 2j + 1 packed in pair[j * stride] (low half: tap 2j), as dp2a takes them.
__device__ __forceinline__ void pack_weight_pairs(const float (&wk)[kTileMaxTaps], uint32_t* pair, int stride) {
  int q[kTileMaxTaps], total = 0, largest = 0, largest_q = -1;  // (no q[largest]: a dynamic index spills q)
#pragma unroll
  for (int k = 0; k < kTileMaxTaps; ++k) {
    q[k] = __float2int_rn(wk[k] * kWeightOne);
    total += q[k];
    if (q[k] > largest_q) {
      largest = k;
      largest_q = q[k];
    }
  }
  const int residual = total > 0 ? kWeightOne - total : 0;
#pragma unroll
  for (int k = 0; k < kTileMaxTaps; ++k) q[k] += k == largest ? residual : 0;
#pragma unroll
  for (int j = 0; j < kTileMaxTaps / 2; ++j)
    pair[j * stride] = static_cast<uint32_t>(q[2 * j]) | (static_cast<uint32_t>(q[2 * j + 1]) << 16);
}

// sm_80+ asynchronous copy of 16 bytes from global to shared memory (a shared-space address), bypassing L1 (the
// build targets sm_80+).
__device__ __forceinline__ void copy_async_16(uint32_t to, const void* from) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(from) : "memory");
}

// Waits for this thread's asynchronous copies (a barrier then makes everyone's visible).
__device__ __forceinline__ void copies_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// First input row of output row v's K-tap window when windows are clamped to the image (h >= K): what
// axis_weights gives with [start, end) = [0, h). Monotonic in v, so a band's windows span [window of one end,
// window of the other end + K).
__device__ __forceinline__ int row_window(float scale, float shift, float support, int h, int K, int v) {
  return window_start(axis_centre(scale, shift, v), support, 0, h, K);
}

// The band of up to band_rows output rows from v0 (block-uniform) and the input rows its windows read (the first
// band's; the later ones take the same values from the windows in shared memory).
__device__ __forceinline__ Band plan_band(int v0, int v_end, int band_rows, float scale, float shift, float support,
                                          int h, int K) {
  Band band{v0, min(band_rows, v_end - v0), 0, 0};
  const int a = row_window(scale, shift, support, h, K, v0);
  const int b = row_window(scale, shift, support, h, K, v0 + band.rows_out - 1);
  band.ya = min(a, b);
  band.yb = max(a, b) + K;
  return band;
}

// Horizontal pass: staged row r -> row sums of the 32 output columns, three channels, scaled and shifted as the
// output will be (the row weights sum to 1, so the vertical pass keeps that). Warp y takes rows y, y + 8, ..., lane
// u column u (its weight pairs and tap offset in registers): neighbouring lanes read bytes ~3 * shrink apart, so a
// warp's loads hit distinct banks or share words. Row r's segment starts (band_first + r * row_bytes) & 15 bytes
// into its staged row; a column's 3K tap bytes are read as the (at most) ceil((3K + 3) / 4) words that hold them
// and shifted into place with funnel shifts. Per channel and pair of taps one byte permute brings the two bytes
// together and one dp2a multiplies and adds them (kWeightOne). The sums are laid out as the output is (row_value).
template <int K, bool kChannelsLast>
__device__ __forceinline__ void tile_horizontal(TiledShared& sh, int rows, uint32_t band_first, int row_bytes) {
  constexpr int kWords = (3 * K + 6) / 4, kAligned = (3 * K + 3) / 4, kPairs = (K + 1) / 2;
  const int u = threadIdx.x;
  uint32_t weights[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) weights[j] = sh.wx[j][u];
  const int tap = sh.lo_x[u];
  float scale[3], bias[3];
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    scale[c] = sh.plan.scale[c];
    bias[c] = sh.plan.bias[c];
  }
  // Row r's taps start at byte `at` of raw (r * kRowStride + its segment's offset + tap): the words from at & ~3
  // on, shifted right by (at & 3) bytes.
  auto filter_row = [&](const uint32_t* p, uint32_t shift, int r) {
    uint32_t word[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) word[i] = p[i];
    uint32_t bytes[kAligned];  // the 3K tap bytes from byte 0 of bytes[0] on: tap k, channel c at 3k + c
#pragma unroll
    for (int i = 0; i < kAligned; ++i) bytes[i] = __funnelshift_r(word[i], word[min(i + 1, kWords - 1)], shift);
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      uint32_t acc = kFloatTwo23;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        // Taps 2j and 2j + 1 (the same byte twice for an odd K's last tap, whose partner weight is zero) into
        // bytes 0 and 1 of one word.
        const int first = 6 * j + c, second = 2 * j + 1 < K ? first + 3 : first, i = first / 4;
        const uint32_t pair = __byte_perm(bytes[i], bytes[min(i + 1, kAligned - 1)],
                                          (first - 4 * i) | ((second - 4 * i) << 4));
        acc = __dp2a_lo(weights[j], pair, acc);
      }
      sh.rowsum[r][row_value<kChannelsLast>(u, c)] = __uint_as_float(acc) * scale[c] + bias[c];
    }
  };
  // Rows 16 apart start at the same offset within 16 bytes (16 * row_bytes is a multiple of 16) and kRowStride is
  // a multiple of 4: warp y's rows y, y + 16, ... share one shift and word offset, rows y + 8, y + 24, ... another.
  const int y = threadIdx.y;
  const uint32_t at0 = y * kRowStride + ((band_first + y * row_bytes) & 15) + tap;
  const uint32_t at1 = (y + kBlockY) * kRowStride + ((band_first + (y + kBlockY) * row_bytes) & 15) + tap;
  const uint32_t shift0 = (at0 & 3) * 8, shift1 = (at1 & 3) * 8;
  const uint32_t* p0 = reinterpret_cast<const uint32_t*>(&sh.raw[0][0] + (at0 & ~3u));
  const uint32_t* p1 = reinterpret_cast<const uint32_t*>(&sh.raw[0][0] + (at1 & ~3u));
  constexpr int kStep = 2 * kBlockY * kRowStride / 4;  // words
  for (int r = y; r < rows; r += 2 * kBlockY, p0 += kStep, p1 += kStep) {
    filter_row(p0, shift0, r);
    if (r + kBlockY < rows) filter_row(p1, shift1, r + kBlockY);
  }
}

// Four consecutive output values, stored with one vector store.
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

// Vertical pass: the row sums -> output row v of the band, 12 consecutive values of the tile's row per thread: value
// chunks q = 0..2 at 32q + 4g of the 96 (row_value's order). NCHW: chunk q is channel q of pixels u0 + 4g..+3;
// channels_last: values 32q + 4g..+3 of the row's interleaved pixels, so each store instruction of a warp writes 128
// contiguous bytes per row. Branch-free inside the image: a row or column whose centre maps outside has zero
// weights and takes the fill value; all_inside: every pixel of the band maps inside the image (the loader's case),
// none to fill. whole_store: the tile lies inside the output, whose rows hold a multiple of 4
// pixels and start 16-byte aligned (one vector store per chunk). o: the output's value (band.v0 + v, column
// u0 + 4g (NCHW) or value 4g of the tile's row (channels_last), channel 0).
template <int K, bool kChannelsLast, typename out_t>
__device__ __forceinline__ void tile_vertical(const TiledShared& sh, const Band& band, int v_begin, int u0,
                                              int out_w, out_t* __restrict__ o, int os_c, bool all_inside,
                                              bool whole_store) {
  const int tid = threadIdx.y * kBlockX + threadIdx.x;
  const int g = tid % kColGroups, v = tid / kColGroups;
  const int width = min(kTileW, out_w - u0);  // the tile's pixels inside the output
  if (v >= band.rows_out || (!kChannelsLast && g * kCols >= width)) return;
  const int row = band.v0 - v_begin + v;  // among the block's rows
  const int r0 = sh.window_y[row] - band.ya;
  float acc[3][kCols];
#pragma unroll
  for (int q = 0; q < 3; ++q)
#pragma unroll
    for (int e = 0; e < kCols; ++e) acc[q][e] = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float wk = sh.wy[k][row];
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      const float4 s = *reinterpret_cast<const float4*>(&sh.rowsum[r0 + k][32 * q + g * kCols]);
      acc[q][0] += wk * s.x;
      acc[q][1] += wk * s.y;
      acc[q][2] += wk * s.z;
      acc[q][3] += wk * s.w;
    }
  }
  if (!all_inside) {
    // Fill where the value's column or the row maps outside. Channel of value 32q + 4g + e: q (NCHW), or
    // (32q + 4g + e) % 3 = (g + 2q + e) % 3 (channels_last): one of three rotations of the fill values.
    const float* fill_value = sh.plan.fill_value;
    const bool inside_y = (sh.inside_y[row / 32] >> (row % 32)) & 1;
    const int turn = g % 3;
    const float fill_turned[3] = {fill_value[turn], fill_value[turn == 2 ? 0 : turn + 1], fill_value[turn == 0 ? 2 : turn - 1]};
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      const uint32_t bits = inside_y ? sh.inside_value[q] >> (g * kCols) : 0u;
#pragma unroll
      for (int e = 0; e < kCols; ++e)
        if (!((bits >> e) & 1)) acc[q][e] = kChannelsLast ? fill_turned[(2 * q + e) % 3] : fill_value[q];
    }
  }
  if (whole_store) {
#pragma unroll
    for (int q = 0; q < 3; ++q)
      *reinterpret_cast<Vec4<out_t>*>(o + (kChannelsLast ? 32 * q : q * os_c)) =
          Vec4<out_t>{{OutCast<out_t>::apply(acc[q][0]), OutCast<out_t>::apply(acc[q][1]),
                       OutCast<out_t>::apply(acc[q][2]), OutCast<out_t>::apply(acc[q][3])}};
    return;
  }
  // Values of the row inside the output: NCHW per chunk 4 pixels from g * 4, channels_last 3 per pixel.
  const int valid = kChannelsLast ? 3 * width : width;
#pragma unroll
  for (int q = 0; q < 3; ++q) {
    const int first = kChannelsLast ? 32 * q + g * kCols : g * kCols;  // of this chunk, in `valid`'s units
#pragma unroll
    for (int e = 0; e < kCols; ++e)
      if (first + e < valid) o[(kChannelsLast ? 32 * q : q * os_c) + e] = OutCast<out_t>::apply(acc[q][e]);
  }
}

// Warp 0's part of the block's start: the sample's header, whether the tiled path takes it, the columns its tile
// reads and its first band, into sh.plan (written by lane 0; a barrier follows).
__device__ __forceinline__ void plan_tile(TilePlan& plan, const uint8_t* __restrict__ data, int64_t data_size,
                                          const int64_t* __restrict__ offsets, const int64_t* __restrict__ shapes,
                                          const float* __restrict__ matrices, int map_cols,
                                          const float* __restrict__ alpha, const float* __restrict__ beta, Fill fill,
                                          int u0, int v_begin, int v_end, int out_w) {
  const int b = blockIdx.z;
  const int64_t h64 = shapes[b * 3], w64 = shapes[b * 3 + 1], c_in = shapes[b * 3 + 2], off = offsets[b];
  const bool valid = c_in == 3 && image_fits(h64, w64, c_in, off, data_size);
  const int h = valid ? static_cast<int>(h64) : 0, w = valid ? static_cast<int>(w64) : 0;
  float m[6];
  const Visible vis = read_map(matrices, b, map_cols, h, w, m);
  // filter_support of an axis-aligned matrix (any other falls back) without the square root.
  const float support_x = fmaxf(fabsf(m[0]), 1.f), support_y = fmaxf(fabsf(m[4]), 1.f);
  const int kx = tile_taps(support_x), ky = tile_taps(support_y);
  int xa = 0, xb = 0;
  bool tileable = valid && m[1] == 0.f && m[3] == 0.f && kx <= kTileMaxTaps && ky <= kTileMaxTaps && w >= kx &&
                  h >= ky;
  if (tileable) tile_range(m[0], m[2], support_x, w, u0, min(u0 + kTileW, out_w) - 1, kx, &xa, &xb);
  tileable = tileable && ((15 + (xb - xa) * 3 + 15) / 16) * 16 <= kRowStride;  // a row segment fits raw's rows
  // Bands of 32 rows where 32 rows' windows surely fit kStagedRows (they span at most floor(31 * shrink) + 1 + K
  // rows; + 1 for rounding), else 16 (at most 15 * 3 + 2 + 6 = 53 for a shrink below 3).
  const int band_rows = static_cast<int>(31.f * fabsf(m[4])) + 2 + ky <= kStagedRows ? kBandRows : kBandRows / 2;
  const Band first = tileable ? plan_band(v_begin, v_end, band_rows, m[4], m[5], support_y, h, ky) : Band{};
  if (threadIdx.x != 0) return;
  // 32-bit offsets within the image (smaller than 2^31 bytes: valid) from here on.
  plan.segment = reinterpret_cast<uintptr_t>(data + off) + xa * 3;
#pragma unroll
  for (int c = 0; c < 3; ++c) {  // the horizontal sums are 2^23 + kWeightOne * (pixel value)
    plan.scale[c] = alpha[c] / kWeightOne;
    plan.bias[c] = beta[c] - plan.scale[c] * (1 << 23);
    plan.fill_value[c] = fill[c] * alpha[c] + beta[c];
  }
  plan.scale_x = m[0];
  plan.shift_x = m[2];
  plan.scale_y = m[4];
  plan.shift_y = m[5];
  plan.support_x = support_x;
  plan.support_y = support_y;
  plan.vis = vis;
  plan.h = h;
  plan.w = w;
  plan.xa = xa;
  plan.xb = xb;
  plan.kx = kx;
  plan.ky = ky;
  plan.band_rows = band_rows;
  plan.first = first;
  plan.tileable = tileable;
}

template <typename out_t, bool kChannelsLast>
__global__ void __launch_bounds__(kThreads, 4) warp_tiled_kernel(
    const uint8_t* __restrict__ data, int64_t data_size, const int64_t* __restrict__ offsets,
    const int64_t* __restrict__ shapes, const float* __restrict__ matrices, int map_cols,
    const float* __restrict__ alpha, const float* __restrict__ beta, Fill fill, out_t* __restrict__ out,
    int64_t os_b, int64_t os_c, int64_t os_y, int64_t os_x, int out_h, int out_w, bool vector_store) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  TiledShared& sh = *reinterpret_cast<TiledShared*>(shared_bytes);
  const TilePlan& plan = sh.plan;
  const int u0 = blockIdx.x * kTileW;
  const int v_begin = blockIdx.y * kBlockRows, v_end = min(out_h, v_begin + kBlockRows);
  if (threadIdx.y == 0) {
    plan_tile(sh.plan, data, data_size, offsets, shapes, matrices, map_cols, alpha, beta, fill, u0, v_begin, v_end,
              out_w);
    if (threadIdx.x == 0) sh.bands_inside = 0;
  }
  __syncthreads();
  if (!plan.tileable) {  // uniform over the block
    const int b = blockIdx.z;
    for (int tile_y = v_begin / kTile; tile_y * kTile < v_end; ++tile_y)
      warp_columns<uint8_t, out_t, 3>(data, data_size, offsets[b], shapes[b * 3], shapes[b * 3 + 1],
                                      shapes[b * 3 + 2], matrices, map_cols, alpha, beta, 3, true, fill, out, os_b,
                                      os_c, os_y, os_x, out_h, out_w, tile_y, reinterpret_cast<float*>(sh.raw));
    return;
  }
  const int row_bytes = plan.w * 3, seg = (plan.xb - plan.xa) * 3, kx = plan.kx, ky = plan.ky;
  // This thread's first output value in the vertical pass (see tile_vertical; the band's row v0 added per band).
  // Offsets within a sample are 32-bit (the launch checks that a sample's output has fewer than 2^31 values).
  const int tid = threadIdx.y * kBlockX + threadIdx.x;
  const int sample_os_y = static_cast<int>(os_y), sample_os_c = static_cast<int>(os_c);
  out_t* const out_sample = out + blockIdx.z * os_b;
  const int out_thread =
      (tid / kColGroups) * sample_os_y + u0 * (kChannelsLast ? 3 : 1) + (tid % kColGroups) * kCols;
  const bool whole_store = vector_store && u0 + kTileW <= out_w;

  // Copying a row in takes a 16-byte chunk per lane: a half warp per row where the segment spans at most 16 chunks
  // at any alignment (shrink below ~2.3), else a whole warp.
  const bool half_warp_rows = (15 + seg + 15) / 16 <= 16;  // uniform
  const int row_slot = half_warp_rows ? 2 * threadIdx.y + threadIdx.x / 16 : threadIdx.y;
  const int row_step = half_warp_rows ? 2 * kBlockY : kBlockY;
  const uint32_t chunk = 16 * (half_warp_rows ? threadIdx.x % 16 : threadIdx.x);
  const uint32_t raw_shared = static_cast<uint32_t>(__cvta_generic_to_shared(&sh.raw[0][0])) + chunk;

  // Copies the band's rows in. A half warp's rows are 16 apart, 16 * row_bytes bytes in global memory, so they
  // start at the same offset within 16 bytes: one misalignment for all (a whole warp's alternate between two).
  const int64_t step_bytes = static_cast<int64_t>(row_step) * row_bytes;
  auto start_band = [&](const Band& band) {
    const int rows = band.yb - band.ya;
    const uint8_t* from =
        reinterpret_cast<const uint8_t*>(plan.segment) + static_cast<int64_t>(band.ya + row_slot) * row_bytes;
    uint32_t to = raw_shared + row_slot * kRowStride;
    uint32_t misalign = reinterpret_cast<uintptr_t>(from) & 15;
    for (int r = row_slot; r < rows; r += row_step, from += step_bytes, to += row_step * kRowStride) {
      if (!half_warp_rows) misalign = reinterpret_cast<uintptr_t>(from) & 15;
      // The chunk holds bytes of the row. The 16-byte copies round each row segment out to 16-byte boundaries; an
      // allocation starts and ends on such boundaries, so they never leave the one holding the batch.
      if (chunk < misalign + seg) copy_async_16(to, from - misalign + chunk);
    }
  };

  Band band = plan.first;
  start_band(band);  // first, so the copies are in flight while the weights are computed
  // The weights of all the block's rows (warps 0-3, a row per thread, windows clamped to the image) and columns
  // (warp 4), once: no warp does more than the others inside the band loop.
  if (threadIdx.y < kBlockRows / 32) {
    const int i = threadIdx.y * 32 + threadIdx.x;
    bool inside;
    int window;
    float wk[kTileMaxTaps];
    axis_weights(plan.scale_y, plan.shift_y, plan.support_y, plan.h, plan.vis.y0, plan.vis.y1, v_begin + i,
                 v_begin + i < v_end, 0, plan.h, ky, wk, &window, &inside);
    sh.window_y[i] = window;
#pragma unroll
    for (int k = 0; k < kTileMaxTaps; ++k) sh.wy[k][i] = wk[k];
    const uint32_t mask = __ballot_sync(0xffffffffu, inside);
    if (threadIdx.x == 0) sh.inside_y[threadIdx.y] = mask;
    // The bands among this warp's 32 rows (one of 32 rows or two of 16): their input rows from the windows of
    // their first and last rows (monotonic in the row), and whether all their rows map inside.
    const int band_rows = plan.band_rows, rows = v_end - v_begin;
    for (int first = threadIdx.y * 32; first < threadIdx.y * 32 + 32 && first < rows; first += band_rows) {
      const int last = min(first + band_rows, rows) - 1;
      const int a = __shfl_sync(0xffffffffu, window, first % 32);
      const int z = __shfl_sync(0xffffffffu, window, last % 32);
      const uint32_t span = (last - first == 31 ? ~0u : (2u << (last - first)) - 1) << (first % 32);
      if (threadIdx.x == 0) {
        sh.bands[first / band_rows] = Band{v_begin + first, last - first + 1, min(a, z), max(a, z) + ky};
        if ((mask & span) == span) atomicOr(&sh.bands_inside, 1u << (first / band_rows));
      }
    }
  } else if (threadIdx.y == kBlockRows / 32) {
    const int i = threadIdx.x;
    bool inside;
    int window;
    float wk[kTileMaxTaps];
    axis_weights(plan.scale_x, plan.shift_x, plan.support_x, plan.w, plan.vis.x0, plan.vis.x1, u0 + i,
                 u0 + i < out_w, plan.xa, plan.xb, kx, wk, &window, &inside);
    pack_weight_pairs(wk, &sh.wx[0][i], kTileW);
    sh.lo_x[i] = 3 * window;
    const uint32_t mask = __ballot_sync(0xffffffffu, inside);
    if (i == 0) {
      const int width = min(kTileW, out_w - u0);
      sh.columns_inside = mask == (width >= kTileW ? ~0u : (1u << width) - 1);
    }
    if (i < 3) {  // the same per value of a row of sums (row_value's order)
      uint32_t bits = 0;
      for (int j = 0; j < 32; ++j) bits |= ((mask >> (kChannelsLast ? (32 * i + j) / 3 : j)) & 1u) << j;
      sh.inside_value[i] = bits;
    }
  }
  for (int index = 0;; ++index) {
    copies_wait_all();
    __syncthreads();  // the band's rows (and the weights) are in; the last band's vertical pass is done with rowsum
    const uint32_t band_first = static_cast<uint32_t>(plan.segment + band.ya * row_bytes);
    switch (kx) {
      case 3: tile_horizontal<3, kChannelsLast>(sh, band.yb - band.ya, band_first, row_bytes); break;
      case 4: tile_horizontal<4, kChannelsLast>(sh, band.yb - band.ya, band_first, row_bytes); break;
      case 5: tile_horizontal<5, kChannelsLast>(sh, band.yb - band.ya, band_first, row_bytes); break;
      default: tile_horizontal<6, kChannelsLast>(sh, band.yb - band.ya, band_first, row_bytes); break;
    }
    __syncthreads();  // raw is free: the next band's rows are copied in during this band's vertical pass
    const bool last = band.v0 + band.rows_out >= v_end;
    if (!last) start_band(sh.bands[index + 1]);
    const bool all_inside = sh.columns_inside && ((sh.bands_inside >> index) & 1);
    out_t* const o = out_sample + (out_thread + band.v0 * sample_os_y);
    switch (ky) {
      case 3: tile_vertical<3, kChannelsLast>(sh, band, v_begin, u0, out_w, o, sample_os_c, all_inside, whole_store); break;
      case 4: tile_vertical<4, kChannelsLast>(sh, band, v_begin, u0, out_w, o, sample_os_c, all_inside, whole_store); break;
      case 5: tile_vertical<5, kChannelsLast>(sh, band, v_begin, u0, out_w, o, sample_os_c, all_inside, whole_store); break;
      default: tile_vertical<6, kChannelsLast>(sh, band, v_begin, u0, out_w, o, sample_os_c, all_inside, whole_store); break;
    }
    if (last) break;
    band = sh.bands[index + 1];
  }
}

// Shared memory beyond the 48 KB a kernel gets by default must be granted per kernel and device: here for both
// layouts of out_t's tiled kernel at once.
template <typename out_t>
void allow_tiled_shared_memory() {
  static std::atomic<uint64_t> granted{0};  // bit d: done for device d
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t(1) << (device % 64);
  if (granted.load(std::memory_order_acquire) & bit) return;
  for (auto kernel : {warp_tiled_kernel<out_t, true>, warp_tiled_kernel<out_t, false>}) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(sizeof(TiledShared))));
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
  }
  granted.fetch_or(bit, std::memory_order_release);
}

template <typename in_t, typename out_t>
void launch(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes, const at::Tensor& matrices,
            const at::Tensor& alpha, const at::Tensor& beta, int64_t channels, bool hwc, const Fill& fill,
            at::Tensor& out) {
  const int64_t batch = offsets.numel();
  const int out_h = static_cast<int>(out.size(2)), out_w = static_cast<int>(out.size(3));
  const int map_cols = static_cast<int>(matrices.size(2));  // 3, or 5 with visible boxes (warp.h)
  TORCH_CHECK(batch <= 65535, "warp_normalize: at most 65535 samples per call on CUDA");
  const dim3 block(kBlockX, kBlockY);
  const dim3 grid((out_w + kBlockX - 1) / kBlockX, (out_h + kBlockY * kRows - 1) / (kBlockY * kRows),
                  static_cast<unsigned>(batch));
  TORCH_CHECK(grid.y <= 65535, "warp_normalize: output too tall");
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if constexpr (std::is_same_v<in_t, uint8_t>) {
    if (hwc && channels == 3 && out.stride(0) < (int64_t(1) << 31)) {  // what the loader decodes
      const bool channels_last = out.stride(1) == 1;
      const dim3 tiled_grid(grid.x, (out_h + kBlockRows - 1) / kBlockRows, grid.z);
      const bool vector_store = out_w % kCols == 0 && reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0 &&
                                out.stride(3) == (channels_last ? 3 : 1);
      allow_tiled_shared_memory<out_t>();
      auto kernel = channels_last ? warp_tiled_kernel<out_t, true> : warp_tiled_kernel<out_t, false>;
      kernel<<<tiled_grid, block, sizeof(TiledShared), stream>>>(
          data.data_ptr<uint8_t>(), data.numel(), offsets.data_ptr<int64_t>(), shapes.data_ptr<int64_t>(),
          matrices.data_ptr<float>(), map_cols, alpha.data_ptr<float>(), beta.data_ptr<float>(),
          fill, out.data_ptr<out_t>(), out.stride(0), out.stride(1), out.stride(2), out.stride(3),
          out_h, out_w, vector_store);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
  }
  auto kernel = channels == 3 ? warp_normalize_kernel<in_t, out_t, 3> : warp_normalize_kernel<in_t, out_t, 0>;
  kernel<<<grid, block, 0, stream>>>(
      data.data_ptr<in_t>(), data.numel(), offsets.data_ptr<int64_t>(), shapes.data_ptr<int64_t>(),
      matrices.data_ptr<float>(), map_cols, alpha.data_ptr<float>(), beta.data_ptr<float>(),
      static_cast<int>(channels), hwc,
      fill, out.data_ptr<out_t>(), out.stride(0), out.stride(1), out.stride(2), out.stride(3),
      out_h, out_w);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor warp_normalize_cuda(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                               const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta,
                               int64_t channels, int64_t out_h, int64_t out_w, bool hwc, at::ScalarType out_dtype,
                               bool channels_last, c10::ArrayRef<double> fill) {
  const c10::cuda::CUDAGuard guard(data.device());
  at::Tensor out = prepare_warp_output(data, offsets, shapes, matrices, alpha, beta, channels, out_h, out_w,
                                       out_dtype, channels_last);
  const Fill fills = make_fill(fill, channels, "warp_normalize");
  if (offsets.numel() == 0) return out;
  dispatch_warp_types(data.scalar_type(), out_dtype, [&](auto in_tag, auto out_tag) {
    using in_t = typename decltype(in_tag)::type;
    using out_t = typename decltype(out_tag)::type;
    launch<in_t, out_t>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fills, out);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fastload, CUDA, m) { m.impl("warp_normalize", &warp_normalize_cuda); }

}  // namespace fastload
