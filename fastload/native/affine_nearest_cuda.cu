// CUDA kernels of `fastload::affine_nearest_` (schema, checks and CPU twin in affine_nearest_cpu.cpp, maths in
// affine_nearest.h), on the current stream: the listed samples are copied to scratch (16 bytes a thread where
// aligned), then the gather writes them back from the copy, a 32 x 32 tile of one sample (grid.z) per block.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>

#include "affine_nearest.h"
#include "check.h"

namespace fastload {

void check_affine_nearest_args(const at::Tensor& images, const at::Tensor& samples, const at::Tensor& matrices);

namespace {

constexpr int kBlockX = 32, kBlockY = 8, kCopyThreads = 256;

// scratch[k] = images[samples[k]], `values` elements of V-element vectors; an index outside the batch is skipped
// (the Python wrapper checks indices on the host; a kernel cannot raise).
template <typename V>
__global__ void copy_samples_kernel(const V* __restrict__ images, V* __restrict__ scratch,
                                    const int64_t* __restrict__ samples, int64_t batch, int64_t vectors) {
  const int64_t k = blockIdx.y, b = samples[k];
  if (b < 0 || b >= batch) return;
  for (int64_t i = blockIdx.x * int64_t(kCopyThreads) + threadIdx.x; i < vectors; i += int64_t(gridDim.x) * kCopyThreads)
    scratch[k * vectors + i] = images[b * vectors + i];
}

// Output tiles of 32 x 32 pixels, a block of 32 x 8 threads (4 rows each) per tile. The tile's source pixels
// (the bounding box of its four corners' sources: the map is affine and the rounding monotonic) are staged in
// shared memory with coalesced loads when they fit, so that the gather's scattered reads hit shared memory, not
// L2 (a rotated warp's lanes read as many sectors as lanes); otherwise, or for a non-RGB image, they read global.
constexpr int kTile = 32, kRowsPerThread = kTile / kBlockY;

template <typename T>
__global__ void __launch_bounds__(kBlockX* kBlockY) gather_kernel(
    const T* __restrict__ scratch, T* __restrict__ images, const int64_t* __restrict__ samples,
    const float* __restrict__ mats, int64_t batch, int64_t s_b, int s_c, int s_y, int s_x, int c, int h, int w,
    nearest::Fills<T> fill) {
  constexpr int kStagedPixels = 4096 / sizeof(T);  // per channel: 12 KB for three uint8 channels
  __shared__ T staged[3][kStagedPixels];
  __shared__ int box[4];  // x0, y0, width, height of the staged source region (width 0: read global)
  const int64_t k = blockIdx.z, b = samples[k];
  if (b < 0 || b >= batch) return;  // uniform over the block
  const int u0 = blockIdx.x * kTile, v0 = blockIdx.y * kTile;
  // Every thread converts the matrix itself (no barrier on one thread's conversion); a non-finite one maps every
  // pixel outside (fill).
  int64_t f[6];
  if (!nearest::to_fixed(mats + k * 6, f)) f[0] = f[1] = f[3] = f[4] = 0, f[2] = f[5] = INT64_MIN / 2;
  if (threadIdx.y == 0) {  // warp 0: lanes 0-3 take the tile's corners, shuffles give the box
    const int u = threadIdx.x & 1 ? min(u0 + kTile, w) - 1 : u0, v = threadIdx.x & 2 ? min(v0 + kTile, h) - 1 : v0;
    const int64_t x = nearest::pixel(f[0] * u + f[1] * v + f[2]), y = nearest::pixel(f[3] * u + f[4] * v + f[5]);
    int64_t x0 = x, x1 = x, y0 = y, y1 = y;
    for (int lane = 1; lane < 4; lane <<= 1) {
      x0 = min(x0, __shfl_xor_sync(0xffffffffu, x0, lane)), x1 = max(x1, __shfl_xor_sync(0xffffffffu, x1, lane));
      y0 = min(y0, __shfl_xor_sync(0xffffffffu, y0, lane)), y1 = max(y1, __shfl_xor_sync(0xffffffffu, y1, lane));
    }
    if (threadIdx.x == 0) {
      x0 = max(x0, int64_t(0)), y0 = max(y0, int64_t(0)), x1 = min(x1, int64_t(w - 1)), y1 = min(y1, int64_t(h - 1));
      const int64_t bw = x1 - x0 + 1, bh = y1 - y0 + 1;
      const bool fits = c == 3 && bw > 0 && bh > 0 && bw * bh <= kStagedPixels;
      box[0] = fits ? static_cast<int>(x0) : 0;
      box[1] = fits ? static_cast<int>(y0) : 0;
      box[2] = fits ? static_cast<int>(bw) : 0;
      box[3] = fits ? static_cast<int>(bh) : 0;
    }
  }
  __syncthreads();
  const T* src = scratch + k * s_b;
  const int bx = box[0], by = box[1], bw = box[2], bh = box[3];
  for (int r = threadIdx.y; r < bh; r += kBlockY) {  // a warp per row, lanes on consecutive bytes
    const T* row = src + (by + r) * s_y + bx * s_x;
    for (int col = threadIdx.x; col < bw; col += kBlockX)
#pragma unroll
      for (int ch = 0; ch < 3; ++ch) staged[ch][r * bw + col] = row[col * s_x + ch * s_c];
  }
  __syncthreads();
  const int u = u0 + threadIdx.x;
  if (u >= w) return;
  T* out = images + b * s_b + u * s_x;
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int v = v0 + threadIdx.y + r * kBlockY;
    if (v >= h) break;
    const int64_t x = nearest::pixel(f[0] * u + f[1] * v + f[2]), y = nearest::pixel(f[3] * u + f[4] * v + f[5]);
    T* dst = out + v * s_y;
    if (!nearest::inside(x, y, h, w)) {
      for (int ch = 0; ch < c; ++ch) dst[ch * s_c] = fill[ch];
    } else if (bw > 0) {  // inside the image, so inside the box of the tile's sources
      const int at = (static_cast<int>(y) - by) * bw + (static_cast<int>(x) - bx);
#pragma unroll
      for (int ch = 0; ch < 3; ++ch) dst[ch * s_c] = staged[ch][at];
    } else {
      const T* p = src + y * s_y + x * s_x;
      for (int ch = 0; ch < c; ++ch) dst[ch * s_c] = p[ch * s_c];
    }
  }
}

template <typename T>
void run(at::Tensor& images, const at::Tensor& samples, const at::Tensor& matrices, const Fill& fill) {
  const int64_t batch = images.size(0), n = samples.size(0);
  const int c = static_cast<int>(images.size(1)), h = static_cast<int>(images.size(2)),
            w = static_cast<int>(images.size(3));
  const int64_t values = int64_t(c) * h * w, s_b = images.stride(0);  // a sample's block, in either layout
  at::Tensor scratch = at::empty({n, values}, images.options());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  T* data = images.data_ptr<T>();
  const int64_t* index = samples.data_ptr<int64_t>();
  const bool vectors = (values * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(data) % 16 == 0;
  const int64_t count = vectors ? values * sizeof(T) / 16 : values;
  const dim3 copy_grid(static_cast<unsigned>(std::min<int64_t>((count + kCopyThreads - 1) / kCopyThreads, 1024)),
                       static_cast<unsigned>(n));
  if (vectors)
    copy_samples_kernel<uint4><<<copy_grid, kCopyThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(data), reinterpret_cast<uint4*>(scratch.data_ptr<T>()), index, batch, count);
  else
    copy_samples_kernel<T><<<copy_grid, kCopyThreads, 0, stream>>>(data, scratch.data_ptr<T>(), index, batch, count);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const dim3 block(kBlockX, kBlockY);
  const dim3 grid((w + kTile - 1) / kTile, (h + kTile - 1) / kTile, static_cast<unsigned>(n));
  gather_kernel<T><<<grid, block, 0, stream>>>(
      scratch.data_ptr<T>(), data, index, matrices.data_ptr<float>(), batch, s_b, static_cast<int>(images.stride(1)),
      static_cast<int>(images.stride(2)), static_cast<int>(images.stride(3)), c, h, w, nearest::typed<T>(fill));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void affine_nearest_cuda(at::Tensor& images, const at::Tensor& samples, const at::Tensor& matrices,
                         c10::ArrayRef<double> fill_arg) {
  check_affine_nearest_args(images, samples, matrices);
  const Fill fill = make_fill(fill_arg, images.size(1), "affine_nearest_");
  if (samples.numel() == 0 || images.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(images.device());
  FL_CHECK(samples.size(0) <= 65535, "affine_nearest_: at most 65535 samples per call on CUDA, got %lld",
           static_cast<long long>(samples.size(0)));
  if (images.scalar_type() == at::kByte)
    run<uint8_t>(images, samples, matrices, fill);
  else
    run<float>(images, samples, matrices, fill);
}

}  // namespace

TORCH_LIBRARY_IMPL(fastload, CUDA, m) { m.impl("affine_nearest_", &affine_nearest_cuda); }

}  // namespace fastload
