// The sampling maths of the affine/normalise stage, shared by the CPU twin (warp_cpu.cpp) and the CUDA
// kernel (warp_cuda.cu) so that both compute the same function.
//
// Convention: a 2x3 matrix maps an output pixel index (u, v) to an input pixel index (x, y) (pixel centres
// at integers, as in OpenCV). The sample is a separable triangle (bilinear) filter centred there whose
// support grows with the shrink factor along each axis, max(1, |row of M|): for axis-aligned matrices this
// is exactly PIL's / torch's antialiased bilinear resize (weights, tap ranges and edge renormalisation).
// An output pixel whose centre maps outside the input gets `fill`.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FL_HD __host__ __device__ __forceinline__
#else
#define FL_HD inline
#endif

namespace fastload {

constexpr int kMaxChannels = 4;

FL_HD float triangle(float x) {
  x = fabsf(x);
  return x < 1.f ? 1.f - x : 0.f;
}

// Taps [lo, hi) of the filter for a centre given in edge coordinates (pixel i spans [i, i+1)), as torch's
// _upsample_bilinear2d_aa computes them: lo = int(centre - support + 0.5), hi = int(centre + support + 0.5).
FL_HD void filter_taps(float centre, float support, int size, int* lo, int* hi) {
  int a = static_cast<int>(floorf(centre - support + 0.5f));
  int b = static_cast<int>(floorf(centre + support + 0.5f));
  *lo = a < 0 ? 0 : a;
  *hi = b > size ? size : b;
}

// Filter support (in input pixels) along an output axis whose step moves the input by (dx, dy).
FL_HD float filter_support(float dx, float dy) {
  const float s = sqrtf(dx * dx + dy * dy);
  return s > 1.f ? s : 1.f;
}

// Input centre (edge coordinates) of output pixel (u, v) and whether it lies inside the image.
FL_HD bool sample_centre(const float* m, int u, int v, int height, int width, float* cx, float* cy) {
  *cx = m[0] * u + m[1] * v + m[2] + 0.5f;
  *cy = m[3] * u + m[4] * v + m[5] + 0.5f;
  return *cx >= 0.f && *cx <= width && *cy >= 0.f && *cy <= height;
}

// Final value: v * alpha + beta, converted to the output type (uint8 rounds and saturates).
template <typename T>
struct OutCast {
  FL_HD static T apply(float v) { return static_cast<T>(v); }
};
template <>
struct OutCast<uint8_t> {
  FL_HD static uint8_t apply(float v) {
    v = v < 0.f ? 0.f : (v > 255.f ? 255.f : v);
    return static_cast<uint8_t>(v + 0.5f);
  }
};

}  // namespace fastload
