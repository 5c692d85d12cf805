// nvJPEG's HARDWARE backend through dlopen (the entry points: nvjpeg_api.h), so nothing of nvJPEG is needed to
// build. The device is set through c10's device
// guard (CUDA's, registered by libtorch_cuda at run time), so this file needs no CUDA header either and compiles
// in every build; where torch has no CUDA, making a decoder fails with an NvjpegError saying so.
#include "nvjpeg_decoder.h"

#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <memory>

namespace fastload {

namespace {

// The same words as fastload.nvjpeg has always used for nvjpegStatus_t.
const char* status_text(NvjpegStatus status) {
  switch (status) {
    case 1: return "not initialized";
    case 2: return "invalid parameter";
    case 3: return "bad JPEG";
    case 4: return "JPEG not supported";
    case 5: return "allocator failure";
    case 6: return "execution failed";
    case 7: return "architecture mismatch (no hardware decoder)";
    case 8: return "internal error";
    case 9: return "implementation not supported";
    case 10: return "incomplete bitstream";
    default: return "unknown";
  }
}

[[noreturn]] void fail(const char* what, NvjpegStatus status) {
  char message[300];
  std::snprintf(message, sizeof(message), "%s: nvJPEG status %d (%s)", what, status, status_text(status));
  throw NvjpegError(message);
}

void check(NvjpegStatus status, const char* what) {
  if (status != 0) fail(what, status);
}

template <typename Fn>
void resolve(void* library, const std::string& path, const char* name, Fn* fn) {
  ::dlerror();
  void* symbol = ::dlsym(library, name);
  if (symbol == nullptr)
    throw NvjpegError(path + " is not a usable libnvjpeg: it has no " + name + " (an older or other library)");
  *fn = reinterpret_cast<Fn>(symbol);
}

// The current CUDA device of the calling thread, through the CUDA device guard torch registered.
int current_cuda_device() {
  try {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
  } catch (const c10::Error& e) {
    throw NvjpegError(std::string("CUDA is not available: ") + e.what_without_backtrace());
  }
}

// Makes `device` the calling thread's current one for the scope (nvJPEG works on the current device), and
// restores the previous one after. A CUDA failure is an NvjpegError too.
class OnDevice {
 public:
  explicit OnDevice(int device)
  try : guard_(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device))) {
  } catch (const c10::Error& e) {
    throw NvjpegError(std::string("CUDA: cannot make device ") + std::to_string(device) + " current: " +
                      e.what_without_backtrace());
  }

 private:
  c10::DeviceGuard guard_;
};

}  // namespace

const NvjpegApi& load_nvjpeg(const std::string& path) {
  static std::mutex mutex;
  // Never destroyed: decoders alive at exit still point into it.
  static auto* loaded = new std::map<std::string, std::unique_ptr<NvjpegApi>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto found = loaded->find(path);
  if (found != loaded->end()) return *found->second;
  ::dlerror();
  void* library = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    throw NvjpegError("cannot load libnvjpeg " + path + ": " + (why ? why : "dlopen failed"));
  }
  auto api = std::make_unique<NvjpegApi>();
#define FL_RESOLVE(name) resolve(library, path, #name, &api->name)
  try {
    FL_RESOLVE(nvjpegCreateEx);
    FL_RESOLVE(nvjpegDestroy);
    FL_RESOLVE(nvjpegJpegStateCreate);
    FL_RESOLVE(nvjpegJpegStateDestroy);
    FL_RESOLVE(nvjpegDecodeParamsCreate);
    FL_RESOLVE(nvjpegDecodeParamsDestroy);
    FL_RESOLVE(nvjpegDecodeParamsSetOutputFormat);
    FL_RESOLVE(nvjpegDecodeParamsSetROI);
    FL_RESOLVE(nvjpegDecodeBatchedInitialize);
    FL_RESOLVE(nvjpegDecodeBatchedEx);
#undef FL_RESOLVE
  } catch (...) {
    ::dlclose(library);
    throw;
  }
  // The library stays loaded from here on (as ctypes left it): nvJPEG keeps CUDA resources and threads, and
  // unloading it under a live CUDA context is not worth the risk.
  return *loaded->emplace(path, std::move(api)).first->second;
}

