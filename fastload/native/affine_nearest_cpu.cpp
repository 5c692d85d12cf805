// `fastload::affine_nearest_`: torchvision's affine/rotate with NEAREST (affine_nearest.h) applied in place to the
// listed samples of a dense batch, each with its own 2x3 matrix. The stage runs it after the warp on the samples
// whose policy drew a rotate/shear/translate; in place, so that the rest of the batch is neither read nor copied
// (each listed sample is copied to scratch first: its pixels are read while they are overwritten). Schema, the
// checks both backends share, and the CPU kernel (a sample per task).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define FL_GATHER_AVX2 1
#endif

#include "affine_nearest.h"
#include "check.h"
#include "cpu_build.h"
#include "exit_guard.h"

namespace fastload {

// The checks both kernels share (sample indices themselves: the CPU kernel checks them; the CUDA kernel skips
// those out of range, and the Python wrapper checks them on the host).
void check_affine_nearest_args(const at::Tensor& images, const at::Tensor& samples, const at::Tensor& matrices) {
  FL_CHECK(images.dim() == 4, "affine_nearest_: images must be a [B, C, H, W] batch, got %lld dimensions",
           static_cast<long long>(images.dim()));
  FL_CHECK(images.scalar_type() == at::kByte || images.scalar_type() == at::kFloat,
           "affine_nearest_: images must be uint8 or float32, got %s", c10::toString(images.scalar_type()));
  TORCH_CHECK(images.is_contiguous() || images.is_contiguous(at::MemoryFormat::ChannelsLast),
              "affine_nearest_: images must be contiguous (NCHW) or channels_last");
  const int64_t c = images.size(1), h = images.size(2), w = images.size(3);
  FL_CHECK(c <= 0 || h <= 0 || w <= 0 || h <= INT32_MAX / c / w,
           "affine_nearest_: samples of %lld x %lld x %lld values are too large (C * H * W must be below 2^31)",
           static_cast<long long>(c), static_cast<long long>(h), static_cast<long long>(w));
  FL_CHECK(h <= nearest::kMaxSide && w <= nearest::kMaxSide,
           "affine_nearest_: images of %lld x %lld pixels are too large (at most %d a side)", static_cast<long long>(h),
           static_cast<long long>(w), nearest::kMaxSide);
  TORCH_CHECK(samples.dim() == 1 && samples.scalar_type() == at::kLong && samples.is_contiguous(),
              "affine_nearest_: samples must be a contiguous int64 [N] tensor");
  FL_CHECK(matrices.dim() == 3 && matrices.size(0) == samples.size(0) && matrices.size(1) == 2 &&
               matrices.size(2) == 3 && matrices.scalar_type() == at::kFloat && matrices.is_contiguous(),
           "affine_nearest_: matrices must be a contiguous float32 [N, 2, 3] tensor with N = %lld (one per sample)",
           static_cast<long long>(samples.size(0)));
  TORCH_CHECK(samples.device() == images.device() && matrices.device() == images.device(),
              "affine_nearest_: samples and matrices must be on the images' device");
}

namespace {

#if FL_GATHER_AVX2
// Row v of a planar uint8 sample (c >= 2 planes of h * w >= 4 pixels, s_c = h * w) moved by the fixed-point matrix
// f, eight output pixels a step: each lane's coordinates are the scalar loop's int64 sums (start + u * step, one
// half added up front), its pixel their high 32 bits (the same floor), read with one masked gather per plane (fill
// outside). A gather reads 4 bytes: plane 0 at its pixel (plane 1 follows), the others ending at it (the plane before
// precedes), so no read leaves the sample. Returns the first pixel left to the scalar loop (w rounded down to 8).
__attribute__((target("avx2"))) int gather_row_u8_avx2(const uint8_t* src, uint8_t* dst, int c, int h, int w,
                                                         int64_t s_c, const int64_t* f, int v,
                                                         const nearest::Fills<uint8_t>& fill) {
  const int64_t half = int64_t(1) << (nearest::kFractionBits - 1);
  const int64_t x0 = f[1] * v + f[2] + half, y0 = f[4] * v + f[5] + half;
  __m256i xa = _mm256_set_epi64x(x0 + 3 * f[0], x0 + 2 * f[0], x0 + f[0], x0);
  __m256i xb = _mm256_add_epi64(xa, _mm256_set1_epi64x(4 * f[0]));
  __m256i ya = _mm256_set_epi64x(y0 + 3 * f[3], y0 + 2 * f[3], y0 + f[3], y0);
  __m256i yb = _mm256_add_epi64(ya, _mm256_set1_epi64x(4 * f[3]));
  const __m256i dx = _mm256_set1_epi64x(8 * f[0]), dy = _mm256_set1_epi64x(8 * f[3]);
  const __m256i wv = _mm256_set1_epi32(w), hv = _mm256_set1_epi32(h), minus1 = _mm256_set1_epi32(-1);
  const __m256i low = _mm256_set1_epi32(0xFF);
  // what a lane outside the image gathers: plane 0 reads its byte at the bottom, the others at the top
  __m256i fills[kMaxChannels];
  for (int ch = 0; ch < kMaxChannels; ++ch)
    fills[ch] = _mm256_set1_epi32(ch == 0 ? fill[0] : static_cast<int>(static_cast<uint32_t>(fill[ch]) << 24));
  const __m256i bytes = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
  const int n = w & ~7;
  for (int u = 0; u < n; u += 8) {
    // high dwords of (a0..a3, b0..b3) in lane order: shuffle_ps gives a0 a1 b0 b1 | a2 a3 b2 b3
    const __m256i px = _mm256_permute4x64_epi64(
        _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(xa), _mm256_castsi256_ps(xb), 0xDD)), 0xD8);
    const __m256i py = _mm256_permute4x64_epi64(
        _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(ya), _mm256_castsi256_ps(yb), 0xDD)), 0xD8);
    const __m256i inside =
        _mm256_and_si256(_mm256_and_si256(_mm256_cmpgt_epi32(px, minus1), _mm256_cmpgt_epi32(wv, px)),
                         _mm256_and_si256(_mm256_cmpgt_epi32(py, minus1), _mm256_cmpgt_epi32(hv, py)));
    const __m256i at = _mm256_add_epi32(_mm256_mullo_epi32(py, wv), px);
    for (int ch = 0; ch < c; ++ch) {
      __m256i g;
      if (ch == 0) {
        g = _mm256_and_si256(
            _mm256_mask_i32gather_epi32(fills[0], reinterpret_cast<const int*>(src), at, inside, 1), low);
      } else {
        g = _mm256_srli_epi32(_mm256_mask_i32gather_epi32(
                                  // past kMaxChannels the fill is one value: plane 1's (shifted) entry holds it
                                  fills[ch < kMaxChannels ? ch : 1], reinterpret_cast<const int*>(src + ch * s_c - 3),
                                  at, inside, 1), 24);
      }
      const __m256i words = _mm256_packus_epi32(g, g);
      const __m256i packed = _mm256_packus_epi16(words, words);  // pixels in bytes 0-3 of each 128-bit half
      _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + ch * s_c + static_cast<int64_t>(v) * w + u),
                       _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(packed, bytes)));
    }
    xa = _mm256_add_epi64(xa, dx);
    xb = _mm256_add_epi64(xb, dx);
    ya = _mm256_add_epi64(ya, dy);
    yb = _mm256_add_epi64(yb, dy);
  }
  return n;
}

