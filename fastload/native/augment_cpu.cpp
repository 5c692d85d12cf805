// `fastload::photometric`: a PhotometricTable (functional.apply_table's semantics on uint8) applied to a batch,
// then the output cast cast(v * alpha[c] + beta[c]) (the pipeline's ToDtype + Normalize). Schema, the checks
// both backends share, and the CPU kernel: one sample per task, its slots in turn through two scratch planes.
// Listed samples (samples/matrices) have their input to slot map_slots[k] moved by their nearest maps
// (affine_nearest.h), as if affine_nearest_ had run on that slot's input, without touching x: the stage's policy
// rotate/shear/translate, between the ops torchvision applies before and after them.
// The per-pixel maths is augment.h's, shared with the CUDA kernels (augment_cuda.cu).

// torch computes each float op with one rounding; a contracted a * b + c would round once where it rounds twice.
// no-trapping-math changes no result (only whether FP exceptions may be raised speculatively); without it GCC will
// not vectorise a loop that converts float to integer (saturation: 1.5 -> 0.2 ms per image at 224 px).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

#include "affine_nearest.h"
#include "augment.h"
#include "check.h"
#include "cpu_build.h"
#include "exit_guard.h"

namespace fastload {

namespace {

// A ValueError (as functional.apply_table raises for a bad table) with a printf-formatted message (check.h says
// why not c10::str).
[[noreturn]] __attribute__((format(printf, 1, 2))) void value_fail(const char* format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  TORCH_CHECK_VALUE(false, static_cast<const char*>(message));
}

}  // namespace

at::Tensor recycled_cpu_output(at::IntArrayRef sizes, const at::TensorOptions& options, bool channels_last);

// The checks both kernels share (shapes, dtypes, devices, sizes); returns the output on x's device.
at::Tensor prepare_photometric_output(const at::Tensor& x, const at::Tensor& ops, const at::Tensor& params,
                                      const at::Tensor& alpha, const at::Tensor& beta, at::ScalarType out_dtype,
                                      bool channels_last) {
  FL_CHECK(x.dim() == 4 && x.size(1) == 3, "photometric: x must be a [B, 3, H, W] batch, got %lld dimensions%s",
           static_cast<long long>(x.dim()), x.dim() == 4 ? " with a channel count other than 3" : "");
  FL_CHECK(x.scalar_type() == at::kByte, "photometric: x must be uint8, got %s", c10::toString(x.scalar_type()));
  TORCH_CHECK(x.is_contiguous(), "photometric: x must be contiguous (NCHW)");
  const int64_t batch = x.size(0), h = x.size(2), w = x.size(3);
  // Kernels index a sample with int: 3 * h * w must stay below 2^31 (checked by division: no overflow).
  FL_CHECK(h <= 0 || w <= 0 || (h <= INT32_MAX / 3 / w),
           "photometric: images of %lld x %lld pixels are too large (3 * H * W must be below 2^31)",
           static_cast<long long>(h), static_cast<long long>(w));
  TORCH_CHECK(ops.dim() == 2 && ops.size(0) == batch && ops.scalar_type() == at::kLong && ops.is_contiguous(),
              "photometric: ops must be a contiguous int64 [B, S] tensor with B = x.size(0)");
  const int64_t slots = ops.size(1);
  TORCH_CHECK(params.dim() == 3 && params.size(0) == batch && params.size(1) == slots && params.size(2) == 3 &&
                  params.scalar_type() == at::kFloat && params.is_contiguous(),
              "photometric: params must be a contiguous float32 [B, S, 3] tensor matching ops [B, S]");
  TORCH_CHECK(alpha.numel() == 3 && beta.numel() == 3 && alpha.scalar_type() == at::kFloat &&
                  beta.scalar_type() == at::kFloat && alpha.is_contiguous() && beta.is_contiguous(),
              "photometric: alpha and beta must be contiguous float32 [3] tensors");
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16 ||
                  out_dtype == at::kByte,
              "photometric: out_dtype must be float32, float16, bfloat16 or uint8");
  for (const at::Tensor* t : {&ops, &params, &alpha, &beta})
    FL_CHECK(t->device() == x.device(), "photometric: ops, params, alpha and beta must be on x's device (%s)",
             x.device().str().c_str());
  auto options = x.options().dtype(out_dtype);
  // On the CPU from warp_cpu.cpp's pool of recycled blocks: a fresh float32 batch costs as much in first-touch
  // page faults as the ops themselves.
  if (x.device().is_cpu()) return recycled_cpu_output({batch, 3, h, w}, options, channels_last);
  if (channels_last) options = options.memory_format(at::MemoryFormat::ChannelsLast);
  return at::empty({batch, 3, h, w}, options);
}

