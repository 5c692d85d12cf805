// pybind11 side of fastload._C: what is not a tensor op (byte buffers in, header structs and per-sample
// status out). The batch decoder takes any list of buffers (bytes, memoryviews of LMDB pages, uint8
// tensors) without copying them, releases the GIL, and decodes on native threads into one ragged buffer.
#include <torch/extension.h>

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <exception>
#include <array>
#include <atomic>
#include <chrono>
#include <string>
#include <memory>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include <cstdio>
#include <jpeglib.h>

#include "check.h"
#include "crc32.h"
#include "exit_guard.h"
#include "jpeg_decoder.h"
#include "jpeg_regions.h"
#include "jpeg_transcode.h"
#include "nvjpeg_decoder.h"

#ifndef FASTLOAD_SOURCE_HASH
#define FASTLOAD_SOURCE_HASH "unknown"
#endif

namespace py = pybind11;
using namespace fastload;

namespace fastload {
size_t release_cpu_outputs();  // warp_cpu.cpp: the batch outputs' host pool
}

namespace {

// The interpreter's main thread (set when the module loads), which runs the interpreter's finalisation.
unsigned long main_thread_ident = 0;

// Whether the interpreter's finalisation has begun (readable without the GIL). Not earlier, at fastload's atexit
// handler say: a daemon thread of the user's that calls an op after it may still be joined by a later atexit
// handler, and must return to it.
bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Releases the GIL around native work, like py::gil_scoped_release, and at interpreter exit stays put
// (stay_if_exiting) instead of taking it back. (The main thread finalises: it may take the GIL back, e.g. in a
// destructor run at exit.)
class ReleasedGil {
 public:
  ReleasedGil() : state_(PyEval_SaveThread()) {}
  ~ReleasedGil() {
    stay_if_exiting();
    PyEval_RestoreThread(state_);
  }
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;

 private:
  PyThreadState* state_;
};

constexpr size_t kMessageSize = 200;
constexpr int kMaxThreads = 256;  // a bound, whatever the caller asks for

struct Bytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

constexpr int64_t kDefaultMaxBytes = int64_t(256) << 20;  // per image: no JPEG worth training on is larger

// Opens a file with the reader's rules: non-blocking (a FIFO or device put where an image was must not block the
// open; fstat then refuses it), regular files only, at most max_bytes. kOk with *fd open and *bytes its size, or
// kUnreadable (nothing left open).
// A read that failed for want of descriptors or memory (the process's limits, not the file): kNoResources, which
// the loader raises whatever on_error says, since skipping would replace good samples.
int read_failure(int err) {
  return (err == EMFILE || err == ENFILE || err == ENOMEM || err == ENOBUFS) ? kNoResources : kUnreadable;
}

int open_file(const std::string& path, int64_t max_bytes, int* fd, int64_t* bytes, char* message, size_t size) {
  *fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (*fd < 0) {
    const int err = errno;
    std::snprintf(message, size, "cannot read: %s", std::strerror(err));
    return read_failure(err);
  }
  struct stat st;
  int status = kOk;
  if (::fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    std::snprintf(message, size, "cannot read: not a regular file");
    status = kUnreadable;
  } else if (st.st_size > max_bytes) {
    std::snprintf(message, size, "file is %lld bytes, over the per-image limit of %lld",
                  static_cast<long long>(st.st_size), static_cast<long long>(max_bytes));
    status = kUnreadable;
  }
  if (status != kOk) {
    ::close(*fd);
    *fd = -1;
    return status;
  }
  *bytes = static_cast<int64_t>(st.st_size);
  return kOk;
}

// Reads exactly n bytes of fd into dst, then closes fd. Returns a Status.
int read_all(int fd, uint8_t* dst, size_t n, char* message, size_t size) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::read(fd, dst + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : 0;
      std::snprintf(message, size, "cannot read: %s", got < 0 ? std::strerror(err) : "file shrank while reading");
      ::close(fd);
      return got < 0 ? read_failure(err) : kUnreadable;
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  return kOk;
}

// Reads a whole file into out (reused across calls by the caller's thread). Returns a Status.
int read_file(const std::string& path, int64_t max_bytes, std::vector<uint8_t>& out, char* message, size_t size) {
  int fd = -1;
  int64_t bytes = 0;
  const int status = open_file(path, max_bytes, &fd, &bytes, message, size);
  if (status != kOk) return status;
  out.resize(static_cast<size_t>(bytes));
  return read_all(fd, out.data(), out.size(), message, size);
}

// A Python error with a printf-formatted message, raised with the GIL held.
template <typename Error>
[[noreturn]] __attribute__((format(printf, 1, 2))) void raise(const char* format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  throw Error(message);
}

// Py_buffer views taken for one call, released at its end (every caller holds the GIL then), also when
// BufferViews' constructor throws half way.
struct HeldBuffers {
  std::vector<Py_buffer> views;
  ~HeldBuffers() {
    for (auto& v : views) PyBuffer_Release(&v);
  }
};

// Holds the buffer views alive for the duration of a call. Buffers must be C-contiguous: the native code reads
// `len` bytes from the start, so a strided or reversed view would give it other bytes (or none of its own). A
// str item is a file path (where the op allows them), read by the native worker that needs it (no GIL, no
// Python file objects).
class BufferViews {
 public:
  BufferViews(const py::sequence& items, const char* op, bool paths_allowed, bool single = false)
      : op_(op), single_(single) {
    const size_t n = items.size();
    held_.views.reserve(n);  // no reallocation: the Bytes point into these views' buffers, not at them
    bytes_.reserve(n);
    paths_.resize(n);
    is_path_.assign(n, false);
    for (size_t i = 0; i < n; ++i) {
      const py::object item = items[i];
      if (py::isinstance<py::str>(item)) {
        if (!paths_allowed)
          raise<py::type_error>("%s: %s is a str; this op takes bytes (read the file first)", op, label(i).c_str());
        paths_[i] = fs_path(item);
        is_path_[i] = true;
        // open() would stop at the NUL and read another file than the one named (Python's open refuses it)
        if (paths_[i].find('\0') != std::string::npos)
          raise<py::value_error>("%s: %s: a file path with an embedded NUL byte", op, label(i).c_str());
        bytes_.push_back({});
      } else {
        bytes_.push_back(view(item, i, paths_allowed));
      }
    }
  }
  // The one argument `data` of a single-sample op.
  BufferViews(const py::object& data, const char* op, bool paths_allowed)
      : BufferViews(py::make_tuple(data), op, paths_allowed, true) {}
  const Bytes& operator[](size_t i) const { return bytes_[i]; }
  size_t size() const { return bytes_.size(); }
  bool is_path(size_t i) const { return is_path_[i]; }
  const std::string& path(size_t i) const { return paths_[i]; }
  // The bytes of item i: the buffer, or the file read into `scratch`. Returns a Status.
  int load(size_t i, int64_t max_bytes, std::vector<uint8_t>& scratch, Bytes* out, char* message,
           size_t size) const {
    if (!is_path_[i]) {
      *out = bytes_[i];
      if (static_cast<int64_t>(out->size) > max_bytes) {
        std::snprintf(message, size, "buffer is %zu bytes, over the per-image limit of %lld", out->size,
                      static_cast<long long>(max_bytes));
        return kUnreadable;
      }
      return kOk;
    }
    const int status = read_file(paths_[i], max_bytes, scratch, message, size);
    *out = {scratch.data(), scratch.size()};
    return status;
  }

