// CPU twin of the affine/normalise stage, and the op's schema. Same maths as the CUDA kernel (warp.h);
// axis-aligned matrices (every crop/resize/flip the loader makes) take a separable two-pass path that
// computes the identical weighted sum in far fewer operations.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "check.h"
#include <cstdint>

#include "cpu_build.h"
#include "warp.h"
#include "warp_op.h"
#include "exit_guard.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#include <immintrin.h>
#define FL_SSE2 1
#endif

namespace fastload {

at::Tensor recycled_cpu_output(at::IntArrayRef sizes, const at::TensorOptions& options, bool channels_last);

Fill make_fill(c10::ArrayRef<double> fill, int64_t channels, const char* op) {
  const int64_t n = static_cast<int64_t>(fill.size());
  FL_CHECK(n == 1 || (n >= 1 && n == channels && n <= kMaxChannels),
           "%s: fill must have 1 value or one per channel (at most %d), got %lld for %lld channels", op,
           kMaxChannels, static_cast<long long>(n), static_cast<long long>(channels));
  Fill out;
  for (int c = 0; c < kMaxChannels; ++c) out.v[c] = static_cast<float>(fill[n == 1 || c >= n ? 0 : c]);
  return out;
}

at::Tensor prepare_warp_output(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                               const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta,
                               int64_t channels, int64_t out_h, int64_t out_w, at::ScalarType out_dtype,
                               bool channels_last) {
  TORCH_CHECK(data.dim() == 1 && data.is_contiguous(), "warp_normalize: data must be a contiguous 1-D tensor");
  FL_CHECK(data.scalar_type() == at::kByte || data.scalar_type() == at::kFloat,
           "warp_normalize: data must be uint8 or float32, got %s", c10::toString(data.scalar_type()));
  const int64_t batch = offsets.numel();
  TORCH_CHECK(offsets.dim() == 1 && offsets.scalar_type() == at::kLong && offsets.is_contiguous(),
              "warp_normalize: offsets must be a contiguous int64 [B] tensor");
  TORCH_CHECK(shapes.dim() == 2 && shapes.size(0) == batch && shapes.size(1) == 3 &&
                  shapes.scalar_type() == at::kLong && shapes.is_contiguous(),
              "warp_normalize: shapes must be a contiguous int64 [B, 3] tensor (h, w, c)");
  TORCH_CHECK(matrices.dim() == 3 && matrices.size(0) == batch && matrices.size(1) == 2 &&
                  (matrices.size(2) == 3 || matrices.size(2) == 5) && matrices.scalar_type() == at::kFloat &&
                  matrices.is_contiguous(),
              "warp_normalize: matrices must be a contiguous float32 [B, 2, 3] tensor, or [B, 2, 5] with each row's "
              "visible interval (warp.h)");
  FL_CHECK(channels >= 1 && channels <= kMaxChannels, "warp_normalize: 1 to %d channels supported, got %lld",
           kMaxChannels, static_cast<long long>(channels));
  TORCH_CHECK(alpha.numel() == channels && beta.numel() == channels && alpha.scalar_type() == at::kFloat &&
                  beta.scalar_type() == at::kFloat && alpha.is_contiguous() && beta.is_contiguous(),
              "warp_normalize: alpha and beta must be contiguous float32 [C] tensors");
  // The kernels index a sample's output with int: its C*H*W values must stay below 2^31.
  FL_CHECK(out_h > 0 && out_w > 0 && out_h <= INT32_MAX / out_w && out_h * out_w <= INT32_MAX / channels,
           "warp_normalize: output size %lld x %lld x %lld channels must be positive, with fewer than 2^31 values "
           "a sample", static_cast<long long>(out_h), static_cast<long long>(out_w), static_cast<long long>(channels));
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16 ||
                  out_dtype == at::kByte,
              "warp_normalize: out_dtype must be float32, float16, bfloat16 or uint8");
  for (const at::Tensor* t : {&offsets, &shapes, &matrices, &alpha, &beta})
    FL_CHECK(t->device() == data.device(), "warp_normalize: all tensors must be on the device of data");
  auto options = data.options().dtype(out_dtype);
  if (data.device().is_cpu()) return recycled_cpu_output({batch, channels, out_h, out_w}, options, channels_last);
  if (channels_last) options = options.memory_format(at::MemoryFormat::ChannelsLast);
  return at::empty({batch, channels, out_h, out_w}, options);
}

namespace {

// Large CPU batches (a 256x3x224x224 float32 batch is 154 MB) come from fresh mmap'd pages each time under
// glibc, and first-touch page faults then cost as much as the warp itself. Blocks come back here when the
// user's tensor dies and are reused; the pool keeps at most kPoolBytes.
class HostPool {
 public:
  static HostPool& get() {
    static HostPool* pool = new HostPool();  // never destroyed: tensors may die after static destructors
    return *pool;
  }
  void* take(size_t bytes, size_t* capacity) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].second >= bytes && free_[i].second <= bytes + bytes / 4) {
          void* p = free_[i].first;
          *capacity = free_[i].second;
          pooled_ -= free_[i].second;
          free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
          return p;
        }
      }
    }
    void* p = nullptr;
    FL_CHECK(posix_memalign(&p, 2 << 20, bytes) == 0, "warp_normalize: out of memory (%zu bytes)", bytes);
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);  // best effort: fewer page faults on first touch
#endif
    *capacity = bytes;
    return p;
  }
  // Pools p. At the limit the oldest blocks make room (after a size change they are the old size's, which no
  // request fits any more); the newest is kept.
  void give(void* p, size_t capacity) {
    if (capacity > kPoolBytes) {  // never pooled: it would only empty the pool
      std::free(p);
      return;
    }
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (!free_.empty() && pooled_ + capacity > kPoolBytes) {
        evicted.push_back(free_.front().first);
        pooled_ -= free_.front().second;
        free_.erase(free_.begin());
      }
      if (pooled_ + capacity > kPoolBytes) {
        evicted.push_back(p);
      } else {
        pooled_ += capacity;
        free_.emplace_back(p, capacity);
      }
    }
    for (void* q : evicted) std::free(q);
  }
  // Frees every pooled block (FastLoader.close(): the host memory goes back at once); returns their bytes. Blocks
  // in use stay theirs.
  size_t release() {
    std::vector<std::pair<void*, size_t>> all;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      all.swap(free_);
      bytes = pooled_;
      pooled_ = 0;
    }
    for (auto& block : all) std::free(block.first);
    return bytes;
  }

 private:
  static constexpr size_t kPoolBytes = size_t(1) << 30;
  std::mutex mutex_;
  std::vector<std::pair<void*, size_t>> free_;
  size_t pooled_ = 0;
};

}  // namespace

size_t release_cpu_outputs() { return HostPool::get().release(); }

at::Tensor recycled_cpu_output(at::IntArrayRef sizes, const at::TensorOptions& options, bool channels_last) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(options.dtype().toScalarType());
  if (bytes < (size_t(4) << 20)) {  // small: torch's allocator is fine
    auto o = channels_last ? options.memory_format(at::MemoryFormat::ChannelsLast) : options;
    return at::empty(sizes, o);
  }
  size_t capacity = 0;
  void* p = HostPool::get().take(bytes, &capacity);
  std::vector<int64_t> strides(sizes.size());
  if (channels_last) {  // N, C, H, W sizes with NHWC memory
    strides = {sizes[1] * sizes[2] * sizes[3], 1, sizes[3] * sizes[1], sizes[1]};
  } else {
    int64_t stride = 1;
    for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
      strides[i] = stride;
      stride *= sizes[i];
    }
  }
  return at::from_blob(p, sizes, strides, [capacity](void* q) { HostPool::get().give(q, capacity); },
                       options.memory_format(c10::nullopt));
}

