// CPU twin of the affine/normalise stage, and the op's schema. Same maths as the CUDA kernel (warp.h);
// axis-aligned matrices (every crop/resize/flip the loader makes) take a separable two-pass path that
// computes the identical weighted sum in far fewer operations.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <vector>

#include "warp.h"
#include "warp_op.h"

namespace fastload {

at::Tensor prepare_warp_output(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                               const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta,
                               int64_t channels, int64_t out_h, int64_t out_w, at::ScalarType out_dtype,
                               bool channels_last) {
  TORCH_CHECK(data.dim() == 1 && data.is_contiguous(), "warp_normalize: data must be a contiguous 1-D tensor");
  TORCH_CHECK(data.scalar_type() == at::kByte || data.scalar_type() == at::kFloat,
              "warp_normalize: data must be uint8 or float32, got ", data.scalar_type());
  const int64_t batch = offsets.numel();
  TORCH_CHECK(offsets.dim() == 1 && offsets.scalar_type() == at::kLong && offsets.is_contiguous(),
              "warp_normalize: offsets must be a contiguous int64 [B] tensor");
  TORCH_CHECK(shapes.dim() == 2 && shapes.size(0) == batch && shapes.size(1) == 3 &&
                  shapes.scalar_type() == at::kLong && shapes.is_contiguous(),
              "warp_normalize: shapes must be a contiguous int64 [B, 3] tensor (h, w, c)");
  TORCH_CHECK(matrices.dim() == 3 && matrices.size(0) == batch && matrices.size(1) == 2 && matrices.size(2) == 3 &&
                  matrices.scalar_type() == at::kFloat && matrices.is_contiguous(),
              "warp_normalize: matrices must be a contiguous float32 [B, 2, 3] tensor");
  TORCH_CHECK(channels >= 1 && channels <= kMaxChannels, "warp_normalize: 1 to ", kMaxChannels,
              " channels supported, got ", channels);
  TORCH_CHECK(alpha.numel() == channels && beta.numel() == channels && alpha.scalar_type() == at::kFloat &&
                  beta.scalar_type() == at::kFloat && alpha.is_contiguous() && beta.is_contiguous(),
              "warp_normalize: alpha and beta must be contiguous float32 [C] tensors");
  TORCH_CHECK(out_h > 0 && out_w > 0, "warp_normalize: output size must be positive");
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16 ||
                  out_dtype == at::kByte,
              "warp_normalize: out_dtype must be float32, float16, bfloat16 or uint8");
  for (const at::Tensor* t : {&offsets, &shapes, &matrices, &alpha, &beta})
    TORCH_CHECK(t->device() == data.device(), "warp_normalize: all tensors must be on ", data.device());
  auto options = data.options().dtype(out_dtype);
  if (channels_last) options = options.memory_format(at::MemoryFormat::ChannelsLast);
  return at::empty({batch, channels, out_h, out_w}, options);
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
  float at(int y, int x, int ch) const { return static_cast<float>(p[y * s.y + x * s.x + ch * s.c]); }
};

// Taps and normalised weights of one output coordinate along one axis.
struct AxisSample {
  int lo = 0, hi = 0;  // hi == lo means "outside": fill
  int first_weight = 0;
};

