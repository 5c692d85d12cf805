// CUDA kernel of `fastload::warp_normalize` (schema and CPU twin in warp_cpu.cpp, maths in warp.h).
// Blocks of 32 x 32 output pixels, grid.z is the sample. Launched on the current stream.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

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

// The per-pixel path, for any input: the column's filter taps (the same for every row of an axis-aligned warp)
// are computed once and kept in shared memory ([tap][thread], conflict-free); rotations, shears and large
// shrinks take the full 2-D filter. Output tile (blockIdx.x, tile_y); tap_weight: kMaxTaps x kThreads floats of
// shared memory. No barrier inside: a thread may return early.
template <typename in_t, typename out_t, int CH>
__device__ __forceinline__ void warp_columns(const in_t* __restrict__ data, int64_t data_size, int64_t off,
                                             int64_t h64, int64_t w64, int64_t c_in, const float* m,
                                             const float* __restrict__ alpha, const float* __restrict__ beta,
                                             int channels, bool hwc, float fill, out_t* __restrict__ out,
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
  for (int c = 0; c < kMaxChannels; ++c) fill_value[c] = c < C ? fill * alpha[c] + beta[c] : 0.f;
  const int v_end = min(v_first + kRows, out_h);
  // A malformed sample (never produced by fastload itself) reads nothing and yields fill, never stray memory.
  const bool valid = h64 > 0 && w64 > 0 && h64 * w64 * c_in < (int64_t(1) << 31) && c_in == C && off >= 0 &&
                     off + h64 * w64 * c_in <= data_size;
  if (!valid) {
    for (int v = v_first; v < v_end; ++v)
      for (int c = 0; c < C; ++c) o_base[v * os_y + c * os_c] = OutCast<out_t>::apply(fill_value[c]);
    return;
  }
  const int h = static_cast<int>(h64), w = static_cast<int>(w64);
  const int s_c = hwc ? 1 : h * w, s_y = hwc ? w * C : w, s_x = hwc ? C : 1;
  const in_t* img = data + off;
  const float sx = filter_support(m[0], m[1]), sy = filter_support(m[3], m[4]);

  if (m[1] == 0.f && m[3] == 0.f) {  // axis-aligned
    const float cx = m[0] * u + m[2] + 0.5f;
    int x0, x1;
    filter_taps(cx, sx, w, &x0, &x1);
    const int nx = x1 - x0;
    if (nx <= kMaxTaps) {
      const bool inside_x = cx >= 0.f && cx <= w;
      float total_x = 0.f;
      for (int k = 0; k < nx; ++k) {
        const float wk = triangle((x0 + k + 0.5f - cx) / sx);
        tap_weight[k * kThreads + tid] = wk;
        total_x += wk;
      }
      for (int v = v_first; v < v_end; ++v) {
        out_t* o = o_base + v * os_y;
        const float cy = m[4] * v + m[5] + 0.5f;
        if (!inside_x || cy < 0.f || cy > h) {
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
    warp_pixel_general(in, C, m, sx, sy, u, v, alpha, beta, fill_value, o_base + v * os_y, os_c);
}

template <typename in_t, typename out_t, int CH>
__global__ void __launch_bounds__(kThreads, 4) warp_normalize_kernel(
    const in_t* __restrict__ data, int64_t data_size, const int64_t* __restrict__ offsets,
    const int64_t* __restrict__ shapes, const float* __restrict__ matrices, const float* __restrict__ alpha,
    const float* __restrict__ beta, int channels, bool hwc, float fill, out_t* __restrict__ out, int64_t os_b,
    int64_t os_c, int64_t os_y, int64_t os_x, int out_h, int out_w) {
  __shared__ float tap_weight[kMaxTaps * kThreads];
  const int b = blockIdx.z;
  float m[6];
#pragma unroll
  for (int k = 0; k < 6; ++k) m[k] = matrices[b * 6 + k];
  warp_columns<in_t, out_t, CH>(data, data_size, offsets[b], shapes[b * 3], shapes[b * 3 + 1], shapes[b * 3 + 2],
                                m, alpha, beta, channels, hwc, fill, out, os_b, os_c, os_y, os_x, out_h, out_w,
                                blockIdx.y, tap_weight);
}

// The loader's case (uint8 HWC RGB, axis-aligned, shrink up to ~2.8x): the block stages its tile's input rows in
// shared memory with asynchronous 32-bit copies, filters them horizontally into 32 output columns, then vertically
// into 32 output rows. Every input byte is read from global memory once per tile instead of once per tap and
// pixel, and the weights are computed once per column and row. Other blocks take warp_columns.
//
// The kernel is bound by instruction issue, so the inner loops are straight-line code: every column (row) of a
// tile gets the same number of taps K, zero-padded, with K a template argument (3 to 6: supports 1 to 3), and
// bytes become floats by a bit trick rather than the quarter-rate conversion instruction.
//
// The shrink limit covers what the loader produces: DCT scales are powers of two, so a crop reaches the kernel
// up to 2x larger than the output along its shorter side, and RandomResizedCrop's aspect ratios (3/4 to 4/3)
// make the other side up to 2.67x.
constexpr int kStagedRows = 68;     // input rows a staged tile may span (33 * shrink + 1): vertical shrink ~2x
constexpr int kTileRowWords = 72;   // 288 bytes of one staged row, alignment included: horizontal shrink ~2.85x
constexpr int kTileRows = 96;       // rows a direct tile may span: vertical shrink up to ~2.85x
constexpr int kTileMinTaps = 3, kTileMaxTaps = 6;

// A tile spanning more than kStagedRows input rows, or wider rows than kTileRowWords words hold, is "direct": its
// horizontal pass reads the bytes from global memory (the L1 cache) instead of staging them, which leaves room for
// 96 rows of row sums within the 48 KB of static shared memory (4 blocks per SM fit either way).
struct TileShared {
  union {
    struct {
      uint32_t raw[kStagedRows][kTileRowWords];    // input rows [ya, yb), bytes from column xa on, word-aligned
      float rowsum[kStagedRows][3][kBlockX];       // horizontal pass: per input row, channel, output column
    } staged;
    float rowsum_direct[kTileRows][3][kBlockX];    // the same row sums, for a direct tile
    float tap_weight[kMaxTaps * kThreads];         // warp_columns' scratch when the block falls back
  };
  float weight[2][kTileMaxTaps][kBlockX];          // K weights of each output column (0) and row (1), zero-padded
  int lo[2][kBlockX];                              // first tap, relative to the staged range's start
  bool inside[2][kBlockX];                         // false: the centre maps outside the image, fill
};
using RowSums = float (*)[3][kBlockX];

// Input centre (edge coordinates) of output position pos along one axis of an axis-aligned warp.
__device__ __forceinline__ float axis_centre(float scale, float shift, int pos) { return scale * pos + shift + 0.5f; }

// Input range [lo, hi) the taps of output positions [first, last] read along one axis. Tap ranges move
// monotonically with the position, so the two ends bound every position's (clamped to the image; an end that
// maps outside only widens the range).
__device__ __forceinline__ void tile_range(float scale, float shift, float support, int size, int first, int last,
                                           int* lo, int* hi) {
  int lo0, hi0, lo1, hi1;
  filter_taps(axis_centre(scale, shift, first), support, size, &lo0, &hi0);
  filter_taps(axis_centre(scale, shift, last), support, size, &lo1, &hi1);
  *lo = min(lo0, lo1);
  *hi = max(hi0, hi1);
}

// Taps per output pixel along an axis: filter_taps gives at most floor(2 * support + 1).
__device__ __forceinline__ int tile_taps(float support) {
  return max(kTileMinTaps, static_cast<int>(2.f * fminf(support, 64.f) + 1.f));
}

// sm_80+ asynchronous copy of one 32-bit word from global to shared memory (the build targets sm_80 and sm_90).
__device__ __forceinline__ void copy_word_async(uint32_t* to, const uint32_t* from) {
  const unsigned shared = static_cast<unsigned>(__cvta_generic_to_shared(to));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared), "l"(from) : "memory");
}

// Waits for this thread's asynchronous copies (a barrier then makes everyone's visible).
__device__ __forceinline__ void copies_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Exactly float(b) for a byte b: 2^23 + b as a float's bits, minus 2^23 (two full-rate instructions).
__device__ __forceinline__ float byte_to_float(uint32_t b) { return __uint_as_float(0x4B000000u | b) - 8388608.f; }

// Horizontal pass: input row r of the tile -> this thread's output column, three channels. Staged: row r's bytes
// start (first + r * row_bytes) & 3 bytes into its first staged word. Direct: they start at rows + r * row_bytes
// in global memory.
template <int K, bool kStaged>
__device__ __forceinline__ void tile_horizontal(TileShared& sh, RowSums rowsum, int rows, uint32_t first,
                                                const uint8_t* __restrict__ direct_rows, int row_bytes) {
  const int u = threadIdx.x;
  if (!sh.inside[0][u]) return;
  float w[K];
#pragma unroll
  for (int k = 0; k < K; ++k) w[k] = sh.weight[0][k][u];
  const int tap = sh.lo[0][u] * 3;
  for (int r = threadIdx.y; r < rows; r += kBlockY) {
    float a0 = 0.f, a1 = 0.f, a2 = 0.f;
    if constexpr (kStaged) {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(sh.staged.raw[r]) + ((first + r * row_bytes) & 3) + tap;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        a0 += w[k] * byte_to_float(p[3 * k]);
        a1 += w[k] * byte_to_float(p[3 * k + 1]);
        a2 += w[k] * byte_to_float(p[3 * k + 2]);
      }
    } else {
      const uint8_t* p = direct_rows + r * row_bytes + tap;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        a0 += w[k] * byte_to_float(__ldg(p + 3 * k));
        a1 += w[k] * byte_to_float(__ldg(p + 3 * k + 1));
        a2 += w[k] * byte_to_float(__ldg(p + 3 * k + 2));
      }
    }
    rowsum[r][0][u] = a0;
    rowsum[r][1][u] = a1;
    rowsum[r][2][u] = a2;
  }
}

