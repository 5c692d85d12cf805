// CUDA kernels of `fastload::photometric` (schema, checks and the CPU twin in augment_cpu.cpp; per-pixel maths in
// augment.h, so both backends compute the same bits). Per slot, two launches on the current stream:
//   stats_kernel  the per-sample statistics the slot's op needs (contrast: luma sum; autocontrast: min/max;
//                 equalize: histograms, turned into the lookup table by the sample's last block; gaussian_blur:
//                 the sample's normalised 1-D weights), blocks of samples that need none return at once;
//   apply_kernel  each block is 32 columns x up to 128 rows of one sample, switching on that sample's op code; the
//                 last slot's launch writes the output dtype/layout (cast(v * alpha + beta)), the others a uint8
//                 scratch batch (two, ping-pong, from the caching allocator).
// Listed samples (samples/matrices: the policies' NEAREST rotate/shear/translate) are read through their maps by
// the launches of their slot (map_slots: its stats and apply), pixel by pixel, so the moved batch is never
// written: the stage skips affine_nearest_'s copy and gather passes.
// The table is on the device, so its values are not checked here (that would synchronise): a sample whose slot
// holds an unknown op code or an undefined blur is left unchanged by that slot (functional.photometric checks
// the host table before copying it).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "affine_nearest.h"
#include "augment.h"
#include "check.h"

namespace fastload {

// augment_cpu.cpp: the checks both backends share; the output on x's device.
at::Tensor prepare_photometric_output(const at::Tensor& x, const at::Tensor& ops, const at::Tensor& params,
                                      const at::Tensor& alpha, const at::Tensor& beta, at::ScalarType out_dtype,
                                      bool channels_last);
void check_photometric_maps(const at::Tensor& x, const std::optional<at::Tensor>& samples,
                            const std::optional<at::Tensor>& matrices);
std::vector<int64_t> photometric_map_slots(at::IntArrayRef map_slots, int64_t listed, int64_t slots);

namespace {

using namespace augment;

constexpr int kTile = 32;                 // apply_kernel: 32 x 32 tiles, up to four per block (kApplyRows)
constexpr int kBlockY = 8;                // of 32 x 8 threads: a quad of each tile row, or 4 rows (8 apart)
constexpr int kThreads = kTile * kBlockY;
constexpr int kApplyRows = 128;           // apply_kernel: at most a block's rows (32-row tiles in turn): per-block
                                          // set-up (op, constants, equalize's table) cost as much as a tile's work
constexpr int kBlurRows = 160;            // horizontal blur sums a block keeps (rows x 32 floats, 20 KB)
static_assert(kThreads == 256, "equalize_luts: one thread per table entry");
constexpr int kStatsChunk = kThreads * 8;  // pixels per stats block (at least; at most 32 blocks per sample)

// One sample's statistics for one slot; the buffer starts zeroed (a minimum is kept as 255 - minimum for that).
struct Stats {
  unsigned long long gray_sum;
  int max[3];
  int inv_min[3];
  unsigned int blocks_done;
  int hist[3][256];
  uint8_t lut[3][256];
};

__device__ __forceinline__ const float* slot_params(const float* params, int b, int slots, int slot) {
  return params + (static_cast<int64_t>(b) * slots + slot) * 3;
}

__device__ __forceinline__ int slot_op(const int64_t* ops, int b, int slots, int slot) {
  if (slot < 0) return kIdentity;  // S = 0: the cast alone
  const int64_t op = ops[static_cast<int64_t>(b) * slots + slot];
  return op >= 0 && op < kNumOps ? static_cast<int>(op) : kIdentity;
}

// The nearest maps of one slot's launch (map_of null: none in this slot). The entries of all slots are one list,
// ordered by slot; this slot's are [start, start + n).
struct Moves {
  const int32_t* map_of;   // [B]: the sample's row in mats for this slot, or -1
  const float* mats;       // [N, 2, 3], all slots'
  nearest::Fills<uint8_t> fill;
  const int64_t* samples;  // [N], all slots'
  int start, n;
};

// A listed sample as its slot reads it: pixel (u, v) is input pixel `source(u, v)` or the fill.
struct Moved {
  const uint8_t* s;
  int h, w, hw;
  int64_t f[6];
  uint32_t fill_rgb;  // the three fill bytes packed in one register (an array member cost the stage ~4%)
  __device__ Moved(const uint8_t* s_, int h_, int w_, const float* m, const nearest::Fills<uint8_t>& fill)
      : s(s_), h(h_), w(w_), hw(h_ * w_), fill_rgb(fill[0] | fill[1] << 8 | fill[2] << 16) {
    // a non-finite matrix maps every pixel outside (fill), as affine_nearest_ (none: unused)
    if (!m || !nearest::to_fixed(m, f)) f[0] = f[1] = f[3] = f[4] = 0, f[2] = f[5] = INT64_MIN / 2;
  }
  __device__ __forceinline__ int source(int u, int v) const {  // the input pixel's index in a plane, or -1
    const int64_t x = nearest::pixel(f[0] * u + f[1] * v + f[2]), y = nearest::pixel(f[3] * u + f[4] * v + f[5]);
    return nearest::inside(x, y, h, w) ? static_cast<int>(y) * w + static_cast<int>(x) : -1;
  }
  // Four pixels (u..u+3, v): the first coordinate, then a step along the row (exact integers: the same pixels).
  __device__ __forceinline__ void sources4(int u, int v, int (&j)[4]) const {
    int64_t x = f[0] * u + f[1] * v + f[2], y = f[3] * u + f[4] * v + f[5];
#pragma unroll
    for (int n = 0; n < 4; ++n, x += f[0], y += f[3]) {
      const int64_t px = nearest::pixel(x), py = nearest::pixel(y);
      j[n] = nearest::inside(px, py, h, w) ? static_cast<int>(py) * w + static_cast<int>(px) : -1;
    }
  }
  __device__ __forceinline__ uint8_t fill_of(int c) const { return static_cast<uint8_t>(fill_rgb >> (8 * c)); }
  __device__ __forceinline__ uint8_t at(int c, int u, int v) const {
    const int i = source(u, v);
    return i < 0 ? fill_of(c) : s[c * hw + i];
  }
};

__device__ __forceinline__ int moved_row(const Moves& moves, int b) { return moves.map_of ? moves.map_of[b] : -1; }

// The set-up, one kernel: the stats records zeroed (16 bytes a thread where possible) and, with listed samples,
// each slot's map_of: map_of[s * B + b] = the last k of slot s's entries [start[s], start[s + 1]) with samples[k] ==
// b, or -1 (an index outside the batch matches nothing). starts: the S + 1 entry bounds, by value.
struct SlotStarts {
  static constexpr int kMax = 16;  // slots with maps per launch (more: further launches)
  int first_slot, count, start[kMax + 1];
};

__global__ void prepare_kernel(uint8_t* __restrict__ stats, int64_t stats_bytes, const int64_t* __restrict__ samples,
                               SlotStarts starts, int64_t batch, int32_t* __restrict__ map_of) {
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < stats_bytes / 16; i += step) reinterpret_cast<uint4*>(stats)[i] = make_uint4(0, 0, 0, 0);
  for (int64_t i = stats_bytes / 16 * 16 + first; i < stats_bytes; i += step) stats[i] = 0;
  if (!map_of) return;
  for (int j = 0; j < starts.count; ++j) {
    int32_t* slot_map = map_of + (starts.first_slot + j) * batch;
    for (int64_t b = first; b < batch; b += step) {
      int found = -1;
      for (int k = starts.start[j]; k < starts.start[j + 1]; ++k) found = samples[k] == b ? k : found;
      slot_map[b] = found;
    }
  }
}

// Normalised taps of one axis into w (all threads of the block): exp in parallel, their sum in order i = 0..k-1
// by one thread (the CPU's order), then the division.
__device__ void blur_weights(int k, float sigma, double* taps, float* w) {
  for (int i = threadIdx.x; i < k; i += blockDim.x) taps[i] = gaussian_tap(i, k, sigma);
  __shared__ double sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int i = 0; i < k; ++i) s = dadd(s, taps[i]);
    sum = s;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < k; i += blockDim.x) w[i] = gaussian_weight(taps[i], sum);
}

