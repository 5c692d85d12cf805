// zlib's crc32_z runs at ~2 GB/s: 23 us for a 50 KB JPEG, 2-4% of the cores' time per image on a store (perf,
// bench/RESULTS.md). Folding 64 bytes at a time with carry-less multiplies (PCLMULQDQ: Intel's "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ Instruction", with the folding and Barrett constants of
// the reflected polynomial 0xEDB88320 as Linux's arch/x86/crypto/crc32-pclmul_asm.S has them) gives the same
// value several times faster. zlib covers the rest: CPUs without PCLMULQDQ, short buffers, the tail.
#include "crc32.h"

#include <zlib.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FL_CRC_PCLMUL 1
#else
#define FL_CRC_PCLMUL 0
#endif

namespace fastload {

namespace {

#if FL_CRC_PCLMUL
#define FL_PCLMUL_TARGET __attribute__((target("pclmul,sse4.1")))

FL_PCLMUL_TARGET inline __m128i load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// x (128 bits of the message's remainder so far) moved forward over 128 bits by k's two constants, plus next.
FL_PCLMUL_TARGET inline __m128i fold16(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

// The CRC register without zlib's inversions, `state`, carried over the n bytes at p (n >= 64, a multiple of 16).
FL_PCLMUL_TARGET uint32_t fold(uint32_t state, const uint8_t* p, size_t n) {
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);  // x^(4*128+32), x^(4*128-32) mod P, reflected
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);  // x^(128+32), x^(128-32)
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);               // x^64
  const __m128i barrett = _mm_set_epi64x(0x1f7011641, 0x1db710641);  // floor(x^64 / P), P
  const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
  __m128i x1 = _mm_xor_si128(load16(p), _mm_cvtsi32_si128(static_cast<int>(state)));
  __m128i x2 = load16(p + 16), x3 = load16(p + 32), x4 = load16(p + 48);
  for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {  // four independent lanes of 128 bits
    x1 = fold16(x1, k1k2, load16(p));
    x2 = fold16(x2, k1k2, load16(p + 16));
    x3 = fold16(x3, k1k2, load16(p + 32));
    x4 = fold16(x4, k1k2, load16(p + 48));
  }
  x1 = fold16(fold16(fold16(x1, k3k4, x2), k3k4, x3), k3k4, x4);  // the four into one
  for (; n >= 16; p += 16, n -= 16) x1 = fold16(x1, k3k4, load16(p));
  // 128 -> 64 bits (appending 32 zero bits), 64 -> 32, then the Barrett reduction to the 32-bit remainder
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(k3k4, x1, 0x01));
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00), _mm_srli_si128(x1, 4));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), barrett, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(t, x1), 1));
}

bool has_pclmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}
#endif

uint32_t zlib_crc32(uint32_t crc, const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(::crc32_z(crc, p, n));
}

}  // namespace

uint32_t crc32_ieee(const uint8_t* data, size_t size) {
#if FL_CRC_PCLMUL
  if (size >= 256 && has_pclmul()) {  // below, the fold's fixed cost is not worth it
    const size_t folded = size & ~size_t(15);
    const uint32_t state = fold(0xffffffffu, data, folded);  // zlib starts from ~0 and inverts at the end
    return zlib_crc32(~state, data + folded, size - folded);  // the tail: zlib carries ~crc in, inverts it back
  }
#endif
  return zlib_crc32(0, data, size);
}

}  // namespace fastload