 private:
  Bytes view(const py::handle& item, size_t index, bool paths_allowed) {
    if (THPVariable_Check(item.ptr())) {
      const at::Tensor t = THPVariable_Unpack(item.ptr());
      if (!(t.scalar_type() == at::kByte && t.device().is_cpu() && t.is_contiguous()))
        raise<py::value_error>("%s: %s: a tensor buffer must be a contiguous uint8 CPU tensor", op_,
                               label(index).c_str());
      tensors_.push_back(t);  // the list may drop it while the GIL is released: the call keeps it alive
      return {t.data_ptr<uint8_t>(), static_cast<size_t>(t.numel())};
    }
    if (!PyObject_CheckBuffer(item.ptr()))
      raise<py::type_error>("%s: %s is a %s; expected a bytes-like object or a uint8 tensor%s", op_,
                            label(index).c_str(), Py_TYPE(item.ptr())->tp_name,
                            paths_allowed ? " or a str file path" : "");
    Py_buffer v;
    if (PyObject_GetBuffer(item.ptr(), &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      raise<py::value_error>("%s: %s is not C-contiguous (a strided or reversed view); pass a contiguous copy, "
                             "e.g. bytes(view) or array.copy()", op_, label(index).c_str());
    }
    held_.views.push_back(v);
    if (v.itemsize != 1 && v.len != 0)
      raise<py::value_error>("%s: %s: expected bytes, got items of size %zd", op_, label(index).c_str(),
                             static_cast<ssize_t>(v.itemsize));
    return {static_cast<const uint8_t*>(v.buf), static_cast<size_t>(v.len)};
  }
  std::string label(size_t index) const { return single_ ? "data" : "buffer " + std::to_string(index); }
  // A str path as the file system's bytes: os.fsencode's encoding, so a name that is not valid UTF-8 (listed by
  // os.scandir as surrogate escapes) reaches open() as the bytes on disk (a plain UTF-8 cast refuses it).
  static std::string fs_path(const py::handle& item) {
    const py::object encoded = py::reinterpret_steal<py::object>(PyUnicode_EncodeFSDefault(item.ptr()));
    if (!encoded) throw py::error_already_set();
    return std::string(PyBytes_AS_STRING(encoded.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(encoded.ptr())));
  }
  const char* op_;
  bool single_;
  HeldBuffers held_;
  std::vector<at::Tensor> tensors_;
  std::vector<Bytes> bytes_;
  std::vector<std::string> paths_;
  std::vector<bool> is_path_;
};

Limits make_limits(bool strict, int64_t max_pixels) {
  Limits limits;
  limits.strict = strict;
  if (max_pixels > 0) limits.max_pixels = max_pixels;
  return limits;
}

// Decode threads run this much nicer than the caller: under full load the training loop's own thread (which
// launches the model's kernels) keeps its core instead of queueing behind decoders.
constexpr int kDecodeNice = 5;

void lower_priority() {
#ifdef __linux__
  const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (errno == 0) ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), current + kDecodeNice);  // best effort
#endif
}

// Runs job(i) for i in [0, n) on up to `threads` native threads. Threads are made per call: no pool survives
// a fork into a DataLoader worker, and the cost (~20 us each) is noise next to a batch of decodes. One
// thread runs inline on the caller's. An exception escaping a native thread would terminate the process, so
// each job's (e.g. std::bad_alloc from reading a file) goes to fail(i, what): that sample's error, not a crash.
template <typename Job, typename Fail>
void run_parallel(int64_t n, int threads, const Job& job, const Fail& fail) {
  threads = std::max(1, std::min<int>({threads, kMaxThreads, static_cast<int>(std::max<int64_t>(n, 1))}));
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next++; i < n; i = next++) {
      try {
        job(i);
      } catch (const std::bad_alloc&) {
        fail(i, "out of memory (std::bad_alloc)");
      } catch (const std::exception& e) {
        fail(i, e.what());
      } catch (...) {
        fail(i, "unknown native exception");
      }
    }
  };
  if (threads == 1) return worker();
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    try {
      pool.emplace_back([&] {
        lower_priority();
        worker();
      });
    } catch (const std::system_error&) {
      break;  // fewer threads than asked: the work still gets done
    }
  }
  if (pool.empty()) worker();
  for (auto& t : pool) t.join();
}

// Per-sample status and message of a batch op; fail() is run_parallel's: a native exception as kInternal.
struct Outcomes {
  explicit Outcomes(int64_t n) : status(at::full({n}, kNotDecoded, at::kInt)), messages(n) {
    for (auto& m : messages) m[0] = '\0';
  }
  int32_t* st() { return status.data_ptr<int32_t>(); }
  char* message(int64_t i) { return messages[i].data(); }
  void fail(int64_t i, const char* what) {
    status.data_ptr<int32_t>()[i] = kInternal;
    std::snprintf(messages[i].data(), kMessageSize, "native error: %s", what);
  }
  py::list message_list() const {
    py::list out;
    for (auto& m : messages) out.append(std::string(m.data()));
    return out;
  }
  at::Tensor status;
  std::vector<std::array<char, kMessageSize>> messages;
};

// Window i of an int64 [n, 5] table. A downscale outside int32 becomes 0 (reported as a bad window) instead of
// being cut to its low 32 bits, which could read as a valid 1, 2, 4 or 8.
Window window_at(const int64_t* wp, int64_t i) {
  const int64_t d = wp[i * 5 + 4];
  return {wp[i * 5], wp[i * 5 + 1], wp[i * 5 + 2], wp[i * 5 + 3],
          d >= INT32_MIN && d <= INT32_MAX ? static_cast<int32_t>(d) : 0};
}