// augment.h's equalize_lut for the three channels, one thread per table entry (blockDim.x == 256): the same
// integers (prefix sums, top bin, step, rounding division), so the same tables; the serial loop's 255 64-bit
// divisions per channel on one thread were most of the stats kernel's time.
__device__ void equalize_luts(int (*hist)[256], uint8_t (*lut)[256]) {
  __shared__ long long cum[256];
  __shared__ int top;
  const int t = threadIdx.x;
  for (int c = 0; c < 3; ++c) {
    cum[t] = hist[c][t];
    if (t == 0) top = 0;
    __syncthreads();
    for (int d = 1; d < 256; d *= 2) {  // inclusive scan: cum[t] = hist[0] + ... + hist[t]
      const long long add = t >= d ? cum[t - d] : 0;
      __syncthreads();
      cum[t] += add;
      __syncthreads();
    }
    if (hist[c][t] > 0) atomicMax(&top, t);
    __syncthreads();
    const long long step = (cum[255] - hist[c][top]) / 255;
    long long v = t;  // step 0: the identity
    if (step != 0) v = t == 0 ? 0 : (cum[t - 1] + step / 2) / step;
    lut[c][t] = static_cast<uint8_t>(v > 255 ? 255 : v);
    __syncthreads();  // cum and top are reused by the next channel
  }
}

