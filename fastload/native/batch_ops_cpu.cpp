// `fastload::batch_ops`: RandomErasing and MixUp/CutMix in one pass over the finished batch,
//   out[i] = mix_i(erase_i(x[i]), erase_j(x[j])),  j = partner(i)  (x.roll(1, 0) or x.flip(0)),
// written to a new tensor in x's layout (contiguous or channels_last): reading partner pixels while writing in
// place would race. Schema, the checks both backends share, and the CPU kernel (one sample per task); the
// per-value maths is batch_ops.h's, shared with the CUDA kernel (batch_ops_cuda.cu).

// torch computes each float op with one rounding; a contracted a * b + c would round once where it rounds twice.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "batch_ops.h"
#include "check.h"
#include "exit_guard.h"

namespace fastload {

using namespace batch_ops;

at::Tensor recycled_cpu_output(at::IntArrayRef sizes, const at::TensorOptions& options, bool channels_last);

// The checks both kernels share; returns the output (x's shape, strides and device).
at::Tensor prepare_batch_ops_output(const at::Tensor& x, const at::Tensor& table, const at::Tensor& fill,
                                    const at::Tensor& noise, int64_t mix, int64_t partner) {
  FL_CHECK(x.dim() == 4, "batch_ops: x must be a [B, C, H, W] batch, got %lld dimensions",
           static_cast<long long>(x.dim()));
  const auto dtype = x.scalar_type();
  FL_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kByte,
           "batch_ops: x must be float32, float16, bfloat16 or uint8, got %s", c10::toString(dtype));
  TORCH_CHECK(x.is_contiguous() || x.is_contiguous(at::MemoryFormat::ChannelsLast),
              "batch_ops: x must be contiguous (NCHW) or channels_last");
  const int64_t batch = x.size(0), channels = x.size(1), h = x.size(2), w = x.size(3);
  // Kernels index within a sample with int: C * H * W must stay below 2^31 (checked by division: no overflow).
  FL_CHECK(channels <= 0 || h <= 0 || w <= 0 || h <= INT32_MAX / channels / w,
           "batch_ops: samples of %lld x %lld x %lld values are too large (C * H * W must be below 2^31)",
           static_cast<long long>(channels), static_cast<long long>(h), static_cast<long long>(w));
  FL_CHECK(table.dim() == 2 && table.size(0) == batch && table.size(1) == kColumns &&
               table.scalar_type() == at::kInt && table.is_contiguous(),
           "batch_ops: table must be a contiguous int32 [B, %d] tensor with B = x.size(0)", kColumns);
  TORCH_CHECK(fill.dim() == 1 && (fill.numel() == 0 || fill.numel() == channels) &&
                  fill.scalar_type() == at::kFloat && fill.is_contiguous(),
              "batch_ops: fill must be a contiguous float32 [C] tensor, or empty (the erase writes noise)");
  TORCH_CHECK(noise.dim() == 1 && noise.scalar_type() == at::kFloat && noise.is_contiguous(),
              "batch_ops: noise must be a contiguous float32 [N] tensor");
  FL_CHECK(mix == kNone || mix == kMixUp || mix == kCutMix, "batch_ops: mix must be 0 (none), 1 (MixUp) or 2 "
           "(CutMix), got %lld", static_cast<long long>(mix));
  FL_CHECK(partner == kRoll || partner == kFlip, "batch_ops: partner must be 0 (roll) or 1 (flip), got %lld",
           static_cast<long long>(partner));
  // torch has no uint8 MixUp (mul_ by a float weight refuses to cast back) and no uint8 noise
  TORCH_CHECK(dtype != at::kByte || mix != kMixUp, "batch_ops: MixUp needs a float batch");
  TORCH_CHECK(dtype != at::kByte || noise.numel() == 0, "batch_ops: noise needs a float batch");
  for (const at::Tensor* t : {&table, &fill, &noise})
    FL_CHECK(t->device() == x.device(), "batch_ops: table, fill and noise must be on x's device (%s)",
             x.device().str().c_str());
  // Dense x: its strides, so out[i] and x[i] share a layout. On the CPU from warp_cpu.cpp's pool of recycled
  // blocks: a fresh batch costs as much in first-touch page faults as the op itself (as much as x.clone()).
  if (x.device().is_cpu())
    return recycled_cpu_output({batch, channels, h, w}, x.options(), !x.is_contiguous());
  return at::empty_like(x);
}