// The CRC-32 check of decode_crops and verify_jpegs: false (and a kCorrupt message) on a mismatch.
bool crc_matches(const Bytes& src, const int64_t* expected, int64_t i, char* message) {
  if (!expected || expected[i] < 0) return true;
  const uint32_t crc = fastload::crc32_ieee(src.data, src.size);
  if (crc == static_cast<uint32_t>(expected[i])) return true;
  std::snprintf(message, kMessageSize,
                "checksum mismatch: CRC-32 %08x, the store recorded %08x (bytes changed since packing)", crc,
                static_cast<uint32_t>(expected[i]));
  return false;
}

// Sample i's bytes for decode_crops and verify_jpegs: loaded (a file read into `file`), then checked against its
// CRC-32 when one was given. kOk, or the status whose reason is in `message`.
int32_t load_checked(BufferViews& views, int64_t i, int64_t max_bytes, std::vector<uint8_t>& file, Bytes* src,
                     const int64_t* expected, char* message) {
  const int32_t status = views.load(i, max_bytes, file, src, message, kMessageSize);
  if (status != kOk) return status;
  return crc_matches(*src, expected, i, message) ? kOk : kCorrupt;
}

// crcs as int64 [n] (kept alive in `holder`), or nullptr when not given.
const int64_t* crc_table(const c10::optional<at::Tensor>& crcs, int64_t n, const char* op, at::Tensor* holder) {
  if (!crcs.has_value()) return nullptr;
  FL_CHECK(crcs->device().is_cpu() && !at::isFloatingType(crcs->scalar_type()) && !crcs->is_complex(),
           "%s: crcs must be an integer CPU tensor", op);
  *holder = crcs->to(at::kLong).contiguous();
  FL_CHECK(holder->numel() == n, "%s: %lld crcs for %lld buffers", op, static_cast<long long>(holder->numel()),
           static_cast<long long>(n));
  const int64_t* values = holder->data_ptr<int64_t>();
  // Only -1 means unchecked: a CRC column kept as int32 turns half the CRCs negative, which must not pass as
  // "unchecked" (nor a value past 2^32 as its low 32 bits).
  for (int64_t i = 0; i < n; ++i)
    FL_CHECK(values[i] == -1 || (values[i] >= 0 && values[i] <= 0xFFFFFFFFLL),
             "%s: crcs[%lld] = %lld is no CRC-32 (0 to 2^32 - 1, or -1 for unchecked); a CRC stored as int32 must be "
             "read back as uint32", op, static_cast<long long>(i), static_cast<long long>(values[i]));
  return values;
}

py::dict header_dict(int status, const char* message, const JpegHeader& h) {
  py::dict d;
  d["status"] = status;
  d["message"] = std::string(message);
  d["height"] = h.height;
  d["width"] = h.width;
  d["components"] = h.components;
  d["color_space"] = h.color_space;
  d["h_samp"] = h.h_samp;
  d["v_samp"] = h.v_samp;
  d["chroma_1x1"] = h.chroma_1x1;
  d["progressive"] = h.progressive;
  d["arithmetic"] = h.arithmetic;
  d["adobe"] = h.adobe;
  return d;
}

// The one buffer of a single-sample op: its bytes, or the file read into `scratch` (GIL released by the caller).
int load_one(const BufferViews& views, int64_t max_bytes, std::vector<uint8_t>& scratch, Bytes* out, char* message) {
  return views.load(0, max_bytes > 0 ? max_bytes : kDefaultMaxBytes, scratch, out, message, kMessageSize);
}

// A kOk status's message is empty or a warning let through ("warning: ..."): see jpeg_decoder.h.
py::dict read_header_py(const py::object& data, int64_t max_pixels, bool strict, int64_t max_bytes) {
  BufferViews views(data, "read_header", true);
  JpegHeader header;
  char message[kMessageSize] = "";
  int status;
  {
    ReleasedGil nogil;
    std::vector<uint8_t> file;
    Bytes src;
    status = load_one(views, max_bytes, file, &src, message);
    if (status == kOk)
      status = read_header(src.data, src.size, &header, make_limits(strict, max_pixels), message, sizeof(message));
  }
  return header_dict(status, message, header);
}

// Header of every buffer: returns (sizes int64 [B, 2] as (h, w), status int32 [B], messages).
py::tuple read_headers_py(const py::sequence& buffers, int threads, int64_t max_pixels, bool strict,
                          int64_t max_bytes) {
  if (max_bytes <= 0) max_bytes = kDefaultMaxBytes;
  BufferViews views(buffers, "read_headers", true);
  const int64_t n = static_cast<int64_t>(views.size());
  at::Tensor sizes = at::zeros({n, 2}, at::kLong);
  Outcomes outcomes(n);
  {
    ReleasedGil nogil;
    int64_t* sz = sizes.data_ptr<int64_t>();
    int32_t* st = outcomes.st();
    const Limits limits = make_limits(strict, max_pixels);
    run_parallel(
        n, threads,
        [&](int64_t i) {
          thread_local std::vector<uint8_t> file;
          Bytes src;
          st[i] = views.load(i, max_bytes, file, &src, outcomes.message(i), kMessageSize);
          if (st[i] != kOk) return;
          JpegHeader h;
          st[i] = read_header(src.data, src.size, &h, limits, outcomes.message(i), kMessageSize);
          sz[i * 2] = h.height;
          sz[i * 2 + 1] = h.width;
        },
        [&](int64_t i, const char* what) { outcomes.fail(i, what); });
  }
  return py::make_tuple(sizes, outcomes.status, outcomes.message_list());
}

py::tuple decode_crop_py(const py::object& data, int64_t top, int64_t left, int64_t height, int64_t width,
                         int downscale, bool strict, int64_t max_pixels, int64_t max_bytes) {
  BufferViews views(data, "decode_crop", true);
  Window w{top, left, height, width, downscale};
  if (!window_in_range(w) || !(downscale == 1 || downscale == 2 || downscale == 4 || downscale == 8)) {
    char message[kMessageSize] = "";
    const int status = decode_window(nullptr, 0, w, nullptr, 0, make_limits(strict, max_pixels), message,
                                     sizeof(message));
    return py::make_tuple(status, std::string(message), py::none());
  }
  int64_t out_h, out_w;
  scaled_extent(w, &out_h, &out_w);
  // Refuse the allocation for a window no image under the pixel limit could hold.
  if (height * width > make_limits(strict, max_pixels).max_pixels)
    return py::make_tuple(static_cast<int>(kTooLarge), std::string("window is larger than the pixel limit"),
                          py::none());
  at::Tensor out = at::empty({out_h, out_w, 3}, at::kByte);
  char message[kMessageSize] = "";
  int status;
  {
    ReleasedGil nogil;
    std::vector<uint8_t> file;
    Bytes src;
    status = load_one(views, max_bytes, file, &src, message);
    if (status == kOk)
      status = decode_window(src.data, src.size, w, out.data_ptr<uint8_t>(), static_cast<size_t>(out.numel()),
                             make_limits(strict, max_pixels), message, sizeof(message));
  }
  return py::make_tuple(status, std::string(message), status == kOk ? py::cast(out) : py::none());
}