namespace {

struct Strides {
  int64_t c, y, x;
};

template <typename in_t>
struct Image {
  const in_t* p;
  int h, w, c;
  Strides s;
};

// The general path's functions are inlined into both builds of warp_general (below), each compiled for its ISA.
#define FL_SAMPLE __attribute__((always_inline)) inline

// Taps and normalised weights of one output coordinate along one axis.
struct AxisSample {
  int lo = 0, hi = 0;  // hi == lo means "outside": fill
  int first_weight = 0;
};

// Precomputes taps and normalised weights for each output column or row of an axis-aligned warp; a position whose
// centre maps outside the visible interval [lo_edge, hi_edge] is fill.
void axis_weights(float scale, float offset, int out_size, int in_size, float lo_edge, float hi_edge,
                  std::vector<AxisSample>& samples, std::vector<float>& weights) {
  const float support = scale < 0 ? (-scale > 1.f ? -scale : 1.f) : (scale > 1.f ? scale : 1.f);
  samples.resize(out_size);
  weights.clear();
  for (int i = 0; i < out_size; ++i) {
    const float centre = scale * i + offset + 0.5f;
    AxisSample& s = samples[i];
    s.first_weight = static_cast<int>(weights.size());
    if (!visible_at(centre, lo_edge, hi_edge)) {
      s.lo = s.hi = 0;
      continue;
    }
    filter_taps(centre, support, in_size, &s.lo, &s.hi);
    float total = 0.f;
    for (int j = s.lo; j < s.hi; ++j) {
      const float w = triangle((j + 0.5f - centre) / support);
      weights.push_back(w);
      total += w;
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    for (int j = s.first_weight; j < static_cast<int>(weights.size()); ++j) weights[j] *= inv;
  }
}

// acc[i] += w * src[i]: the vertical pass's whole inner loop, contiguous, so it vectorises; built for AVX2
// as well as the baseline ISA, picked at load time (a wheel must not assume AVX2).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FL_SIMD_CLONES
#endif
FL_SIMD_CLONES void axpy(float* __restrict__ acc, const uint8_t* __restrict__ src, float w, int n) {
  for (int i = 0; i < n; ++i) acc[i] += w * static_cast<float>(src[i]);
}
FL_SIMD_CLONES void axpy(float* __restrict__ acc, const float* __restrict__ src, float w, int n) {
  for (int i = 0; i < n; ++i) acc[i] += w * src[i];
}
// A row's first tap: what axpy gives on a zeroed row (0.f + x, not x: -0.0 becomes +0.0 as it did), without a pass
// to zero the row first (that memset was 3% of a batch's CPU time on the plain pipeline).
FL_SIMD_CLONES void first_axpy(float* __restrict__ acc, const uint8_t* __restrict__ src, float w, int n) {
  for (int i = 0; i < n; ++i) acc[i] = 0.f + w * static_cast<float>(src[i]);
}
FL_SIMD_CLONES void first_axpy(float* __restrict__ acc, const float* __restrict__ src, float w, int n) {
  for (int i = 0; i < n; ++i) acc[i] = 0.f + w * src[i];
}

#if FL_SSE2
// One RGB pixel's three sums in lanes 0-2 of an SSE register (lane 3 carries a neighbour's value, unused): each
// lane performs the scalar code's multiply and add, rounded as it rounds them, so the bits are the same.

// Lanes 0-2: the uint8 values p[0..2] as floats (lane 3: p[3]; the caller makes sure that byte exists).
inline __m128 rgbx_u8(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  const __m128i z = _mm_setzero_si128();
  return _mm_cvtepi32_ps(_mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(v), z), z));
}

// Stores v * alpha + beta of lanes 0-2 (channels 0-2) as horizontal_rgb and store_pixel compute them (pass sum * inv
// for the latter's (acc * inv) * alpha + beta); for uint8 the clamp and round in lanes too (max/min give the
// ternaries' results, NaN included: 0 either way). The lanes leave the register through shuffles and packs rather
// than a 16-byte store read back lane by lane (a store-to-load forwarding hazard; measured gain small, ~5%).
template <typename out_t>
inline void store_rgb(out_t* o, int64_t os_c, __m128 v, const float* alpha, const float* beta) {
  const __m128 a = _mm_setr_ps(alpha[0], alpha[1], alpha[2], 0.f), b = _mm_setr_ps(beta[0], beta[1], beta[2], 0.f);
  v = _mm_add_ps(_mm_mul_ps(v, a), b);
  if constexpr (std::is_same_v<out_t, uint8_t>) {
    v = _mm_min_ps(_mm_max_ps(v, _mm_setzero_ps()), _mm_set1_ps(255.f));
    const __m128i q = _mm_cvttps_epi32(_mm_add_ps(v, _mm_set1_ps(0.5f)));  // 0..255: the packs do not saturate
    const __m128i q16 = _mm_packs_epi32(q, q);
    const uint32_t bytes = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(q16, q16)));
    o[0] = static_cast<uint8_t>(bytes);
    o[os_c] = static_cast<uint8_t>(bytes >> 8);
    o[2 * os_c] = static_cast<uint8_t>(bytes >> 16);
  } else {
    o[0] = OutCast<out_t>::apply(_mm_cvtss_f32(v));
    o[os_c] = OutCast<out_t>::apply(_mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)));
    o[2 * os_c] = OutCast<out_t>::apply(_mm_cvtss_f32(_mm_shuffle_ps(v, v, 2)));
  }
}
#endif

#if FL_SSE2
// One output pixel's K taps of an accumulated RGB row, its three sums in lanes 0-2 (reads a[3 * K]: the accumulator
// row has one float of padding). Shared by horizontal_rgb and horizontal_row_avx2, so both builds sum alike.
template <int K>
inline __m128 rgb_taps(const float* a, const float* wu) {
  __m128 sum = _mm_setzero_ps();
#pragma GCC unroll 8
  for (int k = 0; k < K; ++k) sum = _mm_add_ps(sum, _mm_mul_ps(_mm_set1_ps(wu[k]), _mm_loadu_ps(a + 3 * k)));
  return sum;
}
#endif

// Horizontal pass of one RGB row with exactly K taps per output pixel (weights zero-padded): a loop the compiler
// unrolls completely, without the data-dependent trip count that costs a branch miss per pixel.
template <int K, typename out_t>
void horizontal_rgb(const float* acc, const int* lo, const float* w, int out_w, const float* alpha, const float* beta,
                    out_t* row_out, const Strides& os) {
  for (int u = 0; u < out_w; ++u) {
    const float* a = acc + lo[u] * 3;
    const float* wu = w + u * K;
    out_t* o = row_out + u * os.x;
#if FL_SSE2
    store_rgb(o, os.c, rgb_taps<K>(a, wu), alpha, beta);
#else
    float r = 0.f, g = 0.f, b = 0.f;
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) {
      r += wu[k] * a[3 * k];
      g += wu[k] * a[3 * k + 1];
      b += wu[k] * a[3 * k + 2];
    }
    o[0] = OutCast<out_t>::apply(r * alpha[0] + beta[0]);
    o[os.c] = OutCast<out_t>::apply(g * alpha[1] + beta[1]);
    o[2 * os.c] = OutCast<out_t>::apply(b * alpha[2] + beta[2]);
#endif
  }
}

