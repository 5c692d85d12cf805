// The torch op `fastload::warp_normalize`: schema in warp_cpu.cpp, kernels for CPU (warp_cpu.cpp) and
// CUDA (warp_cuda.cu). One op over a *ragged* batch: sample b is an image of shapes[b] = (h, w, c) stored at
// data[offsets[b]:], HWC (hwc=true, what the decoder writes) or CHW (dense NCHW batches).
//
//   out[b, c, v, u] = cast(sample(image_b, M_b, u, v)[c] * alpha[c] + beta[c])
//
// alpha/beta fold ToTensor's 1/255 and Normalize's mean/std into one multiply-add per value.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "warp.h"  // Fill

namespace fastload {

// Checks shared by both kernels; returns the output tensor, allocated on data's device.
at::Tensor prepare_warp_output(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                               const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta,
                               int64_t channels, int64_t out_h, int64_t out_w, at::ScalarType out_dtype,
                               bool channels_last);

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<in_t>{}, TypeTag<out_t>{}) for the op's input (uint8 or float32) and output dtype: the one
// place both kernels turn runtime dtypes into template arguments.
template <typename Fn>
void dispatch_warp_types(at::ScalarType in, at::ScalarType out, const Fn& fn) {
  auto with_in = [&](auto in_tag) {
    switch (out) {
      case at::kFloat: return fn(in_tag, TypeTag<float>{});
      case at::kHalf: return fn(in_tag, TypeTag<c10::Half>{});
      case at::kBFloat16: return fn(in_tag, TypeTag<c10::BFloat16>{});
      case at::kByte: return fn(in_tag, TypeTag<uint8_t>{});
      default: TORCH_CHECK(false, "warp_normalize: unsupported out_dtype");
    }
  };
  if (in == at::kByte) {
    with_in(TypeTag<uint8_t>{});
  } else {
    with_in(TypeTag<float>{});
  }
}

}  // namespace fastload