__global__ void __launch_bounds__(kThreads) stats_kernel(const uint8_t* __restrict__ src,
                                                         const int64_t* __restrict__ ops,
                                                         const float* __restrict__ params, int slots, int slot,
                                                         int h, int w, Stats* __restrict__ stats,
                                                         double* __restrict__ taps, float* __restrict__ weights,
                                                         int kcap, bool quads, Moves moves) {
  const int b = blockIdx.y;
  const int op = slot_op(ops, b, slots, slot);
  const float* p = slot_params(params, b, slots, slot);
  if (op == kGaussianBlur) {
    if (blockIdx.x != 0 || !blur_valid(p[0], p[1], p[2], h, w)) return;
    const int64_t base = static_cast<int64_t>(b) * 2 * kcap;
    blur_weights(static_cast<int>(p[0]), p[2], taps + base, weights + base);
    __syncthreads();
    blur_weights(static_cast<int>(p[1]), p[2], taps + base + kcap, weights + base + kcap);
    return;
  }
  if (!needs_stats(op)) return;
  const int hw = h * w;
  int chunk = (hw + gridDim.x - 1) / gridDim.x;
  if (quads) chunk = (chunk + 3) & ~3;  // hw is a multiple of 4: so are begin and end
  const int begin = blockIdx.x * chunk, end = min(hw, begin + chunk);
  const uint8_t* r = src + static_cast<int64_t>(b) * 3 * hw;
  const uint8_t* g = r + hw;
  const uint8_t* bl = g + hw;
  // f(r, g, b) on every pixel of the block's chunk: with quads, 4-byte loads (three per four pixels); a listed
  // sample through its map
  const int row = moved_row(moves, b);
  const auto each_pixel = [&](auto&& f) {
    if (row >= 0) {
      const Moved mv(r, h, w, moves.mats + static_cast<int64_t>(row) * 6, moves.fill);
      for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const int j = mv.source(i % w, i / w);
        if (j < 0)
          f(mv.fill_of(0), mv.fill_of(1), mv.fill_of(2));
        else
          f(r[j], g[j], bl[j]);
      }
    } else if (quads) {
      for (int i = begin + 4 * threadIdx.x; i < end; i += 4 * blockDim.x) {
        const uchar4 q0 = *reinterpret_cast<const uchar4*>(r + i), q1 = *reinterpret_cast<const uchar4*>(g + i),
                     q2 = *reinterpret_cast<const uchar4*>(bl + i);
        f(q0.x, q1.x, q2.x), f(q0.y, q1.y, q2.y), f(q0.z, q1.z, q2.z), f(q0.w, q1.w, q2.w);
      }
    } else {
      for (int i = begin + threadIdx.x; i < end; i += blockDim.x) f(r[i], g[i], bl[i]);
    }
  };
  Stats& st = stats[b];
  const int lane = threadIdx.x % 32;
  if (op == kContrast) {
    unsigned long long sum = 0;
    const bool one_channel = p[2] != 0.f;  // a grey image in three equal channels: the mean of its one channel
    each_pixel([&](uint8_t cr, uint8_t cg, uint8_t cb) {
      sum += one_channel ? cr : static_cast<unsigned long long>(floorf(gray(cr, cg, cb)));
    });
    for (int d = 16; d > 0; d /= 2) sum += __shfl_down_sync(0xffffffffu, sum, d);
    if (lane == 0 && sum) atomicAdd(&st.gray_sum, sum);
    return;
  }
  if (op == kAutocontrast) {
    unsigned int hi[3] = {0, 0, 0}, inv_lo[3] = {0, 0, 0};
    each_pixel([&](uint8_t cr, uint8_t cg, uint8_t cb) {
      const uint8_t v[3] = {cr, cg, cb};
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        hi[c] = max(hi[c], static_cast<unsigned int>(v[c]));
        inv_lo[c] = max(inv_lo[c], 255u - v[c]);
      }
    });
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      hi[c] = __reduce_max_sync(0xffffffffu, hi[c]);
      inv_lo[c] = __reduce_max_sync(0xffffffffu, inv_lo[c]);
      if (lane == 0) {
        atomicMax(&st.max[c], static_cast<int>(hi[c]));
        atomicMax(&st.inv_min[c], static_cast<int>(inv_lo[c]));
      }
    }
    return;
  }
  // equalize: a block histogram in shared memory, added to the sample's; its last block builds the tables.
  __shared__ int hist[3][256];
  __shared__ bool last;
  for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) hist[i / 256][i % 256] = 0;
  __syncthreads();
  each_pixel([&](uint8_t cr, uint8_t cg, uint8_t cb) {
    atomicAdd(&hist[0][cr], 1);
    atomicAdd(&hist[1][cg], 1);
    atomicAdd(&hist[2][cb], 1);
  });
  __syncthreads();
  for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x)
    if (hist[i / 256][i % 256]) atomicAdd(&st.hist[i / 256][i % 256], hist[i / 256][i % 256]);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&st.blocks_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) hist[i / 256][i % 256] = __ldcg(&st.hist[i / 256][i % 256]);
  __syncthreads();
  equalize_luts(hist, st.lut);
}

// Where a slot's values go: the next slot's uint8 planes, or (last slot) the output, cast.
template <typename out_t, bool kFinal, bool kChannelsLast>
struct Sink {
  uint8_t* dst;  // this sample's planes
  out_t* out;    // this sample's output
  float alpha[3], beta[3];
  int hw;
  __device__ __forceinline__ void put(int c, int i, uint8_t v) const {
    if constexpr (kFinal) {
      out[kChannelsLast ? 3 * i + c : c * hw + i] = cast_out<out_t>(v, alpha[c], beta[c]);
    } else {
      dst[c * hw + i] = v;
    }
  }
};