// The nearest maps both backends take (samples int64 [N], matrices float32 [N, 2, 3], on x's device; both or
// neither). The indices themselves: checked by the CPU op; the CUDA kernels skip one out of range and read a sample
// listed twice through one of its matrices (the Python wrapper checks host ones).
void check_photometric_maps(const at::Tensor& x, const std::optional<at::Tensor>& samples,
                            const std::optional<at::Tensor>& matrices) {
  TORCH_CHECK(samples.has_value() == matrices.has_value(), "photometric: pass both samples and matrices, or neither");
  if (!samples) return;
  TORCH_CHECK(samples->dim() == 1 && samples->scalar_type() == at::kLong && samples->is_contiguous(),
              "photometric: samples must be a contiguous int64 [N] tensor");
  FL_CHECK(matrices->dim() == 3 && matrices->size(0) == samples->size(0) && matrices->size(1) == 2 &&
               matrices->size(2) == 3 && matrices->scalar_type() == at::kFloat && matrices->is_contiguous(),
           "photometric: matrices must be a contiguous float32 [N, 2, 3] tensor with N = %lld (one per sample)",
           static_cast<long long>(samples->size(0)));
  TORCH_CHECK(samples->device() == x.device() && matrices->device() == x.device(),
              "photometric: samples and matrices must be on x's device");
  FL_CHECK(x.size(2) <= nearest::kMaxSide && x.size(3) <= nearest::kMaxSide,
           "photometric: images read through nearest maps must be at most %d a side, got %lld x %lld",
           nearest::kMaxSide, static_cast<long long>(x.size(2)), static_cast<long long>(x.size(3)));
}

// map_slots (host): the slot whose input each listed sample's map moves, one per entry, non-decreasing, below
// max(S, 1) (S = 0: the cast alone, "slot 0"); empty: every entry at slot 0. Returns one entry's slot each.
std::vector<int64_t> photometric_map_slots(at::IntArrayRef map_slots, int64_t listed, int64_t slots) {
  if (map_slots.empty()) return std::vector<int64_t>(listed, 0);
  FL_CHECK(static_cast<int64_t>(map_slots.size()) == listed,
           "photometric: map_slots must give one slot per listed sample (%lld), got %lld",
           static_cast<long long>(listed), static_cast<long long>(map_slots.size()));
  const int64_t bound = std::max<int64_t>(slots, 1);
  for (size_t k = 0; k < map_slots.size(); ++k) {
    FL_CHECK(map_slots[k] >= 0 && map_slots[k] < bound, "photometric: map_slots[%lld] = %lld is not a slot (%lld)",
             static_cast<long long>(k), static_cast<long long>(map_slots[k]), static_cast<long long>(bound));
    FL_CHECK(k == 0 || map_slots[k] >= map_slots[k - 1], "photometric: map_slots must be non-decreasing");
  }
  return std::vector<int64_t>(map_slots.begin(), map_slots.end());
}

namespace {

using namespace augment;

// The table's values, checked on the host before any pixel is touched (the CUDA op cannot read them without a
// sync: there, functional.photometric checks the host table and the kernels leave a bad slot's sample unchanged).
void check_table(const at::Tensor& ops, const at::Tensor& params, int h, int w) {
  const int64_t batch = ops.size(0), slots = ops.size(1);
  const int64_t* op = ops.data_ptr<int64_t>();
  const float* p = params.data_ptr<float>();
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t s = 0; s < slots; ++s) {
      const int64_t code = op[i * slots + s];
      const float* q = p + (i * slots + s) * 3;
      const long long li = static_cast<long long>(i), ls = static_cast<long long>(s);
      if (code < 0 || code >= kNumOps)
        value_fail("photometric: sample %lld, slot %lld: unknown op code %lld (0 to %d)", li, ls,
                   static_cast<long long>(code), kNumOps - 1);
      if (code == kPosterize && !(q[0] >= 0.f && q[0] <= 8.f && q[0] == truncf(q[0])))
        value_fail("photometric: sample %lld, slot %lld: posterize bits must be an integer in [0, 8], got %g", li,
                   ls, q[0]);
      if (code == kGaussianBlur && h > 0 && w > 0 && !blur_valid(q[0], q[1], q[2], h, w))
        value_fail("photometric: sample %lld, slot %lld: gaussian_blur needs odd kernel sizes (%g, %g) of at most "
                   "2 * side - 1 (%d, %d) and a positive sigma (%g)",
                   li, ls, q[0], q[1], 2 * w - 1, 2 * h - 1, q[2]);
    }
  }
}