// Batch decode into a caller-provided ragged buffer, shared by decode_crops, decode_batch and decode_batch_start:
// windows int64 [B, 5] = (top, left, height, width, downscale); the layout is made before anything is decoded, the
// reads (files or buffers), CRC checks and decodes run on native threads without the GIL.
struct CropBatch {
  explicit CropBatch(int64_t n) : offsets(at::zeros({n}, at::kLong)), shapes(at::zeros({n, 3}, at::kLong)), outcomes(n) {}
  at::Tensor offsets, shapes;
  Outcomes outcomes;
};

// What the native threads read and write, checked and laid out with the GIL held (CropJob::make); run() then
// touches no Python object, so it may run on a thread of its own while the caller goes on (PendingDecode).
struct CropJob {
  CropJob(const py::sequence& buffers, const char* op) : views(buffers, op, true) {}
  BufferViews views;     // holds the buffers' views: released with the GIL held, when the job is
  at::Tensor crc_values, whole, win, out, sizes;
  const int64_t* expected = nullptr;
  const bool* whole_of = nullptr;
  const int64_t* size_of = nullptr;  // [B, 2]: each image's (height, width) as indexed, checked against its header
  int threads = 1;
  int64_t max_bytes = 0;
  Limits limits;
  std::unique_ptr<CropBatch> batch;

  // whole_scan: bool [B], the samples whose decode reads the scan to its end (Limits::whole_scan), or none.
  // sizes: int64 [B, 2], each image's (height, width) as the dataset's index says (Window::image_height), or none.
  static std::unique_ptr<CropJob> make(const py::sequence& buffers, const at::Tensor& windows, at::Tensor& out,
                                       int threads, bool strict, int64_t max_pixels, int64_t max_bytes,
                                       const c10::optional<at::Tensor>& crcs, const char* op,
                                       const c10::optional<at::Tensor>& whole_scan,
                                       const c10::optional<at::Tensor>& sizes = c10::nullopt) {
    at::Tensor crc_values;
    // CRC-32 of each buffer as stored, or -1: checked before decoding
    const int64_t* expected = crc_table(crcs, static_cast<int64_t>(buffers.size()), op, &crc_values);
    auto job = std::make_unique<CropJob>(buffers, op);
    job->crc_values = crc_values;
    job->expected = expected;
    const int64_t n = static_cast<int64_t>(job->views.size());
    FL_CHECK(windows.dim() == 2 && windows.size(0) == n && windows.size(1) == 5 &&
                 windows.scalar_type() == at::kLong && windows.device().is_cpu(),
             "%s: windows must be an int64 CPU tensor of shape [%lld, 5]", op, static_cast<long long>(n));
    TORCH_CHECK(out.scalar_type() == at::kByte && out.device().is_cpu() && out.is_contiguous(), op,
                ": out must be a contiguous uint8 CPU tensor");
    if (whole_scan.has_value()) {
      FL_CHECK(whole_scan->dim() == 1 && whole_scan->size(0) == n && whole_scan->scalar_type() == at::kBool &&
                   whole_scan->device().is_cpu(),
               "%s: whole_scan must be a bool CPU tensor of shape [%lld]", op, static_cast<long long>(n));
      job->whole = whole_scan->contiguous();
      job->whole_of = job->whole.data_ptr<bool>();
    }
    if (sizes.has_value()) {
      FL_CHECK(sizes->dim() == 2 && sizes->size(0) == n && sizes->size(1) == 2 && sizes->scalar_type() == at::kLong &&
                   sizes->device().is_cpu(),
               "%s: sizes must be an int64 CPU tensor of shape [%lld, 2]", op, static_cast<long long>(n));
      job->sizes = sizes->clone(at::MemoryFormat::Contiguous);  // a copy, as for windows
      job->size_of = job->sizes.data_ptr<int64_t>();
    }
    // A copy: the layout below is made from it, and a caller changing its table before the threads read it
    // (decode_batch_start returns at once) must not move a window off its room.
    job->win = windows.clone(at::MemoryFormat::Contiguous);
    job->out = out;
    job->threads = threads;
    job->max_bytes = max_bytes <= 0 ? kDefaultMaxBytes : max_bytes;
    job->limits = make_limits(strict, max_pixels);
    const int64_t* wp = job->win.data_ptr<int64_t>();
    job->batch = std::make_unique<CropBatch>(n);
    int64_t* op_ = job->batch->offsets.data_ptr<int64_t>();
    int64_t* sp = job->batch->shapes.data_ptr<int64_t>();
    int64_t total = 0;
    for (int64_t i = 0; i < n; ++i) {  // lay the batch out before decoding anything
      const Window w = window_at(wp, i);
      int64_t h = 0, wd = 0;
      // Out-of-range windows take no room (decode_window then reports them): their byte counts could overflow.
      if (window_in_range(w) && w.downscale > 0) scaled_extent(w, &h, &wd);
      op_[i] = total;
      sp[i * 3] = h;
      sp[i * 3 + 1] = wd;
      sp[i * 3 + 2] = 3;
      total += h * wd * 3;
    }
    FL_CHECK(total <= out.numel(), "%s: out holds %lld bytes, the batch needs %lld", op,
             static_cast<long long>(out.numel()), static_cast<long long>(total));
    return job;
  }

  // The reads, checks and decodes. Without the GIL, touching no Python object.
  void run() {
    const int64_t* wp = win.data_ptr<int64_t>();
    const int64_t* op_ = batch->offsets.data_ptr<int64_t>();
    const int64_t* sp = batch->shapes.data_ptr<int64_t>();
    uint8_t* base = out.data_ptr<uint8_t>();
    Outcomes& outcomes = batch->outcomes;
    int32_t* st = outcomes.st();
    run_parallel(
        static_cast<int64_t>(views.size()), threads,
        [&](int64_t i) {
          Window w = window_at(wp, i);
          if (size_of != nullptr) {
            w.image_height = std::max<int64_t>(size_of[2 * i], 0);
            w.image_width = std::max<int64_t>(size_of[2 * i + 1], 0);
          }
          char* message = outcomes.message(i);
          thread_local std::vector<uint8_t> file;
          Bytes src;
          st[i] = load_checked(views, i, max_bytes, file, &src, expected, message);
          if (st[i] != kOk) return;
          const size_t room = static_cast<size_t>(sp[i * 3] * sp[i * 3 + 1] * 3);
          Limits own = limits;
          own.whole_scan = whole_of != nullptr && whole_of[i];
          st[i] = decode_window(src.data, src.size, w, base + op_[i], room, own, message, kMessageSize);
        },
        [&](int64_t i, const char* what) { outcomes.fail(i, what); });
  }
};