bool gather_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && !baseline_build_requested();
}
#endif

// Whether each output row of the fixed-point map f reads a run of one input row: a step of exactly one pixel along
// x and none along y (translations, ShearX).
bool rows_are_runs(const int64_t* f) { return f[0] == (int64_t(1) << nearest::kFractionBits) && f[3] == 0; }

// One sample moved by one matrix from src into dst (distinct buffers of C * H * W values with strides s_c, s_y, s_x,
// the same for both). Rows that map to a run of one input row (translations, ShearX: a step of exactly one pixel
// along x and none along y) are copied as that run, with the fill around it: the same pixels as the general loop.
template <typename T>
void gather_sample(const T* src, T* dst, int c, int h, int w, int s_c, int s_y, int s_x, const float* matrix,
                   const nearest::Fills<T>& fill, std::vector<int>& source) {
  int64_t f[6];
  const bool finite = nearest::to_fixed(matrix, f);
  const bool runs = finite && rows_are_runs(f);
  source.resize(w);  // per pixel of a row: its input pixel's offset in the sample, or -1 (fill)
#if FL_GATHER_AVX2
  const bool avx2 = std::is_same_v<T, uint8_t> && finite && !runs && s_x == 1 && c >= 2 && s_c == h * w &&
                    s_y == w && h * w >= 4 && gather_avx2();
#endif
  for (int v = 0; v < h; ++v) {
    int64_t x = f[1] * v + f[2], y = f[4] * v + f[5];  // at u = 0, then one step per pixel
    if (runs && s_x == 1) {
      const int64_t px = nearest::pixel(x), py = nearest::pixel(y);
      const bool row_inside = py >= 0 && py < h;
      // output u reads input px + u: inside for u in [first, last)
      const int first = row_inside ? static_cast<int>(std::clamp<int64_t>(-px, 0, w)) : w;
      const int last = row_inside ? static_cast<int>(std::clamp<int64_t>(w - px, first, w)) : w;
      for (int ch = 0; ch < c; ++ch) {
        T* out = dst + v * s_y + ch * s_c;
        std::fill(out, out + first, fill[ch]);
        if (last > first) std::memcpy(out + first, src + ch * s_c + py * s_y + px + first, (last - first) * sizeof(T));
        std::fill(out + last, out + w, fill[ch]);
      }
      continue;
    }
    int done = 0;
#if FL_GATHER_AVX2
    if constexpr (std::is_same_v<T, uint8_t>) {
      if (avx2) {
        done = gather_row_u8_avx2(src, dst, c, h, w, s_c, f, v, fill);
        x += f[0] * done;
        y += f[3] * done;
      }
    }
#endif
    for (int u = done; u < w; ++u, x += f[0], y += f[3]) {
      const int64_t px = nearest::pixel(x), py = nearest::pixel(y);
      source[u] = finite && nearest::inside(px, py, h, w) ? static_cast<int>(py * s_y + px * s_x) : -1;
    }
    for (int ch = 0; ch < c; ++ch) {  // a plane at a time (NCHW)
      const T* from = src + ch * s_c;
      T* out = dst + v * s_y + ch * s_c;
      const T fill_c = fill[ch];
      for (int u = done; u < w; ++u) out[u * s_x] = source[u] >= 0 ? from[source[u]] : fill_c;
    }
  }
}

}  // namespace

