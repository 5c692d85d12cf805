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
// shrinks take the full 2-D filter. tap_weight: kMaxTaps x kThreads floats of shared memory.
template <typename in_t, typename out_t, int CH>
__device__ __forceinline__ void warp_columns(const in_t* __restrict__ data, int64_t data_size, int64_t off,
                                             int64_t h64, int64_t w64, int64_t c_in, const float* m,
                                             const float* __restrict__ alpha, const float* __restrict__ beta,
                                             int channels, bool hwc, float fill, out_t* __restrict__ out,
                                             int64_t os_b, int64_t os_c, int64_t os_y, int64_t os_x, int out_h,
                                             int out_w, float* tap_weight) {
  const int b = blockIdx.z;
  const int tid = threadIdx.y * kBlockX + threadIdx.x;
  const int u = blockIdx.x * kBlockX + threadIdx.x;
  const int v_first = (blockIdx.y * kBlockY + threadIdx.y) * kRows;
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
                                tap_weight);
}

// The loader's case (uint8 HWC RGB, axis-aligned, shrink up to ~2x): the block stages its tile's input rows in
// shared memory with coalesced 32-bit loads, filters them horizontally into 32 output columns, then vertically
// into 32 output rows. Every input byte is read from global memory once per tile instead of once per tap and
// pixel, and the weights are computed once per column and row. Other blocks take warp_columns.
constexpr int kTileRows = 72;       // input rows one tile may span: vertical shrink up to ~2.1x
constexpr int kTileRowWords = 56;   // 224 bytes of one row, alignment included: horizontal shrink up to ~2.1x
constexpr int kTileTaps = 8;

struct TileShared {
  union {
    struct {
      uint32_t raw[kTileRows][kTileRowWords];      // input rows [ya, yb), bytes from column xa on, word-aligned
      float rowsum[kTileRows][3][kBlockX];         // horizontal pass: per input row, channel, output column
    } tile;
    float tap_weight[kMaxTaps * kThreads];         // warp_columns' scratch when the block falls back
  };
  float weight[2][kTileTaps][kBlockX];             // normalised taps of each output column (0) and row (1)
  int lo[2][kBlockX], taps[2][kBlockX];            // first tap and tap count; 0 taps: outside, fill
  int region[4];                                   // xa, xb, ya, yb: the input the tile needs
  int too_many_taps;
};

