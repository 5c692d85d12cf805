// CUDA kernels of `fastload::affine_nearest_` (schema, checks and CPU twin in affine_nearest_cpu.cpp, maths in
// affine_nearest.h), on the current stream: the listed samples are copied to scratch (16 bytes a thread where
// aligned), then a thread per output pixel gathers from the copy, in blocks of 32 x 8 pixels of one sample (grid.z).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

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

template <typename T>
__global__ void gather_kernel(const T* __restrict__ scratch, T* __restrict__ images,
                              const int64_t* __restrict__ samples, const float* __restrict__ mats, int64_t batch,
                              int64_t s_b, int s_c, int s_y, int s_x, int c, int h, int w, T fill) {
  const int u = blockIdx.x * kBlockX + threadIdx.x, v = blockIdx.y * kBlockY + threadIdx.y;
  const int64_t k = blockIdx.z, b = samples[k];
  if (u >= w || v >= h || b < 0 || b >= batch) return;
  int64_t f[6];
  const bool finite = nearest::to_fixed(mats + k * 6, f);
  const int64_t x = nearest::pixel(f[0] * u + f[1] * v + f[2]), y = nearest::pixel(f[3] * u + f[4] * v + f[5]);
  T* dst = images + b * s_b + v * s_y + u * s_x;
  if (finite && nearest::inside(x, y, h, w)) {
    const T* p = scratch + k * s_b + y * s_y + x * s_x;
    for (int ch = 0; ch < c; ++ch) dst[ch * s_c] = p[ch * s_c];
  } else {
    for (int ch = 0; ch < c; ++ch) dst[ch * s_c] = fill;
  }
}

template <typename T>
void run(at::Tensor& images, const at::Tensor& samples, const at::Tensor& matrices, double fill) {
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
  const dim3 grid((w + kBlockX - 1) / kBlockX, (h + kBlockY - 1) / kBlockY, static_cast<unsigned>(n));
  gather_kernel<T><<<grid, block, 0, stream>>>(
      scratch.data_ptr<T>(), data, index, matrices.data_ptr<float>(), batch, s_b, static_cast<int>(images.stride(1)),
      static_cast<int>(images.stride(2)), static_cast<int>(images.stride(3)), c, h, w, nearest::fill_value<T>(fill));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void affine_nearest_cuda(at::Tensor& images, const at::Tensor& samples, const at::Tensor& matrices, double fill) {
  check_affine_nearest_args(images, samples, matrices);
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