// Precomputes taps and normalised weights for each output column or row of an axis-aligned warp.
void axis_weights(float scale, float offset, int out_size, int in_size, std::vector<AxisSample>& samples,
                  std::vector<float>& weights) {
  const float support = scale < 0 ? (-scale > 1.f ? -scale : 1.f) : (scale > 1.f ? scale : 1.f);
  samples.resize(out_size);
  weights.clear();
  for (int i = 0; i < out_size; ++i) {
    const float centre = scale * i + offset + 0.5f;
    AxisSample& s = samples[i];
    s.first_weight = static_cast<int>(weights.size());
    if (centre < 0.f || centre > in_size) {
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

template <typename in_t, typename out_t>
void warp_separable(const Image<in_t>& img, const float* m, const float* alpha, const float* beta, float fill,
                    out_t* out, const Strides& os, int out_h, int out_w) {
  thread_local std::vector<AxisSample> xs, ys;
  thread_local std::vector<float> wx, wy, rows;
  axis_weights(m[0], m[2], out_w, img.w, xs, wx);
  axis_weights(m[4], m[5], out_h, img.h, ys, wy);
  int row_lo = img.h, row_hi = 0;
  for (const AxisSample& s : ys)
    if (s.hi > s.lo) {
      row_lo = s.lo < row_lo ? s.lo : row_lo;
      row_hi = s.hi > row_hi ? s.hi : row_hi;
    }
  const int C = img.c;
  // Pass 1: horizontal filter of every input row the vertical pass needs -> rows[r][u][c].
  const int nrows = row_hi > row_lo ? row_hi - row_lo : 0;
  rows.resize(static_cast<size_t>(nrows) * out_w * C);  // every element is written below
  for (int r = 0; r < nrows; ++r) {
    float* dst = rows.data() + static_cast<size_t>(r) * out_w * C;
    for (int u = 0; u < out_w; ++u) {
      const AxisSample& s = xs[u];
      float acc[kMaxChannels] = {0.f, 0.f, 0.f, 0.f};
      const float* w = wx.data() + s.first_weight;
      for (int x = s.lo; x < s.hi; ++x, ++w)
        for (int c = 0; c < C; ++c) acc[c] += *w * img.at(row_lo + r, x, c);
      for (int c = 0; c < C; ++c) dst[u * C + c] = acc[c];
    }
  }
  // Pass 2: vertical filter, normalise, cast, store.
  for (int v = 0; v < out_h; ++v) {
    const AxisSample& sy = ys[v];
    for (int u = 0; u < out_w; ++u) {
      out_t* o = out + v * os.y + u * os.x;
      if (sy.hi == sy.lo || xs[u].hi == xs[u].lo) {
        for (int c = 0; c < C; ++c) o[c * os.c] = OutCast<out_t>::apply(fill * alpha[c] + beta[c]);
        continue;
      }
      float acc[kMaxChannels] = {0.f, 0.f, 0.f, 0.f};
      const float* w = wy.data() + sy.first_weight;
      for (int y = sy.lo; y < sy.hi; ++y, ++w) {
        const float* src = rows.data() + (static_cast<size_t>(y - row_lo) * out_w + u) * C;
        for (int c = 0; c < C; ++c) acc[c] += *w * src[c];
      }
      for (int c = 0; c < C; ++c) o[c * os.c] = OutCast<out_t>::apply(acc[c] * alpha[c] + beta[c]);
    }
  }
}

template <typename in_t, typename out_t>
void warp_general(const Image<in_t>& img, const float* m, const float* alpha, const float* beta, float fill,
                  out_t* out, const Strides& os, int out_h, int out_w) {
  const float sx = filter_support(m[0], m[1]), sy = filter_support(m[3], m[4]);
  const int C = img.c;
  for (int v = 0; v < out_h; ++v) {
    for (int u = 0; u < out_w; ++u) {
      out_t* o = out + v * os.y + u * os.x;
      float cx, cy;
      if (!sample_centre(m, u, v, img.h, img.w, &cx, &cy)) {
        for (int c = 0; c < C; ++c) o[c * os.c] = OutCast<out_t>::apply(fill * alpha[c] + beta[c]);
        continue;
      }
      int x0, x1, y0, y1;
      filter_taps(cx, sx, img.w, &x0, &x1);
      filter_taps(cy, sy, img.h, &y0, &y1);
      float acc[kMaxChannels] = {0.f, 0.f, 0.f, 0.f};
      float total_x = 0.f, total_y = 0.f;
      for (int x = x0; x < x1; ++x) total_x += triangle((x + 0.5f - cx) / sx);
      for (int y = y0; y < y1; ++y) {
        const float wy = triangle((y + 0.5f - cy) / sy);
        total_y += wy;
        for (int x = x0; x < x1; ++x) {
          const float w = wy * triangle((x + 0.5f - cx) / sx);
          for (int c = 0; c < C; ++c) acc[c] += w * img.at(y, x, c);
        }
      }
      const float total = total_x * total_y;
      const float inv = total > 0.f ? 1.f / total : 0.f;
      for (int c = 0; c < C; ++c) o[c * os.c] = OutCast<out_t>::apply(acc[c] * inv * alpha[c] + beta[c]);
    }
  }
}

template <typename in_t, typename out_t>
void warp_batch_cpu(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                    const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta, int64_t channels,
                    bool hwc, double fill, at::Tensor& out) {
  const in_t* base = data.data_ptr<in_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* shp = shapes.data_ptr<int64_t>();
  const float* mats = matrices.data_ptr<float>();
  const float* a = alpha.data_ptr<float>();
  const float* b = beta.data_ptr<float>();
  out_t* o = out.data_ptr<out_t>();
  const int out_h = static_cast<int>(out.size(2)), out_w = static_cast<int>(out.size(3));
  const Strides os{out.stride(1), out.stride(2), out.stride(3)};
  const int64_t total = data.numel();
  for (int64_t i = 0; i < offsets.numel(); ++i) {  // validate before any thread touches memory
    const int64_t h = shp[i * 3], w = shp[i * 3 + 1], c = shp[i * 3 + 2];
    TORCH_CHECK(h > 0 && w > 0 && c == channels, "warp_normalize: sample ", i, " has shape (", h, ", ", w, ", ", c,
                "), expected positive size and ", channels, " channels");
    TORCH_CHECK(off[i] >= 0 && off[i] + h * w * c <= total, "warp_normalize: sample ", i,
                " extends past the end of data");
  }
  at::parallel_for(0, offsets.numel(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int h = static_cast<int>(shp[i * 3]), w = static_cast<int>(shp[i * 3 + 1]);
      const int c = static_cast<int>(channels);
      const Strides is = hwc ? Strides{1, int64_t(w) * c, c} : Strides{int64_t(h) * w, w, 1};
      const Image<in_t> img{base + off[i], h, w, c, is};
      const float* m = mats + i * 6;
      out_t* dst = o + i * out.stride(0);
      if (m[1] == 0.f && m[3] == 0.f)
        warp_separable(img, m, a, b, static_cast<float>(fill), dst, os, out_h, out_w);
      else
        warp_general(img, m, a, b, static_cast<float>(fill), dst, os, out_h, out_w);
    }
  });
}

template <typename in_t>
void dispatch_out(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                  const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta, int64_t channels,
                  bool hwc, double fill, at::Tensor& out) {
  switch (out.scalar_type()) {
    case at::kFloat: return warp_batch_cpu<in_t, float>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
    case at::kHalf: return warp_batch_cpu<in_t, c10::Half>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
    case at::kBFloat16: return warp_batch_cpu<in_t, c10::BFloat16>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
    case at::kByte: return warp_batch_cpu<in_t, uint8_t>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
    default: TORCH_CHECK(false, "warp_normalize: unsupported out_dtype");
  }
}

at::Tensor warp_normalize_cpu(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& shapes,
                              const at::Tensor& matrices, const at::Tensor& alpha, const at::Tensor& beta,
                              int64_t channels, int64_t out_h, int64_t out_w, bool hwc, at::ScalarType out_dtype,
                              bool channels_last, double fill) {
  at::Tensor out = prepare_warp_output(data, offsets, shapes, matrices, alpha, beta, channels, out_h, out_w,
                                       out_dtype, channels_last);
  if (data.scalar_type() == at::kByte)
    dispatch_out<uint8_t>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
  else
    dispatch_out<float>(data, offsets, shapes, matrices, alpha, beta, channels, hwc, fill, out);
  return out;
}

}  // namespace

TORCH_LIBRARY(fastload, m) {
  m.def(
      "warp_normalize(Tensor data, Tensor offsets, Tensor shapes, Tensor matrices, Tensor alpha, Tensor beta, "
      "int channels, int out_h, int out_w, bool hwc, ScalarType out_dtype, bool channels_last, float fill) "
      "-> Tensor");
}

TORCH_LIBRARY_IMPL(fastload, CPU, m) { m.impl("warp_normalize", &warp_normalize_cpu); }

}  // namespace fastload