NvjpegDecoder::NvjpegDecoder(const std::string& library, int max_batch) : api_(load_nvjpeg(library)) {
  device_ = current_cuda_device();
  OnDevice on(device_);
  try {
    NvjpegHandle* handle = nullptr;
    check(api_.nvjpegCreateEx(kBackendHardware, nullptr, nullptr, 0, &handle),
          "the hardware decoder is not available (nvjpegCreateEx)");
    handle_ = handle;
    NvjpegState* state = nullptr;
    check(api_.nvjpegJpegStateCreate(handle_, &state), "nvjpegJpegStateCreate");
    state_ = state;
    grow(static_cast<size_t>(std::max(max_batch, 0)));
  } catch (...) {
    release();  // no destructor runs for a constructor that throws
    throw;
  }
}

NvjpegDecoder::~NvjpegDecoder() {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handle_ == nullptr) return;
    OnDevice on(device_);
    release();
  } catch (...) {  // at interpreter exit CUDA may be gone already: nothing left to do about it
  }
}

void NvjpegDecoder::grow(size_t n) {
  while (params_.size() < n) {
    NvjpegParams* params = nullptr;
    check(api_.nvjpegDecodeParamsCreate(handle_, &params), "nvjpegDecodeParamsCreate");
    params_.push_back(params);
    check(api_.nvjpegDecodeParamsSetOutputFormat(params, kOutputRgbInterleaved), "nvjpegDecodeParamsSetOutputFormat");
  }
}

int NvjpegDecoder::release() noexcept {
  int first = 0;
  auto keep = [&first](NvjpegStatus status) {
    if (first == 0) first = status;
  };
  for (NvjpegParams* p : params_) keep(api_.nvjpegDecodeParamsDestroy(p));
  params_.clear();
  if (state_ != nullptr) keep(api_.nvjpegJpegStateDestroy(state_));
  if (handle_ != nullptr) keep(api_.nvjpegDestroy(handle_));
  state_ = nullptr;
  handle_ = nullptr;
  batch_ = 0;
  return first;
}

void NvjpegDecoder::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (handle_ == nullptr) return;
  OnDevice on(device_);
  check(release(), "closing the decoder (nvjpegDecodeParamsDestroy, nvjpegJpegStateDestroy, nvjpegDestroy)");
}

void NvjpegDecoder::decode(const std::vector<NvjpegCrop>& crops, void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (handle_ == nullptr) throw NvjpegError("the decoder is closed");
  const size_t n = crops.size();
  if (n == 0) return;
  if (n > static_cast<size_t>(INT_MAX)) throw NvjpegError("a batch of more than INT_MAX images");
  OnDevice on(device_);
  grow(n);
  data_.resize(n);
  lengths_.resize(n);
  images_.assign(n, NvjpegImage{});
  for (size_t i = 0; i < n; ++i) {
    const NvjpegCrop& c = crops[i];
    data_[i] = c.data;
    lengths_[i] = c.size;
    images_[i].channel[0] = c.dst;  // RGBI: one interleaved plane
    images_[i].pitch[0] = static_cast<size_t>(c.width) * 3;
    check(api_.nvjpegDecodeParamsSetROI(params_[i], c.left, c.top, c.width, c.height), "nvjpegDecodeParamsSetROI");
  }
  const int batch = static_cast<int>(n);
  if (batch != batch_) {  // nvJPEG's batched state is sized for one batch size
    batch_ = 0;
    check(api_.nvjpegDecodeBatchedInitialize(handle_, state_, batch, 1, kOutputRgbInterleaved),
          "nvjpegDecodeBatchedInitialize");
    batch_ = batch;
  }
  const NvjpegStatus status =
      api_.nvjpegDecodeBatchedEx(handle_, state_, data_.data(), lengths_.data(), images_.data(), params_.data(), stream);
  if (status != 0) {
    batch_ = 0;  // "if the batch decoding fails, call nvjpegDecodeBatchedInitialize() again"
    fail("nvjpegDecodeBatchedEx", status);
  }
}

}  // namespace fastload
