// CUDA kernel of `fastload::warp_normalize` (schema and CPU twin in warp_cpu.cpp, maths in warp.h).
// One thread per output pixel, all channels; grid.y is the sample. Launched on the current stream.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "warp.h"
#include "warp_op.h"

namespace fastload {
namespace {

constexpr int kThreads = 256;

constexpr int kMaxTaps = 8;  // per axis in the register path: covers shrinks up to ~3.5x (the loader's <= 2x)

// Sums taps of a separable filter whose weights sit in registers: fully unrolled, predicated, so the arrays
// never go to local memory. CH > 0 fixes the channel count at compile time (3 for the loader).
template <int CH, typename in_t>
__device__ __forceinline__ void sum_separable(const in_t* __restrict__ img, int s_c, int s_y, int s_x, int x0, int nx,
                                              int y0, int ny, const float* wx, const float* wy, int channels,
                                              float* acc) {
#pragma unroll
  for (int ky = 0; ky < kMaxTaps; ++ky) {
    if (ky < ny) {
      const in_t* row = img + (y0 + ky) * s_y + x0 * s_x;
      float part[kMaxChannels] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kx = 0; kx < kMaxTaps; ++kx) {
        if (kx < nx) {
          const in_t* p = row + kx * s_x;
#pragma unroll
          for (int c = 0; c < kMaxChannels; ++c)
            if (CH > 0 ? c < CH : c < channels) part[c] += wx[kx] * static_cast<float>(p[c * s_c]);
        }
      }
#pragma unroll
      for (int c = 0; c < kMaxChannels; ++c) acc[c] += wy[ky] * part[c];
    }
  }
}

template <typename in_t, typename out_t, int CH>
__global__ void __launch_bounds__(256) warp_normalize_kernel(
    const in_t* __restrict__ data, int64_t data_size, const int64_t* __restrict__ offsets,
    const int64_t* __restrict__ shapes, const float* __restrict__ matrices, const float* __restrict__ alpha,
    const float* __restrict__ beta, int channels, bool hwc, float fill, out_t* __restrict__ out, int64_t os_b,
    int64_t os_c, int64_t os_y, int64_t os_x, int out_h, int out_w) {
  const int b = blockIdx.y;
  const int pixel = blockIdx.x * blockDim.x + threadIdx.x;
  if (pixel >= out_h * out_w) return;
  const int v = pixel / out_w, u = pixel - v * out_w;
  const int64_t h64 = shapes[b * 3], w64 = shapes[b * 3 + 1], c_in = shapes[b * 3 + 2];
  const int64_t off = offsets[b];
  out_t* o = out + b * os_b + v * os_y + u * os_x;
  const int C = CH > 0 ? CH : channels;
  float m[6];
#pragma unroll
  for (int k = 0; k < 6; ++k) m[k] = matrices[b * 6 + k];
  float cx, cy;
  // A malformed sample (never produced by fastload itself) reads nothing and yields fill, never stray memory.
  const bool valid = h64 > 0 && w64 > 0 && h64 * w64 * c_in < (int64_t(1) << 31) && c_in == C && off >= 0 &&
                     off + h64 * w64 * c_in <= data_size;
  const int h = static_cast<int>(h64), w = static_cast<int>(w64);
  if (!valid || !sample_centre(m, u, v, h, w, &cx, &cy)) {
    for (int c = 0; c < C; ++c) o[c * os_c] = OutCast<out_t>::apply(fill * alpha[c] + beta[c]);
    return;
  }
  const float sx = filter_support(m[0], m[1]), sy = filter_support(m[3], m[4]);
  int x0, x1, y0, y1;
  filter_taps(cx, sx, w, &x0, &x1);
  filter_taps(cy, sy, h, &y0, &y1);
  const int s_c = hwc ? 1 : h * w, s_y = hwc ? w * C : w, s_x = hwc ? C : 1;
  const in_t* img = data + off;
  float acc[kMaxChannels] = {0.f, 0.f, 0.f, 0.f};
  float total;
  const int nx = x1 - x0, ny = y1 - y0;
  if (m[1] == 0.f && m[3] == 0.f && nx <= kMaxTaps && ny <= kMaxTaps) {
    // Axis-aligned (every crop/resize/flip): weights once per axis, in registers.
    float wx[kMaxTaps], wy[kMaxTaps], total_x = 0.f, total_y = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxTaps; ++k) {
      wx[k] = k < nx ? triangle((x0 + k + 0.5f - cx) / sx) : 0.f;
      wy[k] = k < ny ? triangle((y0 + k + 0.5f - cy) / sy) : 0.f;
      total_x += wx[k];
      total_y += wy[k];
    }
    sum_separable<CH>(img, s_c, s_y, s_x, x0, nx, y0, ny, wx, wy, C, acc);
    total = total_x * total_y;
  } else {
    float total_x = 0.f, total_y = 0.f;
    for (int x = x0; x < x1; ++x) total_x += triangle((x + 0.5f - cx) / sx);
    for (int y = y0; y < y1; ++y) {
      const float wy = triangle((y + 0.5f - cy) / sy);
      total_y += wy;
      const in_t* row = img + y * s_y;
      for (int x = x0; x < x1; ++x) {
        const float wgt = wy * triangle((x + 0.5f - cx) / sx);
        const in_t* p = row + x * s_x;
#pragma unroll
        for (int c = 0; c < kMaxChannels; ++c)
          if (c < C) acc[c] += wgt * static_cast<float>(p[c * s_c]);
      }
    }
    total = total_x * total_y;
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
  for (int c = 0; c < kMaxChannels; ++c)
    if (c < C) o[c * os_c] = OutCast<out_t>::apply(acc[c] * inv * alpha[c] + beta[c]);
}

template <typename in_t, typename out_t>
void launch(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes, const at::Tensor& matrices,
            const at::Tensor& alpha, const at::Tensor& beta, int64_t channels, bool hwc, double fill,
            at::Tensor& out) {
  const int64_t batch = offsets.numel();
  const int out_h = static_cast<int>(out.size(2)), out_w = static_cast<int>(out.size(3));
  TORCH_CHECK(static_cast<int64_t>(out_h) * out_w < (int64_t(1) << 31), "warp_normalize: output too large");
  TORCH_CHECK(batch <= 65535, "warp_normalize: at most 65535 samples per call on CUDA");
  const dim3 grid((out_h * out_w + kThreads - 1) / kThreads, static_cast<unsigned>(batch));
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto kernel = channels == 3 ? warp_normalize_kernel<in_t, out_t, 3> : warp_normalize_kernel<in_t, out_t, 0>;
  kernel<<<grid, kThreads, 0, stream>>>(
      data.data_ptr<in_t>(), data.numel(), offsets.data_ptr<int64_t>(), shapes.data_ptr<int64_t>(),
      matrices.data_ptr<float>(), alpha.data_ptr<float>(), beta.data_ptr<float>(), static_cast<int>(channels), hwc,
      static_cast<float>(fill), out.data_ptr<out_t>(), out.stride(0), out.stride(1), out.stride(2), out.stride(3),
      out_h, out_w);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename in_t>
void dispatch_out(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                  const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta, int64_t channels,
                  bool hwc, double fill, at::Tensor& out) {
  switch (out.scalar_type()) {
    case at::kFloat: return launch<in_t, float>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
    case at::kHalf: return launch<in_t, c10::Half>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
    case at::kBFloat16: return launch<in_t, c10::BFloat16>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
    case at::kByte: return launch<in_t, uint8_t>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
    default: TORCH_CHECK(false, "warp_normalize: unsupported out_dtype");
  }
}

at::Tensor warp_normalize_cuda(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                               const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta,
                               int64_t channels, int64_t out_h, int64_t out_w, bool hwc, at::ScalarType out_dtype,
                               bool channels_last, double fill) {
  const c10::cuda::CUDAGuard guard(data.device());
  at::Tensor out = prepare_warp_output(data, offsets, shapes, matrices, alpha, beta, channels, out_h, out_w,
                                       out_dtype, channels_last);
  if (offsets.numel() == 0) return out;
  if (data.scalar_type() == at::kByte)
    dispatch_out<uint8_t>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
  else
    dispatch_out<float>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fastload, CUDA, m) { m.impl("warp_normalize", &warp_normalize_cuda); }

}  // namespace fastload
