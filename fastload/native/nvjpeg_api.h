// The part of nvJPEG's C API (nvjpeg.h, CUDA 12 and 13) the hardware decoder calls, declared here from NVIDIA's
// documentation so that nothing of nvJPEG is needed to build: the entry points are found with dlsym at run time.
// Same ABI as the header's: enums are passed as int (their underlying type), the opaque handles and cudaStream_t
// as pointers, nvjpegImage_t with the same layout. tests/test_nvjpeg.py checks these against nvjpeg.h where one
// is installed (test_declared_entry_points_match_nvjpeg_h).
#pragma once

#include <cstddef>

namespace fastload {

// nvjpegHandle_t, nvjpegJpegState_t and nvjpegDecodeParams_t point to these.
struct NvjpegHandle;
struct NvjpegState;
struct NvjpegParams;

// nvjpegImage_t: NVJPEG_MAX_COMPONENT = 4 channel pointers, then their 4 pitches.
struct NvjpegImage {
  unsigned char* channel[4];
  size_t pitch[4];
};

using NvjpegStatus = int;                 // nvjpegStatus_t: 0 = NVJPEG_STATUS_SUCCESS, 1-10 errors
constexpr int kBackendHardware = 3;       // nvjpegBackend_t NVJPEG_BACKEND_HARDWARE
constexpr int kOutputRgbInterleaved = 5;  // nvjpegOutputFormat_t NVJPEG_OUTPUT_RGBI

// The entry points, named after their symbols.
struct NvjpegApi {
  // nvjpegCreateEx(backend, nvjpegDevAllocator_t*, nvjpegPinnedAllocator_t*, flags, nvjpegHandle_t*)
  NvjpegStatus (*nvjpegCreateEx)(int, void*, void*, unsigned int, NvjpegHandle**);
  NvjpegStatus (*nvjpegDestroy)(NvjpegHandle*);
  NvjpegStatus (*nvjpegJpegStateCreate)(NvjpegHandle*, NvjpegState**);
  NvjpegStatus (*nvjpegJpegStateDestroy)(NvjpegState*);
  NvjpegStatus (*nvjpegDecodeParamsCreate)(NvjpegHandle*, NvjpegParams**);
  NvjpegStatus (*nvjpegDecodeParamsDestroy)(NvjpegParams*);
  NvjpegStatus (*nvjpegDecodeParamsSetOutputFormat)(NvjpegParams*, int);
  // (params, offset_x, offset_y, roi_width, roi_height)
  NvjpegStatus (*nvjpegDecodeParamsSetROI)(NvjpegParams*, int, int, int, int);
  // (handle, state, batch_size, max_cpu_threads, output_format)
  NvjpegStatus (*nvjpegDecodeBatchedInitialize)(NvjpegHandle*, NvjpegState*, int, int, int);
  // (handle, state, data, lengths, destinations, decode_params, stream)
  NvjpegStatus (*nvjpegDecodeBatchedEx)(NvjpegHandle*, NvjpegState*, const unsigned char* const*, const size_t*,
                                        NvjpegImage*, NvjpegParams**, void*);
};

}  // namespace fastload