std::unique_ptr<CropBatch> decode_crop_batch(const py::sequence& buffers, const at::Tensor& windows, at::Tensor& out,
                                             int threads, bool strict, int64_t max_pixels, int64_t max_bytes,
                                             const c10::optional<at::Tensor>& crcs, const char* op,
                                             const c10::optional<at::Tensor>& whole_scan = c10::nullopt,
                                             const c10::optional<at::Tensor>& sizes = c10::nullopt) {
  auto job = CropJob::make(buffers, windows, out, threads, strict, max_pixels, max_bytes, crcs, op, whole_scan,
                           sizes);
  {
    ReleasedGil nogil;
    job->run();
  }
  return std::move(job->batch);
}

// Returns (offsets int64 [B], shapes int64 [B, 3], status int32 [B], messages list[str]).
py::tuple decode_crops_py(const py::sequence& buffers, const at::Tensor& windows, at::Tensor& out, int threads,
                          bool strict, int64_t max_pixels, int64_t max_bytes, const c10::optional<at::Tensor>& crcs) {
  auto b = decode_crop_batch(buffers, windows, out, threads, strict, max_pixels, max_bytes, crcs, "decode_crops");
  return py::make_tuple(b->offsets, b->shapes, b->outcomes.status, b->outcomes.message_list());
}

// decode_batch's result: (offsets, shapes, status, {i: message} for the failed and warned samples, count of OK
// samples with a warning): a batch that decodes cleanly costs its producer no per-sample Python work.
py::tuple batch_result(const CropBatch& b) {
  const int32_t* st = b.outcomes.status.data_ptr<int32_t>();
  py::dict said;
  int64_t warned = 0;
  for (size_t i = 0; i < b.outcomes.messages.size(); ++i) {
    const char* m = b.outcomes.messages[i].data();
    if (st[i] == kOk && m[0] == '\0') continue;
    if (st[i] == kOk) ++warned;  // an OK sample's message is a warning let through (see read_header_py)
    said[py::int_(i)] = std::string(m);
  }
  return py::make_tuple(b.offsets, b.shapes, b.outcomes.status, said, warned);
}

// The loader's per-batch call: as decode_crops, returning batch_result.
py::tuple decode_batch_py(const py::sequence& buffers, const at::Tensor& windows, at::Tensor& out, int threads,
                          bool strict, int64_t max_pixels, int64_t max_bytes, const c10::optional<at::Tensor>& crcs,
                          const c10::optional<at::Tensor>& whole_scan, const c10::optional<at::Tensor>& sizes) {
  return batch_result(*decode_crop_batch(buffers, windows, out, threads, strict, max_pixels, max_bytes, crcs,
                                         "decode_batch", whole_scan, sizes));
}

// decode_batch started on a native thread of its own: the caller (a producer) plans and hands over its previous
// batch while the batch decodes, then wait() gives decode_batch's result. The job keeps what it reads and writes
// alive (the buffers' views, a copy of windows, out) until it is done; dropping an unwaited one waits for it
// first. `out` must not be resized or freed by other means until then (as with any asynchronous out= op). In a
// forked child the thread is not there: nothing is joined.
class PendingDecode {
 public:
  explicit PendingDecode(std::unique_ptr<CropJob> job) : job_(std::move(job)), pid_(::getpid()) {
    CropJob* j = job_.get();
    try {
      // With one thread the runner decodes itself, at the caller's priority as decode_batch's caller would
      // (run_parallel's own threads lower theirs). What escapes run() (std::bad_alloc making its threads) is
      // raised by wait(), as decode_batch would raise it, instead of ending the process.
      runner_ = std::make_unique<std::thread>([this, j] {
        try {
          j->run();
        } catch (...) {
          error_ = std::current_exception();
        }
      });
    } catch (const std::system_error&) {  // no thread to be had: decode now, as decode_batch would
      ReleasedGil nogil;
      j->run();
    }
  }
  PendingDecode(const PendingDecode&) = delete;
  PendingDecode& operator=(const PendingDecode&) = delete;
  ~PendingDecode() { close(); }
  // Waits for the decode without its result (an abandoned batch); never raises, and in a forked child does nothing.
  void close() {
    if (!runner_) return;
    if (::getpid() != pid_) {
      (void)runner_.release();  // a forked child: the thread is the parent's, there is none here to join
      return;
    }
    if (runner_->joinable()) {
      ReleasedGil nogil;
      runner_->join();
    }
  }
  py::tuple wait() {
    if (!job_) throw py::value_error("decode_batch_start: wait() was called already");
    FL_CHECK(::getpid() == pid_, "decode_batch_start: wait() in a forked child: the decode ran in the parent");
    close();  // the decode done
    if (error_) {
      job_.reset();
      std::rethrow_exception(error_);
    }
    py::tuple result = batch_result(*job_->batch);
    job_.reset();  // the views released now, with the GIL held
    return result;
  }

 private:
  std::unique_ptr<CropJob> job_;
  std::unique_ptr<std::thread> runner_;
  std::exception_ptr error_;  // written by the runner, read after it is joined
  pid_t pid_;
};

std::unique_ptr<PendingDecode> decode_batch_start_py(const py::sequence& buffers, const at::Tensor& windows,
                                                     at::Tensor& out, int threads, bool strict, int64_t max_pixels,
                                                     int64_t max_bytes, const c10::optional<at::Tensor>& crcs,
                                                     const c10::optional<at::Tensor>& whole_scan,
                                                     const c10::optional<at::Tensor>& sizes) {
  return std::make_unique<PendingDecode>(CropJob::make(buffers, windows, out, threads, strict, max_pixels, max_bytes,
                                                       crcs, "decode_batch_start", whole_scan, sizes));
}