// Vertical pass: the row sums -> this thread's kRows output pixels, normalised and stored. Branch-free inside the
// image: a row or column whose centre maps outside has zero weights over valid rows and takes the fill value.
// kChannelsLast: the channel stride is 1 (compile-time store offsets).
template <int K, bool kChannelsLast, typename out_t>
__device__ __forceinline__ void tile_vertical(const TileShared& sh, RowSums rowsum, out_t* __restrict__ o, int64_t os_c,
                                              int64_t os_y, int rows_left, const float* scale, const float* bias,
                                              const float* fill_value) {
  const int u = threadIdx.x;
  const bool inside_x = sh.inside[0][u];
  const int64_t step = kBlockY * os_y;
#pragma unroll
  for (int i = 0; i < kRows; ++i, o += step) {
    const int v = threadIdx.y + i * kBlockY;
    if (v >= rows_left) break;
    const int r0 = sh.lo[1][v];
    float acc[3] = {0.f, 0.f, 0.f};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float wk = sh.weight[1][k][v];
#pragma unroll
      for (int c = 0; c < 3; ++c) acc[c] += wk * rowsum[r0 + k][c][u];
    }
    const bool inside = inside_x && sh.inside[1][v];
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      const float value = inside ? acc[c] * scale[c] + bias[c] : fill_value[c];
      o[kChannelsLast ? c : c * os_c] = OutCast<out_t>::apply(value);
    }
  }
}