// The blur of one tile: horizontal sums of the rows the tile needs in shared memory, then the vertical sums, a
// band of output rows at a time; kernels too tall for that recompute each row sum (the same sums, slower).
// row_sum(c, y, x): the horizontal pass at column x of row y of plane c (blur_row's sum, in its order).
template <typename RowSum, typename Put>
__device__ void blur_tile(float (*rows)[kTile], int y0, int y_end, int h, int w, int ky, const float* wy,
                          const RowSum& row_sum, const Put& put) {
  const int x = blockIdx.x * kTile + threadIdx.x;
  const int ry = ky / 2, band = kBlurRows - 2 * ry;
  for (int c = 0; c < 3; ++c) {
    if (band < 1) {
      if (x >= w) continue;
      for (int y = y0 + threadIdx.y; y < y_end; y += kBlockY) {
        float acc = 0.f;
        for (int j = 0; j < ky; ++j) acc = fma_rn(wy[j], row_sum(c, reflect(y + j - ry, h), x), acc);
        put(c, y * w + x, blur_round(acc));
      }
      continue;
    }
    for (int yb = y0; yb < y_end; yb += band) {
      const int ye = min(yb + band, y_end), n = ye - yb + 2 * ry;
      __syncthreads();  // the previous band is done with rows
      for (int k = threadIdx.y; k < n; k += kBlockY)
        if (x < w) rows[k][threadIdx.x] = row_sum(c, reflect(yb - ry + k, h), x);
      __syncthreads();
      if (x >= w) continue;
      for (int y = yb + threadIdx.y; y < ye; y += kBlockY) {
        float acc = 0.f;
        for (int j = 0; j < ky; ++j) acc = fma_rn(wy[j], rows[y - yb + j][threadIdx.x], acc);
        put(c, y * w + x, blur_round(acc));
      }
    }
  }
}

// A slot's per-sample constants, read once per block.
struct SlotConsts {
  int op;
  float p0, om, mean;
  int lo[3], hi[3];
  const uint8_t (*lut)[256];  // equalize: the sample's tables, staged in shared memory
};

// The slot's op on N consecutive pixels of row y, starting at column x (index i = y * w + x): v[n] -> o[n]. The
// switch is outside the pixel loop (the op is uniform over the block).
// at(c, x, y): a pixel of the slot's input (sharpness's neighbours).
template <int N, typename At>
__device__ __forceinline__ void apply_op(const SlotConsts& k, const At& at, int h, int w, int x, int y,
                                         const uint8_t (&v)[N][3], uint8_t (&o)[N][3]) {
  // o[n][c] = f(v[n][c], c): the ops whose output value depends on its input value and channel alone
  const auto each_value = [&](auto&& f) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int c = 0; c < 3; ++c) o[n][c] = f(v[n][c], c);
  };
  switch (k.op) {
    case kBrightness:
      each_value([&](uint8_t val, int) -> uint8_t { return brightness(val, k.p0); });
      break;
    case kContrast:
      each_value([&](uint8_t val, int) -> uint8_t { return blend(val, k.mean, k.p0, k.om); });
      break;
    case kSaturation:
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const float gr = floorf(gray(v[n][0], v[n][1], v[n][2]));
#pragma unroll
        for (int c = 0; c < 3; ++c) o[n][c] = blend(v[n][c], gr, k.p0, k.om);
      }
      break;
    case kHue:
#pragma unroll
      for (int n = 0; n < N; ++n) hue(v[n][0], v[n][1], v[n][2], k.p0, o[n]);
      break;
    case kSharpness:
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const int xn = x + n;
        const bool inside = h > 2 && w > 2 && xn > 0 && xn < w - 1 && y > 0 && y < h - 1;
#pragma unroll
        for (int c = 0; c < 3; ++c) {
          o[n][c] = v[n][c];
          if (inside) {
            const int sum = at(c, xn - 1, y - 1) + at(c, xn, y - 1) + at(c, xn + 1, y - 1) + at(c, xn - 1, y) +
                            5 * v[n][c] + at(c, xn + 1, y) + at(c, xn - 1, y + 1) + at(c, xn, y + 1) +
                            at(c, xn + 1, y + 1);
            o[n][c] = sharpen(v[n][c], sum, k.om);
          }
        }
      }
      break;
    case kPosterize:
      each_value([&](uint8_t val, int) -> uint8_t { return posterize(val, k.p0); });
      break;
    case kSolarize:
      each_value([&](uint8_t val, int) -> uint8_t { return solarize(val, k.p0); });
      break;
    case kAutocontrast:
      each_value([&](uint8_t val, int c) -> uint8_t { return autocontrast(val, k.lo[c], k.hi[c]); });
      break;
    case kEqualize:
      each_value([&](uint8_t val, int c) -> uint8_t { return k.lut[c][val]; });
      break;
    case kInvert:
      each_value([&](uint8_t val, int) -> uint8_t { return static_cast<uint8_t>(255 - val); });
      break;
    case kGrayscale:
#pragma unroll
      for (int n = 0; n < N; ++n) o[n][0] = o[n][1] = o[n][2] = static_cast<uint8_t>(gray(v[n][0], v[n][1], v[n][2]));
      break;
    default:  // identity, and a blur that is not defined on this image
      each_value([](uint8_t val, int) { return val; });
      break;
  }
}

// A quad's 12 float32 outputs in channels-last order, as three 16-byte values into q (global or shared memory).
template <typename Sink_t>
__device__ __forceinline__ void quad_floats(const Sink_t& sink, const uint8_t (&o)[4][3], float (&f)[4][3]) {
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int c = 0; c < 3; ++c) f[n][c] = cast_out<float>(o[n][c], sink.alpha[c], sink.beta[c]);
}

template <typename Sink_t>
__device__ __forceinline__ void quad_channels_last(const Sink_t& sink, const uint8_t (&o)[4][3], float4* q) {
  float f[4][3];
  quad_floats(sink, o, f);
  q[0] = make_float4(f[0][0], f[0][1], f[0][2], f[1][0]);
  q[1] = make_float4(f[1][1], f[1][2], f[2][0], f[2][1]);
  q[2] = make_float4(f[2][2], f[3][0], f[3][1], f[3][2]);
}

// Four pixels' values to the sink at index i (a multiple of 4, w too): float32 output as 16-byte stores (three
// per quad in channels-last order, one per plane otherwise), uint8 planes as 4-byte stores, other types per value.
template <typename out_t, bool kFinal, bool kChannelsLast>
__device__ __forceinline__ void put_quad(const Sink<out_t, kFinal, kChannelsLast>& sink, int i,
                                         const uint8_t (&o)[4][3]) {
  if constexpr (!kFinal) {
#pragma unroll
    for (int c = 0; c < 3; ++c)
      *reinterpret_cast<uchar4*>(sink.dst + c * sink.hw + i) = make_uchar4(o[0][c], o[1][c], o[2][c], o[3][c]);
  } else if constexpr (std::is_same_v<out_t, float>) {
    if constexpr (kChannelsLast) {
      float4* q = reinterpret_cast<float4*>(sink.out + 3 * i);
      quad_channels_last(sink, o, q);
    } else {
      float f[4][3];
      quad_floats(sink, o, f);
#pragma unroll
      for (int c = 0; c < 3; ++c)
        *reinterpret_cast<float4*>(sink.out + c * sink.hw + i) = make_float4(f[0][c], f[1][c], f[2][c], f[3][c]);
    }
  } else {
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int c = 0; c < 3; ++c) sink.put(c, i + n, o[n][c]);
  }
}