// The engines' read: every sample's bytes in host memory, in one call per batch without the GIL. File paths are
// read by native threads (read_file's rules) straight into one uint8 buffer, back to back: their sizes first (open,
// fstat), then each file read into its place (a file whose size changed in between is unreadable: the CPU path
// reads it again). `out` is reused when it holds them all, else a new buffer (25% headroom) is returned. Buffers
// stay where they are (length 0 here) unless copy_buffers: then they are copied in too (a store's records are views
// of its mapped file, pageable memory, which nvJPEG stages through a copy of its own; from a page-locked `out` its
// batched call takes 7.3 ms a batch of 256 against 10.3, bench/RESULTS.md). A given CRC-32 is checked for both,
// on the bytes copied where there is a copy. Returns (data uint8: the buffer used, lengths int64 [B]: sample i's
// room, after the rooms before it (0 for buffers not copied and samples refused before reading); status int32
// [B]; {i: message} for the samples that failed, whose room holds nothing of use).
py::tuple read_batch_py(const py::sequence& buffers, int threads, int64_t max_bytes,
                        const c10::optional<at::Tensor>& crcs, const c10::optional<at::Tensor>& out,
                        bool copy_buffers) {
  if (max_bytes <= 0) max_bytes = kDefaultMaxBytes;
  at::Tensor crc_values;
  const int64_t* expected = crc_table(crcs, static_cast<int64_t>(buffers.size()), "read_batch", &crc_values);
  if (out.has_value())
    TORCH_CHECK(out->scalar_type() == at::kByte && out->device().is_cpu() && out->is_contiguous() && out->dim() == 1,
                "read_batch: out must be a contiguous 1-D uint8 CPU tensor");
  BufferViews views(buffers, "read_batch", true);
  const int64_t n = static_cast<int64_t>(views.size());
  Outcomes outcomes(n);
  at::Tensor lengths = at::zeros({n}, at::kLong);
  at::Tensor data;
  {
    ReleasedGil nogil;
    int32_t* st = outcomes.st();
    int64_t* len = lengths.data_ptr<int64_t>();
    std::vector<uint8_t> unused;
    run_parallel(
        n, threads,
        [&](int64_t i) {
          char* message = outcomes.message(i);
          if (!views.is_path(i)) {  // a buffer: its limit, and its checksum now unless it is copied
            Bytes src;
            if (!copy_buffers) {
              st[i] = load_checked(views, i, max_bytes, unused, &src, expected, message);
              return;
            }
            st[i] = views.load(i, max_bytes, unused, &src, message, kMessageSize);
            len[i] = static_cast<int64_t>(src.size);
            return;
          }
          int fd = -1;
          st[i] = open_file(views.path(i), max_bytes, &fd, &len[i], message, kMessageSize);
          if (st[i] == kOk) ::close(fd);
        },
        [&](int64_t i, const char* what) { outcomes.fail(i, what); });
    std::vector<int64_t> offsets(static_cast<size_t>(n) + 1, 0);
    for (int64_t i = 0; i < n; ++i) offsets[i + 1] = offsets[i] + (st[i] == kOk ? len[i] : (len[i] = 0));
    data = out.has_value() && out->numel() >= offsets[n] ? *out : at::empty({offsets[n] + offsets[n] / 4}, at::kByte);
    uint8_t* base = data.data_ptr<uint8_t>();
    run_parallel(
        n, threads,
        [&](int64_t i) {
          if (st[i] != kOk) return;
          char* message = outcomes.message(i);
          if (!views.is_path(i)) {
            if (!copy_buffers) return;
            uint8_t* room = base + offsets[i];
            if (len[i] > 0) std::memcpy(room, views[i].data, static_cast<size_t>(len[i]));
            if (!crc_matches(Bytes{room, static_cast<size_t>(len[i])}, expected, i, message)) st[i] = kCorrupt;
            return;
          }
          int fd = -1;
          int64_t now = 0;
          st[i] = open_file(views.path(i), max_bytes, &fd, &now, message, kMessageSize);
          if (st[i] == kOk && now != len[i]) {
            ::close(fd);
            std::snprintf(message, kMessageSize, "cannot read: file changed size while reading (%lld, then %lld bytes)",
                          static_cast<long long>(len[i]), static_cast<long long>(now));
            st[i] = kUnreadable;
          }
          if (st[i] == kOk) st[i] = read_all(fd, base + offsets[i], static_cast<size_t>(len[i]), message, kMessageSize);
          if (st[i] == kOk && !crc_matches(Bytes{base + offsets[i], static_cast<size_t>(len[i])}, expected, i, message))
            st[i] = kCorrupt;
        },
        [&](int64_t i, const char* what) { outcomes.fail(i, what); });
  }
  const int32_t* st = outcomes.st();
  py::dict failed;
  for (int64_t i = 0; i < n; ++i)
    if (st[i] != kOk) failed[py::int_(i)] = std::string(outcomes.message(i));
  return py::make_tuple(data, lengths, outcomes.status, failed);
}

// Whether each JPEG would decode in full under the decoder's policy, without decoding pixels (entropy decoding
// only): the check of decoders (nvJPEG) that do not report damaged data. Returns (status int32 [B], messages).
py::tuple verify_jpegs_py(const py::sequence& buffers, int threads, bool strict, int64_t max_pixels,
                          int64_t max_bytes, const c10::optional<at::Tensor>& crcs) {
  if (max_bytes <= 0) max_bytes = kDefaultMaxBytes;
  at::Tensor crc_values;
  const int64_t* expected = crc_table(crcs, static_cast<int64_t>(buffers.size()), "verify_jpegs", &crc_values);
  BufferViews views(buffers, "verify_jpegs", true);
  const int64_t n = static_cast<int64_t>(views.size());
  Outcomes outcomes(n);
  {
    ReleasedGil nogil;
    int32_t* st = outcomes.st();
    const Limits limits = make_limits(strict, max_pixels);
    run_parallel(
        n, threads,
        [&](int64_t i) {
          char* message = outcomes.message(i);
          thread_local std::vector<uint8_t> file;
          Bytes src;
          st[i] = load_checked(views, i, max_bytes, file, &src, expected, message);
          if (st[i] != kOk) return;
          st[i] = verify_jpeg(src.data, src.size, limits, message, kMessageSize);
        },
        [&](int64_t i, const char* what) { outcomes.fail(i, what); });
  }
  return py::make_tuple(outcomes.status, outcomes.message_list());
}

