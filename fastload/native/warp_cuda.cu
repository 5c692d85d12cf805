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

// Block = 32 columns x 8 row-groups of one sample; each thread owns one output column u and kRows output rows,
// so the column's filter taps (the same for every row of an axis-aligned warp) are computed once and kept in
// shared memory ([tap][thread], conflict-free), and a warp's threads write consecutive u (coalesced).
constexpr int kBlockX = 32, kBlockY = 8, kRows = 4;
constexpr int kMaxTaps = 12;  // x taps kept in shared memory: shrinks up to ~5.5x; beyond, the general path

template <typename in_t, typename out_t, int CH>
__global__ void __launch_bounds__(kBlockX * kBlockY, 4) warp_normalize_kernel(
    const in_t* __restrict__ data, int64_t data_size, const int64_t* __restrict__ offsets,
    const int64_t* __restrict__ shapes, const float* __restrict__ matrices, const float* __restrict__ alpha,
    const float* __restrict__ beta, int channels, bool hwc, float fill, out_t* __restrict__ out, int64_t os_b,
    int64_t os_c, int64_t os_y, int64_t os_x, int out_h, int out_w) {
  __shared__ float tap_weight[kMaxTaps][kBlockX * kBlockY];
  const int b = blockIdx.z;
  const int tid = threadIdx.y * kBlockX + threadIdx.x;
  const int u = blockIdx.x * kBlockX + threadIdx.x;
  const int v_first = (blockIdx.y * kBlockY + threadIdx.y) * kRows;
  if (u >= out_w || v_first >= out_h) return;
  const int C = CH > 0 ? CH : channels;
  const int64_t h64 = shapes[b * 3], w64 = shapes[b * 3 + 1], c_in = shapes[b * 3 + 2];
  const int64_t off = offsets[b];
  out_t* o_base = out + b * os_b + u * os_x;
  float m[6];
#pragma unroll
  for (int k = 0; k < 6; ++k) m[k] = matrices[b * 6 + k];
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

  if (m[1] == 0.f && m[3] == 0.f) {  // axis-aligned: every crop/resize/flip the loader makes
    const float cx = m[0] * u + m[2] + 0.5f;
    int x0, x1;
    filter_taps(cx, sx, w, &x0, &x1);
    const int nx = x1 - x0;
    if (nx <= kMaxTaps) {
      const bool inside_x = cx >= 0.f && cx <= w;
      float total_x = 0.f;
      for (int k = 0; k < nx; ++k) {
        const float wk = triangle((x0 + k + 0.5f - cx) / sx);
        tap_weight[k][tid] = wk;
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
            const float wk = tap_weight[k][tid];
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