// A block takes kTilesPerBlock tiles down one column of tiles, so the per-sample work (reading the sample's
// shape and matrix, the supports, the column taps) is shared between them.
constexpr int kTilesPerBlock = 2;

template <typename out_t, bool kChannelsLast>
__global__ void __launch_bounds__(kThreads, 4) warp_tiled_kernel(
    const uint8_t* __restrict__ data, int64_t data_size, const int64_t* __restrict__ offsets,
    const int64_t* __restrict__ shapes, const float* __restrict__ matrices, const float* __restrict__ alpha,
    const float* __restrict__ beta, float fill, out_t* __restrict__ out, int64_t os_b, int64_t os_c, int64_t os_y,
    int64_t os_x, int out_h, int out_w) {
  __shared__ TileShared sh;
  const int b = blockIdx.z;
  const int tid = threadIdx.y * kBlockX + threadIdx.x;
  const int64_t h64 = shapes[b * 3], w64 = shapes[b * 3 + 1], c_in = shapes[b * 3 + 2], off = offsets[b];
  float m[6];
#pragma unroll
  for (int k = 0; k < 6; ++k) m[k] = matrices[b * 6 + k];
  const bool valid = h64 > 0 && w64 > 0 && h64 * w64 * 3 < (int64_t(1) << 31) && c_in == 3 && off >= 0 &&
                     off + h64 * w64 * 3 <= data_size;
  const int u0 = blockIdx.x * kBlockX;
  const int h = static_cast<int>(h64), w = static_cast<int>(w64);
  // filter_support of an axis-aligned matrix (any other falls back below) without the square root.
  const float support_x = fmaxf(fabsf(m[0]), 1.f), support_y = fmaxf(fabsf(m[4]), 1.f);
  const int kx = tile_taps(support_x), ky = tile_taps(support_y);
  int xa = 0, xb = 0;
  if (valid) tile_range(m[0], m[2], support_x, w, u0, min(u0 + kBlockX, out_w) - 1, &xa, &xb);
  // Per sample and column of tiles, uniform over the block.
  const bool tileable = valid && m[1] == 0.f && m[3] == 0.f && kx <= kTileMaxTaps && ky <= kTileMaxTaps &&
                        xb - xa >= kx;
  const int row_bytes = w * 3, seg = (xb - xa) * 3;
  // Staged rows are read as aligned 32-bit words from `src`, the image starting at byte (image & 3) of it.
  // 32-bit offsets: the image is smaller than 2^31 bytes (valid). Every word read holds at least one byte of a
  // row segment, so no read leaves the image's allocation.
  const uintptr_t image = reinterpret_cast<uintptr_t>(data + off);
  const uint32_t* src = reinterpret_cast<const uint32_t*>(image & ~uintptr_t(3));
  float scale[3], bias[3], fill_value[3];
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    scale[c] = alpha[c];
    bias[c] = beta[c];
    fill_value[c] = fill * scale[c] + bias[c];
  }
  const int tiles_y = (out_h + kTile - 1) / kTile;
  const int tile_end = min(tiles_y, static_cast<int>(blockIdx.y + 1) * kTilesPerBlock);
  for (int tile_y = blockIdx.y * kTilesPerBlock; tile_y < tile_end; ++tile_y) {
    if (tile_y != static_cast<int>(blockIdx.y) * kTilesPerBlock) __syncthreads();  // shared memory is reused
    const int v0 = tile_y * kTile;
    int ya = 0, yb = 0;
    if (tileable) tile_range(m[4], m[5], support_y, h, v0, min(v0 + kTile, out_h) - 1, &ya, &yb);
    const int rows = yb - ya;
    if (!tileable || rows < ky || rows > kTileRows) {  // uniform over the block
      warp_columns<uint8_t, out_t, 3>(data, data_size, off, h64, w64, c_in, m, alpha, beta, 3, true, fill, out,
                                      os_b, os_c, os_y, os_x, out_h, out_w, tile_y, sh.tap_weight);
      continue;
    }
    const bool staged = rows <= kStagedRows && seg + 3 <= kTileRowWords * 4;
    const RowSums rowsum = staged ? sh.staged.rowsum : sh.rowsum_direct;
    // Row r of the tile starts at byte first + r * row_bytes of src.
    const uint32_t first = static_cast<uint32_t>(image & 3) + static_cast<uint32_t>(ya * row_bytes + xa * 3);

    // Stage the rows: warp y copies rows y, y + 8, ..., a word per lane and instruction, as asynchronous copies
    // (global to shared memory without registers), so every word of the tile is in flight at once while the
    // weights are computed.
    if (staged) {
      uint32_t* raw = &sh.staged.raw[0][0];
      for (int r = threadIdx.y; r < rows; r += kBlockY) {
        const uint32_t start = first + r * row_bytes;
        const int n = static_cast<int>(((start & 3) + seg + 3) >> 2);
        const uint32_t* from = src + (start >> 2);
        uint32_t* to = raw + r * kTileRowWords;
        for (int k = threadIdx.x; k < n; k += kBlockX) copy_word_async(to + k, from + k);
      }
    }

    // Taps and weights of the tile's columns (threads 0-31) and rows (32-63): K per position, the filter's n <= K
    // weights placed where its taps fall in a K-window kept inside the staged range, zeros around them.
    if (tid < 2 * kBlockX) {
      const int axis = tid / kBlockX, i = tid % kBlockX;
      const int pos = (axis == 0 ? u0 : v0) + i, size = axis == 0 ? w : h, K = axis == 0 ? kx : ky;
      const int start = axis == 0 ? xa : ya, end = axis == 0 ? xb : yb;
      const float support = axis == 0 ? support_x : support_y;
      const float centre = axis_centre(axis == 0 ? m[0] : m[4], axis == 0 ? m[2] : m[5], pos);
      const bool inside = pos < (axis == 0 ? out_w : out_h) && centre >= 0.f && centre <= size;
      int lo = start, hi = start;
      if (inside) {
        filter_taps(centre, support, size, &lo, &hi);
        // Inside the staged range by construction (tile_range); clamped anyway, so that a rounding difference
        // between the two computations could only drop an edge tap, never read bytes that were not loaded.
        lo = max(lo, start);
        hi = min(hi, end);
      }
      const int window = max(start, min(lo, end - K));  // K taps from here stay inside [start, end)
      float total = 0.f;
      float wk[kTileMaxTaps];
#pragma unroll
      for (int k = 0; k < kTileMaxTaps; ++k) {
        const int x = window + k;
        wk[k] = k < K && x >= lo && x < hi ? triangle((x + 0.5f - centre) / support) : 0.f;
        total += wk[k];
      }
      const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
      for (int k = 0; k < kTileMaxTaps; ++k) sh.weight[axis][k][i] = wk[k] * inv;
      sh.lo[axis][i] = window - start;
      sh.inside[axis][i] = inside && hi > lo;
    }
    if (staged) copies_wait_all();
    __syncthreads();
    const uint8_t* direct_rows = data + off + ya * row_bytes + xa * 3;
    if (staged) {
      switch (kx) {
        case 3: tile_horizontal<3, true>(sh, rowsum, rows, first, direct_rows, row_bytes); break;
        case 4: tile_horizontal<4, true>(sh, rowsum, rows, first, direct_rows, row_bytes); break;
        case 5: tile_horizontal<5, true>(sh, rowsum, rows, first, direct_rows, row_bytes); break;
        default: tile_horizontal<6, true>(sh, rowsum, rows, first, direct_rows, row_bytes); break;
      }
    } else {
      switch (kx) {
        case 3: tile_horizontal<3, false>(sh, rowsum, rows, first, direct_rows, row_bytes); break;
        case 4: tile_horizontal<4, false>(sh, rowsum, rows, first, direct_rows, row_bytes); break;
        case 5: tile_horizontal<5, false>(sh, rowsum, rows, first, direct_rows, row_bytes); break;
        default: tile_horizontal<6, false>(sh, rowsum, rows, first, direct_rows, row_bytes); break;
      }
    }
    __syncthreads();
    const int u = u0 + threadIdx.x;
    if (u < out_w) {
      out_t* o = out + b * os_b + static_cast<int64_t>(v0 + threadIdx.y) * os_y + u * os_x;
      const int rows_left = out_h - v0;
      switch (ky) {
        case 3: tile_vertical<3, kChannelsLast>(sh, rowsum, o, os_c, os_y, rows_left, scale, bias, fill_value); break;
        case 4: tile_vertical<4, kChannelsLast>(sh, rowsum, o, os_c, os_y, rows_left, scale, bias, fill_value); break;
        case 5: tile_vertical<5, kChannelsLast>(sh, rowsum, o, os_c, os_y, rows_left, scale, bias, fill_value); break;
        default: tile_vertical<6, kChannelsLast>(sh, rowsum, o, os_c, os_y, rows_left, scale, bias, fill_value); break;
      }
    }
  }
}

