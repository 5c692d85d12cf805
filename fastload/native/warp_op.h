// The torch op `fastload::warp_normalize`: schema in warp_cpu.cpp, kernels for CPU (warp_cpu.cpp) and
// CUDA (warp_cuda.cu). One op over a *ragged* batch: sample b is an image of shapes[b] = (h, w, c) stored at
// data[offsets[b]:], HWC (hwc=true, what the decoder writes) or CHW (dense NCHW batches).
//
//   out[b, c, v, u] = cast(sample(image_b, M_b, u, v)[c] * alpha[c] + beta[c])
//
// alpha/beta fold ToTensor's 1/255 and Normalize's mean/std into one multiply-add per value.
#pragma once
#include <ATen/ATen.h>

namespace fastload {

// Checks shared by both kernels; returns the output tensor, allocated on data's device.
at::Tensor prepare_warp_output(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                               const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta,
                               int64_t channels, int64_t out_h, int64_t out_w, at::ScalarType out_dtype,
                               bool channels_last);

}  // namespace fastload
