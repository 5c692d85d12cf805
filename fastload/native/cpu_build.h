// Which build of the CPU kernels runs. Each kernel with a fast path for AVX2 (warp_cpu.cpp's rows and general
// warp, affine_nearest_cpu.cpp's gather, augment_cpu.cpp's AVX2 + FMA photometric build) takes it where the CPU has
// the instructions, unless FASTLOAD_WARP_BASELINE=1 asks for the baseline code: the tests run both builds on one
// machine and compare their bits. Read at each call, so a test can switch builds.
#pragma once
#include <cstdlib>
#include <cstring>

namespace fastload {

inline bool baseline_build_requested() {
  const char* value = std::getenv("FASTLOAD_WARP_BASELINE");
  return value && std::strcmp(value, "1") == 0;
}

}  // namespace fastload
