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
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
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

// nvJPEG's device and pinned allocations, made through the CUDA driver torch has loaded (what nvJPEG's default
// cudaMalloc / cudaHostAlloc do) and counted: a cudaFree or cudaFreeHost waits for the whole device, so one
// inside a training loop stalls the model's stream; the counts say whether nvJPEG makes any after its first
// batches. Where libcuda cannot be found the decoder keeps nvJPEG's own allocators (and counts nothing).
struct DriverMemory {
  int (*mem_alloc)(unsigned long long*, size_t) = nullptr;    // cuMemAlloc_v2
  int (*mem_free)(unsigned long long) = nullptr;              // cuMemFree_v2
  int (*host_alloc)(void**, size_t, unsigned int) = nullptr;  // cuMemHostAlloc (cudaHostAlloc's flag values)
  int (*host_free)(void*) = nullptr;                          // cuMemFreeHost
  bool usable() const { return mem_alloc && mem_free && host_alloc && host_free; }
};

const DriverMemory& driver_memory() {
  static const DriverMemory memory = [] {
    DriverMemory m;
    void* cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);  // only the one already loaded
    if (cuda == nullptr) return m;
    m.mem_alloc = reinterpret_cast<decltype(m.mem_alloc)>(::dlsym(cuda, "cuMemAlloc_v2"));
    m.mem_free = reinterpret_cast<decltype(m.mem_free)>(::dlsym(cuda, "cuMemFree_v2"));
    m.host_alloc = reinterpret_cast<decltype(m.host_alloc)>(::dlsym(cuda, "cuMemHostAlloc"));
    m.host_free = reinterpret_cast<decltype(m.host_free)>(::dlsym(cuda, "cuMemFreeHost"));
    return m;
  }();
  return memory;
}

std::atomic<long long> counts[6];  // device allocs, frees, bytes; pinned allocs, frees, bytes

int device_alloc(void** p, size_t size) {
  unsigned long long address = 0;
  const int status = driver_memory().mem_alloc(&address, size);
  *p = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
  counts[0]++;
  counts[2] += static_cast<long long>(size);
  return status;
}
int device_free(void* p) {
  counts[1]++;
  return driver_memory().mem_free(static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
}
int pinned_alloc(void** p, size_t size, unsigned int flags) {
  counts[3]++;
  counts[5] += static_cast<long long>(size);
  return driver_memory().host_alloc(p, size, flags);
}
int pinned_free(void* p) {
  counts[4]++;
  return driver_memory().host_free(p);
}

struct DeviceAllocator {  // nvjpegDevAllocator_t
  int (*dev_malloc)(void**, size_t);
  int (*dev_free)(void*);
};
struct PinnedAllocator {  // nvjpegPinnedAllocator_t
  int (*pinned_malloc)(void**, size_t, unsigned int);
  int (*pinned_free)(void*);
};
DeviceAllocator counted_device{device_alloc, device_free};
PinnedAllocator counted_pinned{pinned_alloc, pinned_free};

// EXPERIMENT (twenty-sixth session): FASTLOAD_NVJPEG_FORMAT=1 asks for YUV planes (speed only: wrong pixels)
int output_format() {
  const char* format = std::getenv("FASTLOAD_NVJPEG_FORMAT");
  return format ? std::atoi(format) : kOutputRgbInterleaved;
}

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
    // EXPERIMENT (twenty-sixth session): counted allocators and nvJPEG's memory padding, by environment only
    const bool counted = std::getenv("FASTLOAD_NVJPEG_COUNT") != nullptr && driver_memory().usable();
    check(api_.nvjpegCreateEx(kBackendHardware, counted ? &counted_device : nullptr,
                              counted ? &counted_pinned : nullptr, 0, &handle),
          "the hardware decoder is not available (nvjpegCreateEx)");
    handle_ = handle;
    if (const char* padding = std::getenv("FASTLOAD_NVJPEG_PADDING")) {
      void* lib = ::dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
      using SetPadding = NvjpegStatus (*)(size_t, NvjpegHandle*);
      auto device_padding = reinterpret_cast<SetPadding>(::dlsym(lib, "nvjpegSetDeviceMemoryPadding"));
      auto pinned_padding = reinterpret_cast<SetPadding>(::dlsym(lib, "nvjpegSetPinnedMemoryPadding"));
      const size_t bytes = std::strtoull(padding, nullptr, 10);
      if (device_padding == nullptr || pinned_padding == nullptr) throw NvjpegError("no nvjpegSet*MemoryPadding");
      check(device_padding(bytes, handle_), "nvjpegSetDeviceMemoryPadding");
      check(pinned_padding(bytes, handle_), "nvjpegSetPinnedMemoryPadding");
    }
    NvjpegState* state = nullptr;
    check(api_.nvjpegJpegStateCreate(handle_, &state), "nvjpegJpegStateCreate");
    state_ = state;
    grow(static_cast<size_t>(std::max(max_batch, 0)));
  } catch (...) {
    release();  // no destructor runs for a constructor that throws
    throw;
  }
}

std::vector<long long> nvjpeg_allocations() {
  std::vector<long long> out;
  for (auto& c : counts) out.push_back(c.load());
  return out;
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
    check(api_.nvjpegDecodeParamsSetOutputFormat(params, output_format()), "nvjpegDecodeParamsSetOutputFormat");
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
    if (output_format() == 1) {  // EXPERIMENT: YUV planes, each width x height (room for any subsampling)
      const size_t plane = static_cast<size_t>(c.width) * c.height;
      for (int k = 0; k < 3; ++k) {
        images_[i].channel[k] = c.dst + k * plane;
        images_[i].pitch[k] = static_cast<size_t>(c.width);
      }
    }
    check(api_.nvjpegDecodeParamsSetROI(params_[i], c.left, c.top, c.width, c.height), "nvjpegDecodeParamsSetROI");
  }
  const int batch = static_cast<int>(n);
  if (batch != batch_) {  // nvJPEG's batched state is sized for one batch size
    batch_ = 0;
    check(api_.nvjpegDecodeBatchedInitialize(handle_, state_, batch, 1, output_format()),
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