// Each block covers 32 columns x at most 128 rows of one sample (h split evenly over a column's blocks), a 32 x 32
// tile at a time. With `quads` (w a multiple of 4,
// buffers aligned: decided on the host) each thread takes four consecutive pixels of a row per tile (4-byte loads
// per plane, 16-byte float stores), else one pixel of four rows; blur keeps its own layout (blur_tile).
// kMoved: the launch for the listed samples (grid.z = N, block z is sample samples[z], read through its map), a
// kernel of its own so that its fixed-point maths does not cost the other samples' kernel registers; that kernel
// leaves the listed samples to it.
template <typename out_t, bool kFinal, bool kChannelsLast, bool kMoved>
__global__ void __launch_bounds__(kThreads, kMoved ? 2 : 4)
    apply_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, out_t* __restrict__ out,
                 const int64_t* __restrict__ ops, const float* __restrict__ params, int slots, int slot, int h, int w,
                 const Stats* __restrict__ stats, const float* __restrict__ weights, int kcap,
                 const float* __restrict__ alpha, const float* __restrict__ beta, bool quads, Moves moves,
                 const int64_t* __restrict__ samples, int64_t batch, int block_rows) {
  int b;
  if constexpr (kMoved) {
    const int k = moves.start + static_cast<int>(blockIdx.z);  // this slot's entry z
    const int64_t listed = samples[k];
    // an index outside the batch, or a sample listed twice in the slot (the Python wrapper checks host indices):
    // one listing writes it, the one the stats kernel used (prepare_kernel's)
    if (listed < 0 || listed >= batch || moves.map_of[listed] != k) return;
    b = static_cast<int>(listed);
  } else {
    b = blockIdx.z;
    if (moved_row(moves, b) >= 0) return;  // the kMoved launch's
  }
  const int op = slot_op(ops, b, slots, slot);
  const float* p = slot < 0 ? nullptr : slot_params(params, b, slots, slot);
  const int hw = h * w;
  const int64_t sample = static_cast<int64_t>(b) * 3 * hw;
  const uint8_t* s = src + sample;
  Sink<out_t, kFinal, kChannelsLast> sink{kFinal ? nullptr : dst + sample, kFinal ? out + sample : nullptr,
                                          {alpha[0], alpha[1], alpha[2]}, {beta[0], beta[1], beta[2]}, hw};
  const auto put = [&](int c, int i, uint8_t v) { sink.put(c, i, v); };
  // The sample's pixels: as stored, or through the map.
  const Moved mv(s, h, w, kMoved ? moves.mats + static_cast<int64_t>(moves.start + blockIdx.z) * 6 : nullptr,
                 moves.fill);
  const auto at = [&](int c, int x, int y) -> uint8_t {
    if constexpr (kMoved) return mv.at(c, x, y);
    else return s[c * hw + y * w + x];
  };
  __shared__ float rows[kBlurRows][kTile];
  const int rows_begin = blockIdx.y * block_rows, rows_end = min(h, rows_begin + block_rows);
  if (op == kGaussianBlur && blur_valid(p[0], p[1], p[2], h, w)) {
    const float* wx = weights + static_cast<int64_t>(b) * 2 * kcap;
    const int kx = static_cast<int>(p[0]), ky = static_cast<int>(p[1]);
    const auto row_sum = [&](int c, int y, int x) {
      if constexpr (kMoved) {  // blur_row's sum, in its order, through the map
        float acc = 0.f;
        for (int i = 0; i < kx; ++i)
          acc = fma_rn(wx[i], static_cast<float>(mv.at(c, reflect(x + i - kx / 2, w), y)), acc);
        return acc;
      } else {
        return blur_row(s + c * hw + y * w, w, x, wx, kx);
      }
    };
    for (int y0 = rows_begin; y0 < rows_end; y0 += kTile)
      blur_tile(rows, y0, min(y0 + kTile, rows_end), h, w, ky, wx + kcap, row_sum, put);
    return;
  }
  // The op's per-sample constants.
  __shared__ uint8_t lut[3][256];
  SlotConsts k{op, p ? p[0] : 0.f, 0.f, 0.f, {0, 0, 0}, {0, 0, 0}, lut};
  if (op == kContrast || op == kSaturation || op == kSharpness) k.om = blend_one_minus(p);
  if (op == kContrast) k.mean = contrast_mean(static_cast<int64_t>(stats[b].gray_sum), hw);
  if (op == kAutocontrast) {
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      k.lo[c] = 255 - stats[b].inv_min[c];
      k.hi[c] = stats[b].max[c];
    }
  }
  if (op == kEqualize) {
    for (int i = threadIdx.y * kTile + threadIdx.x; i < 3 * 256; i += kThreads)
      lut[i / 256][i % 256] = stats[b].lut[i / 256][i % 256];
    __syncthreads();
  }
  // One pixel's three values.
  const auto fetch = [&](int x, int y, uint8_t (&v)[3]) {
    if constexpr (kMoved) {
      const int j = mv.source(x, y);
#pragma unroll
      for (int c = 0; c < 3; ++c) v[c] = j < 0 ? mv.fill_of(c) : s[c * hw + j];
    } else {
#pragma unroll
      for (int c = 0; c < 3; ++c) v[c] = s[c * hw + y * w + x];
    }
  };
  if (quads) {  // a quad per thread in each 32-row tile
    const int t = threadIdx.y * kTile + threadIdx.x;
    const int x0 = blockIdx.x * kTile, x = x0 + 4 * (t % (kTile / 4));
    // float32 channels-last over a whole tile width: a warp's 4 rows x 32 pixels go through shared memory, so that
    // each store instruction writes 512 contiguous bytes (a quad's own three 16-byte stores are 48 bytes apart
    // across lanes: every sector written three times, partially, which bound the kernel on L2).
    constexpr bool kStaged = kFinal && kChannelsLast && std::is_same_v<out_t, float>;
    const bool staged = kStaged && x0 + kTile <= w;  // uniform over the block
    if (!staged && x >= w) return;
    const int warp = t / 32, lane = t % 32;
    for (int ty = rows_begin; ty < rows_end; ty += kTile) {
      const int y = ty + t / (kTile / 4);
      const bool live = y < rows_end && x < w;
      uint8_t o[4][3];
      if (live) {
        const int i = y * w + x;
        uint8_t v[4][3];
        if constexpr (kMoved) {
          int j[4];
          mv.sources4(x, y, j);
#pragma unroll
          for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int c = 0; c < 3; ++c) v[n][c] = j[n] < 0 ? mv.fill_of(c) : s[c * hw + j[n]];
        } else {
#pragma unroll
          for (int c = 0; c < 3; ++c) {
            const uchar4 q = *reinterpret_cast<const uchar4*>(s + c * hw + i);
            v[0][c] = q.x, v[1][c] = q.y, v[2][c] = q.z, v[3][c] = q.w;
          }
        }
        apply_op<4>(k, at, h, w, x, y, v, o);
        if (!staged) put_quad(sink, i, o);
      }
      if constexpr (kStaged) {
        if (staged) {
          __shared__ float4 slab[kThreads / 32][4 * 3 * kTile / 4];  // per warp: 4 rows of 24 float4, 1.5 KB
          if (live) quad_channels_last(sink, o, &slab[warp][3 * lane]);
          __syncwarp();
#pragma unroll
          for (int r = 0; r < 3; ++r) {  // float4 e of the slab: row e / 24, value e % 24 of that row
            const int e = lane + 32 * r, yy = ty + 4 * warp + e / 24;
            if (yy < rows_end)
              reinterpret_cast<float4*>(sink.out + 3 * (yy * w + x0))[e % 24] = slab[warp][e];
          }
          __syncwarp();  // the slab is rewritten by the next tile
        }
      }
    }
    return;
  }
  const int x = blockIdx.x * kTile + threadIdx.x;
  if (x >= w) return;
  for (int y = rows_begin + threadIdx.y; y < rows_end; y += kBlockY) {
    uint8_t v[1][3], o[1][3];
    fetch(x, y, v[0]);
    apply_op<1>(k, at, h, w, x, y, v, o);
#pragma unroll
    for (int c = 0; c < 3; ++c) put(c, y * w + x, o[0][c]);
  }
}