// CRC-32 of every buffer (int64 [B]), on native threads: the checksum check of paths that do not decode here.
at::Tensor crc32s_py(const py::sequence& buffers, int threads) {
  BufferViews views(buffers, "crc32s", false);
  const int64_t n = static_cast<int64_t>(views.size());
  at::Tensor out = at::empty({n}, at::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  {
    ReleasedGil nogil;
    run_parallel(
        n, threads,
        [&](int64_t i) { o[i] = static_cast<int64_t>(fastload::crc32_ieee(views[i].data, views[i].size)); },
        [&](int64_t i, const char*) { o[i] = -1; });  // crc32_ieee allocates nothing: cannot happen
  }
  return out;
}

// Lossless re-encoding with restart markers: (status, message, bytes or None).
py::tuple add_restart_markers_py(const py::object& data, bool strict, int64_t max_pixels) {
  BufferViews views(data, "add_restart_markers", false);
  std::vector<uint8_t> out;
  char message[kMessageSize] = "";
  int status;
  {
    ReleasedGil nogil;
    status = add_restart_markers(views[0].data, views[0].size, make_limits(strict, max_pixels), &out, message,
                                 sizeof(message));
  }
  if (status != kOk) return py::make_tuple(status, std::string(message), py::none());
  return py::make_tuple(status, std::string(message),
                        py::bytes(reinterpret_cast<const char*>(out.data()), out.size()));
}

// How a file can be sliced (None when it cannot): for inspect and tests.
py::object restart_layout_py(const py::object& data) {
  BufferViews views(data, "restart_layout", false);
  RestartLayout layout;
  if (!parse_restart_layout(views[0].data, views[0].size, &layout)) return py::none();
  py::dict d;
  d["mcu_height"] = layout.mcu_h;
  d["mcu_width"] = layout.mcu_w;
  d["mcus_per_row"] = layout.mcus_per_row;
  d["mcu_rows"] = layout.mcu_rows;
  d["interval"] = layout.interval;
  return d;
}

// The region JPEG the decoder would use for a window, and the window inside it; None when it would not slice.
py::object jpeg_region_py(const py::object& data, int64_t top, int64_t left, int64_t height, int64_t width,
                          int downscale) {
  BufferViews views(data, "jpeg_region", false);
  RestartLayout layout;
  const Window w{top, left, height, width, downscale};
  if (!window_in_range(w) || !parse_restart_layout(views[0].data, views[0].size, &layout) ||
      top + height > layout.height || left + width > layout.width)
    return py::none();
  std::vector<uint8_t> out(views[0].size + 2);
  Window sub;
  const size_t n = build_region(views[0].data, views[0].size, layout, w, out.data(), out.size(), &sub);
  if (n == 0) return py::none();
  return py::make_tuple(py::bytes(reinterpret_cast<const char*>(out.data()), n),
                        py::make_tuple(sub.top, sub.left, sub.height, sub.width, sub.downscale));
}


// ---- the hardware decoder (nvjpeg_decoder.h) -------------------------------------------------------------------

// A batch for NvjpegDecoder.decode, checked and laid out as ops.decode_crops does at downscale 1 (sample i is HWC
// uint8 at offsets[i]): offsets int64 [B], shapes int64 [B, 3], and what the decoder reads and writes.
struct NvjpegBatch {
  at::Tensor offsets, shapes;
  std::vector<NvjpegCrop> crops;
};

std::string shape_text(const at::Tensor& t) {
  std::string text = "[";
  for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
  return text + "]";
}

constexpr int64_t kJpegMaxSide = 65535;  // a JPEG's dimensions are 16-bit: larger windows cannot be valid

// Raises ValueError (TypeError for a buffer that is not bytes-like, from BufferViews) before anything is decoded;
// `out` is checked last, so the window checks can be tested without a GPU.
NvjpegBatch nvjpeg_batch(const BufferViews& views, const at::Tensor& windows, const at::Tensor& out) {
  const char* op = "NvjpegDecoder.decode";
  const int64_t n = static_cast<int64_t>(views.size());
  if (!(windows.dim() == 2 && windows.size(0) == n && windows.size(1) == 5 && windows.device().is_cpu() &&
        (windows.scalar_type() == at::kLong || windows.scalar_type() == at::kInt)))
    raise<py::value_error>("%s: windows must be an int64 or int32 CPU tensor of shape [%lld, 5] (one row per buffer: "
                           "top, left, height, width, 1), got a %s %s tensor of shape %s", op,
                           static_cast<long long>(n),
                           c10::DeviceTypeName(windows.device().type(), true).c_str(),
                           c10::toString(windows.scalar_type()), shape_text(windows).c_str());
  const at::Tensor win = windows.to(at::kLong).contiguous();
  const int64_t* w = win.data_ptr<int64_t>();
  NvjpegBatch batch{at::empty({n}, at::kLong), at::empty({n, 3}, at::kLong), {}};
  int64_t* offsets = batch.offsets.data_ptr<int64_t>();
  int64_t* shapes = batch.shapes.data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t top = w[i * 5], left = w[i * 5 + 1], height = w[i * 5 + 2], width = w[i * 5 + 3];
    const char* why = w[i * 5 + 4] != 1 ? "the hardware decoder has no DCT downscale (the last field must be 1)"
                      : top < 0 || left < 0 ? "top and left must be >= 0"
                      : height < 1 || width < 1 ? "height and width must be >= 1"
                      : top > kJpegMaxSide - height || left > kJpegMaxSide - width
                          ? "it reaches past 65535 pixels, beyond any JPEG"
                          : nullptr;
    if (why != nullptr)
      raise<py::value_error>("%s: window %lld (top, left, height, width, downscale) = (%lld, %lld, %lld, %lld, "
                             "%lld): %s", op, static_cast<long long>(i), static_cast<long long>(top),
                             static_cast<long long>(left), static_cast<long long>(height),
                             static_cast<long long>(width), static_cast<long long>(w[i * 5 + 4]), why);
    offsets[i] = total;
    shapes[i * 3] = height;
    shapes[i * 3 + 1] = width;
    shapes[i * 3 + 2] = 3;
    total += height * width * 3;  // < 2^34 per window: no overflow for any batch that fits in memory
  }
  if (!(out.scalar_type() == at::kByte && out.is_cuda() && out.is_contiguous()))
    raise<py::value_error>("%s: out must be a contiguous uint8 CUDA tensor", op);
  if (total > out.numel())
    raise<py::value_error>("%s: out holds %lld bytes, the batch needs %lld", op, static_cast<long long>(out.numel()),
                           static_cast<long long>(total));
  uint8_t* base = out.data_ptr<uint8_t>();  // device memory: only its address is used here
  batch.crops.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    batch.crops.push_back({views[i].data, views[i].size, static_cast<int>(w[i * 5]), static_cast<int>(w[i * 5 + 1]),
                           static_cast<int>(w[i * 5 + 2]), static_cast<int>(w[i * 5 + 3]), base + offsets[i]});
  return batch;
}