namespace {

// The table's values, checked on the host before any pixel is touched (the CUDA op cannot read them without a
// sync: there, transforms/batch_ops.py checks the host table and the kernel keeps every read in bounds).
void check_table(const at::Tensor& table, const at::Tensor& fill, const at::Tensor& noise, int64_t channels) {
  const int32_t* t = table.data_ptr<int32_t>();
  for (int64_t i = 0; i < table.size(0); ++i) {
    const int32_t* row = t + i * kColumns;
    const long long h = row[kHeight], w = row[kWidth], start = row[kNoise];
    FL_CHECK(h >= 0 && w >= 0, "batch_ops: sample %lld: negative erase box size %lld x %lld",
             static_cast<long long>(i), h, w);
    if (fill.numel() == 0 && h > 0 && w > 0) {
      long long count = 0;  // channels * h * w of int32 sides can pass 2^63: checked, not wrapped
      FL_CHECK(!__builtin_mul_overflow(h * w, static_cast<long long>(channels), &count),
               "batch_ops: sample %lld: an erase box of %lld x %lld has more noise values than int64 holds",
               static_cast<long long>(i), h, w);
      FL_CHECK(start >= 0 && count <= noise.numel() - start,
               "batch_ops: sample %lld: noise values %lld..%lld are outside the %lld given",
               static_cast<long long>(i), start, start + count, static_cast<long long>(noise.numel()));
    }
  }
}

// Sample i in two steps, with the same bits as batch_ops.h's value at every position: first the mix alone (no
// erase) over the whole sample in bulk (copies, or MixUp's loop, which vectorises), then the values inside either
// erase box (i's own, or the partner's) computed again one by one. RandomErasing boxes are few and small, so the
// per-value path with its box checks no longer runs over every value (CutMix 52 -> ~5 ms per batch of 64 at 224).
template <typename T>
void batch_ops_cpu_impl(const at::Tensor& x, const at::Tensor& table, const at::Tensor& fill,
                        const at::Tensor& noise, int mix, int partner, at::Tensor& out) {
  const int64_t batch = x.size(0);
  const int channels = static_cast<int>(x.size(1)), h = static_cast<int>(x.size(2)), w = static_cast<int>(x.size(3));
  const int64_t sc = x.stride(1), sh = x.stride(2), sw = x.stride(3), sn = x.stride(0);
  const int64_t per_sample = static_cast<int64_t>(channels) * h * w;  // dense samples: NCHW or channels_last
  const bool last = sc == 1 && channels > 1;
  const T* in = x.data_ptr<T>();
  T* o = out.data_ptr<T>();
  const int32_t* t = table.data_ptr<int32_t>();
  const float* f = fill.numel() ? fill.data_ptr<float>() : nullptr;
  const float* z = noise.data_ptr<float>();
  const int64_t nz = noise.numel();
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = partner_of(i, batch, partner);
      const int32_t *ri = t + i * kColumns, *rj = t + j * kColumns;
      const T *__restrict__ xi = in + i * sn, *__restrict__ xj = in + j * sn;
      T* __restrict__ oi = o + i * sn;
      if (mix == kMixUp) {
        const float own = bits_to_float(ri[kOwn]), other = bits_to_float(ri[kOther]);
        for (int64_t k = 0; k < per_sample; ++k) oi[k] = mixup(xi[k], xj[k], own, other);
      } else {
        std::memcpy(oi, xi, per_sample * sizeof(T));
        const int y1 = std::max(0, ri[kY1]), y2 = std::min(h, ri[kY2]);
        const int x1 = std::max(0, ri[kX1]), x2 = std::min(w, ri[kX2]);
        if (mix == kCutMix && y1 < y2 && x1 < x2) {  // the box's row segments from the partner
          for (int r = y1; r < y2; ++r) {
            if (last) {
              const int64_t k = r * sh + x1 * sw;
              std::memcpy(oi + k, xj + k, static_cast<size_t>(x2 - x1) * channels * sizeof(T));
            } else {
              for (int c = 0; c < channels; ++c) {
                const int64_t k = c * sc + r * sh + x1;
                std::memcpy(oi + k, xj + k, static_cast<size_t>(x2 - x1) * sizeof(T));
              }
            }
          }
        }
      }
      // The erase boxes: each value as batch_ops.h defines it (overlaps are recomputed to the same value).
      for (int which = 0; which < 2; ++which) {
        // The partner's erase only shows through a mix; a sample that is its own partner (a batch of one, the
        // middle of an odd batch paired from both ends) has one box: by index, not pointer, or it would skip its own.
        if (which == 1 && (mix == kNone || j == i)) continue;
        const int32_t* box = which == 0 ? ri : rj;
        const int top = std::max(0, box[kTop]), left = std::max(0, box[kLeft]);  // int64: top + height may pass 2^31
        const int bottom = static_cast<int>(std::min<int64_t>(h, static_cast<int64_t>(box[kTop]) + box[kHeight]));
        const int right = static_cast<int>(std::min<int64_t>(w, static_cast<int64_t>(box[kLeft]) + box[kWidth]));
        for (int c = 0; c < channels; ++c)
          for (int r = top; r < bottom; ++r)
            for (int col = left; col < right; ++col) {
              const int64_t k = c * sc + r * sh + col * sw;
              const T a = erased<T>(xi[k], ri, c, r, col, f, z, nz);
              oi[k] = mix == kNone ? a : mixed<T>(a, erased<T>(xj[k], rj, c, r, col, f, z, nz), ri, mix, r, col);
            }
      }
    }
  });
}

at::Tensor batch_ops_cpu(const at::Tensor& x, const at::Tensor& table, const at::Tensor& fill,
                         const at::Tensor& noise, int64_t mix, int64_t partner) {
  StayIfExiting stay;  // a producer's stage may still run at interpreter exit (exit_guard.h)
  at::Tensor out = prepare_batch_ops_output(x, table, fill, noise, mix, partner);
  check_table(table, fill, noise, x.size(1));
  if (out.numel() == 0) return out;
  const int m = static_cast<int>(mix), p = static_cast<int>(partner);
  switch (x.scalar_type()) {
    case at::kFloat: batch_ops_cpu_impl<float>(x, table, fill, noise, m, p, out); break;
    case at::kHalf: batch_ops_cpu_impl<c10::Half>(x, table, fill, noise, m, p, out); break;
    case at::kBFloat16: batch_ops_cpu_impl<c10::BFloat16>(x, table, fill, noise, m, p, out); break;
    default: batch_ops_cpu_impl<uint8_t>(x, table, fill, noise, m, p, out); break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastload, m) {
  m.def("batch_ops(Tensor x, Tensor table, Tensor fill, Tensor noise, int mix, int partner) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastload, CPU, m) { m.impl("batch_ops", &batch_ops_cpu); }
// Not differentiable: a backward through it raises (autograd's default fallback would give no gradient and
// only warn).
TORCH_LIBRARY_IMPL(fastload, Autograd, m) { m.impl("batch_ops", torch::autograd::autogradNotImplementedFallback()); }

}  // namespace fastload