#if FL_SSE2 && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_AVX2_ROWS 1
// The AVX2 build's horizontal pass (planar output, uint8 or float32): two pixels per register, pixel u in the low
// half and u + 1 in the high one, each half rgb_taps' operations on its pixel (the same bits as horizontal_rgb);
// eight pixels are then finished together: store_rgb's operations in every lane (v * alpha + beta; for uint8 the
// clamp, + 0.5 and truncation), channels regrouped in registers and written as 8-value runs per plane. Per pixel,
// store_rgb's conversions and three scattered stores were about half of the pass's time, and the 4-lane taps a
// quarter idle (bench/RESULTS.md, "CPU kernels, one thread"). tests/test_cpu_fastpaths.py compares it with the
// baseline build.

// pair_weights[(p * K + k) * 8 + 0..3] = w[2p][k], [.. + 4..7] = w[2p + 1][k]: each tap's weights for a pair of
// pixels, as one register.
void pair_weights(const float* w, int out_w, int K, std::vector<float>* pairs) {
  pairs->resize(static_cast<size_t>(out_w / 2) * K * 8);
  float* p = pairs->data();
  for (int u = 0; u + 1 < out_w; u += 2)
    for (int k = 0; k < K; ++k, p += 8)
      for (int i = 0; i < 4; ++i) p[i] = w[u * K + k], p[4 + i] = w[(u + 1) * K + k];
}

template <int K>
__attribute__((target("avx2"))) inline __m256 rgb_taps_pair(const float* a0, const float* a1, const float* wp) {
  __m256 sum = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int k = 0; k < K; ++k)
    sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_loadu_ps(wp + 8 * k), _mm256_loadu2_m128(a1 + 3 * k, a0 + 3 * k)));
  return sum;
}

template <int K, typename out_t>
__attribute__((target("avx2"))) void horizontal_row_avx2(const float* acc, const int* lo, const float* w,
                                                         const float* wp, int out_w, const float* alpha,
                                                         const float* beta, out_t* o, int64_t os_c) {
  const __m256 a = _mm256_setr_ps(alpha[0], alpha[1], alpha[2], 0.f, alpha[0], alpha[1], alpha[2], 0.f);
  const __m256 b = _mm256_setr_ps(beta[0], beta[1], beta[2], 0.f, beta[0], beta[1], beta[2], 0.f);
  int u = 0;
  for (; u + 8 <= out_w; u += 8) {
    __m256 v[4];  // v[j]: pixels u + 2j (low half) and u + 2j + 1 (high half), each R, G, B, unused
    for (int j = 0; j < 4; ++j) {
      const int p = u + 2 * j;
      const float* pair_w = wp + static_cast<size_t>(p / 2) * K * 8;
      const __m256 sums = rgb_taps_pair<K>(acc + lo[p] * 3, acc + lo[p + 1] * 3, pair_w);
      v[j] = _mm256_add_ps(_mm256_mul_ps(sums, a), b);
    }
    if constexpr (std::is_same_v<out_t, uint8_t>) {
      __m256i q[4];
      for (int j = 0; j < 4; ++j) {
        const __m256 c = _mm256_min_ps(_mm256_max_ps(v[j], _mm256_setzero_ps()), _mm256_set1_ps(255.f));
        q[j] = _mm256_cvttps_epi32(_mm256_add_ps(c, _mm256_set1_ps(0.5f)));  // 0..255: the packs do not saturate
      }
      // packs/packus work within 128-bit halves: bytes = pixels 0, 2, 4, 6 | 1, 3, 5, 7 (R, G, B, unused each)
      __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      const __m256i by_channel = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                                  0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
      bytes = _mm256_shuffle_epi8(bytes, by_channel);  // R0 R2 R4 R6 G0 G2 G4 G6 B0 .. | R1 R3 R5 R7 G1 ..
      const __m128i even = _mm256_castsi256_si128(bytes), odd = _mm256_extracti128_si256(bytes, 1);
      const __m128i rg = _mm_unpacklo_epi8(even, odd), bx = _mm_unpackhi_epi8(even, odd);  // R0..R7 G0..G7 | B0..B7
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o + u), rg);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o + os_c + u), _mm_unpackhi_epi64(rg, rg));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o + 2 * os_c + u), bx);
    } else {
      // a 4x4 transpose in each half, then the halves' pixels (0, 2, 4, 6 | 1, 3, 5, 7) back in order
      const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
      const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
      const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
      const __m256 r = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), order);
      const __m256 g = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)), order);
      const __m256 bl = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), order);
      _mm256_storeu_ps(o + u, r);
      _mm256_storeu_ps(o + os_c + u, g);
      _mm256_storeu_ps(o + 2 * os_c + u, bl);
    }
  }
  for (; u < out_w; ++u) store_rgb(o + u, os_c, rgb_taps<K>(acc + lo[u] * 3, w + u * K), alpha, beta);
}
#endif

