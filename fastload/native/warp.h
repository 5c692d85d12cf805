// The sampling maths of the affine/normalise stage, shared by the CPU twin (warp_cpu.cpp) and the CUDA
// kernel (warp_cuda.cu) so that both compute the same function.
//
// Convention: a 2x3 matrix maps an output pixel index (u, v) to an input pixel index (x, y) (pixel centres
// at integers, as in OpenCV). The sample is a separable triangle (bilinear) filter centred there whose
// support grows with the shrink factor along each axis, max(1, |row of M|): for axis-aligned matrices this
// is exactly PIL's / torch's antialiased bilinear resize (weights, tap ranges and edge renormalisation).
// An output pixel whose centre maps outside the input's visible box gets `fill`.
//
// A sample's map is [2, 3] (the matrix; the whole input is visible) or [2, 5]: each row r is the matrix row followed
// by the interval [lo, hi] of input axis r (edge coordinates) that is visible. The box lets the planner put the fill
// boundary exactly where torchvision's is (a crop's edge, the true image edge of a DCT-downscaled decode, whose last
// decoded pixel covers part of the image only) while the filter's taps still read the whole decoded window.
#pragma once
#include <c10/util/ArrayRef.h>

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FL_HD __host__ __device__ __forceinline__
#else
#define FL_HD inline
#endif

// Channel loops run to kMaxChannels, guarded by c < C, and are fully unrolled so that per-channel accumulators stay
// in registers on CUDA (a runtime-indexed local array would live in local memory).
#if defined(__CUDA_ARCH__)
#define FL_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define FL_UNROLL  // nvcc's host pass: only device instantiations are used, and either pragma draws a warning
#else
#define FL_UNROLL _Pragma("GCC unroll 4")
#endif