// The per-sample functions are inlined into both builds of run_sample (below): each build compiles them for its ISA.
#define FL_SAMPLE __attribute__((always_inline)) inline

// Per-thread scratch: two uint8 images (the slots ping-pong between them) and the blur's rows and weights.
struct Scratch {
  std::vector<uint8_t> image[2];
  std::vector<uint8_t> moved;  // a listed sample after its nearest map, with no slots (the cast's input)
  std::vector<uint8_t> staged;  // nearest_gather_u8's copy of a listed sample
  std::vector<int> source;
  std::vector<float> rows;     // the blur's horizontal sums, a plane
  std::vector<float> padded;   // one row as floats, reflected out by the kernel's radius
  std::vector<float> sums;     // one row of vertical sums
  std::vector<float> wx, wy;
};

// The op's value map for ops where each output value depends only on the input value of its channel: computed
// once per channel through augment.h's functions, then applied as a table.
FL_SAMPLE void map_planes(const uint8_t* src, uint8_t* dst, int64_t hw, const uint8_t (*lut)[256]) {
  for (int c = 0; c < 3; ++c) {
    const uint8_t* t = lut[c];
    const uint8_t* s = src + c * hw;
    uint8_t* d = dst + c * hw;
    for (int64_t i = 0; i < hw; ++i) d[i] = t[s[i]];
  }
}

void gaussian_weights(int k, float sigma, std::vector<float>& w) {
  w.resize(k);
  double sum = 0.0;
  for (int i = 0; i < k; ++i) sum = dadd(sum, gaussian_tap(i, k, sigma));
  for (int i = 0; i < k; ++i) w[i] = gaussian_weight(gaussian_tap(i, k, sigma), sum);
}

// Both passes run across a row's columns (the loops vectorise) while each pixel keeps blur_row's sums in its order,
// i = 0..k-1 from 0.f, so the bits equal the CUDA kernels' (which sum per pixel): the horizontal pass over a row
// padded by reflection and converted to float once, the vertical pass over whole rows of horizontal sums.
FL_SAMPLE void blur(const float* p, const uint8_t* src, uint8_t* dst, int h, int w, Scratch& scratch) {
  const int kx = static_cast<int>(p[0]), ky = static_cast<int>(p[1]);
  gaussian_weights(kx, p[2], scratch.wx);
  gaussian_weights(ky, p[2], scratch.wy);
  const int64_t hw = static_cast<int64_t>(h) * w;
  const int rx = kx / 2, ry = ky / 2;
  scratch.rows.resize(hw);
  scratch.padded.resize(w + 2 * rx);
  scratch.sums.resize(w);
  float* __restrict__ rows = scratch.rows.data();
  float* __restrict__ padded = scratch.padded.data();
  float* __restrict__ acc = scratch.sums.data();
  const float* wx = scratch.wx.data();
  const float* wy = scratch.wy.data();
  for (int c = 0; c < 3; ++c) {
    const uint8_t* s = src + c * hw;
    for (int y = 0; y < h; ++y) {
      const uint8_t* row = s + static_cast<int64_t>(y) * w;
      for (int i = 0; i < w + 2 * rx; ++i) padded[i] = static_cast<float>(row[reflect(i - rx, w)]);
      float* __restrict__ out = rows + static_cast<int64_t>(y) * w;
      for (int x = 0; x < w; ++x) out[x] = 0.f;
      for (int i = 0; i < kx; ++i) {
        const float wi = wx[i];
        const float* __restrict__ in = padded + i;
        for (int x = 0; x < w; ++x) out[x] = fma_rn(wi, in[x], out[x]);
      }
    }
    uint8_t* d = dst + c * hw;
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) acc[x] = 0.f;
      for (int j = 0; j < ky; ++j) {
        const float wj = wy[j];
        const float* __restrict__ in = rows + static_cast<int64_t>(reflect(y + j - ry, h)) * w;
        for (int x = 0; x < w; ++x) acc[x] = fma_rn(wj, in[x], acc[x]);
      }
      uint8_t* __restrict__ out = d + static_cast<int64_t>(y) * w;
      for (int x = 0; x < w; ++x) out[x] = blur_round(acc[x]);
    }
  }
}