// Decodes windows [B, 5] of the JPEGs in `buffers` into `out` on `stream` (a cudaStream_t as an integer); the
// buffers' pointers are taken and everything checked with the GIL held, then it is released for the whole nvJPEG
// part. Returns (offsets, shapes).
py::tuple nvjpeg_decode_py(NvjpegDecoder& decoder, const py::sequence& buffers, const at::Tensor& windows,
                           const at::Tensor& out, uintptr_t stream) {
  BufferViews views(buffers, "NvjpegDecoder.decode", false);
  NvjpegBatch batch = nvjpeg_batch(views, windows, out);
  if (out.device().index() != decoder.device())
    raise<py::value_error>("NvjpegDecoder.decode: out is on cuda:%d, the decoder on cuda:%d",
                           static_cast<int>(out.device().index()), decoder.device());
  {
    ReleasedGil nogil;
    decoder.decode(batch.crops, reinterpret_cast<void*>(stream));
  }
  return py::make_tuple(batch.offsets, batch.shapes);
}

}  // namespace

namespace fastload {

void stay_if_exiting() {
  if (PyThread_get_thread_ident() == main_thread_ident) return;
  while (interpreter_finalizing()) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace fastload

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastload native ops: libjpeg-turbo crop decoding and the affine/normalise stage";
  m.attr("source_hash") = FASTLOAD_SOURCE_HASH;
  main_thread_ident = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  // A forked child's interpreter is finalised by the thread that forked (CPython makes it the main thread)
  ::pthread_atfork(nullptr, nullptr, [] { main_thread_ident = PyThread_get_thread_ident(); });
  m.attr("libjpeg_turbo_version") = LIBJPEG_TURBO_VERSION_NUMBER;
#ifdef FASTLOAD_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.def("read_header", &read_header_py, py::arg("data"), py::arg("max_pixels") = 0, py::arg("strict") = true,
        py::arg("max_bytes") = 0);
  m.def("read_headers", &read_headers_py, py::arg("buffers"), py::arg("threads") = 1, py::arg("max_pixels") = 0,
        py::arg("strict") = true, py::arg("max_bytes") = 0);
  m.def("decode_crop", &decode_crop_py, py::arg("data"), py::arg("top"), py::arg("left"), py::arg("height"),
        py::arg("width"), py::arg("downscale") = 1, py::arg("strict") = true, py::arg("max_pixels") = 0,
        py::arg("max_bytes") = 0);
  m.def("decode_crops", &decode_crops_py, py::arg("buffers"), py::arg("windows"), py::arg("out"),
        py::arg("threads") = 1, py::arg("strict") = true, py::arg("max_pixels") = 0, py::arg("max_bytes") = 0,
        py::arg("crcs") = py::none());
  m.def("decode_batch", &decode_batch_py, py::arg("buffers"), py::arg("windows"), py::arg("out"),
        py::arg("threads") = 1, py::arg("strict") = true, py::arg("max_pixels") = 0, py::arg("max_bytes") = 0,
        py::arg("crcs") = py::none(), py::arg("whole_scan") = py::none(), py::arg("sizes") = py::none());
  py::class_<PendingDecode>(m, "PendingDecode", "decode_batch_start's decode, running: wait() for its result")
      .def("wait", &PendingDecode::wait,
           "decode_batch's result (offsets, shapes, status, {i: message}, warned), once the decode is done")
      .def("close", &PendingDecode::close, "waits for the decode, without its result (never raises)");
  m.def("decode_batch_start", &decode_batch_start_py, py::arg("buffers"), py::arg("windows"), py::arg("out"),
        py::arg("threads") = 1, py::arg("strict") = true, py::arg("max_pixels") = 0, py::arg("max_bytes") = 0,
        py::arg("crcs") = py::none(), py::arg("whole_scan") = py::none(), py::arg("sizes") = py::none());
  m.def("read_batch", &read_batch_py, py::arg("buffers"), py::arg("threads") = 1, py::arg("max_bytes") = 0,
        py::arg("crcs") = py::none(), py::arg("out") = py::none(), py::arg("copy_buffers") = false);
  m.def("verify_jpegs", &verify_jpegs_py, py::arg("buffers"), py::arg("threads") = 1, py::arg("strict") = true,
        py::arg("max_pixels") = 0, py::arg("max_bytes") = 0, py::arg("crcs") = py::none());
  m.def("add_restart_markers", &add_restart_markers_py, py::arg("data"), py::arg("strict") = true,
        py::arg("max_pixels") = 0);
  m.def("restart_layout", &restart_layout_py, py::arg("data"));
  m.def("crc32s", &crc32s_py, py::arg("buffers"), py::arg("threads") = 1);
  m.def("release_cpu_outputs", &fastload::release_cpu_outputs,
        "Frees the pooled host blocks of batch outputs no tensor holds; returns their bytes");
  m.def("jpeg_region", &jpeg_region_py, py::arg("data"), py::arg("top"), py::arg("left"), py::arg("height"),
        py::arg("width"), py::arg("downscale") = 1);

  auto nvjpeg_error = py::register_exception<NvjpegError>(m, "NvjpegError", PyExc_RuntimeError);
  nvjpeg_error.attr("__doc__") =
      "libnvjpeg is missing, or it refused: no hardware decoder, an unsupported or broken file, a failed call.";
  py::class_<NvjpegDecoder>(m, "NvjpegDecoder",
                            "nvJPEG's hardware decoder (one handle + state, on the CUDA device current when made)")
      .def(py::init([](const std::string& library, int max_batch) {
             if (max_batch < 0) raise<py::value_error>("NvjpegDecoder: max_batch must be >= 0, got %d", max_batch);
             ReleasedGil nogil;  // creating the handle may take a while (CUDA context, engines)
             return std::make_unique<NvjpegDecoder>(library, max_batch);
           }),
           py::arg("library"), py::arg("max_batch"))
      .def("decode", &nvjpeg_decode_py, py::arg("buffers"), py::arg("windows"), py::arg("out"), py::arg("stream"))
      .def("close", &NvjpegDecoder::close, py::call_guard<ReleasedGil>())
      .def_property_readonly("device", &NvjpegDecoder::device)
      .def_static("load_library", [](const std::string& path) {
             ReleasedGil nogil;
             load_nvjpeg(path);
           }, py::arg("path"), "Loads libnvjpeg at path and resolves its entry points, or raises NvjpegError.")
      .def_static("check_batch", [](const py::sequence& buffers, const at::Tensor& windows, const at::Tensor& out) {
             BufferViews views(buffers, "NvjpegDecoder.decode", false);
             NvjpegBatch batch = nvjpeg_batch(views, windows, out);
             return py::make_tuple(batch.offsets, batch.shapes);
           }, py::arg("buffers"), py::arg("windows"), py::arg("out"),
           "decode's checks and layout, without a decoder: (offsets, shapes), or the ValueError decode raises.");
}
