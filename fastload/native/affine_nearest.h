// The maths of `fastload::affine_nearest_` (schema and CPU kernel in affine_nearest_cpu.cpp, CUDA kernel in
// affine_nearest_cuda.cu): torchvision's affine/rotate with interpolation=NEAREST on an image already at the output
// size, as grid_sample(mode="nearest", padding_mode="zeros") samples it. Output pixel (u, v) takes input pixel
// (round(m0 u + m1 v + m2), round(m3 u + m4 v + m5)) (pixel centres at integers), or the fill value where that pixel
// lies outside the image.
//
// The coordinates are fixed point with 32 fractional bits: each matrix entry is rounded to a multiple of 2^-32 once,
// after which every coordinate is exact integer arithmetic, the same on both devices however it is computed (a
// step along a row or a multiply). The error against the real-valued map is below 2^-33 * (1 + u + v), under
// 2e-6 pixels for any allowed size, so a pixel can differ from torchvision's float32 grid only within that of a
// rounding tie; an exact tie rounds up (grid_sample rounds ties to even, but its float32 grid rarely lands on one).
// Bounds keep the sums inside int64: |entries| < 2^15, sides below 2^14 (checked by the op; a matrix with a larger
// or non-finite entry maps every pixel outside).
#pragma once
#include <cmath>
#include <cstdint>

#include <c10/util/ArrayRef.h>

#include "warp.h"

#if !defined(__CUDACC__)
#include <ATen/core/Tensor.h>

#include <vector>
#endif

namespace fastload {
namespace nearest {

constexpr int kFractionBits = 32;
constexpr double kOne = 4294967296.0;  // 2^32
constexpr float kMaxEntry = 32768.f;   // 2^15
constexpr int kMaxSide = 16384;        // 2^14

// m (2x3 floats, output index -> input index) in fixed point: false if an entry is not finite or too large.
FL_HD bool to_fixed(const float* m, int64_t* f) {
  for (int k = 0; k < 6; ++k) {
    if (!(fabsf(m[k]) < kMaxEntry)) return false;
    f[k] = static_cast<int64_t>(llrint(static_cast<double>(m[k]) * kOne));  // exact product, rounded once
  }
  return true;
}

// The pixel index of a fixed-point coordinate: floor(x + 1/2).
FL_HD int64_t pixel(int64_t fixed) { return (fixed + (int64_t(1) << (kFractionBits - 1))) >> kFractionBits; }

// Whether pixel (x, y) lies inside an h x w image.
FL_HD bool inside(int64_t x, int64_t y, int h, int w) {
  return static_cast<uint64_t>(x) < static_cast<uint64_t>(w) && static_cast<uint64_t>(y) < static_cast<uint64_t>(h);
}

// The fill value in the image's type: torchvision rounds it (float_img.round_().to(uint8)); saturated here.
template <typename T>
FL_HD T fill_value(double fill) {
  if constexpr (sizeof(T) == 1) {
    const double r = nearbyint(fill);
    return static_cast<T>(r < 0.0 ? 0.0 : (r > 255.0 ? 255.0 : r));
  } else {
    return static_cast<T>(fill);
  }
}

// The fill per channel in the image's type (fill_value's rounding): Fill's values, broadcast past kMaxChannels
// (where only one value is allowed). Passed by value, to CUDA kernels too.
template <typename T>
struct Fills {
  T v[kMaxChannels];
  FL_HD T operator[](int c) const { return v[c < kMaxChannels ? c : 0]; }
};

template <typename T>
FL_HD Fills<T> typed(const Fill& fill) {
  Fills<T> out;
  for (int c = 0; c < kMaxChannels; ++c) out.v[c] = fill_value<T>(fill[c]);
  return out;
}

}  // namespace nearest

#if !defined(__CUDACC__)
// affine_nearest_cpu.cpp, for the ops that read samples through nearest maps (fastload::photometric): checks that
// `samples` (contiguous int64 [N] on the CPU) are distinct indices into a batch of `batch` (errors name `op`) ...
void check_sample_list(const at::Tensor& samples, int64_t batch, const char* op);
// ... and moves one uint8 NCHW sample of h x w pixels by `matrix` (2x3 floats) from src into dst (distinct
// buffers); `source` and `staged` are the caller's scratch.
void nearest_gather_u8(const uint8_t* src, uint8_t* dst, int h, int w, const float* matrix,
                       const nearest::Fills<uint8_t>& fill, std::vector<int>& source, std::vector<uint8_t>& staged);
#endif

}  // namespace fastload