// sharpen() over x in [x0, x1) of one row (up, mid, down: the rows around it).
FL_SAMPLE void sharpen_row(const uint8_t* __restrict__ up, const uint8_t* __restrict__ mid,
                           const uint8_t* __restrict__ down, uint8_t* __restrict__ out, int x0, int x1, float om) {
  for (int x = x0; x < x1; ++x) {
    const int sum = up[x - 1] + up[x] + up[x + 1] + mid[x - 1] + 5 * mid[x] + mid[x + 1] + down[x - 1] + down[x] +
                    down[x + 1];
    // sharpen()'s (sum + 6) / 13 as a multiply and shift, which vectorise (equal for sum <= 13 * 255)
    const int smooth = ((sum + 6) * 5042) >> 16;
    out[x] = clamp_trunc_u8(fma_rn(static_cast<float>(smooth - mid[x]), om, static_cast<float>(mid[x])));
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_FMA_BUILD 1
// The row's interior 16 pixels a step: the 3x3 sums in 16-bit lanes (at most 13 * 255), (sum + 6) * 5042 >> 16 as
// mulhi, then per pixel sharpen()'s one fma, clamp and truncation in float lanes: the scalar code's bits.
__attribute__((target("avx2"), always_inline)) inline __m256i load16_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

__attribute__((target("avx2,fma"))) void sharpen_row_avx2(const uint8_t* up, const uint8_t* mid, const uint8_t* down,
                                                           uint8_t* out, int w, float om) {
  const __m256 omv = _mm256_set1_ps(om), zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.f);
  const __m256i six = _mm256_set1_epi16(6), magic = _mm256_set1_epi16(5042);
  int x = 1;
  for (; x + 16 <= w - 1; x += 16) {
    const __m256i centre = load16_u8(mid + x);
    __m256i sum = _mm256_add_epi16(_mm256_add_epi16(load16_u8(up + x - 1), load16_u8(up + x)), load16_u8(up + x + 1));
    sum = _mm256_add_epi16(sum, _mm256_add_epi16(load16_u8(mid + x - 1), load16_u8(mid + x + 1)));
    sum = _mm256_add_epi16(sum, _mm256_add_epi16(_mm256_add_epi16(load16_u8(down + x - 1), load16_u8(down + x)),
                                                 load16_u8(down + x + 1)));
    sum = _mm256_add_epi16(sum, _mm256_add_epi16(centre, _mm256_slli_epi16(centre, 2)));
    const __m256i diff = _mm256_sub_epi16(_mm256_mulhi_epu16(_mm256_add_epi16(sum, six), magic), centre);
    __m256i half[2];
    for (int k = 0; k < 2; ++k) {
      const __m128i d = k ? _mm256_extracti128_si256(diff, 1) : _mm256_castsi256_si128(diff);
      const __m128i c = k ? _mm256_extracti128_si256(centre, 1) : _mm256_castsi256_si128(centre);
      const __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(d)), omv,
                                       _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(c)));
      // clamp_trunc_u8: max/min return the bound for a NaN, as its comparisons do (then 0)
      half[k] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, zero), top));
    }
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(half[0], half[1]), 0xD8);
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(words, words), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x), _mm256_castsi256_si128(bytes));
  }
  sharpen_row(up, mid, down, out, x, w - 1, om);
}
#endif

template <bool avx2>
FL_SAMPLE void sharpness(float om, const uint8_t* src, uint8_t* dst, int h, int w) {
  const int64_t hw = static_cast<int64_t>(h) * w;
  std::memcpy(dst, src, 3 * hw);  // borders (and images of side <= 2) stay as they are
  if (h <= 2 || w <= 2) return;
  for (int c = 0; c < 3; ++c) {
    const uint8_t* s = src + c * hw;
    uint8_t* d = dst + c * hw;
    for (int y = 1; y < h - 1; ++y) {
      const uint8_t *up = s + (y - 1) * w, *mid = s + y * w, *down = s + (y + 1) * w;
#if FL_FMA_BUILD
      if constexpr (avx2) {
        sharpen_row_avx2(up, mid, down, d + y * w, w, om);
        continue;
      }
#endif
      sharpen_row(up, mid, down, d + y * w, 1, w - 1, om);
    }
  }
}

