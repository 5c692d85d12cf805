// CUDA kernels of `fastload::photometric` (schema, checks and the CPU twin in augment_cpu.cpp; per-pixel maths in
// augment.h, so both backends compute the same bits). Per slot, two launches on the current stream:
//   stats_kernel  the per-sample statistics the slot's op needs (contrast: luma sum; autocontrast: min/max;
//                 equalize: histograms, turned into the lookup table by the sample's last block; gaussian_blur:
//                 the sample's normalised 1-D weights), blocks of samples that need none return at once;
//   apply_kernel  each block is a 32 x 32 tile of one sample and switches on that sample's op code; the last slot's
//                 launch writes the output dtype/layout (cast(v * alpha + beta)), the others a uint8 scratch batch
//                 (two, ping-pong, from the caching allocator).
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
#include <cstdint>

#include "augment.h"

namespace fastload {

// augment_cpu.cpp: the checks both backends share; the output on x's device.
at::Tensor prepare_photometric_output(const at::Tensor& x, const at::Tensor& ops, const at::Tensor& params,
                                      const at::Tensor& alpha, const at::Tensor& beta, at::ScalarType out_dtype,
                                      bool channels_last);

namespace {

using namespace augment;

constexpr int kTile = 32;                 // apply_kernel: a 32 x 32 tile per block
constexpr int kBlockY = 8;                // of 32 x 8 threads, each thread 4 rows (8 apart)
constexpr int kThreads = kTile * kBlockY;
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
                                                         int kcap) {
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
  const int chunk = (hw + gridDim.x - 1) / gridDim.x;
  const int begin = blockIdx.x * chunk, end = min(hw, begin + chunk);
  const uint8_t* r = src + static_cast<int64_t>(b) * 3 * hw;
  const uint8_t* g = r + hw;
  const uint8_t* bl = g + hw;
  Stats& st = stats[b];
  const int lane = threadIdx.x % 32;
  if (op == kContrast) {
    unsigned long long sum = 0;
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x)
      sum += static_cast<unsigned long long>(floorf(gray(r[i], g[i], bl[i])));
    for (int d = 16; d > 0; d /= 2) sum += __shfl_down_sync(0xffffffffu, sum, d);
    if (lane == 0 && sum) atomicAdd(&st.gray_sum, sum);
    return;
  }
  if (op == kAutocontrast) {
    unsigned int hi[3] = {0, 0, 0}, inv_lo[3] = {0, 0, 0};
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const uint8_t v[3] = {r[i], g[i], bl[i]};
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        hi[c] = max(hi[c], static_cast<unsigned int>(v[c]));
        inv_lo[c] = max(inv_lo[c], 255u - v[c]);
      }
    }
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
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    atomicAdd(&hist[0][r[i]], 1);
    atomicAdd(&hist[1][g[i]], 1);
    atomicAdd(&hist[2][bl[i]], 1);
  }
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
template <typename Put>
__device__ void blur_tile(const uint8_t* s, int h, int w, int kx, int ky, const float* wx, const float* wy,
                          const Put& put) {
  __shared__ float rows[kBlurRows][kTile];
  const int x = blockIdx.x * kTile + threadIdx.x, y0 = blockIdx.y * kTile, y_end = min(y0 + kTile, h);
  const int ry = ky / 2, band = kBlurRows - 2 * ry;
  for (int c = 0; c < 3; ++c) {
    const uint8_t* plane = s + c * h * w;
    if (band < 1) {
      if (x >= w) continue;
      for (int y = y0 + threadIdx.y; y < y_end; y += kBlockY) {
        float acc = 0.f;
        for (int j = 0; j < ky; ++j)
          acc = fma_rn(wy[j], blur_row(plane + reflect(y + j - ry, h) * w, w, x, wx, kx), acc);
        put(c, y * w + x, blur_round(acc));
      }
      continue;
    }
    for (int yb = y0; yb < y_end; yb += band) {
      const int ye = min(yb + band, y_end), n = ye - yb + 2 * ry;
      __syncthreads();  // the previous band is done with rows
      for (int k = threadIdx.y; k < n; k += kBlockY)
        if (x < w) rows[k][threadIdx.x] = blur_row(plane + reflect(yb - ry + k, h) * w, w, x, wx, kx);
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

template <typename out_t, bool kFinal, bool kChannelsLast>
__global__ void __launch_bounds__(kThreads) apply_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                                         out_t* __restrict__ out, const int64_t* __restrict__ ops,
                                                         const float* __restrict__ params, int slots, int slot,
                                                         int h, int w, const Stats* __restrict__ stats,
                                                         const float* __restrict__ weights, int kcap,
                                                         const float* __restrict__ alpha,
                                                         const float* __restrict__ beta) {
  const int b = blockIdx.z;
  const int op = slot_op(ops, b, slots, slot);
  const float* p = slot < 0 ? nullptr : slot_params(params, b, slots, slot);
  const int hw = h * w;
  const int64_t sample = static_cast<int64_t>(b) * 3 * hw;
  const uint8_t* s = src + sample;
  Sink<out_t, kFinal, kChannelsLast> sink{kFinal ? nullptr : dst + sample, kFinal ? out + sample : nullptr,
                                          {alpha[0], alpha[1], alpha[2]}, {beta[0], beta[1], beta[2]}, hw};
  const auto put = [&](int c, int i, uint8_t v) { sink.put(c, i, v); };
  if (op == kGaussianBlur && blur_valid(p[0], p[1], p[2], h, w)) {
    const float* wx = weights + static_cast<int64_t>(b) * 2 * kcap;
    blur_tile(s, h, w, static_cast<int>(p[0]), static_cast<int>(p[1]), wx, wx + kcap, put);
    return;
  }
  // The op's per-sample constants.
  __shared__ uint8_t lut[3][256];
  const float p0 = p ? p[0] : 0.f;
  float om = 0.f, mean = 0.f;
  int lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};
  if (op == kContrast || op == kSaturation || op == kSharpness) om = one_minus(p0);
  if (op == kContrast) mean = contrast_mean(static_cast<int64_t>(stats[b].gray_sum), hw);
  if (op == kAutocontrast) {
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      lo[c] = 255 - stats[b].inv_min[c];
      hi[c] = stats[b].max[c];
    }
  }
  if (op == kEqualize) {
    for (int i = threadIdx.y * kTile + threadIdx.x; i < 3 * 256; i += kThreads) lut[i / 256][i % 256] = stats[b].lut[i / 256][i % 256];
    __syncthreads();
  }
  const int x = blockIdx.x * kTile + threadIdx.x;
  if (x >= w) return;
  for (int y = blockIdx.y * kTile + threadIdx.y; y < min(h, (blockIdx.y + 1) * kTile); y += kBlockY) {
    const int i = y * w + x;
    const uint8_t v[3] = {s[i], s[hw + i], s[2 * hw + i]};
    uint8_t o[3];
    switch (op) {
      case kBrightness:
#pragma unroll
        for (int c = 0; c < 3; ++c) o[c] = brightness(v[c], p0);
        break;
      case kContrast:
#pragma unroll
        for (int c = 0; c < 3; ++c) o[c] = blend(v[c], mean, p0, om);
        break;
      case kSaturation: {
        const float gr = floorf(gray(v[0], v[1], v[2]));
#pragma unroll
        for (int c = 0; c < 3; ++c) o[c] = blend(v[c], gr, p0, om);
        break;
      }
      case kHue: hue(v[0], v[1], v[2], p0, o); break;
      case kSharpness:
#pragma unroll
        for (int c = 0; c < 3; ++c) {
          o[c] = v[c];
          if (h > 2 && w > 2 && x > 0 && x < w - 1 && y > 0 && y < h - 1) {
            const uint8_t* m = s + c * hw + i;
            const int sum = m[-w - 1] + m[-w] + m[-w + 1] + m[-1] + 5 * m[0] + m[1] + m[w - 1] + m[w] + m[w + 1];
            o[c] = sharpen(v[c], sum, om);
          }
        }
        break;
      case kPosterize:
#pragma unroll
        for (int c = 0; c < 3; ++c) o[c] = posterize(v[c], p0);
        break;
      case kSolarize:
#pragma unroll
        for (int c = 0; c < 3; ++c) o[c] = solarize(v[c], p0);
        break;
      case kAutocontrast:
#pragma unroll
        for (int c = 0; c < 3; ++c) o[c] = autocontrast(v[c], lo[c], hi[c]);
        break;
      case kEqualize:
#pragma unroll
        for (int c = 0; c < 3; ++c) o[c] = lut[c][v[c]];
        break;
      case kInvert:
#pragma unroll
        for (int c = 0; c < 3; ++c) o[c] = static_cast<uint8_t>(255 - v[c]);
        break;
      case kGrayscale:
        o[0] = o[1] = o[2] = static_cast<uint8_t>(gray(v[0], v[1], v[2]));
        break;
      default:  // identity, and a blur that is not defined on this image
#pragma unroll
        for (int c = 0; c < 3; ++c) o[c] = v[c];
        break;
    }
#pragma unroll
    for (int c = 0; c < 3; ++c) put(c, i, o[c]);
  }
}