// Vertical pass first (contiguous rows, vectorised), then the horizontal taps on one accumulated row:
// the gather-heavy pass then runs over out_h rows instead of the taller input.
template <typename in_t, typename out_t>
void warp_separable(const Image<in_t>& img, const float* m, const Visible& vis, const float* alpha, const float* beta,
                    const Fill& fill, out_t* out, const Strides& os, int out_h, int out_w, bool avx2_rows) {
  thread_local std::vector<AxisSample> xs, ys;
  thread_local std::vector<float> wx, wy, acc;
  axis_weights(m[0], m[2], out_w, img.w, vis.x0, vis.x1, xs, wx);
  axis_weights(m[4], m[5], out_h, img.h, vis.y0, vis.y1, ys, wy);
  const int C = img.c, W = img.w;
  const bool hwc = img.s.x == C;  // else CHW: one plane per channel
  acc.resize(static_cast<size_t>(W) * C + 1);  // + 1: horizontal_rgb's SSE loads read one float past a pixel
  acc[static_cast<size_t>(W) * C] = 0.f;  // that float, never written by the taps
  // acc holds one filtered row: HWC -> acc[x * C + c]; CHW -> acc[c * W + x].
  const int64_t ax = hwc ? C : 1, ac = hwc ? 1 : W;
  float fill_value[kMaxChannels];
  for (int c = 0; c < C; ++c) fill_value[c] = fill[c] * alpha[c] + beta[c];
  // The loader's case (RGB, HWC): a fixed tap count per row, zero-padded, over the columns [u0, u1) that read the
  // image; the columns outside the window lie at the row's ends (the map is monotone along x) and are fill (a
  // NEAREST policy's moved sample decodes only what its gather reads, so its warp has such columns).
  thread_local std::vector<int> fixed_lo;
  thread_local std::vector<float> fixed_w;
  int K = 0, u0 = 0, u1 = out_w;
  while (u0 < out_w && xs[u0].hi == xs[u0].lo) ++u0;
  while (u1 > u0 && xs[u1 - 1].hi == xs[u1 - 1].lo) --u1;
  bool fixed = C == 3 && hwc && u1 > u0;
  for (int u = u0; u < u1; ++u) {
    fixed = fixed && xs[u].hi > xs[u].lo;
    K = std::max(K, xs[u].hi - xs[u].lo);
  }
  fixed = fixed && K >= 1 && K <= 6 && K <= W;
  if (fixed) {
    fixed_lo.resize(out_w);
    fixed_w.assign(static_cast<size_t>(out_w) * K, 0.f);
    for (int u = u0; u < u1; ++u) {
      const AxisSample& sx = xs[u];
      const int lo = std::min(sx.lo, W - K);  // K taps from lo stay inside the row; weights shift to match
      fixed_lo[u] = lo;
      for (int x = sx.lo; x < sx.hi; ++x) fixed_w[u * K + (x - lo)] = wx[sx.first_weight + (x - sx.lo)];
    }
  }
#if FL_AVX2_ROWS
  thread_local std::vector<float> pairs;  // the columns [u0, u1)'s weights by pairs, for horizontal_row_avx2
  constexpr bool paired_out = std::is_same_v<out_t, uint8_t> || std::is_same_v<out_t, float>;
  if (paired_out && fixed && avx2_rows && os.x == 1)
    pair_weights(fixed_w.data() + static_cast<size_t>(u0) * K, u1 - u0, K, &pairs);
#endif
  for (int v = 0; v < out_h; ++v) {
    const AxisSample& sy = ys[v];
    out_t* row_out = out + v * os.y;
    if (sy.hi == sy.lo) {
      for (int u = 0; u < out_w; ++u)
        for (int c = 0; c < C; ++c) row_out[u * os.x + c * os.c] = OutCast<out_t>::apply(fill_value[c]);
      continue;
    }
    const float* w = wy.data() + sy.first_weight;
    for (int y = sy.lo; y < sy.hi; ++y, ++w) {  // sy.hi > sy.lo here: the first tap writes the whole row
      const bool first = y == sy.lo;
      if (hwc) {
        const in_t* src = img.p + y * img.s.y;
        first ? first_axpy(acc.data(), src, *w, W * C) : axpy(acc.data(), src, *w, W * C);
      } else {
        for (int c = 0; c < C; ++c) {
          const in_t* src = img.p + c * img.s.c + y * img.s.y;
          first ? first_axpy(acc.data() + c * W, src, *w, W) : axpy(acc.data() + c * W, src, *w, W);
        }
      }
    }
    if (fixed) {
      for (const auto& [from, to] : {std::pair<int, int>{0, u0}, std::pair<int, int>{u1, out_w}})  // fill columns
        for (int u = from; u < to; ++u)
          for (int c = 0; c < C; ++c) row_out[u * os.x + c * os.c] = OutCast<out_t>::apply(fill_value[c]);
      const int* lo = fixed_lo.data() + u0;
      const float* fw = fixed_w.data() + static_cast<size_t>(u0) * K;
      const int n = u1 - u0;
      out_t* run = row_out + u0 * os.x;
#if FL_AVX2_ROWS
      if constexpr (paired_out) {
        if (avx2_rows && os.x == 1) {
          switch (K) {
            case 1: horizontal_row_avx2<1>(acc.data(), lo, fw, pairs.data(), n, alpha, beta, run, os.c); break;
            case 2: horizontal_row_avx2<2>(acc.data(), lo, fw, pairs.data(), n, alpha, beta, run, os.c); break;
            case 3: horizontal_row_avx2<3>(acc.data(), lo, fw, pairs.data(), n, alpha, beta, run, os.c); break;
            case 4: horizontal_row_avx2<4>(acc.data(), lo, fw, pairs.data(), n, alpha, beta, run, os.c); break;
            case 5: horizontal_row_avx2<5>(acc.data(), lo, fw, pairs.data(), n, alpha, beta, run, os.c); break;
            default: horizontal_row_avx2<6>(acc.data(), lo, fw, pairs.data(), n, alpha, beta, run, os.c); break;
          }
          continue;
        }
      }
#else
      (void)avx2_rows;
#endif
      switch (K) {
        case 1: horizontal_rgb<1>(acc.data(), lo, fw, n, alpha, beta, run, os); break;
        case 2: horizontal_rgb<2>(acc.data(), lo, fw, n, alpha, beta, run, os); break;
        case 3: horizontal_rgb<3>(acc.data(), lo, fw, n, alpha, beta, run, os); break;
        case 4: horizontal_rgb<4>(acc.data(), lo, fw, n, alpha, beta, run, os); break;
        case 5: horizontal_rgb<5>(acc.data(), lo, fw, n, alpha, beta, run, os); break;
        default: horizontal_rgb<6>(acc.data(), lo, fw, n, alpha, beta, run, os); break;
      }
      continue;
    }
    for (int u = 0; u < out_w; ++u) {
      const AxisSample& sx = xs[u];
      out_t* o = row_out + u * os.x;
      if (sx.hi == sx.lo) {
        for (int c = 0; c < C; ++c) o[c * os.c] = OutCast<out_t>::apply(fill_value[c]);
        continue;
      }
      const float* wxp = wx.data() + sx.first_weight;
      if (C == 3 && hwc) {  // the loader's case, unrolled over channels
        float r = 0.f, g = 0.f, b = 0.f;
        const float* a = acc.data() + sx.lo * 3;
        for (int k = 0, n = sx.hi - sx.lo; k < n; ++k, a += 3) {
          r += wxp[k] * a[0];
          g += wxp[k] * a[1];
          b += wxp[k] * a[2];
        }
        o[0] = OutCast<out_t>::apply(r * alpha[0] + beta[0]);
        o[os.c] = OutCast<out_t>::apply(g * alpha[1] + beta[1]);
        o[2 * os.c] = OutCast<out_t>::apply(b * alpha[2] + beta[2]);
        continue;
      }
      for (int c = 0; c < C; ++c) {
        float sum = 0.f;
        for (int x = sx.lo; x < sx.hi; ++x) sum += wxp[x - sx.lo] * acc[x * ax + c * ac];
        o[c * os.c] = OutCast<out_t>::apply(sum * alpha[c] + beta[c]);
      }
    }
  }
}

// Taps and weights of one output pixel along one axis for the general path: weight k is that of input index
// start + k, k < K. The taps [lo, hi) are warp.h's; K is fixed per sample, start pulled back so that all K stay in
// the image, and the padded taps weigh exactly 0 (so for uint8 input they add +0 to a sum >= +0: no change).
struct GeneralAxis {
  int start, K;
  bool fits;  // hi - lo <= K; else the pixel takes warp.h's loop
};

// weights[k] = triangle((start + k + 0.5 - centre) / support) inside [lo, hi), 0 outside; returns their sum in
// index order, the same float operations as warp_pixel_general's total_x / total_y loops.
FL_SAMPLE float general_weights(float centre, float support, int size, int K, float* weights, GeneralAxis* axis) {
  int lo, hi;
  filter_taps(centre, support, size, &lo, &hi);
  axis->K = K;
  axis->fits = hi - lo <= K;
  axis->start = std::max(0, std::min(lo, size - K));
  int k = 0;
#if FL_SSE2  // four weights at once, each lane the scalar loop's operations
  const __m128 c = _mm_set1_ps(centre), s = _mm_set1_ps(support), half = _mm_set1_ps(0.5f), one = _mm_set1_ps(1.f);
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  const __m128i lo4 = _mm_set1_epi32(lo - 1), hi4 = _mm_set1_epi32(hi);
  for (; k < K; k += 4) {  // up to 3 weights past K written: the caller's buffer has room
    const __m128i i = _mm_add_epi32(_mm_set1_epi32(axis->start + k), _mm_setr_epi32(0, 1, 2, 3));
    const __m128 x = _mm_and_ps(_mm_div_ps(_mm_sub_ps(_mm_add_ps(_mm_cvtepi32_ps(i), half), c), s), abs_mask);
    const __m128 tri = _mm_and_ps(_mm_cmplt_ps(x, one), _mm_sub_ps(one, x));
    const __m128i inside = _mm_and_si128(_mm_cmpgt_epi32(i, lo4), _mm_cmplt_epi32(i, hi4));
    _mm_storeu_ps(weights + k, _mm_and_ps(tri, _mm_castsi128_ps(inside)));
  }
#else
  for (; k < K; ++k) {
    const int i = axis->start + k;
    weights[k] = i >= lo && i < hi ? triangle((i + 0.5f - centre) / support) : 0.f;
  }
#endif
  float total = 0.f;
  for (k = 0; k < K; ++k) total += weights[k];
  return total;
}