// The slot's apply: the kernel over the batch (the listed samples' blocks return at once), then, with listed
// samples, the kernel over them (grid.z = N).
template <typename out_t, bool kFinal>
void launch_apply(dim3 grid, cudaStream_t stream, bool channels_last, const uint8_t* src, uint8_t* dst, out_t* out,
                  const int64_t* ops, const float* params, int slots, int slot, int h, int w, const Stats* stats,
                  const float* weights, int kcap, const float* alpha, const float* beta, bool quads,
                  const Moves& moves) {
  const int64_t batch = grid.z;
  const int block_rows = (h + grid.y - 1) / grid.y;  // the rows split evenly over the blocks of a column
  auto kernel = channels_last ? apply_kernel<out_t, kFinal, true, false> : apply_kernel<out_t, kFinal, false, false>;
  kernel<<<grid, dim3(kTile, kBlockY), 0, stream>>>(src, dst, out, ops, params, slots, slot, h, w, stats, weights,
                                                     kcap, alpha, beta, quads, moves, moves.samples, batch,
                                                     block_rows);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (!moves.map_of || moves.n == 0) return;
  auto moved = channels_last ? apply_kernel<out_t, kFinal, true, true> : apply_kernel<out_t, kFinal, false, true>;
  const dim3 listed(grid.x, grid.y, static_cast<unsigned>(moves.n));
  moved<<<listed, dim3(kTile, kBlockY), 0, stream>>>(src, dst, out, ops, params, slots, slot, h, w, stats, weights,
                                                     kcap, alpha, beta, quads, moves, moves.samples, batch,
                                                     block_rows);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// moves: the listed entries (map_of: [max(S, 1) * B], filled here); slot_of: each entry's slot, non-decreasing.
template <typename out_t>
void run(const at::Tensor& x, const at::Tensor& ops, const at::Tensor& params, const at::Tensor& alpha,
         const at::Tensor& beta, at::Tensor& out, Moves moves, int32_t* map_of, const std::vector<int64_t>& slot_of) {
  const int64_t batch = x.size(0), slots = ops.size(1);
  const int h = static_cast<int>(x.size(2)), w = static_cast<int>(x.size(3));
  const int hw = h * w;
  TORCH_CHECK(batch <= 65535, "photometric: at most 65535 samples per call on CUDA");
  const dim3 grid((w + kTile - 1) / kTile, (h + kApplyRows - 1) / kApplyRows, static_cast<unsigned>(batch));
  TORCH_CHECK(grid.y <= 65535, "photometric: images too tall for the CUDA kernels (at most 8,388,480 rows)");
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool channels_last = out.stride(1) == 1 && out.size(1) > 1;
  const int64_t* op = ops.data_ptr<int64_t>();
  const float* p = params.data_ptr<float>();
  const float *a = alpha.data_ptr<float>(), *bt = beta.data_ptr<float>();
  const uint8_t* src = x.data_ptr<uint8_t>();
  // Four pixels a thread where every row starts on a 4-pixel boundary and the buffers allow the wide accesses
  // (the scratch batches come from the allocator, aligned).
  const bool quads = w % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(out.data_ptr<out_t>()) % 16 == 0;
  // Scratch from the caching allocator: stats (zeroed by prepare_kernel, one record per slot and sample), blur
  // weights, two uint8 batches.
  at::Tensor stats = at::empty({slots * batch * static_cast<int64_t>(sizeof(Stats))}, x.options().dtype(at::kByte));
  // Each slot's entries [begin[s], begin[s + 1]) of the listed samples (host: slot_of is a host list).
  const int64_t slot_count = std::max<int64_t>(slots, 1);
  std::vector<int> begin(slot_count + 1, 0);
  for (int64_t s = 0, k = 0; s < slot_count; ++s) {
    while (k < static_cast<int64_t>(slot_of.size()) && slot_of[k] == s) ++k;
    begin[s + 1] = static_cast<int>(k);
  }
  if (slots > 0 || map_of) {
    const int64_t work = std::max<int64_t>(stats.numel() / 16, map_of ? batch : 0);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, 512));
    for (int64_t s0 = 0; s0 < (map_of ? slot_count : 1); s0 += SlotStarts::kMax) {  // one launch for <= 16 slots
      SlotStarts starts{static_cast<int>(s0), 0, {}};
      if (map_of) {
        starts.count = static_cast<int>(std::min<int64_t>(SlotStarts::kMax, slot_count - s0));
        for (int j = 0; j <= starts.count; ++j) starts.start[j] = begin[s0 + j];
      }
      prepare_kernel<<<std::max(blocks, 1u), 256, 0, stream>>>(stats.data_ptr<uint8_t>(), s0 == 0 ? stats.numel() : 0,
                                                               moves.samples, starts, batch, map_of);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
  // Slot s's moves: its entries, and map_of's row for it (none listed: no map).
  const auto slot_moves = [&](int64_t s) {
    const int n = begin[s + 1] - begin[s];
    return n > 0 ? Moves{map_of + s * batch, moves.mats, moves.fill, moves.samples, begin[s], n}
                 : Moves{nullptr, nullptr, {}, nullptr, 0, 0};
  };
  if (slots == 0) {
    launch_apply<out_t, true>(grid, stream, channels_last, src, nullptr, out.data_ptr<out_t>(), op, p, 0, -1, h, w,
                              nullptr, nullptr, 0, a, bt, quads, slot_moves(0));
    return;
  }
  const int kcap = 2 * std::max(h, w) - 1;  // the largest kernel reflect padding allows
  at::Tensor taps = at::empty({batch * 2 * kcap}, x.options().dtype(at::kDouble));
  at::Tensor weights = at::empty({batch * 2 * kcap}, x.options().dtype(at::kFloat));
  at::Tensor scratch[2];
  for (int i = 0; i < 2 && i < slots - 1; ++i) scratch[i] = at::empty_like(x);
  const int chunks = std::max(1, std::min(32, (hw + kStatsChunk - 1) / kStatsChunk));
  Stats* all_stats = reinterpret_cast<Stats*>(stats.data_ptr<uint8_t>());
  for (int s = 0; s < slots; ++s) {
    Stats* st = all_stats + s * batch;
    const Moves first = slot_moves(s);  // this slot reads its input through these samples' maps
    stats_kernel<<<dim3(chunks, static_cast<unsigned>(batch)), kThreads, 0, stream>>>(
        src, op, p, static_cast<int>(slots), s, h, w, st, taps.data_ptr<double>(), weights.data_ptr<float>(), kcap,
        quads, first);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const float* wt = weights.data_ptr<float>();
    if (s == slots - 1) {
      launch_apply<out_t, true>(grid, stream, channels_last, src, nullptr, out.data_ptr<out_t>(), op, p,
                                static_cast<int>(slots), s, h, w, st, wt, kcap, a, bt, quads, first);
    } else {
      uint8_t* dst = scratch[s % 2].data_ptr<uint8_t>();
      launch_apply<out_t, false>(grid, stream, channels_last, src, dst, static_cast<out_t*>(nullptr), op, p,
                                 static_cast<int>(slots), s, h, w, st, wt, kcap, a, bt, quads, first);
      src = dst;
    }
  }
}

at::Tensor photometric_cuda(const at::Tensor& x, const at::Tensor& ops, const at::Tensor& params,
                            const at::Tensor& alpha, const at::Tensor& beta, at::ScalarType out_dtype,
                            bool channels_last, const std::optional<at::Tensor>& samples,
                            const std::optional<at::Tensor>& matrices, c10::ArrayRef<double> fill,
                            at::IntArrayRef map_slots) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = prepare_photometric_output(x, ops, params, alpha, beta, out_dtype, channels_last);
  check_photometric_maps(x, samples, matrices);
  const int64_t listed = samples ? samples->size(0) : 0;
  const std::vector<int64_t> slot_of = photometric_map_slots(map_slots, listed, ops.size(1));
  if (out.numel() == 0) return out;
  Moves moves{nullptr, nullptr, nearest::typed<uint8_t>(make_fill(fill, 3, "photometric")), nullptr, 0, 0};
  at::Tensor map_of;
  if (listed > 0) {
    FL_CHECK(listed <= std::max<int64_t>(ops.size(1), 1) * x.size(0),
             "photometric: %lld samples listed for a batch of %lld", static_cast<long long>(listed),
             static_cast<long long>(x.size(0)));
    // filled by run's prepare_kernel: a row per slot
    map_of = at::empty({std::max<int64_t>(ops.size(1), 1) * x.size(0)}, x.options().dtype(at::kInt));
    moves.map_of = map_of.data_ptr<int32_t>();
    moves.mats = matrices->data_ptr<float>();
    moves.samples = samples->data_ptr<int64_t>();
    moves.n = static_cast<int>(listed);
  }
  int32_t* map_out = map_of.defined() ? map_of.data_ptr<int32_t>() : nullptr;
  switch (out_dtype) {
    case at::kFloat: run<float>(x, ops, params, alpha, beta, out, moves, map_out, slot_of); break;
    case at::kHalf: run<c10::Half>(x, ops, params, alpha, beta, out, moves, map_out, slot_of); break;
    case at::kBFloat16: run<c10::BFloat16>(x, ops, params, alpha, beta, out, moves, map_out, slot_of); break;
    default: run<uint8_t>(x, ops, params, alpha, beta, out, moves, map_out, slot_of); break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fastload, CUDA, m) { m.impl("photometric", &photometric_cuda); }

}  // namespace fastload
