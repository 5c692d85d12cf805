// The per-pixel maths of `fastload::photometric` (schema and CPU kernel in augment_cpu.cpp, CUDA kernels in
// augment_cuda.cu): one definition for both backends, so that they compute the same bits.
//
// Every function replays functional.py's torch ops on uint8 images in float32, op for op: each torch op rounds
// once, so each step here is one correctly rounded operation (mul_rn, add_rn, ...), and a blend that torch
// computes as one fused multiply-add (addcmul, add_(alpha=)) is fma_rn. On CUDA these are the _rn intrinsics:
// nvcc's --use_fast_math would otherwise contract a * b + c and approximate divisions. The CPU file turns
// contraction off for the same reason.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "warp.h"  // FL_HD, FL_UNROLL, OutCast

namespace fastload {
namespace augment {

// functional.OPS
enum Op : int {
  kIdentity = 0, kBrightness, kContrast, kSaturation, kHue, kSharpness, kPosterize, kSolarize, kAutocontrast,
  kEqualize, kInvert, kGrayscale, kGaussianBlur, kNumOps
};

// Which per-sample statistics an op needs before its pixels can be computed.
FL_HD bool needs_stats(int op) { return op == kContrast || op == kAutocontrast || op == kEqualize; }

// ---- correctly rounded, never contracted float/double steps --------------------------------------------------
#if defined(__CUDA_ARCH__)
FL_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
FL_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
FL_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
FL_HD float div_rn(float a, float b) { return __fdiv_rn(a, b); }
FL_HD float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
FL_HD double dmul(double a, double b) { return __dmul_rn(a, b); }
FL_HD double dadd(double a, double b) { return __dadd_rn(a, b); }
FL_HD double ddiv(double a, double b) { return __ddiv_rn(a, b); }
FL_HD double dfma(double a, double b, double c) { return __fma_rn(a, b, c); }
FL_HD float to_float(double a) { return __double2float_rn(a); }
FL_HD float i64_to_float(int64_t a) { return __ll2float_rn(a); }
#else
FL_HD float mul_rn(float a, float b) { return a * b; }
FL_HD float add_rn(float a, float b) { return a + b; }
FL_HD float sub_rn(float a, float b) { return a - b; }
FL_HD float div_rn(float a, float b) { return a / b; }
FL_HD float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
FL_HD double dmul(double a, double b) { return a * b; }
FL_HD double dadd(double a, double b) { return a + b; }
FL_HD double ddiv(double a, double b) { return a / b; }
FL_HD double dfma(double a, double b, double c) { return std::fma(a, b, c); }
FL_HD float to_float(double a) { return static_cast<float>(a); }
FL_HD float i64_to_float(int64_t a) { return static_cast<float>(a); }
#endif

// torch's clamp_(0, 255).to(uint8): clamp, then truncate.
FL_HD uint8_t clamp_trunc_u8(float v) {
  v = v < 0.f ? 0.f : (v > 255.f ? 255.f : v);
  return static_cast<uint8_t>(static_cast<int>(v));
}

// 1 - factor computed in float64 as Python does, then the float32 torch computes with.
FL_HD float one_minus(float factor) { return to_float(1.0 - static_cast<double>(factor)); }

// A blend's 1 - factor from a table slot (contrast, saturation, sharpness): p1 where the table carries it (the
// float32 of 1 - the double factor torchvision was given: a policy's 1 + magnitude is often no float32, so p0 alone
// cannot give it), else one_minus(p0) (p1 = 0 means 1 - factor = 0 exactly, which that gives too).
FL_HD float blend_one_minus(const float* p) { return p[1] != 0.f ? p[1] : one_minus(p[0]); }

// ---- per-pixel ops ---------------------------------------------------------------------------------------------

// _gray: r * 0.2989, then g and b added with alpha (fused multiply-adds), unrounded.
FL_HD float gray(uint8_t r, uint8_t g, uint8_t b) {
  return fma_rn(static_cast<float>(b), 0.114f, fma_rn(static_cast<float>(g), 0.587f, mul_rn(static_cast<float>(r), 0.2989f)));
}

// _blend: x * factor + other * (1 - factor), the second product fused; clamped and truncated.
FL_HD uint8_t blend(uint8_t x, float other, float factor, float om) {
  return clamp_trunc_u8(fma_rn(other, om, mul_rn(static_cast<float>(x), factor)));
}

FL_HD uint8_t brightness(uint8_t x, float factor) { return clamp_trunc_u8(mul_rn(static_cast<float>(x), factor)); }

// Contrast's blend target: the mean of the floored luma (p2 != 0: of channel 0, a grey image carried in three
// equal channels after Grayscale(num_output_channels=1)), sum / count in float32 as torch's CPU mean computes it
// (exact for sums below 2^24, i.e. up to 65,793 pixels; beyond, the correctly rounded sum).
FL_HD float contrast_mean(int64_t gray_sum, int64_t pixels) {
  return div_rn(i64_to_float(gray_sum), i64_to_float(pixels));
}

FL_HD uint8_t posterize(uint8_t x, float bits_param) {
  int bits = static_cast<int>(rintf(bits_param));  // round() then long(), as apply_table; clamped: memory-safe
  bits = bits < 0 ? 0 : (bits > 8 ? 8 : bits);
  const int mask = ((1 << bits) - 1) << (8 - bits);
  return static_cast<uint8_t>(x & mask);
}

FL_HD uint8_t solarize(uint8_t x, float threshold) {
  return static_cast<float>(x) >= threshold ? static_cast<uint8_t>(255 - x) : x;
}

// Autocontrast of one channel with minimum lo and maximum hi: (x - lo) / ((hi - lo) * (1/255)); flat: unchanged.
FL_HD uint8_t autocontrast(uint8_t x, int lo, int hi) {
  if (lo == hi) return x;
  const float inv_scale = mul_rn(static_cast<float>(hi - lo), static_cast<float>(1.0 / 255.0));
  return clamp_trunc_u8(div_rn(static_cast<float>(x - lo), inv_scale));
}

// Equalize's lookup table of one channel from its histogram (PIL's, as functional._equalize builds it):
// step = pixels that are not of the largest value present / 255; a channel with step 0 is left as it is.
FL_HD void equalize_lut(const int32_t* hist, uint8_t* lut) {
  int64_t total = 0;
  int top = 0;
  for (int i = 0; i < 256; ++i) {
    total += hist[i];
    if (hist[i] > 0) top = i;
  }
  const int64_t step = (total - hist[top]) / 255;
  if (step == 0) {
    for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(i);
    return;
  }
  lut[0] = 0;
  int64_t cum = 0;
  for (int i = 1; i < 256; ++i) {
    cum += hist[i - 1];
    const int64_t v = (cum + step / 2) / step;
    lut[i] = static_cast<uint8_t>(v > 255 ? 255 : v);
  }
}

// Sharpness of an inside pixel: s = the 3x3 sum with the centre counted 5 times (torchvision's kernel times 13),
// the smoothed value round(s / 13) (never a tie), blended with the pixel as a fused multiply-add.
FL_HD uint8_t sharpen(uint8_t x, int s, float om) {
  const int smooth = (s + 6) / 13;
  return clamp_trunc_u8(fma_rn(static_cast<float>(smooth - x), om, static_cast<float>(x)));
}

// x - trunc(x): torch's fmod(x, 1.0), exact.
FL_HD float frac(float x) { return sub_rn(x, truncf(x)); }

// adjust_hue of one pixel: functional._rgb_to_hsv, the shift, _hsv_to_rgb and _to_uint8, step for step. Written
// without branches (each candidate computed, the taken one selected) so that augment_cpu.cpp's loop over whole
// planes vectorises (GCC does so only when it is inlined: forced on the host); r, g, b are never NaN or negative,
// so the selects are fmaxf / fminf.
#if defined(__CUDACC__) || !defined(__GNUC__)
FL_HD void hue(uint8_t r8, uint8_t g8, uint8_t b8, float factor, uint8_t* out) {
#else
__attribute__((always_inline)) inline void hue(uint8_t r8, uint8_t g8, uint8_t b8, float factor, uint8_t* out) {
#endif
  const float scale = static_cast<float>(1.0 / 255.0), sixth = static_cast<float>(1.0 / 6.0);
  const float r = mul_rn(static_cast<float>(r8), scale), g = mul_rn(static_cast<float>(g8), scale),
              b = mul_rn(static_cast<float>(b8), scale);
  const float gb = g > b ? g : b, gb_min = g < b ? g : b;
  const float maxc = r > gb ? r : gb, minc = r < gb_min ? r : gb_min;
  const bool eqc = maxc == minc;
  const float range = sub_rn(maxc, minc);
  const float s = div_rn(range, eqc ? 1.f : maxc);
  const float divisor = eqc ? 1.f : range;
  const float rc = div_rn(sub_rn(maxc, r), divisor), gc = div_rn(sub_rn(maxc, g), divisor),
              bc = div_rn(sub_rn(maxc, b), divisor);
  // one of hr, hg, hb (torchvision adds the other two, which are zeros)
  const float hr = sub_rn(bc, gc), hg = sub_rn(add_rn(rc, 2.f), bc), hb = sub_rn(add_rn(gc, 4.f), rc);
  float h = maxc == r ? hr : (maxc == g ? hg : hb);
  h = frac(add_rn(mul_rn(h, sixth), 1.f));
  h = frac(add_rn(h, factor));  // remainder(h, 1): fmod, plus 1 when negative
  h = h < 0.f ? add_rn(h, 1.f) : h;
  // _hsv_to_rgb. h is in [0, 1] here, so torchvision's sector floor(h * 6) % 6 is floor(h * 6), 6 meaning 0.
  const float h6 = mul_rn(h, 6.f);
  const float fi = floorf(h6);
  const float f = sub_rn(h6, fi);
  const float sector = fi >= 6.f ? 0.f : fi;  // 0..5
  const float sxf = mul_rn(s, f);
  const float one_minus_s = sub_rn(1.f, s);
  const float v = maxc;
  float q = mul_rn(sub_rn(1.f, sxf), v), t = mul_rn(add_rn(sxf, one_minus_s), v), p = mul_rn(one_minus_s, v);
  q = q < 0.f ? 0.f : (q > 1.f ? 1.f : q);
  t = t < 0.f ? 0.f : (t > 1.f ? 1.f : t);
  p = p < 0.f ? 0.f : (p > 1.f ? 1.f : p);
  // torchvision's table, sector i: (R, G, B) = (v,t,p) (q,v,p) (p,v,t) (p,q,v) (t,p,v) (v,p,q), as a flat run
  // of selects (nested ones are control flow to GCC, and the plane loop would not vectorise)
  float R = p, G = p, B = p;
  R = sector == 4.f ? t : R, R = sector == 1.f ? q : R, R = sector == 0.f ? v : R, R = sector == 5.f ? v : R;
  G = sector == 3.f ? q : G, G = sector == 0.f ? t : G, G = sector == 1.f ? v : G, G = sector == 2.f ? v : G;
  B = sector == 5.f ? q : B, B = sector == 2.f ? t : B, B = sector == 3.f ? v : B, B = sector == 4.f ? v : B;
  const float to_u8 = static_cast<float>(255.0 + 1.0 - 1e-3);  // _to_uint8: x * 255.999, truncated
  out[0] = static_cast<uint8_t>(static_cast<int>(mul_rn(R, to_u8)));
  out[1] = static_cast<uint8_t>(static_cast<int>(mul_rn(G, to_u8)));
  out[2] = static_cast<uint8_t>(static_cast<int>(mul_rn(B, to_u8)));
}

// ---- gaussian_blur ---------------------------------------------------------------------------------------------

// exp(x) for x <= 0 in float64 from correctly rounded steps only (the same bits on both backends; libm's and
// CUDA's exp may differ in the last place): 2^n * e^r, |r| <= ln2 / 2, Taylor to r^13 (error below 1e-16).
FL_HD double exp_nonpositive(double x) {
  if (x < -104.0) return 0.0;  // below float32's smallest normal once normalised: flushed anyway
  const double n = rint(dmul(x, 1.4426950408889634));
  double r = dfma(-n, 6.93147180369123816490e-01, x);  // ln2 split in two: n * hi is exact
  r = dfma(-n, 1.90821492927058770002e-10, r);
  double p = 1.0 / 6227020800.0;  // 1/13!
  constexpr double kInvFact[13] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                   1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0,
                                   0.5, 1.0, 1.0};
  for (int k = 0; k < 13; ++k) p = dfma(p, r, kInvFact[k]);
  const int64_t bits = static_cast<int64_t>(static_cast<int>(n) + 1023) << 52;  // 2^n, normal for n >= -151
  double scale;
  memcpy(&scale, &bits, sizeof(scale));
  return dmul(p, scale);
}

// Unnormalised tap i of torchvision's 1-D kernel of odd size k: exp(-(i - k//2)^2 / (2 sigma^2)) (its linspace
// over +-(k-1)/(2 sqrt 2), divided by sigma and squared, is the same function).
FL_HD double gaussian_tap(int i, int k, float sigma) {
  const double d = static_cast<double>(i - k / 2), s = static_cast<double>(sigma);
  return exp_nonpositive(-ddiv(dmul(d, d), dmul(2.0, dmul(s, s))));
}

// Normalised float32 tap from the float64 sum of all taps (summed i = 0..k-1 by the caller, in that order).
FL_HD float gaussian_weight(double tap, double sum) {
  const float w = to_float(ddiv(tap, sum));
  return w < 1.17549435e-38f ? 0.f : w;  // no subnormals: CUDA flushes them
}

FL_HD int reflect(int i, int n) {  // torch's reflect padding (pad < n)
  if (i < 0) i = -i;
  if (i >= n) i = 2 * (n - 1) - i;
  return i;
}

// Horizontal pass at column x of one row: sum_i w[i] * row[reflect(x + i - k/2)], i = 0..k-1, fused.
FL_HD float blur_row(const uint8_t* row, int width, int x, const float* w, int k) {
  float acc = 0.f;
  const int r = k / 2;
  for (int i = 0; i < k; ++i) acc = fma_rn(w[i], static_cast<float>(row[reflect(x + i - r, width)]), acc);
  return acc;
}

// The vertical pass's result, rounded half to even (torch's round_) and stored as uint8.
FL_HD uint8_t blur_round(float v) {
  v = rintf(v);
  return static_cast<uint8_t>(static_cast<int>(v < 0.f ? 0.f : (v > 255.f ? 255.f : v)));
}

// Whether a blur with kernel sizes (kx, ky) and sigma is defined on an h x w image (torch's reflect padding
// needs pad < side): the CPU op refuses the others, the CUDA kernels leave such a sample unchanged.
FL_HD bool blur_valid(float kx, float ky, float sigma, int h, int w) {
  const bool ints = kx == truncf(kx) && ky == truncf(ky);
  if (!ints || !(kx >= 1.f) || !(ky >= 1.f) || !(sigma > 0.f)) return false;
  if (kx > 2.f * w - 1.f || ky > 2.f * h - 1.f) return false;  // also bounds them below 2^31
  return (static_cast<int>(kx) & 1) && (static_cast<int>(ky) & 1);
}

// ---- the output cast -------------------------------------------------------------------------------------------

// cast(v * alpha + beta), the multiply-add fused as the pipeline's torch.addcmul computes it.
template <typename out_t>
FL_HD out_t cast_out(uint8_t v, float alpha, float beta) {
  return OutCast<out_t>::apply(fma_rn(static_cast<float>(v), alpha, beta));
}

}  // namespace augment
}  // namespace fastload