// Taps per axis of a sample: hi - lo is floor(2 * support) or one more in exact arithmetic (just floor when
// 2 * support is an integer); a pixel that float rounding gives one more tap takes warp.h's loop.
FL_SAMPLE int general_taps(float support, int size) {
  const float twice = 2.f * support;
  if (std::isnan(twice)) return 1;  // a NaN matrix: no taps at all
  if (twice >= static_cast<float>(size)) return std::max(1, size);  // the whole axis (and no int overflow below)
  const int taps = static_cast<int>(std::floor(twice)) + (twice == std::floor(twice) ? 0 : 1);
  return std::max(1, std::min(size, taps));
}

// The general path (rotation, shear): warp_pixel_general's sum, weight for weight and in the same order. The
// loader's case (uint8 RGB, HWC) computes each column weight once per pixel instead of once per tap and pads the
// taps to a count fixed per sample, so the loops have no data-dependent trip count (a branch miss a pixel).
template <typename in_t, typename out_t>
FL_SAMPLE void warp_general(const Image<in_t>& img, const float* m, const Visible& vis, const float* alpha,
                            const float* beta, const Fill& fill, out_t* out, const Strides& os, int out_h, int out_w) {
  const float sx = filter_support(m[0], m[1]), sy = filter_support(m[3], m[4]);
  const InputView<in_t, int64_t> in{img.p, img.h, img.w, img.s.c, img.s.y, img.s.x};
  float fill_value[kMaxChannels] = {};
  for (int c = 0; c < img.c; ++c) fill_value[c] = fill[c] * alpha[c] + beta[c];
  constexpr bool kU8 = std::is_same_v<in_t, uint8_t>;  // padded taps: 0 * p must be +0, not NaN (float inputs)
  if (!kU8 || img.c != 3 || img.s.x != 3) {
    for (int v = 0; v < out_h; ++v)
      for (int u = 0; u < out_w; ++u)
        warp_pixel_general(in, vis, img.c, m, sx, sy, u, v, alpha, beta, fill_value, out + v * os.y + u * os.x, os.c);
    return;
  }
  const int kx = general_taps(sx, img.w), ky = general_taps(sy, img.h);
  // Per output row: first each pixel's taps and weights (a pixel whose centre row equals its left neighbour's,
  // as under a horizontal shear, copies its row weights), then the sums, two pixels at a time so that two
  // dependency chains of adds overlap.
  enum Kind : uint8_t { kFill, kSlow, kScalar, kFast };  // kSlow: warp.h's loop; kScalar: no read past the image
  thread_local std::vector<float> wx, wy, totals;
  thread_local std::vector<const uint8_t*> starts;
  thread_local std::vector<uint8_t> kinds;
  wx.resize(static_cast<size_t>(out_w) * kx + 3);  // + 3: general_weights writes whole groups of four
  wy.resize(static_cast<size_t>(out_w) * ky + 3);
  totals.resize(out_w);
  starts.resize(out_w);
  kinds.resize(out_w);
  const uint8_t* pixels = reinterpret_cast<const uint8_t*>(img.p);
  for (int v = 0; v < out_h; ++v) {
    float last_cy = 0.f;
    GeneralAxis last_ay{0, 0, false};
    float last_total_y = 0.f;
    int last_u = -1;  // the pixel whose row weights last_cy names
    for (int u = 0; u < out_w; ++u) {
      float cx, cy;
      if (!sample_centre(m, u, v, vis, &cx, &cy)) {
        kinds[u] = kFill;
        continue;
      }
      GeneralAxis ax, ay;
      float* wxu = wx.data() + static_cast<size_t>(u) * kx;
      float* wyu = wy.data() + static_cast<size_t>(u) * ky;
      const float total_x = general_weights(cx, sx, img.w, kx, wxu, &ax);
      float total_y;
      if (last_u >= 0 && cy == last_cy) {  // the same centre row: the same weights, bit for bit
        ay = last_ay;
        total_y = last_total_y;
        std::copy_n(wy.data() + static_cast<size_t>(last_u) * ky, ky, wyu);
      } else {
        total_y = general_weights(cy, sy, img.h, ky, wyu, &ay);
        last_cy = cy, last_ay = ay, last_total_y = total_y;
      }
      last_u = u;
      totals[u] = total_x * total_y;
      starts[u] = pixels + static_cast<int64_t>(ay.start) * img.s.y + ax.start * 3;
      // rgbx_u8 reads one byte past each pixel: past the image only at its last pixel
      kinds[u] = !ax.fits || !ay.fits ? kSlow : (ay.start + ky < img.h || ax.start + kx < img.w ? kFast : kScalar);
    }
    out_t* row_out = out + v * os.y;
    for (int u = 0; u < out_w; ++u) {
      out_t* o = row_out + u * os.x;
      const float* wxu = wx.data() + static_cast<size_t>(u) * kx;
      const float* wyu = wy.data() + static_cast<size_t>(u) * ky;
      const float inv = totals[u] > 0.f ? 1.f / totals[u] : 0.f;
      switch (kinds[u]) {
        case kFill:
          for (int c = 0; c < 3; ++c) o[c * os.c] = OutCast<out_t>::apply(fill_value[c]);
          continue;
        case kSlow:  // never expected (general_taps' bound); exact either way
          warp_pixel_general(in, vis, 3, m, sx, sy, u, v, alpha, beta, fill_value, o, os.c);
          continue;
#if FL_SSE2
        case kFast: {
          if (u + 1 < out_w && kinds[u + 1] == kFast) {  // two pixels, two independent sums
            const float* wxv = wxu + kx;
            const float* wyv = wyu + ky;
            const uint8_t *ra = starts[u], *rb = starts[u + 1];
            __m128 sa = _mm_setzero_ps(), sb = _mm_setzero_ps();
            for (int j = 0; j < ky; ++j, ra += img.s.y, rb += img.s.y) {
              const float wya = wyu[j], wyb = wyv[j];
              for (int k = 0; k < kx; ++k) {
                sa = _mm_add_ps(sa, _mm_mul_ps(_mm_set1_ps(wya * wxu[k]), rgbx_u8(ra + 3 * k)));
                sb = _mm_add_ps(sb, _mm_mul_ps(_mm_set1_ps(wyb * wxv[k]), rgbx_u8(rb + 3 * k)));
              }
            }
            store_rgb(o, os.c, _mm_mul_ps(sa, _mm_set1_ps(inv)), alpha, beta);
            ++u;
            store_rgb(row_out + u * os.x, os.c, _mm_mul_ps(sb, _mm_set1_ps(totals[u] > 0.f ? 1.f / totals[u] : 0.f)),
                      alpha, beta);
            continue;
          }
          __m128 sum = _mm_setzero_ps();
          const uint8_t* row = starts[u];
          for (int j = 0; j < ky; ++j, row += img.s.y)
            for (int k = 0; k < kx; ++k)
              sum = _mm_add_ps(sum, _mm_mul_ps(_mm_set1_ps(wyu[j] * wxu[k]), rgbx_u8(row + 3 * k)));
          store_rgb(o, os.c, _mm_mul_ps(sum, _mm_set1_ps(inv)), alpha, beta);
          continue;
        }
#endif
        default: {  // kScalar, and kFast without SSE2
          float r = 0.f, g = 0.f, b = 0.f;
          const uint8_t* row = starts[u];
          for (int j = 0; j < ky; ++j, row += img.s.y) {
            const uint8_t* p = row;
            for (int k = 0; k < kx; ++k, p += 3) {
              const float w = wyu[j] * wxu[k];
              r += w * static_cast<float>(p[0]);
              g += w * static_cast<float>(p[1]);
              b += w * static_cast<float>(p[2]);
            }
          }
          const float acc[3] = {r, g, b};
          store_pixel(o, os.c, acc, inv, alpha, beta, 3);
        }
      }
    }
  }
}