// augment::hue on whole planes (its branch-free body inlined: the loop vectorises).
FL_SAMPLE void hue_planes(float factor, const uint8_t* __restrict__ r8, const uint8_t* __restrict__ g8,
                          const uint8_t* __restrict__ b8, uint8_t* __restrict__ dst, int64_t hw) {
  uint8_t* __restrict__ dr = dst;
  uint8_t* __restrict__ dg = dst + hw;
  uint8_t* __restrict__ db = dst + 2 * hw;
  for (int64_t k = 0; k < hw; ++k) {
    uint8_t rgb[3];
    hue(r8[k], g8[k], b8[k], factor, rgb);
    dr[k] = rgb[0];
    dg[k] = rgb[1];
    db[k] = rgb[2];
  }
}

// Saturation on whole planes: restrict-qualified (src and dst never overlap: the slots ping-pong between two scratch
// images), so the loop vectorises.
FL_SAMPLE void saturation_planes(float factor, float om, const uint8_t* __restrict__ r, const uint8_t* __restrict__ g,
                                 const uint8_t* __restrict__ b, uint8_t* __restrict__ dst, int64_t hw) {
  uint8_t* __restrict__ dr = dst;
  uint8_t* __restrict__ dg = dst + hw;
  uint8_t* __restrict__ db = dst + 2 * hw;
  for (int64_t i = 0; i < hw; ++i) {
    const float gr = floorf(gray(r[i], g[i], b[i]));
    dr[i] = blend(r[i], gr, factor, om);
    dg[i] = blend(g[i], gr, factor, om);
    db[i] = blend(b[i], gr, factor, om);
  }
}

// Grayscale on whole planes, restrict-qualified as saturation_planes (the loop vectorises).
FL_SAMPLE void grayscale_planes(const uint8_t* __restrict__ r, const uint8_t* __restrict__ g,
                                const uint8_t* __restrict__ b, uint8_t* __restrict__ dst, int64_t hw) {
  uint8_t* __restrict__ dr = dst;
  uint8_t* __restrict__ dg = dst + hw;
  uint8_t* __restrict__ db = dst + 2 * hw;
  for (int64_t i = 0; i < hw; ++i) {
    const uint8_t v = static_cast<uint8_t>(gray(r[i], g[i], b[i]));
    dr[i] = v;
    dg[i] = v;
    db[i] = v;
  }
}

// The value map of a slot whose op maps each channel's values through a table (computed from src's statistics
// where the op needs them): true and the table in `lut`, or false for the other ops.
FL_SAMPLE bool slot_lut(int op, const float* p, const uint8_t* src, int64_t hw, uint8_t (*lut)[256]) {
  const uint8_t *r = src, *g = src + hw, *b = src + 2 * hw;
  switch (op) {
    case kBrightness:
    case kPosterize:
    case kSolarize:
    case kInvert:
      for (int v = 0; v < 256; ++v) {
        const uint8_t u = static_cast<uint8_t>(v);
        lut[0][v] = op == kBrightness ? brightness(u, p[0])
                    : op == kPosterize ? posterize(u, p[0])
                    : op == kSolarize  ? solarize(u, p[0])
                                       : static_cast<uint8_t>(255 - v);
      }
      break;
    case kContrast: {
      int64_t sum = 0;
      for (int64_t start = 0; start < hw; start += 1 << 16) {  // int32 partial sums (at most 255 * 2^16): they vectorise
        const int64_t stop = std::min<int64_t>(hw, start + (1 << 16));
        int32_t part = 0;
        if (p[2] != 0.f) {  // a grey image in three equal channels: torchvision's mean of its one channel
          for (int64_t i = start; i < stop; ++i) part += r[i];
        } else {
          for (int64_t i = start; i < stop; ++i) part += static_cast<int32_t>(floorf(gray(r[i], g[i], b[i])));
        }
        sum += part;
      }
      const float mean = contrast_mean(sum, hw), om = blend_one_minus(p);
      for (int v = 0; v < 256; ++v) lut[0][v] = blend(static_cast<uint8_t>(v), mean, p[0], om);
      break;
    }
    case kAutocontrast:
      for (int c = 0; c < 3; ++c) {
        const uint8_t* s = src + c * hw;
        int lo = 255, hi = 0;
        for (int64_t i = 0; i < hw; ++i) {
          lo = std::min<int>(lo, s[i]);
          hi = std::max<int>(hi, s[i]);
        }
        for (int v = 0; v < 256; ++v) lut[c][v] = autocontrast(static_cast<uint8_t>(v), lo, hi);
      }
      return true;
    case kEqualize:
      for (int c = 0; c < 3; ++c) {
        // Four partial histograms: consecutive equal values would otherwise wait on each other's increment.
        int32_t part[4][256] = {};
        const uint8_t* s = src + c * hw;
        int64_t i = 0;
        for (; i + 4 <= hw; i += 4) {
          ++part[0][s[i]];
          ++part[1][s[i + 1]];
          ++part[2][s[i + 2]];
          ++part[3][s[i + 3]];
        }
        for (; i < hw; ++i) ++part[0][s[i]];
        int32_t hist[256];
        for (int v = 0; v < 256; ++v) hist[v] = part[0][v] + part[1][v] + part[2][v] + part[3][v];
        equalize_lut(hist, lut[c]);
      }
      return true;
    default: return false;
  }
  std::memcpy(lut[1], lut[0], 256);  // the same map for the three channels
  std::memcpy(lut[2], lut[0], 256);
  return true;
}