template <typename out_t>
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
  // Uniform over the block (per-sample values), as is every branch below that returns: __syncthreads is safe.
  if (!valid || m[1] != 0.f || m[3] != 0.f) {
    warp_columns<uint8_t, out_t, 3>(data, data_size, off, h64, w64, c_in, m, alpha, beta, 3, true, fill, out, os_b,
                                    os_c, os_y, os_x, out_h, out_w, sh.tap_weight);
    return;
  }
  const int h = static_cast<int>(h64), w = static_cast<int>(w64);
  if (tid < 4) sh.region[tid] = tid % 2 == 0 ? INT_MAX : INT_MIN;
  if (tid == 0) sh.too_many_taps = 0;
  __syncthreads();
  if (tid < 2 * kBlockX) {  // taps and normalised weights: threads 0-31 for the columns, 32-63 for the rows
    const int axis = tid / kBlockX, i = tid % kBlockX;
    const int pos = (axis == 0 ? blockIdx.x * kBlockX : blockIdx.y * kTile) + i;
    const int size = axis == 0 ? w : h;
    const float scale = axis == 0 ? m[0] : m[4], shift = axis == 0 ? m[2] : m[5];
    const float support = axis == 0 ? filter_support(m[0], m[1]) : filter_support(m[3], m[4]);
    int lo = 0, n = 0;
    const float centre = scale * pos + shift + 0.5f;
    if (pos < (axis == 0 ? out_w : out_h) && centre >= 0.f && centre <= size) {
      int hi;
      filter_taps(centre, support, size, &lo, &hi);
      n = hi - lo;  // >= 1 for a centre inside the image (support >= 1)
      if (n > kTileTaps) {
        atomicOr(&sh.too_many_taps, 1);
      } else {
        float total = 0.f;
        for (int k = 0; k < n; ++k) {
          const float wk = triangle((lo + k + 0.5f - centre) / support);
          sh.weight[axis][k][i] = wk;
          total += wk;
        }
        const float inv = total > 0.f ? 1.f / total : 0.f;
        for (int k = 0; k < n; ++k) sh.weight[axis][k][i] *= inv;
        atomicMin(&sh.region[2 * axis], lo);
        atomicMax(&sh.region[2 * axis + 1], hi);
      }
    }
    sh.lo[axis][i] = lo;
    sh.taps[axis][i] = n;
  }
  __syncthreads();
  const int xa = sh.region[0], xb = sh.region[1], ya = sh.region[2], yb = sh.region[3];
  const bool empty = xb <= xa || yb <= ya;  // every column or every row maps outside: all fill
  if (sh.too_many_taps || (!empty && (yb - ya > kTileRows || (xb - xa) * 3 + 3 > kTileRowWords * 4))) {
    warp_columns<uint8_t, out_t, 3>(data, data_size, off, h64, w64, c_in, m, alpha, beta, 3, true, fill, out, os_b,
                                    os_c, os_y, os_x, out_h, out_w, sh.tap_weight);
    return;
  }
  const uint8_t* img = data + off;
  const int row_bytes = w * 3, seg = (xb - xa) * 3, rows = empty ? 0 : yb - ya;
  // Row r's bytes start `shift` bytes into its first aligned word. Every word read holds at least one byte of the
  // row segment, so no read leaves the image's allocation.
  auto row_start = [&](int r) { return reinterpret_cast<uintptr_t>(img + (ya + r) * row_bytes + xa * 3); };
  for (int r = threadIdx.y; r < rows; r += kBlockY) {
    const uintptr_t start = row_start(r);
    const uint32_t* src = reinterpret_cast<const uint32_t*>(start & ~uintptr_t(3));
    const int words = static_cast<int>((start & 3) + seg + 3) / 4;
    for (int k = threadIdx.x; k < words; k += kBlockX) sh.tile.raw[r][k] = __ldg(src + k);
  }
  __syncthreads();
  const int u_local = threadIdx.x;
  const int nx = sh.taps[0][u_local];
  if (nx > 0) {  // horizontal: input row r -> output column u, three channels
    const int first = (sh.lo[0][u_local] - xa) * 3;
    for (int r = threadIdx.y; r < rows; r += kBlockY) {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(sh.tile.raw[r]) + (row_start(r) & 3) + first;
      float a0 = 0.f, a1 = 0.f, a2 = 0.f;
#pragma unroll
      for (int k = 0; k < kTileTaps; ++k) {
        if (k < nx) {
          const float wk = sh.weight[0][k][u_local];
          a0 += wk * static_cast<float>(p[3 * k]);
          a1 += wk * static_cast<float>(p[3 * k + 1]);
          a2 += wk * static_cast<float>(p[3 * k + 2]);
        }
      }
      sh.tile.rowsum[r][0][u_local] = a0;
      sh.tile.rowsum[r][1][u_local] = a1;
      sh.tile.rowsum[r][2][u_local] = a2;
    }
  }
  __syncthreads();
  const int u = blockIdx.x * kBlockX + u_local;
  if (u >= out_w) return;
  float fill_value[3];
#pragma unroll
  for (int c = 0; c < 3; ++c) fill_value[c] = fill * alpha[c] + beta[c];
  for (int v_local = threadIdx.y; v_local < kTile; v_local += kBlockY) {  // vertical: rows -> output pixel
    const int v = blockIdx.y * kTile + v_local;
    if (v >= out_h) break;
    out_t* o = out + b * os_b + v * os_y + u * os_x;
    const int ny = sh.taps[1][v_local];
    if (ny == 0 || nx == 0) {
#pragma unroll
      for (int c = 0; c < 3; ++c) o[c * os_c] = OutCast<out_t>::apply(fill_value[c]);
      continue;
    }
    const int r0 = sh.lo[1][v_local] - ya;
    float acc[kMaxChannels] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int k = 0; k < kTileTaps; ++k) {
      if (k < ny) {
        const float wk = sh.weight[1][k][v_local];
#pragma unroll
        for (int c = 0; c < 3; ++c) acc[c] += wk * sh.tile.rowsum[r0 + k][c][u_local];
      }
    }
    store_pixel(o, os_c, acc, 1.f, alpha, beta, 3);
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
      warp_tiled_kernel<out_t><<<grid, block, 0, stream>>>(
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
