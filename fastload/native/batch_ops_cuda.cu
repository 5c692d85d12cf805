// CUDA kernel of `fastload::batch_ops` (schema, checks and the CPU twin in batch_ops_cpu.cpp; per-value maths in
// batch_ops.h, so both backends compute the same bits). One launch on the current stream. Each thread takes V
// consecutive values of a sample (4 float32, 8 float16/bfloat16, 8 uint8: one 16- or 8-byte access; one value
// where the sample's size or the pointers do not allow it) and a group of samples, so that x is read once per
// value:
//   no mixing   a group is one sample;
//   flip        a group is a pair (i, B - 1 - i): both read once, both written (the middle one of an odd batch
//               mixes with itself);
//   roll        a group is kRollChunk consecutive samples i0..i1 and the one before i0: sample i mixes with the
//               one read just before it, so x is read (kRollChunk + 1) / kRollChunk times.
// The table is on the device, so its values are not checked here (that would synchronise): every read stays in
// bounds whatever it holds (batch_ops.h: noise indices are bounds-checked, boxes are only compared).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>

#include "batch_ops.h"

namespace fastload {

// batch_ops_cpu.cpp: the checks both backends share; the output (x's layout, on x's device).
at::Tensor prepare_batch_ops_output(const at::Tensor& x, const at::Tensor& table, const at::Tensor& fill,
                                    const at::Tensor& noise, int64_t mix, int64_t partner);

namespace {

using namespace batch_ops;

constexpr int kThreads = 256;
constexpr int kRollChunk = 8;

struct Args {
  const int32_t* table;
  const float* fill;  // nullptr: noise
  const float* noise;
  int64_t n_noise;
  int64_t batch;
  int channels, h, w, chw;
  int mix, partner;
};

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// The (channel, row, column) of V consecutive values of a sample starting at value e, in x's layout.
template <int V, bool kNHWC>
__device__ __forceinline__ void coordinates(int e, const Args& a, int* c, int* r, int* col) {
  int ch, row, cl;
  if (kNHWC) {
    const int pix = e / a.channels;
    ch = e - pix * a.channels;
    row = pix / a.w;
    cl = pix - row * a.w;
  } else {
    const int hw = a.h * a.w;
    ch = e / hw;
    const int rem = e - ch * hw;
    row = rem / a.w;
    cl = rem - row * a.w;
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    c[k] = ch, r[k] = row, col[k] = cl;
    if (kNHWC) {
      if (++ch == a.channels) ch = 0, row += (++cl == a.w), cl = cl == a.w ? 0 : cl;
    } else {
      if (++cl == a.w) cl = 0, ch += (++row == a.h), row = row == a.h ? 0 : row;
    }
  }
}

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load(const T* x, int64_t i, int e, const Args& a) {
  return *reinterpret_cast<const Vec<T, V>*>(x + i * a.chw + e);
}

// Sample i's erase on its V values.
template <typename T, int V>
__device__ __forceinline__ void erase(Vec<T, V>& v, int64_t i, const Args& a, const int* c, const int* r,
                                      const int* col) {
  const int32_t* row = a.table + i * kColumns;
#pragma unroll
  for (int k = 0; k < V; ++k) v.v[k] = erased<T>(v.v[k], row, c[k], r[k], col[k], a.fill, a.noise, a.n_noise);
}

template <typename T, int V>
__device__ __forceinline__ void store_mixed(T* out, int64_t i, int e, const Args& a, const Vec<T, V>& own,
                                            const Vec<T, V>& other, const int* r, const int* col) {
  const int32_t* row = a.table + i * kColumns;
  Vec<T, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) o.v[k] = mixed<T>(own.v[k], other.v[k], row, a.mix, r[k], col[k]);
  *reinterpret_cast<Vec<T, V>*>(out + i * a.chw + e) = o;
}

// Every load of a group is issued before any value is used: memory-bound, the loads in flight set the speed.
template <typename T, int V, bool kNHWC>
__global__ void __launch_bounds__(kThreads) batch_ops_kernel(const T* __restrict__ x, T* __restrict__ out, Args a) {
  const int64_t vec = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (vec * V >= a.chw) return;
  const int e = static_cast<int>(vec * V);
  int c[V], r[V], col[V];
  coordinates<V, kNHWC>(e, a, c, r, col);
  const int64_t g = blockIdx.y;
  if (a.mix == kNone) {
    Vec<T, V> v = load<T, V>(x, g, e, a);
    erase<T, V>(v, g, a, c, r, col);
    *reinterpret_cast<Vec<T, V>*>(out + g * a.chw + e) = v;
  } else if (a.partner == kFlip) {
    const int64_t j = a.batch - 1 - g;
    Vec<T, V> vi = load<T, V>(x, g, e, a);
    Vec<T, V> vj = load<T, V>(x, j, e, a);
    erase<T, V>(vi, g, a, c, r, col);
    erase<T, V>(vj, j, a, c, r, col);
    store_mixed<T, V>(out, g, e, a, vi, vj, r, col);
    if (j != g) store_mixed<T, V>(out, j, e, a, vj, vi, r, col);
  } else {
    const int64_t i0 = g * kRollChunk, first = partner_of(i0, a.batch, kRoll);
    const int n = a.batch - i0 < kRollChunk ? static_cast<int>(a.batch - i0) : kRollChunk;
    Vec<T, V> v[kRollChunk + 1];  // v[0]: the sample before i0; v[k + 1]: sample i0 + k
    v[0] = load<T, V>(x, first, e, a);
#pragma unroll
    for (int k = 0; k < kRollChunk; ++k)
      if (k < n) v[k + 1] = load<T, V>(x, i0 + k, e, a);
    erase<T, V>(v[0], first, a, c, r, col);
#pragma unroll
    for (int k = 0; k < kRollChunk; ++k) {
      if (k < n) {
        erase<T, V>(v[k + 1], i0 + k, a, c, r, col);
        store_mixed<T, V>(out, i0 + k, e, a, v[k + 1], v[k], r, col);
      }
    }
  }
}

template <typename T, int V>
void launch(const T* x, T* out, const Args& a, bool nhwc, unsigned groups, cudaStream_t stream) {
  const int64_t vecs = (a.chw + V - 1) / V;
  const dim3 grid(static_cast<unsigned>((vecs + kThreads - 1) / kThreads), groups);
  if (nhwc)
    batch_ops_kernel<T, V, true><<<grid, kThreads, 0, stream>>>(x, out, a);
  else
    batch_ops_kernel<T, V, false><<<grid, kThreads, 0, stream>>>(x, out, a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void run(const at::Tensor& x, const Args& a, at::Tensor& out) {
  const int64_t groups = a.mix == kNone ? a.batch
                         : a.partner == kFlip ? (a.batch + 1) / 2
                                              : (a.batch + kRollChunk - 1) / kRollChunk;
  TORCH_CHECK(groups <= 65535, "batch_ops: batch too large for the CUDA kernel (at most 65535 groups)");
  // channels_last, unless the two layouts are the same order (C == 1, or 1 x 1 images)
  const bool nhwc = !x.is_contiguous();
  constexpr int V = sizeof(T) == 1 ? 8 : 16 / sizeof(T);  // uint8: 8 (16 costs 128 registers of coordinates)
  const T* in = x.data_ptr<T>();
  T* o = out.data_ptr<T>();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  constexpr uintptr_t kBytes = sizeof(Vec<T, V>);
  const bool aligned = a.chw % V == 0 && reinterpret_cast<uintptr_t>(in) % kBytes == 0 &&
                       reinterpret_cast<uintptr_t>(o) % kBytes == 0;
  if (aligned)
    launch<T, V>(in, o, a, nhwc, static_cast<unsigned>(groups), stream);
  else
    launch<T, 1>(in, o, a, nhwc, static_cast<unsigned>(groups), stream);
}

at::Tensor batch_ops_cuda(const at::Tensor& x, const at::Tensor& table, const at::Tensor& fill,
                          const at::Tensor& noise, int64_t mix, int64_t partner) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = prepare_batch_ops_output(x, table, fill, noise, mix, partner);
  if (out.numel() == 0) return out;
  Args a;
  a.table = table.data_ptr<int32_t>();
  a.fill = fill.numel() ? fill.data_ptr<float>() : nullptr;
  a.noise = noise.data_ptr<float>();
  a.n_noise = noise.numel();
  a.batch = x.size(0);
  a.channels = static_cast<int>(x.size(1));
  a.h = static_cast<int>(x.size(2));
  a.w = static_cast<int>(x.size(3));
  a.chw = a.channels * a.h * a.w;
  a.mix = static_cast<int>(mix);
  a.partner = static_cast<int>(partner);
  switch (x.scalar_type()) {
    case at::kFloat: run<float>(x, a, out); break;
    case at::kHalf: run<c10::Half>(x, a, out); break;
    case at::kBFloat16: run<c10::BFloat16>(x, a, out); break;
    default: run<uint8_t>(x, a, out); break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fastload, CUDA, m) { m.impl("batch_ops", &batch_ops_cuda); }

}  // namespace fastload