template <typename out_t, bool kFinal>
void launch_apply(dim3 grid, cudaStream_t stream, bool channels_last, const uint8_t* src, uint8_t* dst, out_t* out,
                  const int64_t* ops, const float* params, int slots, int slot, int h, int w, const Stats* stats,
                  const float* weights, int kcap, const float* alpha, const float* beta) {
  auto kernel = channels_last ? apply_kernel<out_t, kFinal, true> : apply_kernel<out_t, kFinal, false>;
  kernel<<<grid, dim3(kTile, kBlockY), 0, stream>>>(src, dst, out, ops, params, slots, slot, h, w, stats, weights,
                                                     kcap, alpha, beta);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename out_t>
void run(const at::Tensor& x, const at::Tensor& ops, const at::Tensor& params, const at::Tensor& alpha,
         const at::Tensor& beta, at::Tensor& out) {
  const int64_t batch = x.size(0), slots = ops.size(1);
  const int h = static_cast<int>(x.size(2)), w = static_cast<int>(x.size(3));
  const int hw = h * w;
  TORCH_CHECK(batch <= 65535, "photometric: at most 65535 samples per call on CUDA");
  const dim3 grid((w + kTile - 1) / kTile, (h + kTile - 1) / kTile, static_cast<unsigned>(batch));
  TORCH_CHECK(grid.y <= 65535, "photometric: images too tall for the CUDA kernels (at most 2,097,120 rows)");
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool channels_last = out.stride(1) == 1 && out.size(1) > 1;
  const int64_t* op = ops.data_ptr<int64_t>();
  const float* p = params.data_ptr<float>();
  const float *a = alpha.data_ptr<float>(), *bt = beta.data_ptr<float>();
  const uint8_t* src = x.data_ptr<uint8_t>();
  if (slots == 0) {
    launch_apply<out_t, true>(grid, stream, channels_last, src, nullptr, out.data_ptr<out_t>(), op, p, 0, -1, h, w,
                              nullptr, nullptr, 0, a, bt);
    return;
  }
  // Scratch from the caching allocator: stats (zeroed, one record per slot and sample), blur weights, two
  // uint8 batches.
  const int kcap = 2 * std::max(h, w) - 1;  // the largest kernel reflect padding allows
  auto bytes = x.options().dtype(at::kByte);
  at::Tensor stats = at::zeros({slots * batch * static_cast<int64_t>(sizeof(Stats))}, bytes);
  at::Tensor taps = at::empty({batch * 2 * kcap}, x.options().dtype(at::kDouble));
  at::Tensor weights = at::empty({batch * 2 * kcap}, x.options().dtype(at::kFloat));
  at::Tensor scratch[2];
  for (int i = 0; i < 2 && i < slots - 1; ++i) scratch[i] = at::empty_like(x);
  const int chunks = std::max(1, std::min(32, (hw + kStatsChunk - 1) / kStatsChunk));
  Stats* all_stats = reinterpret_cast<Stats*>(stats.data_ptr<uint8_t>());
  for (int s = 0; s < slots; ++s) {
    Stats* st = all_stats + s * batch;
    stats_kernel<<<dim3(chunks, static_cast<unsigned>(batch)), kThreads, 0, stream>>>(
        src, op, p, static_cast<int>(slots), s, h, w, st, taps.data_ptr<double>(), weights.data_ptr<float>(), kcap);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const float* wt = weights.data_ptr<float>();
    if (s == slots - 1) {
      launch_apply<out_t, true>(grid, stream, channels_last, src, nullptr, out.data_ptr<out_t>(), op, p,
                                static_cast<int>(slots), s, h, w, st, wt, kcap, a, bt);
    } else {
      uint8_t* dst = scratch[s % 2].data_ptr<uint8_t>();
      launch_apply<out_t, false>(grid, stream, channels_last, src, dst, static_cast<out_t*>(nullptr), op, p,
                                 static_cast<int>(slots), s, h, w, st, wt, kcap, a, bt);
      src = dst;
    }
  }
}

at::Tensor photometric_cuda(const at::Tensor& x, const at::Tensor& ops, const at::Tensor& params,
                            const at::Tensor& alpha, const at::Tensor& beta, at::ScalarType out_dtype,
                            bool channels_last) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = prepare_photometric_output(x, ops, params, alpha, beta, out_dtype, channels_last);
  if (out.numel() == 0) return out;
  switch (out_dtype) {
    case at::kFloat: run<float>(x, ops, params, alpha, beta, out); break;
    case at::kHalf: run<c10::Half>(x, ops, params, alpha, beta, out); break;
    case at::kBFloat16: run<c10::BFloat16>(x, ops, params, alpha, beta, out); break;
    default: run<uint8_t>(x, ops, params, alpha, beta, out); break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fastload, CUDA, m) { m.impl("photometric", &photometric_cuda); }

}  // namespace fastload