// warp_general built for any x86-64 and for AVX2, picked at run time; the AVX2 build takes the loader's case (uint8
// RGB) eight pixels at a time (warp_general_rgb8_avx2). AVX2 brings no FMA, and GCC contracts nothing without it:
// both builds round every operation alike. (The separable path gains nothing from it: its vertical pass is axpy's
// own AVX2 clone.)
template <typename in_t, typename out_t>
void warp_general_base(const Image<in_t>& img, const float* m, const Visible& vis, const float* alpha,
                       const float* beta, const Fill& fill, out_t* out, const Strides& os, int out_h, int out_w) {
  warp_general(img, m, vis, alpha, beta, fill, out, os, out_h, out_w);
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_AVX2_BUILD 1
#define FL_AVX2 __attribute__((target("avx2"), always_inline)) inline

// The AVX2 build's general path for uint8 RGB HWC: eight output pixels of a row at once, one per lane, each lane
// performing warp_pixel_general's float operations in its order (centre, taps, weights, then acc += (wy * wx) * p
// tap by tap, row-major), so every lane's bits are the scalar code's. Taps are padded to a count fixed per sample
// as in warp_general; a lane's padded taps weigh exactly 0 and add +0 to a sum >= +0.

// Lane i: warp.h's filter_taps for centre[i] and general_weights' padded weights, w[k * 8 + i] for k < K; returns
// each lane's weight sum in tap order. start: first tap's index; fits: hi - lo <= K (else warp.h's loop).
FL_AVX2 __m256 general_weights8(__m256 centre, float support, int size, int K, float* w, __m256i* start,
                                __m256i* fits) {
  const __m256 s = _mm256_set1_ps(support), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.f);
  // As filter_taps: each bound clamped to [0, kTapLimit] as a float before the int cast (max_ps returns its second
  // operand for a NaN first: 0, no taps), then to [0, size] as an int.
  const __m256 zero = _mm256_setzero_ps(), limit = _mm256_set1_ps(kTapLimit);
  const __m256 a = _mm256_floor_ps(_mm256_add_ps(_mm256_sub_ps(centre, s), half));
  const __m256 b = _mm256_floor_ps(_mm256_add_ps(_mm256_add_ps(centre, s), half));
  const __m256i lo = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(a, zero), limit));
  const __m256i hi = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(b, zero), limit)),
                                      _mm256_set1_epi32(size));
  *fits = _mm256_cmpgt_epi32(_mm256_set1_epi32(K + 1), _mm256_sub_epi32(hi, lo));  // wraps as the scalar int does
  *start = _mm256_max_epi32(_mm256_setzero_si256(), _mm256_min_epi32(lo, _mm256_set1_epi32(size - K)));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lo1 = _mm256_sub_epi32(lo, _mm256_set1_epi32(1));
  __m256i i = *start;
  __m256 total = _mm256_setzero_ps();
  for (int k = 0; k < K; ++k, i = _mm256_add_epi32(i, _mm256_set1_epi32(1))) {
    const __m256 x = _mm256_and_ps(_mm256_div_ps(_mm256_sub_ps(_mm256_add_ps(_mm256_cvtepi32_ps(i), half), centre), s),
                                   abs_mask);
    const __m256 tri = _mm256_and_ps(_mm256_cmp_ps(x, one, _CMP_LT_OQ), _mm256_sub_ps(one, x));
    const __m256i inside = _mm256_and_si256(_mm256_cmpgt_epi32(i, lo1), _mm256_cmpgt_epi32(hi, i));
    const __m256 wk = _mm256_and_ps(tri, _mm256_castsi256_ps(inside));
    _mm256_storeu_ps(w + 8 * k, wk);
    total = _mm256_add_ps(total, wk);
  }
  return total;
}

// Lanes of one channel as floats: byte `shift / 8` of each lane's rgbx word.
FL_AVX2 __m256 channel8(__m256i rgbx, int shift) {
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(rgbx, shift), _mm256_set1_epi32(0xff)));
}

// Lane i: the 4 bytes at p + off[i] (rgb and the next byte), by scalar loads: cheaper than vpgatherdd on Zen 3.
FL_AVX2 __m256i load_rgbx8(const uint8_t* p, const int64_t* off) {
  auto word = [&](int i) {
    int32_t v;
    std::memcpy(&v, p + off[i], 4);
    return _mm_cvtsi32_si128(v);
  };
  const __m128i lo = _mm_unpacklo_epi64(_mm_unpacklo_epi32(word(0), word(1)), _mm_unpacklo_epi32(word(2), word(3)));
  const __m128i hi = _mm_unpacklo_epi64(_mm_unpacklo_epi32(word(4), word(5)), _mm_unpacklo_epi32(word(6), word(7)));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// Each lane's sums over its taps, tap by tap in warp_pixel_general's order: acc += (wy[j] * wx[k]) * p.
template <int KX>
FL_AVX2 void accumulate8(const uint8_t* pixels, int64_t row_stride, const int64_t* off, const float* wx,
                         const float* wy, int kx, int ky, __m256* r, __m256* g, __m256* b) {
  const int taps = KX > 0 ? KX : kx;
  __m256 sr = _mm256_setzero_ps(), sg = _mm256_setzero_ps(), sb = _mm256_setzero_ps();
  for (int j = 0; j < ky; ++j, pixels += row_stride) {
    const __m256 wyj = _mm256_loadu_ps(wy + 8 * j);
    for (int k = 0; k < taps; ++k) {
      const __m256 w = _mm256_mul_ps(wyj, _mm256_loadu_ps(wx + 8 * k));
      const __m256i p = load_rgbx8(pixels + 3 * k, off);
      sr = _mm256_add_ps(sr, _mm256_mul_ps(w, channel8(p, 0)));
      sg = _mm256_add_ps(sg, _mm256_mul_ps(w, channel8(p, 8)));
      sb = _mm256_add_ps(sb, _mm256_mul_ps(w, channel8(p, 16)));
    }
  }
  *r = sr, *g = sg, *b = sb;
}

// One row's group of eight pixels between the two passes of warp_general_rgb8_avx2.
struct GroupPlan {
  int inside_bits, fast_bits;  // lanes whose centre lies inside the image / that take the fast sums
  const float* wy;             // y weights, ky * 8
  int64_t off[8];              // byte offset of each lane's first tap (pixel order)
  float inv[8];                // 1 / (total_x * total_y), 0 where the total is 0
};

// One axis's taps of a group (general_weights8's outputs) and the centres they were computed for. Plain arrays: a
// std::vector of __m256 members need not be 32-byte aligned.
struct AxisCache8 {
  bool valid = false;
  int32_t key[8], start[8], fits[8];
  float total[8];
  const float* w = nullptr;  // the weights, K * 8
  // True if the cached taps are those of `centre`, bit for bit; else computes them into `buffer` (then w).
  FL_AVX2 bool update(__m256 centre, float support, int size, int K, float* buffer) {
    const __m256i c = _mm256_castps_si256(centre);
    auto* k = reinterpret_cast<__m256i*>(key);
    if (valid && _mm256_movemask_epi8(_mm256_cmpeq_epi32(c, _mm256_loadu_si256(k))) == -1) return true;
    __m256i st, ft;
    _mm256_storeu_ps(total, general_weights8(centre, support, size, K, buffer, &st, &ft));
    w = buffer;
    _mm256_storeu_si256(k, c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(start), st);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(fits), ft);
    valid = true;
    return false;
  }
  FL_AVX2 __m256i starts() const { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(start)); }
  FL_AVX2 __m256i fit() const { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(fits)); }
  FL_AVX2 __m256 totals() const { return _mm256_loadu_ps(total); }
};