namespace fastload {

constexpr int kMaxChannels = 4;

// The value of pixels outside the visible box, per channel, on the input's scale (alpha/beta not yet applied):
// torchvision's `fill`, one value or one per channel (make_fill broadcasts one). Passed by value, CUDA kernels
// included.
struct Fill {
  float v[kMaxChannels];
  FL_HD float operator[](int c) const { return v[c]; }
};

// The ops' `fill` for an image of `channels` channels: one value, or one per channel where there are at most
// kMaxChannels; every entry set (one value broadcast). Errors name `op`. In warp_cpu.cpp; the ops of warp,
// affine_nearest and photometric all take it.
Fill make_fill(c10::ArrayRef<double> fill, int64_t channels, const char* op);

FL_HD float triangle(float x) {
  x = fabsf(x);
  return x < 1.f ? 1.f - x : 0.f;
}

// The largest float below 2^31: a bound clamped to it converts to int without overflow.
constexpr float kTapLimit = 2147483520.f;

// Taps [lo, hi) of the filter for a centre given in edge coordinates (pixel i spans [i, i+1)), as torch's
// _upsample_bilinear2d_aa computes them: lo = int(centre - support + 0.5), hi = int(centre + support + 0.5).
// Each bound is clamped to [0, kTapLimit] as a float before the int cast (a huge scale overflowed it and left no
// taps; NaN gives 0: no taps), then hi to size as an int: the old results wherever the old cast was defined.
FL_HD void filter_taps(float centre, float support, int size, int* lo, int* hi) {
  const float a = floorf(centre - support + 0.5f), b = floorf(centre + support + 0.5f);
  *lo = static_cast<int>(fminf(fmaxf(a, 0.f), kTapLimit));
  const int top = static_cast<int>(fminf(fmaxf(b, 0.f), kTapLimit));
  *hi = top > size ? size : top;
}

// Filter support (in input pixels) along an output axis whose step moves the input by (dx, dy).
FL_HD float filter_support(float dx, float dy) {
  const float s = sqrtf(dx * dx + dy * dy);
  return s > 1.f ? s : 1.f;
}

// The part of an input (edge coordinates) whose output pixels are image, not fill.
struct Visible {
  float x0, x1, y0, y1;
};

// Sample b's matrix m[6] and visible box from a map of `cols` (3 or 5) columns per row (see the top of this file),
// the box narrowed to the h x w input: taps never leave the input, so a centre beyond it could have none.
FL_HD Visible read_map(const float* maps, int64_t b, int cols, int h, int w, float* m) {
  const float* p = maps + b * 2 * cols;
  for (int k = 0; k < 3; ++k) m[k] = p[k], m[3 + k] = p[cols + k];
  Visible v{0.f, static_cast<float>(w), 0.f, static_cast<float>(h)};
  if (cols == 5) {  // comparisons, not fmaxf/fminf: a NaN bound shows nothing (fill), never more than the input
    v.x0 = p[3] > v.x0 ? p[3] : v.x0;
    v.x1 = p[4] < v.x1 ? p[4] : v.x1;
    v.y0 = p[cols + 3] > v.y0 ? p[cols + 3] : v.y0;
    v.y1 = p[cols + 4] < v.y1 ? p[cols + 4] : v.y1;
    if (!(p[3] == p[3]) || !(p[4] == p[4]) || !(p[cols + 3] == p[cols + 3]) || !(p[cols + 4] == p[cols + 4]))
      v = Visible{1.f, 0.f, 1.f, 0.f};
  }
  return v;
}

// Whether an input coordinate (edge coordinates) along one axis lies in the visible interval [lo, hi].
FL_HD bool visible_at(float centre, float lo, float hi) { return centre >= lo && centre <= hi; }

// Input centre (edge coordinates) of output pixel (u, v) and whether it lies inside the visible box.
FL_HD bool sample_centre(const float* m, int u, int v, const Visible& vis, float* cx, float* cy) {
  *cx = m[0] * u + m[1] * v + m[2] + 0.5f;
  *cy = m[3] * u + m[4] * v + m[5] + 0.5f;
  return visible_at(*cx, vis.x0, vis.x1) && visible_at(*cy, vis.y0, vis.y1);
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

// Writes channels c < C of one output pixel: the normalised sum, then alpha/beta and the cast.
template <typename out_t>
FL_HD void store_pixel(out_t* o, int64_t os_c, const float* acc, float inv, const float* alpha, const float* beta,
                       int C) {
  FL_UNROLL
  for (int c = 0; c < kMaxChannels; ++c)
    if (c < C) o[c * os_c] = OutCast<out_t>::apply(acc[c] * inv * alpha[c] + beta[c]);
}

// One input image: channel c of pixel (y, x) is p[y * s_y + x * s_x + c * s_c]. index_t is int on CUDA (the kernel
// checks that the image fits) to keep address arithmetic 32-bit, int64_t on the CPU.
template <typename in_t, typename index_t>
struct InputView {
  const in_t* p;
  int h, w;
  index_t s_c, s_y, s_x;
};

// Output pixel (u, v) of a general (rotation, shear, large shrink) warp: the full 2-D filter, normalised by the
// product of the per-axis weight sums; fill_value (already through alpha/beta) when the centre maps outside vis.
// sx, sy: filter_support() of the matrix rows, constant per sample. The one definition for both backends, so the
// CPU twin and the CUDA kernel perform the same float operations in the same order.
template <typename in_t, typename index_t, typename out_t>
FL_HD void warp_pixel_general(const InputView<in_t, index_t>& in, const Visible& vis, int C, const float* m, float sx,
                              float sy, int u, int v, const float* alpha, const float* beta, const float* fill_value,
                              out_t* o, int64_t os_c) {
  float cx, cy;
  if (!sample_centre(m, u, v, vis, &cx, &cy)) {
    // Not unrolled: that would hold fill_value in registers, and the CUDA kernel would spill more.
    for (int c = 0; c < C; ++c) o[c * os_c] = OutCast<out_t>::apply(fill_value[c]);
    return;
  }
  int x0, x1, y0, y1;
  filter_taps(cx, sx, in.w, &x0, &x1);
  filter_taps(cy, sy, in.h, &y0, &y1);
  float acc[kMaxChannels] = {0.f, 0.f, 0.f, 0.f};
  float total_x = 0.f, total_y = 0.f;
  for (int x = x0; x < x1; ++x) total_x += triangle((x + 0.5f - cx) / sx);
  for (int y = y0; y < y1; ++y) {
    const float wy = triangle((y + 0.5f - cy) / sy);
    total_y += wy;
    const in_t* row = in.p + y * in.s_y;
    for (int x = x0; x < x1; ++x) {
      const float w = wy * triangle((x + 0.5f - cx) / sx);
      const in_t* p = row + x * in.s_x;
      FL_UNROLL
      for (int c = 0; c < kMaxChannels; ++c)
        if (c < C) acc[c] += w * static_cast<float>(p[c * in.s_c]);
    }
  }
  const float total = total_x * total_y;
  store_pixel(o, os_c, acc, total > 0.f ? 1.f / total : 0.f, alpha, beta, C);
}

}  // namespace fastload