// One slot of one sample: src -> dst, both 3 planes of h * w.
template <bool avx2>
FL_SAMPLE void apply_slot(int op, const float* p, const uint8_t* src, uint8_t* dst, int h, int w, Scratch& scratch) {
  const int64_t hw = static_cast<int64_t>(h) * w;
  const uint8_t *r = src, *g = src + hw, *b = src + 2 * hw;
  uint8_t lut[3][256];
  if (slot_lut(op, p, src, hw, lut)) return map_planes(src, dst, hw, lut);
  switch (op) {
    case kSaturation: return saturation_planes(p[0], blend_one_minus(p), r, g, b, dst, hw);
    case kHue:
      return hue_planes(p[0], r, g, b, dst, hw);
    case kGrayscale: return grayscale_planes(r, g, b, dst, hw);
    case kSharpness: return sharpness<avx2>(blend_one_minus(p), src, dst, h, w);
    case kGaussianBlur: return blur(p, src, dst, h, w, scratch);
    default: std::memcpy(dst, src, 3 * hw); return;  // identity
  }
}

// A sample's nearest maps, per slot: rows[s * stride] is the row of `mats` that moves slot s's input, or -1.
struct SlotMaps {
  const int64_t* rows;  // null: none
  int64_t stride;
  const float* mats;
  nearest::Fills<uint8_t> fill;
  int64_t at(int64_t s) const { return rows ? rows[s * stride] : -1; }
};