template <typename out_t>
__attribute__((target("avx2"))) void warp_general_rgb8_avx2(const Image<uint8_t>& img, const float* m,
                                                           const Visible& vis, const float* alpha, const float* beta,
                                                           const float* fill_value, out_t* out, const Strides& os,
                                                           int out_h, int out_w) {
  const float sx = filter_support(m[0], m[1]), sy = filter_support(m[3], m[4]);
  const InputView<uint8_t, int64_t> in{img.p, img.h, img.w, img.s.c, img.s.y, img.s.x};
  const int kx = general_taps(sx, img.w), ky = general_taps(sy, img.h);
  thread_local std::vector<float> wx, wy;
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 m0 = _mm256_set1_ps(m[0]), m2 = _mm256_set1_ps(m[2]), m3 = _mm256_set1_ps(m[3]),
               m5 = _mm256_set1_ps(m[5]), half = _mm256_set1_ps(0.5f), zero = _mm256_setzero_ps();
  const __m256 x0 = _mm256_set1_ps(vis.x0), x1 = _mm256_set1_ps(vis.x1), y0 = _mm256_set1_ps(vis.y0),
               y1 = _mm256_set1_ps(vis.y1);
  const __m256i last_row = _mm256_set1_epi32(img.h - ky), last_col = _mm256_set1_epi32(img.w - kx);
  const __m256 a[3] = {_mm256_set1_ps(alpha[0]), _mm256_set1_ps(alpha[1]), _mm256_set1_ps(alpha[2])};
  const __m256 bt[3] = {_mm256_set1_ps(beta[0]), _mm256_set1_ps(beta[1]), _mm256_set1_ps(beta[2])};
  // A group whose centres equal, bit for bit, those its weights were last computed for reuses them: along an axis
  // that a shear leaves alone, the weights repeat (y along a row under a horizontal shear, x down the columns under a
  // vertical one). x weights are kept per column group, y weights from the row's previous group.
  const int groups = (out_w + 7) / 8;
  thread_local std::vector<AxisCache8> xcache;
  xcache.assign(groups, AxisCache8{});
  AxisCache8 ycache{};
  wx.resize(static_cast<size_t>(groups) * kx * 8);
  // Each row in two passes: first every group's taps and weights, then the sums, back to back, so that one group's
  // loads start while the previous group's adds finish.
  thread_local std::vector<GroupPlan> plans;
  plans.resize(groups);
  wy.resize(static_cast<size_t>(groups) * ky * 8);
  for (int v = 0; v < out_h; ++v) {
    out_t* row_out = out + v * os.y;
    const __m256 m1v = _mm256_set1_ps(m[1] * v), m4v = _mm256_set1_ps(m[4] * v);
    ycache.valid = false;  // its weights may lie in a group's buffer that this row rewrites
    for (int u0 = 0; u0 < out_w; u0 += 8) {
      GroupPlan& plan = plans[u0 / 8];
      const int lanes = std::min(8, out_w - u0);
      // sample_centre, lane by lane: m[0] * u + m[1] * v + m[2] + 0.5f
      const __m256 uf = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_set1_epi32(u0), iota));
      const __m256 cx = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m0, uf), m1v), m2), half);
      const __m256 cy = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m3, uf), m4v), m5), half);
      AxisCache8& xc = xcache[u0 / 8];
      const __m256 inside = _mm256_and_ps(
          _mm256_and_ps(_mm256_cmp_ps(cx, x0, _CMP_GE_OQ), _mm256_cmp_ps(cx, x1, _CMP_LE_OQ)),
          _mm256_and_ps(_mm256_cmp_ps(cy, y0, _CMP_GE_OQ), _mm256_cmp_ps(cy, y1, _CMP_LE_OQ)));
      plan.inside_bits = _mm256_movemask_ps(inside) & ((1 << lanes) - 1);
      plan.fast_bits = 0;
      if (!plan.inside_bits) continue;
      xc.update(cx, sx, img.w, kx, wx.data() + static_cast<size_t>(u0) * kx);
      ycache.update(cy, sy, img.h, ky, wy.data() + static_cast<size_t>(u0) * ky);
      plan.wy = ycache.w;
      const __m256i startx = xc.starts(), starty = ycache.starts(), fitsx = xc.fit(), fitsy = ycache.fit();
      const __m256 total = _mm256_mul_ps(xc.totals(), ycache.totals());
      _mm256_storeu_ps(plan.inv, _mm256_and_ps(_mm256_cmp_ps(total, zero, _CMP_GT_OQ),
                                               _mm256_div_ps(_mm256_set1_ps(1.f), total)));
      // fast: inside, taps fit, and the window leaves the last row or the last column (the rgbx read's spare byte)
      const __m256i room = _mm256_or_si256(_mm256_cmpgt_epi32(last_row, starty), _mm256_cmpgt_epi32(last_col, startx));
      const __m256i fast = _mm256_and_si256(_mm256_and_si256(_mm256_castps_si256(inside), room),
                                            _mm256_and_si256(fitsx, fitsy));
      plan.fast_bits = _mm256_movemask_ps(_mm256_castsi256_ps(fast)) & ((1 << lanes) - 1);
      if (plan.fast_bits) {
        // each lane's first tap; lanes that are not fast read the first fast lane's taps (in bounds), unused
        // (the image's size fits an int32: checked by the caller)
        alignas(32) int32_t off32[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(off32),
                           _mm256_add_epi32(_mm256_mullo_epi32(starty, _mm256_set1_epi32(static_cast<int>(img.s.y))),
                                            _mm256_mullo_epi32(startx, _mm256_set1_epi32(3))));
        const int first = __builtin_ctz(plan.fast_bits);
        for (int i = 0; i < 8; ++i) plan.off[i] = off32[plan.fast_bits >> i & 1 ? i : first];
      }
    }
    for (int u0 = 0; u0 < out_w; u0 += 8) {
      const GroupPlan& plan = plans[u0 / 8];
      const int lanes = std::min(8, out_w - u0), fast_bits = plan.fast_bits, inside_bits = plan.inside_bits;
      alignas(32) float res[3][8];
      if (fast_bits) {
        __m256 sum[3];
        const uint8_t* pixels = img.p;
        const float* wxg = wx.data() + static_cast<size_t>(u0) * kx;
        switch (kx) {  // the common tap counts unrolled
          case 3: accumulate8<3>(pixels, img.s.y, plan.off, wxg, plan.wy, kx, ky, &sum[0], &sum[1], &sum[2]); break;
          case 4: accumulate8<4>(pixels, img.s.y, plan.off, wxg, plan.wy, kx, ky, &sum[0], &sum[1], &sum[2]); break;
          case 5: accumulate8<5>(pixels, img.s.y, plan.off, wxg, plan.wy, kx, ky, &sum[0], &sum[1], &sum[2]); break;
          default: accumulate8<0>(pixels, img.s.y, plan.off, wxg, plan.wy, kx, ky, &sum[0], &sum[1], &sum[2]);
        }
        // store_pixel's (acc * inv) * alpha + beta; uint8 clamps and rounds as store_rgb does
        const __m256 inv = _mm256_loadu_ps(plan.inv);
        for (int c = 0; c < 3; ++c) {
          __m256 val = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(sum[c], inv), a[c]), bt[c]);
          if constexpr (std::is_same_v<out_t, uint8_t>)
            val = _mm256_add_ps(_mm256_min_ps(_mm256_max_ps(val, zero), _mm256_set1_ps(255.f)), half);
          _mm256_store_ps(res[c], val);
        }
      }
      out_t* o = row_out + u0 * os.x;
      if (fast_bits == 0xff && os.x == 1) {  // NCHW, all eight: one contiguous run per channel
        for (int c = 0; c < 3; ++c) {
          if constexpr (std::is_same_v<out_t, float>) {
            _mm256_storeu_ps(o + c * os.c, _mm256_load_ps(res[c]));
          } else if constexpr (std::is_same_v<out_t, uint8_t>) {
            const __m256i q = _mm256_cvttps_epi32(_mm256_load_ps(res[c]));
            const __m128i q16 = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(o + c * os.c), _mm_packus_epi16(q16, q16));
          } else {
            for (int i = 0; i < 8; ++i) o[c * os.c + i] = OutCast<out_t>::apply(res[c][i]);
          }
        }
        continue;
      }
      for (int i = 0; i < lanes; ++i, o += os.x) {
        if (fast_bits >> i & 1) {
          for (int c = 0; c < 3; ++c) {
            if constexpr (std::is_same_v<out_t, uint8_t>)
              o[c * os.c] = static_cast<uint8_t>(static_cast<int32_t>(res[c][i]));
            else
              o[c * os.c] = OutCast<out_t>::apply(res[c][i]);
          }
        } else if (inside_bits >> i & 1) {  // near the image's last pixel, or taps that did not fit: warp.h's loop
          warp_pixel_general(in, vis, 3, m, sx, sy, u0 + i, v, alpha, beta, fill_value, o, os.c);
        } else {
          for (int c = 0; c < 3; ++c) o[c * os.c] = OutCast<out_t>::apply(fill_value[c]);
        }
      }
    }
  }
}

