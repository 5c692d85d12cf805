// The GPU's hardware JPEG decoder (nvJPEG's HARDWARE backend) behind one small class. libnvjpeg is opened at run
// time (dlopen): no header or link-time dependency, so fastload builds and imports where it is absent. Plain C++:
// the Python glue (buffers, tensors, validation, the GIL) is in bindings.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "nvjpeg_api.h"

namespace fastload {

// libnvjpeg is missing or is not libnvjpeg, or a nvJPEG or CUDA call failed. Python sees fastload.nvjpeg.NvjpegError.
struct NvjpegError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Opens libnvjpeg at `path` (a path, or a name the dynamic loader resolves) and resolves every entry point the
// decoder uses; the library then stays loaded for the process's life. Cached per path. Throws NvjpegError naming
// the path, or the missing symbol.
const NvjpegApi& load_nvjpeg(const std::string& path);

// One crop of one JPEG: the bitstream (host memory), the window in image pixels, and where its pixels go (device
// memory, interleaved RGB rows of width * 3 bytes, back to back).
struct NvjpegCrop {
  const uint8_t* data;
  size_t size;
  int top, left, height, width;
  uint8_t* dst;
};

// One nvJPEG handle + JPEG state + a pool of per-image decode parameters, on the CUDA device that was current
// when it was made. Calls are serialised by a mutex (one batch at a time, close() waits for a decode); make one
// per concurrent user for parallel decodes. Every method may be called without the GIL. Hidden, like the pybind11
// types that bind it: it is not part of the extension's interface.
class __attribute__((visibility("hidden"))) NvjpegDecoder {
 public:
  NvjpegDecoder(const std::string& library, int max_batch);
  ~NvjpegDecoder();
  NvjpegDecoder(const NvjpegDecoder&) = delete;
  NvjpegDecoder& operator=(const NvjpegDecoder&) = delete;

  // Decodes every crop, in one nvjpegDecodeBatchedEx on `stream` (a cudaStream_t of this decoder's device).
  // Asynchronous: the pixels are there once the stream gets past this point; the bitstreams must stay valid until
  // the call returns. Throws NvjpegError.
  void decode(const std::vector<NvjpegCrop>& crops, void* stream);
  // Destroys the nvJPEG objects; idempotent. Throws NvjpegError when a destroy call failed (all are made).
  void close();
  int device() const { return device_; }

 private:
  void grow(size_t n);
  int release() noexcept;  // destroys everything; the first failing status, or 0

  const NvjpegApi& api_;
  int device_ = -1;
  NvjpegHandle* handle_ = nullptr;
  NvjpegState* state_ = nullptr;
  std::vector<NvjpegParams*> params_;  // one per image of the largest batch so far
  int batch_ = 0;                      // the batch size the state was initialised for; 0: initialise again
  // nvjpegDecodeBatchedEx's per-batch arrays, kept between batches (no allocation per batch)
  std::vector<const unsigned char*> data_;
  std::vector<size_t> lengths_;
  std::vector<NvjpegImage> images_;
  std::mutex mutex_;
};

}  // namespace fastload