// One sample: its slots in turn through the two scratch images (a slot with a map first gathers its input into
// one), then the output cast into dst.
template <bool avx2, typename out_t>
__attribute__((always_inline)) inline void run_sample(const uint8_t* src, const int64_t* op, const float* p,
                                                      int64_t slots, int h, int w, const out_t (*cast)[256],
                                                      const float* a, const float* bt, bool channels_last,
                                                      out_t* dst, Scratch& scratch, const SlotMaps& maps) {
  const int64_t hw = static_cast<int64_t>(h) * w;
  int64_t last = -1;  // the last slot that changes anything
  for (int64_t s = 0; s < slots; ++s)
    if (op[s] != kIdentity || maps.at(s) >= 0) last = s;
  // A last slot that maps values through a table folds into the output cast: one pass over the planes, not two.
  const out_t(*table)[256] = cast;
  out_t folded[3][256];
  int written = 0;  // ping-pong between the two scratch images; an identity slot writes nothing
  for (int64_t s = 0; s <= last; ++s) {
    if (maps.at(s) >= 0) {
      uint8_t* moved = scratch.image[written++ % 2].data();
      nearest_gather_u8(src, moved, h, w, maps.mats + maps.at(s) * 6, maps.fill, scratch.source, scratch.staged);
      src = moved;
    }
    const int code = static_cast<int>(op[s]);
    if (code == kIdentity) continue;
    uint8_t lut[3][256];
    if (s == last && slot_lut(code, p + s * 3, src, hw, lut)) {
      for (int c = 0; c < 3; ++c)
        for (int v = 0; v < 256; ++v) folded[c][v] = cast[c][lut[c][v]];
      table = folded;
      break;
    }
    uint8_t* next = scratch.image[written++ % 2].data();
    apply_slot<avx2>(code, p + s * 3, src, next, h, w, scratch);
    src = next;
  }
  if (channels_last) {
    for (int64_t j = 0; j < hw; ++j)
      for (int c = 0; c < 3; ++c) dst[j * 3 + c] = table[c][src[c * hw + j]];
  } else if (table != cast) {
    for (int c = 0; c < 3; ++c) {
      const out_t* t = table[c];
      const uint8_t* sc = src + c * hw;
      out_t* dc = dst + c * hw;
      for (int64_t j = 0; j < hw; ++j) dc[j] = t[sc[j]];
    }
  } else if constexpr (std::is_same_v<out_t, float>) {
    // fma_rn per value (the table's own formula): vectorised where FMA is an instruction
    for (int c = 0; c < 3; ++c) {
      const float ac = a[c], bc = bt[c];
      const uint8_t* sc = src + c * hw;
      float* dc = dst + c * hw;
      for (int64_t j = 0; j < hw; ++j) dc[j] = fma_rn(static_cast<float>(sc[j]), ac, bc);
    }
  } else {
    for (int c = 0; c < 3; ++c)
      for (int64_t j = 0; j < hw; ++j) dst[c * hw + j] = cast[c][src[c * hw + j]];
  }
}

// The same code built twice: for any x86-64, and for AVX2 + FMA, where std::fma is one instruction instead of a
// libm call and the pixel loops vectorise. Both compute each value with the same correctly rounded operations
// (contraction stays off in both), so the output bits do not depend on which one runs.
#if FL_FMA_BUILD
template <typename out_t>
__attribute__((target("avx2,fma"))) void run_sample_fma(const uint8_t* src, const int64_t* op, const float* p,
                                                         int64_t slots, int h, int w, const out_t (*cast)[256],
                                                         const float* a, const float* bt, bool channels_last,
                                                         out_t* dst, Scratch& scratch, const SlotMaps& maps) {
  run_sample<true>(src, op, p, slots, h, w, cast, a, bt, channels_last, dst, scratch, maps);
}
#endif

template <typename out_t>
void run_sample_base(const uint8_t* src, const int64_t* op, const float* p, int64_t slots, int h, int w,
                     const out_t (*cast)[256], const float* a, const float* bt, bool channels_last, out_t* dst,
                     Scratch& scratch, const SlotMaps& maps) {
  run_sample<false>(src, op, p, slots, h, w, cast, a, bt, channels_last, dst, scratch, maps);
}

bool cpu_has_fma() {
#if FL_FMA_BUILD
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes && !baseline_build_requested();
#else
  return false;
#endif
}

// moved_as: [max(S, 1) * B], entry s * B + i: the row of mats that moves sample i's slot-s input, or -1 (empty:
// no maps). With S = 0 (the cast alone) a "slot 0" map moves the sample before the cast.
template <typename out_t>
void photometric_cpu_impl(const at::Tensor& x, const at::Tensor& ops, const at::Tensor& params,
                          const at::Tensor& alpha, const at::Tensor& beta, at::Tensor& out,
                          const std::vector<int64_t>& moved_as, const float* mats,
                          const nearest::Fills<uint8_t>& fill) {
  const int64_t batch = x.size(0), slots = ops.size(1);
  const int h = static_cast<int>(x.size(2)), w = static_cast<int>(x.size(3));
  const int64_t hw = static_cast<int64_t>(h) * w;
  const uint8_t* in = x.data_ptr<uint8_t>();
  const int64_t* op = ops.data_ptr<int64_t>();
  const float* p = params.data_ptr<float>();
  const float a[3] = {alpha.data_ptr<float>()[0], alpha.data_ptr<float>()[1], alpha.data_ptr<float>()[2]};
  const float bt[3] = {beta.data_ptr<float>()[0], beta.data_ptr<float>()[1], beta.data_ptr<float>()[2]};
  out_t* o = out.data_ptr<out_t>();
  const bool channels_last = out.stride(1) == 1;
  // The cast of a uint8 value depends on (channel, value) alone: 3 x 256 entries computed once (the fma per value
  // is a libm call on baseline x86-64, which has no FMA instruction).
  out_t cast[3][256];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) cast[c][v] = cast_out<out_t>(static_cast<uint8_t>(v), a[c], bt[c]);
  auto* run = &run_sample_base<out_t>;