template <typename in_t, typename out_t>
void launch(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes, const at::Tensor& matrices,
            const at::Tensor& alpha, const at::Tensor& beta, int64_t channels, bool hwc, double fill,
            at::Tensor& out) {
  const int64_t batch = offsets.numel();
  const int out_h = static_cast<int>(out.size(2)), out_w = static_cast<int>(out.size(3));
  TORCH_CHECK(batch <= 65535, "warp_normalize: at most 65535 samples per call on CUDA");
  const dim3 block(kBlockX, kBlockY);
  const dim3 grid((out_w + kBlockX - 1) / kBlockX, (out_h + kBlockY * kRows - 1) / (kBlockY * kRows),
                  static_cast<unsigned>(batch));
  TORCH_CHECK(grid.y <= 65535, "warp_normalize: output too tall");
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if constexpr (std::is_same_v<in_t, uint8_t>) {
    if (hwc && channels == 3) {  // what the loader decodes
      const dim3 tiled_grid(grid.x, (grid.y + kTilesPerBlock - 1) / kTilesPerBlock, grid.z);
      auto kernel = out.stride(1) == 1 ? warp_tiled_kernel<out_t, true> : warp_tiled_kernel<out_t, false>;
      kernel<<<tiled_grid, block, 0, stream>>>(
          data.data_ptr<uint8_t>(), data.numel(), offsets.data_ptr<int64_t>(), shapes.data_ptr<int64_t>(),
          matrices.data_ptr<float>(), alpha.data_ptr<float>(), beta.data_ptr<float>(), static_cast<float>(fill),
          out.data_ptr<out_t>(), out.stride(0), out.stride(1), out.stride(2), out.stride(3), out_h, out_w);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
  }
  auto kernel = channels == 3 ? warp_normalize_kernel<in_t, out_t, 3> : warp_normalize_kernel<in_t, out_t, 0>;
  kernel<<<grid, block, 0, stream>>>(
      data.data_ptr<in_t>(), data.numel(), offsets.data_ptr<int64_t>(), shapes.data_ptr<int64_t>(),
      matrices.data_ptr<float>(), alpha.data_ptr<float>(), beta.data_ptr<float>(), static_cast<int>(channels), hwc,
      static_cast<float>(fill), out.data_ptr<out_t>(), out.stride(0), out.stride(1), out.stride(2), out.stride(3),
      out_h, out_w);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor warp_normalize_cuda(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                               const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta,
                               int64_t channels, int64_t out_h, int64_t out_w, bool hwc, at::ScalarType out_dtype,
                               bool channels_last, double fill) {
  const c10::cuda::CUDAGuard guard(data.device());
  at::Tensor out = prepare_warp_output(data, offsets, shapes, matrices, alpha, beta, channels, out_h, out_w,
                                       out_dtype, channels_last);
  if (offsets.numel() == 0) return out;
  dispatch_warp_types(data.scalar_type(), out_dtype, [&](auto in_tag, auto out_tag) {
    using in_t = typename decltype(in_tag)::type;
    using out_t = typename decltype(out_tag)::type;
    launch<in_t, out_t>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fastload, CUDA, m) { m.impl("warp_normalize", &warp_normalize_cuda); }

}  // namespace fastload