void check_sample_list(const at::Tensor& samples, int64_t batch, const char* op) {
  const int64_t* index = samples.data_ptr<int64_t>();
  std::vector<bool> seen(batch, false);
  for (int64_t k = 0; k < samples.size(0); ++k) {
    FL_CHECK(index[k] >= 0 && index[k] < batch, "%s: sample index %lld is out of range for a batch of %lld", op,
             static_cast<long long>(index[k]), static_cast<long long>(batch));
    FL_CHECK(!seen[index[k]], "%s: sample %lld is listed twice", op, static_cast<long long>(index[k]));
    seen[index[k]] = true;
  }
}

void nearest_gather_u8(const uint8_t* src, uint8_t* dst, int h, int w, const float* matrix,
                       const nearest::Fills<uint8_t>& fill, std::vector<int>& source, std::vector<uint8_t>& staged) {
  // A map whose rows are not runs (a rotation, ShearY) reads a slanted line of the input per row: from a batch in
  // memory those reads wait, from a copy just made (sequential, prefetched) they hit L2: 2.4x faster
  // (bench.photometric_cpu's map rows). Runs are copied row by row and need no copy first.
  int64_t f[6];
  if (nearest::to_fixed(matrix, f) && !rows_are_runs(f)) {
    staged.resize(3 * static_cast<size_t>(h) * w);
    std::memcpy(staged.data(), src, staged.size());
    src = staged.data();
  }
  gather_sample<uint8_t>(src, dst, 3, h, w, h * w, w, 1, matrix, fill, source);
}

namespace {

template <typename T>
void affine_nearest_samples(at::Tensor& images, const at::Tensor& samples, const at::Tensor& matrices,
                            const Fill& fill) {
  const int64_t n = samples.size(0);
  const int c = static_cast<int>(images.size(1)), h = static_cast<int>(images.size(2)),
            w = static_cast<int>(images.size(3));
  check_sample_list(samples, images.size(0), "affine_nearest_");
  const int64_t* index = samples.data_ptr<int64_t>();
  // A sample's C * H * W values are one block, with the same inner strides in both layouts.
  const int64_t s_b = images.stride(0), values = int64_t(c) * h * w;
  const int s_c = static_cast<int>(images.stride(1)), s_y = static_cast<int>(images.stride(2)),
            s_x = static_cast<int>(images.stride(3));
  T* base = images.data_ptr<T>();
  const float* mats = matrices.data_ptr<float>();
  const nearest::Fills<T> fill_value = nearest::typed<T>(fill);
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> copy(values);
    std::vector<int> source;
    for (int64_t k = begin; k < end; ++k) {
      T* sample = base + index[k] * s_b;
      std::memcpy(copy.data(), sample, values * sizeof(T));
      gather_sample<T>(copy.data(), sample, c, h, w, s_c, s_y, s_x, mats + k * 6, fill_value, source);
    }
  });
}

void affine_nearest_cpu(at::Tensor& images, const at::Tensor& samples, const at::Tensor& matrices,
                        c10::ArrayRef<double> fill_arg) {
  StayIfExiting stay;  // a producer's stage may still run at interpreter exit (exit_guard.h)
  check_affine_nearest_args(images, samples, matrices);
  const Fill fill = make_fill(fill_arg, images.size(1), "affine_nearest_");
  if (samples.numel() == 0 || images.numel() == 0) return;
  if (images.scalar_type() == at::kByte)
    affine_nearest_samples<uint8_t>(images, samples, matrices, fill);
  else
    affine_nearest_samples<float>(images, samples, matrices, fill);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastload, m) {
  m.def("affine_nearest_(Tensor(a!) images, Tensor samples, Tensor matrices, float[] fill) -> ()");
}

TORCH_LIBRARY_IMPL(fastload, CPU, m) { m.impl("affine_nearest_", &affine_nearest_cpu); }

}  // namespace fastload