#if FL_FMA_BUILD
  if (cpu_has_fma()) run = &run_sample_fma<out_t>;
#endif
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch scratch;
    for (auto& image : scratch.image) image.resize(3 * hw);
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* sample = in + i * 3 * hw;
      const SlotMaps maps{moved_as.empty() ? nullptr : moved_as.data() + i, batch, mats, fill};
      if (slots == 0 && maps.at(0) >= 0) {  // the cast alone, of the moved sample
        scratch.moved.resize(3 * hw);
        nearest_gather_u8(sample, scratch.moved.data(), h, w, mats + maps.at(0) * 6, fill, scratch.source,
                          scratch.staged);
        sample = scratch.moved.data();
      }
      run(sample, op + i * slots, p + i * slots * 3, slots, h, w, cast, a, bt, channels_last, o + i * 3 * hw,
          scratch, maps);
    }
  });
}

at::Tensor photometric_cpu(const at::Tensor& x, const at::Tensor& ops, const at::Tensor& params,
                           const at::Tensor& alpha, const at::Tensor& beta, at::ScalarType out_dtype,
                           bool channels_last, const std::optional<at::Tensor>& samples,
                           const std::optional<at::Tensor>& matrices, c10::ArrayRef<double> fill_arg,
                           at::IntArrayRef map_slots) {
  StayIfExiting stay;  // a producer's stage may still run at interpreter exit (exit_guard.h)
  at::Tensor out = prepare_photometric_output(x, ops, params, alpha, beta, out_dtype, channels_last);
  const auto fill = nearest::typed<uint8_t>(make_fill(fill_arg, 3, "photometric"));
  check_photometric_maps(x, samples, matrices);
  check_table(ops, params, static_cast<int>(x.size(2)), static_cast<int>(x.size(3)));
  const int64_t listed = samples ? samples->size(0) : 0, batch = x.size(0);
  const std::vector<int64_t> slot_of = photometric_map_slots(map_slots, listed, ops.size(1));
  if (out.numel() == 0) return out;
  std::vector<int64_t> moved_as;  // [slot * B + sample]: its row in matrices, or -1
  const float* mats = nullptr;
  if (listed > 0) {
    const int64_t* index = samples->data_ptr<int64_t>();
    for (int64_t first = 0, k = 0; k <= listed; ++k) {  // each slot's entries: distinct samples of the batch
      if (k < listed && slot_of[k] == slot_of[first]) continue;
      check_sample_list(samples->narrow(0, first, k - first), batch, "photometric");
      first = k;
    }
    moved_as.assign(std::max<int64_t>(ops.size(1), 1) * batch, -1);
    for (int64_t k = 0; k < listed; ++k) moved_as[slot_of[k] * batch + index[k]] = k;
    mats = matrices->data_ptr<float>();
  }
  switch (out_dtype) {
    case at::kFloat: photometric_cpu_impl<float>(x, ops, params, alpha, beta, out, moved_as, mats, fill); break;
    case at::kHalf: photometric_cpu_impl<c10::Half>(x, ops, params, alpha, beta, out, moved_as, mats, fill); break;
    case at::kBFloat16:
      photometric_cpu_impl<c10::BFloat16>(x, ops, params, alpha, beta, out, moved_as, mats, fill);
      break;
    default: photometric_cpu_impl<uint8_t>(x, ops, params, alpha, beta, out, moved_as, mats, fill); break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastload, m) {
  m.def(
      "photometric(Tensor x, Tensor ops, Tensor params, Tensor alpha, Tensor beta, ScalarType out_dtype, "
      "bool channels_last, Tensor? samples=None, Tensor? matrices=None, float[] fill=[0.], int[] map_slots=[]) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastload, CPU, m) { m.impl("photometric", &photometric_cpu); }
// Not differentiable: a backward through it raises (autograd's default fallback would give no gradient and
// only warn).
TORCH_LIBRARY_IMPL(fastload, Autograd, m) { m.impl("photometric", torch::autograd::autogradNotImplementedFallback()); }

}  // namespace fastload