template <typename in_t, typename out_t>
__attribute__((target("avx2"))) void warp_general_avx2(const Image<in_t>& img, const float* m, const Visible& vis,
                                                       const float* alpha, const float* beta, const Fill& fill, out_t* out,
                                                       const Strides& os, int out_h, int out_w) {
  if constexpr (std::is_same_v<in_t, uint8_t>) {
    // lane offsets into the image are int32
    if (img.c == 3 && img.s.x == 3 && static_cast<int64_t>(img.h) * img.s.y < INT32_MAX - 64) {
      float fill_value[kMaxChannels] = {};
      for (int c = 0; c < 3; ++c) fill_value[c] = fill[c] * alpha[c] + beta[c];
      warp_general_rgb8_avx2(img, m, vis, alpha, beta, fill_value, out, os, out_h, out_w);
      return;
    }
  }
  warp_general(img, m, vis, alpha, beta, fill, out, os, out_h, out_w);
}
#endif

template <typename in_t, typename out_t>
void warp_batch_cpu(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                    const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta, int64_t channels,
                    bool hwc, const Fill& fill, at::Tensor& out) {
  const in_t* base = data.data_ptr<in_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* shp = shapes.data_ptr<int64_t>();
  const float* mats = matrices.data_ptr<float>();
  const int cols = static_cast<int>(matrices.size(2));
  const float* a = alpha.data_ptr<float>();
  const float* b = beta.data_ptr<float>();
  out_t* o = out.data_ptr<out_t>();
  const int out_h = static_cast<int>(out.size(2)), out_w = static_cast<int>(out.size(3));
  const Strides os{out.stride(1), out.stride(2), out.stride(3)};
  const int64_t total = data.numel();
  for (int64_t i = 0; i < offsets.numel(); ++i) {  // validate before any thread touches memory
    const int64_t h = shp[i * 3], w = shp[i * 3 + 1], c = shp[i * 3 + 2];
    // The kernels index within a sample with int (a row of w*c, a plane of h*w), so h*w*c stays below 2^31;
    // the product is checked, not computed blindly: h*w*c of caller-given sides can wrap int64.
    int64_t hw = 0, size = 0;
    FL_CHECK(h > 0 && w > 0 && c == channels && !__builtin_mul_overflow(h, w, &hw) &&
                 !__builtin_mul_overflow(hw, c, &size) && size <= INT32_MAX,
             "warp_normalize: sample %lld has shape (%lld, %lld, %lld), expected positive sides, fewer than 2^31 "
             "values, and %lld channels",
             static_cast<long long>(i), static_cast<long long>(h), static_cast<long long>(w),
             static_cast<long long>(c), static_cast<long long>(channels));
    FL_CHECK(off[i] >= 0 && off[i] <= total && size <= total - off[i],
             "warp_normalize: sample %lld (offset %lld, %lld elements) extends past the end of data (%lld elements)",
             static_cast<long long>(i), static_cast<long long>(off[i]), static_cast<long long>(size),
             static_cast<long long>(total));
  }
  auto* general = &warp_general_base<in_t, out_t>;
  bool avx2_rows = false;
#if FL_AVX2_BUILD
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && !baseline_build_requested()) {
    general = &warp_general_avx2<in_t, out_t>;
    avx2_rows = true;
  }
#endif
  at::parallel_for(0, offsets.numel(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int h = static_cast<int>(shp[i * 3]), w = static_cast<int>(shp[i * 3 + 1]);
      const int c = static_cast<int>(channels);
      const Strides is = hwc ? Strides{1, int64_t(w) * c, c} : Strides{int64_t(h) * w, w, 1};
      const Image<in_t> img{base + off[i], h, w, c, is};
      float m[6];
      const Visible vis = read_map(mats, i, cols, h, w, m);
      out_t* dst = o + i * out.stride(0);
      if (m[1] == 0.f && m[3] == 0.f)
        warp_separable(img, m, vis, a, b, fill, dst, os, out_h, out_w, avx2_rows);
      else
        general(img, m, vis, a, b, fill, dst, os, out_h, out_w);
    }
  });
}

at::Tensor warp_normalize_cpu(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                              const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta,
                              int64_t channels, int64_t out_h, int64_t out_w, bool hwc, at::ScalarType out_dtype,
                              bool channels_last, c10::ArrayRef<double> fill) {
  StayIfExiting stay;  // a producer's stage may still run at interpreter exit (exit_guard.h)
  at::Tensor out = prepare_warp_output(data, offsets, shapes, matrices, alpha, beta, channels, out_h, out_w,
                                       out_dtype, channels_last);
  const Fill fills = make_fill(fill, channels, "warp_normalize");
  dispatch_warp_types(data.scalar_type(), out_dtype, [&](auto in_tag, auto out_tag) {
    using in_t = typename decltype(in_tag)::type;
    using out_t = typename decltype(out_tag)::type;
    warp_batch_cpu<in_t, out_t>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fills, out);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(fastload, m) {
  m.def(
      "warp_normalize(Tensor data, Tensor offsets, Tensor shapes, Tensor matrices, Tensor alpha, Tensor beta, "
      "int channels, int out_h, int out_w, bool hwc, ScalarType out_dtype, bool channels_last, float[] fill) "
      "-> Tensor");
}

TORCH_LIBRARY_IMPL(fastload, CPU, m) { m.impl("warp_normalize", &warp_normalize_cpu); }
// Not differentiable: a backward through it raises (autograd's default fallback would give no gradient and
// only warn).
TORCH_LIBRARY_IMPL(fastload, Autograd, m) { m.impl("warp_normalize", torch::autograd::autogradNotImplementedFallback()); }

}  // namespace fastload
