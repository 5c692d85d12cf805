// The per-value maths of `fastload::batch_ops` (RandomErasing + MixUp/CutMix fused; schema and CPU kernel in
// batch_ops_cpu.cpp, CUDA kernel in batch_ops_cuda.cu): one definition for both backends, so that they compute
// the same bits, and the same bits as the torch-op chain it replaces (erasing.py / mixing.py before issue 17):
//   erase:  torch.where(mask, value, x) / masked_scatter(mask, noise)  -> the value (or noise) cast to x's dtype
//   CutMix: torch.where(inside, x[partner], x)                        -> a select
//   MixUp:  x[partner].mul_(other).add_(x.mul(own))                   -> three ops, each computed in float and
//           rounded to x's dtype (torch's opmath for float16/bfloat16; float32 rounds once per op). Never
//           contracted into an fma (the CPU file turns contraction off), and on CUDA never flushing subnormals:
//           setup.py builds with --use_fast_math (-ftz=true, which can flush in the _rn intrinsics too), torch
//           does not, and a tiny lam (Beta with a small alpha) gives subnormal weights and products.
#pragma once
#include <cstdint>
#include <cstring>

#include "warp.h"  // FL_HD

namespace fastload {
namespace batch_ops {

// One IEEE multiply / add, rounded to nearest even, subnormals kept.
#if defined(__CUDA_ARCH__)
FL_HD float mul_ieee(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
FL_HD float add_ieee(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#else
FL_HD float mul_ieee(float a, float b) { return a * b; }
FL_HD float add_ieee(float a, float b) { return a + b; }
#endif

// Columns of the int32 [B, kColumns] per-sample table (transforms/batch_ops.py builds it on the host).
enum Column : int {
  kTop = 0, kLeft, kHeight, kWidth,  // the erase box; height or width 0: not erased
  kNoise,                            // where the sample's noise starts in `noise` (value="random")
  kY1, kY2, kX1, kX2,                // CutMix: rows y1..y2-1, columns x1..x2-1 come from the partner
  kOwn, kOther,                      // MixUp: the float32 weights lam and 1 - lam, as bit patterns
  kColumns
};
enum Mix : int { kNone = 0, kMixUp = 1, kCutMix = 2 };
enum Partner : int { kRoll = 0, kFlip = 1 };  // mixing.py's x.roll(1, 0) (partner i - 1) and x.flip(0) (B - 1 - i)

FL_HD int64_t partner_of(int64_t i, int64_t batch, int partner) {
  return partner == kFlip ? batch - 1 - i : (i == 0 ? batch - 1 : i - 1);
}

FL_HD float bits_to_float(int32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

template <typename T>
FL_HD T cast(float v) { return static_cast<T>(v); }  // round to nearest even (Half, BFloat16); exact for fill

// Sample i's value at (c, r, col) after its erase: x's own value v outside the box. fill (C values, exact in T)
// when given, else the sample's noise in (channel, row, column) order of its box (masked_scatter's order); a
// noise index outside [0, n_noise) keeps v (the CPU op checks the table; the CUDA op trusts it but stays in
// bounds).
template <typename T>
FL_HD T erased(T v, const int32_t* row, int c, int r, int col, const float* fill, const float* noise,
               int64_t n_noise) {
  const int top = row[kTop], left = row[kLeft], h = row[kHeight], w = row[kWidth];
  // int64: top + h of int32 table values may pass 2^31
  if (r < top || r >= static_cast<int64_t>(top) + h || col < left || col >= static_cast<int64_t>(left) + w) return v;
  if (fill != nullptr) return cast<T>(fill[c]);
  const int64_t k = row[kNoise] + (static_cast<int64_t>(c) * h + (r - top)) * w + (col - left);
  return k >= 0 && k < n_noise ? cast<T>(noise[k]) : v;
}

// MixUp of own value a and partner's b with the row's weights, in torchvision's order of operations. torchvision
// multiplies by Python floats, which torch keeps in float32 for a half-precision batch (its opmath): the weights
// (own, other: the row's float32 bits) are not rounded to T first (they would no longer sum to 1).
template <typename T>
FL_HD T mixup(T a, T b, float own, float other) {
  const T t1 = cast<T>(mul_ieee(static_cast<float>(b), other));  // x[partner].mul_(other)
  const T t2 = cast<T>(mul_ieee(static_cast<float>(a), own));    // x.mul(own)
  return cast<T>(add_ieee(static_cast<float>(t1), static_cast<float>(t2)));  // .add_()
}

// Sample i's output from its own (erased) value a and its partner's b.
template <typename T>
FL_HD T mixed(T a, T b, const int32_t* row, int mix, int r, int col) {
  if (mix == kCutMix)
    return r >= row[kY1] && r < row[kY2] && col >= row[kX1] && col < row[kX2] ? b : a;
  if (mix == kMixUp) return mixup(a, b, bits_to_float(row[kOwn]), bits_to_float(row[kOther]));
  return a;
}

}  // namespace batch_ops
}  // namespace fastload
