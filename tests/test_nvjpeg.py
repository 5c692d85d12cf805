"""decoder="nvjpeg": the GPU's hardware JPEG decoder behind FastLoader(device="cuda").

Option handling runs everywhere; the decoding tests need a GPU with a hardware decoder (A100, A30, H100, H200)
and skip elsewhere. nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's, so its pixels are compared by
PSNR (what the loader's DCT-scaling test accepts too), while everything the loader decides (windows, flips,
labels, order) must be identical.
"""
import os

import numpy as np
import pytest
import torch

import fastload as fl
from fastload import decoders, nvjpeg, ops
from fastload.datasets import LMDBDataset, pack
from fastload.producer import CORES, UNKNOWN, VERIFIED, _read_file, engine_ready
from pack_corpus import flip_middle_byte, rewrite_record
import broken_jpeg as bj

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_decoder_option_is_checked(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    with pytest.raises(ValueError, match="decoder must be"):
        fl.FastLoader(ds, decoder="turbo")
    for decoder in ("nvjpeg", "hybrid"):
        with pytest.raises(ValueError, match=f"decoder='{decoder}' decodes on the GPU: it needs device='cuda'"):
            fl.FastLoader(ds, decoder=decoder)
    assert fl.FastLoader(ds, decoder="auto").decoder == "cpu"  # no GPU: the CPU decoder, no error


def test_missing_library_says_where_it_looked(monkeypatch):
    monkeypatch.setattr(nvjpeg, "_path", None)
    monkeypatch.setattr(nvjpeg, "_path_error", None)
    monkeypatch.setenv("FASTLOAD_NVJPEG_LIB", "/nonexistent/libnvjpeg.so.13")
    for make in (nvjpeg.library_path, lambda: nvjpeg.HardwareDecoder(1)):
        with pytest.raises(nvjpeg.NvjpegError, match="libnvjpeg not found .*/nonexistent/libnvjpeg.so.13: cannot open"):
            make()
    assert issubclass(nvjpeg.NvjpegError, RuntimeError)


# ---- the native decoder (fastload/native/nvjpeg_decoder.cpp): loading and checks, without a GPU ----------------

Native = ops.C.NvjpegDecoder


def test_native_loader_names_the_path_it_cannot_open():
    for make in (lambda p: Native.load_library(p), lambda p: Native(p, 1)):
        with pytest.raises(nvjpeg.NvjpegError, match="cannot load libnvjpeg /nonexistent/libnvjpeg.so.13: .*No such"):
            make("/nonexistent/libnvjpeg.so.13")


# A stand-in for libnvjpeg with the entry points the decoder calls: it records each call as a line of the file
# $FAKE_NVJPEG_LOG (read when the handle is made) and touches no memory but its arguments; nvjpegDecodeBatchedEx
# reports "bad JPEG" (status 3) for a batch whose first bitstream starts with "X". -DOMIT=name leaves one out.
FAKE_NVJPEG = r"""
#include <stdio.h>
#include <stdlib.h>
typedef struct { unsigned char* channel[4]; size_t pitch[4]; } Image;
static FILE* out;
static int batch, objects;
#define LOG(...) (fprintf(out, __VA_ARGS__), fputc('\n', out), fflush(out))
int nvjpegCreateEx(int backend, void* dev, void* pinned, unsigned flags, void** handle) {
  out = fopen(getenv("FAKE_NVJPEG_LOG"), "a");
  *handle = (void*)(size_t)++objects;
  LOG("create %d %d %d %u %zu", backend, dev != 0, pinned != 0, flags, (size_t)*handle);
  return 0;
}
int nvjpegDestroy(void* h) { LOG("destroy %zu", (size_t)h); return 0; }
int nvjpegJpegStateCreate(void* h, void** state) {
  *state = (void*)(size_t)++objects;
  LOG("state %zu", (size_t)*state);
  return 0;
}
int nvjpegJpegStateDestroy(void* state) { LOG("state_destroy %zu", (size_t)state); return 0; }
int nvjpegDecodeParamsCreate(void* h, void** p) {
  *p = (void*)(size_t)++objects;
  LOG("params %zu", (size_t)*p);
  return 0;
}
int nvjpegDecodeParamsDestroy(void* p) { LOG("params_destroy %zu", (size_t)p); return 0; }
int nvjpegDecodeParamsSetOutputFormat(void* p, int format) { LOG("format %zu %d", (size_t)p, format); return 0; }
#ifndef OMIT_ROI
int nvjpegDecodeParamsSetROI(void* p, int x, int y, int w, int h) {
  LOG("roi %zu %d %d %d %d", (size_t)p, x, y, w, h);
  return 0;
}
#endif
int nvjpegDecodeBatchedInitialize(void* h, void* s, int n, int threads, int format) {
  batch = n;
  LOG("init %d %d %d", n, threads, format);
  return 0;
}
int nvjpegDecodeBatchedEx(void* h, void* s, const unsigned char** data, const size_t* lengths, Image* images,
                          void** params, void* stream) {
  LOG("batched %d %zu", batch, (size_t)stream);
  for (int i = 0; i < batch; ++i)
    LOG("image %zu %zu %zu %zu %zu", (size_t)params[i], lengths[i], (size_t)images[i].channel[0],
        images[i].pitch[0], (size_t)images[i].channel[1] + images[i].pitch[1]);
  return data[0][0] == 'X' ? 3 : 0;
}
"""


def fake_nvjpeg(tmp_path, omit=None):
    import shutil
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in libnvjpeg")
    (tmp_path / "fake.c").write_text(FAKE_NVJPEG)
    lib = tmp_path / f"libfakenvjpeg{'_' + omit if omit else ''}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(tmp_path / "fake.c")] +
                   ([f"-DOMIT_{omit}"] if omit else []), check=True)
    return str(lib)


def test_a_library_without_an_entry_point_is_refused_naming_it(tmp_path):
    with pytest.raises(nvjpeg.NvjpegError, match=r"libc.so.6 is not a usable libnvjpeg: it has no nvjpegCreateEx"):
        Native.load_library("libc.so.6")
    lacking = fake_nvjpeg(tmp_path, omit="ROI")  # every entry point but one: each is looked up
    with pytest.raises(nvjpeg.NvjpegError, match=rf"{lacking} is not a usable libnvjpeg: it has no "
                                                 r"nvjpegDecodeParamsSetROI"):
        Native(lacking, 1)
    Native.load_library(fake_nvjpeg(tmp_path))  # the complete one loads


# nvjpeg_api.h's hand-written declarations against NVIDIA's header: each entry point's type, once nvjpeg.h's types
# are mapped to nvjpeg_api.h's (enums -> int, handles -> pointers to its opaque structs, cudaStream_t and the
# allocator pointers -> void*), must be the declared one; the constants and nvjpegImage_t's layout must agree.
ABI_CHECK = r"""
#include <nvjpeg.h>
#include <cstddef>
#include <type_traits>
#include "nvjpeg_api.h"
using namespace fastload;
template <class T> struct Mine { using type = T; };
template <class T> struct Mine<T*> { using type = typename Mine<T>::type*; };
template <class T> struct Mine<const T> { using type = const typename Mine<T>::type; };
template <class R, class... A> struct Mine<R (*)(A...)> {
  using type = typename Mine<R>::type (*)(typename Mine<A>::type...);
};
template <> struct Mine<nvjpegHandle> { using type = NvjpegHandle; };
template <> struct Mine<nvjpegJpegState> { using type = NvjpegState; };
template <> struct Mine<nvjpegDecodeParams> { using type = NvjpegParams; };
template <> struct Mine<nvjpegImage_t> { using type = NvjpegImage; };
template <> struct Mine<nvjpegStatus_t> { using type = int; };
template <> struct Mine<nvjpegBackend_t> { using type = int; };
template <> struct Mine<nvjpegOutputFormat_t> { using type = int; };
template <> struct Mine<nvjpegDevAllocator_t*> { using type = void*; };
template <> struct Mine<nvjpegPinnedAllocator_t*> { using type = void*; };
template <> struct Mine<cudaStream_t> { using type = void*; };
template <> struct Mine<const unsigned char**> { using type = const unsigned char* const*; };  // CUDA 12's data[]
#define SAME(name) static_assert(std::is_same<Mine<decltype(&name)>::type, decltype(NvjpegApi::name)>::value, #name)
SAME(nvjpegCreateEx);
SAME(nvjpegDestroy);
SAME(nvjpegJpegStateCreate);
SAME(nvjpegJpegStateDestroy);
SAME(nvjpegDecodeParamsCreate);
SAME(nvjpegDecodeParamsDestroy);
SAME(nvjpegDecodeParamsSetOutputFormat);
SAME(nvjpegDecodeParamsSetROI);
SAME(nvjpegDecodeBatchedInitialize);
SAME(nvjpegDecodeBatchedEx);
static_assert(sizeof(nvjpegStatus_t) == sizeof(int) && sizeof(nvjpegBackend_t) == sizeof(int) &&
              sizeof(nvjpegOutputFormat_t) == sizeof(int), "enums are ints");
static_assert(NVJPEG_BACKEND_HARDWARE == kBackendHardware && NVJPEG_OUTPUT_RGBI == kOutputRgbInterleaved, "values");
static_assert(NVJPEG_MAX_COMPONENT == 4 && sizeof(nvjpegImage_t) == sizeof(NvjpegImage) &&
              offsetof(nvjpegImage_t, pitch) == offsetof(NvjpegImage, pitch), "nvjpegImage_t");
static_assert(NVJPEG_STATUS_SUCCESS == 0 && NVJPEG_STATUS_NOT_INITIALIZED == 1 && NVJPEG_STATUS_INVALID_PARAMETER == 2 &&
              NVJPEG_STATUS_BAD_JPEG == 3 && NVJPEG_STATUS_JPEG_NOT_SUPPORTED == 4 &&
              NVJPEG_STATUS_ALLOCATOR_FAILURE == 5 && NVJPEG_STATUS_EXECUTION_FAILED == 6 &&
              NVJPEG_STATUS_ARCH_MISMATCH == 7 && NVJPEG_STATUS_INTERNAL_ERROR == 8 &&
              NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED == 9 && NVJPEG_STATUS_INCOMPLETE_BITSTREAM == 10,
              "the statuses fastload names");
"""


def nvjpeg_include_dirs():
    """Where nvjpeg.h and the CUDA runtime headers it includes may be: the toolkit, NVIDIA's wheels."""
    import glob
    import site
    roots = [os.path.join(h, "include") for h in filter(None, (os.environ.get("CUDA_HOME"), "/usr/local/cuda"))]
    for packages in site.getsitepackages():
        roots += sorted(glob.glob(os.path.join(packages, "nvidia", "*", "include")))
    return [d for d in roots if os.path.isdir(d)]


def check_nvjpeg_abi(include_dirs, tmp_path):
    """Compiles ABI_CHECK against the nvjpeg.h found in include_dirs: None when it agrees, else the compiler's words."""
    import subprocess
    from fastload.native.sources import NATIVE_DIR
    (tmp_path / "abi.cpp").write_text(ABI_CHECK)
    done = subprocess.run(["c++", "-std=c++17", "-fsyntax-only", f"-I{NATIVE_DIR}"] +
                          [f"-I{d}" for d in include_dirs] + [str(tmp_path / "abi.cpp")], capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr


def test_declared_entry_points_match_nvjpeg_h(tmp_path):
    import shutil
    dirs = nvjpeg_include_dirs()
    if not any(os.path.exists(os.path.join(d, "nvjpeg.h")) for d in dirs) or shutil.which("c++") is None:
        pytest.skip("no nvjpeg.h (CUDA toolkit or NVIDIA's nvjpeg wheel) or no C++ compiler")
    assert check_nvjpeg_abi(dirs, tmp_path) is None


def test_batches_are_checked_before_anything_is_decoded():
    """decode's checks (here through check_batch, the same code without a decoder): ValueError naming what is
    wrong, before any nvJPEG call; out is checked last, so the rest needs no GPU."""
    two = [b"a", b"b"]
    windows = torch.tensor([[0, 0, 10, 20, 1], [5, 6, 3, 4, 1]])
    cpu_out = torch.empty(1000, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"windows must be an int64 or int32 CPU tensor of shape \[3, 5\]"):
        Native.check_batch(two + [b"c"], windows, cpu_out)
    for bad in (windows.float(), windows[:, :4], windows[0]):
        with pytest.raises(ValueError, match=r"windows must be .* of shape \[2, 5\]"):
            Native.check_batch(two, bad, cpu_out)
    cases = {(0, 4, 2): "no DCT downscale", (1, 0, -1): "top and left must be >= 0",
             (1, 1, -6): "top and left must be >= 0", (0, 2, 0): "height and width must be >= 1",
             (1, 3, -4): "height and width must be >= 1", (1, 0, 65533): "reaches past 65535 pixels",
             (0, 3, 65536): "reaches past 65535 pixels"}
    for (row, col, value), why in cases.items():
        bad = windows.clone()
        bad[row, col] = value
        with pytest.raises(ValueError, match=rf"window {row} \(top, left, height, width, downscale\) = .*{why}"):
            Native.check_batch(two, bad, cpu_out)
    with pytest.raises(TypeError, match="buffer 1 is a str"):
        Native.check_batch([b"a", "b.jpg"], windows, cpu_out)
    for dtype in (torch.int64, torch.int32):  # good windows: only out is left, and a CPU out is refused
        with pytest.raises(ValueError, match="out must be a contiguous uint8 CUDA tensor"):
            Native.check_batch(two, windows.to(dtype), cpu_out)
    with pytest.raises(ValueError, match="max_batch must be >= 0"):
        Native("/nonexistent/libnvjpeg.so.13", -1)



@pytest.mark.cuda
def test_native_decoder_drives_nvjpeg_as_documented(tmp_path, monkeypatch):
    """With the stand-in libnvjpeg (any CUDA GPU; no hardware decoder needed): the calls, their arguments and order
    (the HARDWARE backend; RGBI output for each params; one ROI per image, x = left, y = top; the batched state
    initialised when the batch size changes and again after a failed decode; destinations at out + offsets with
    pitch width * 3), the results (ops.decode_crops's layout at downscale 1), nvJPEG's status in words, checks
    that refuse before any call, and close."""
    import gc
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_NVJPEG_LOG", str(log))

    def calls():
        lines = log.read_text().splitlines()
        log.write_text("")  # the stand-in appends (O_APPEND): this empties it for the next step
        return lines
    fake = fake_nvjpeg(tmp_path)  # built once: it stays loaded, and is not to be rewritten under the process
    decoder = Native(fake, 2)
    made = calls()
    handle = int(made[0].split()[-1])
    state, p0, p1 = (int(made[k].split()[1]) for k in (1, 2, 4))
    assert made == [f"create 3 0 0 0 {handle}", f"state {state}", f"params {p0}", f"format {p0} 5", f"params {p1}",
                    f"format {p1} 5"]
    assert decoder.device == torch.cuda.current_device()
    stream = torch.cuda.Stream()
    out = torch.empty(1000, dtype=torch.uint8, device="cuda")
    windows = torch.tensor([[1, 2, 10, 20, 1], [3, 4, 5, 6, 1], [0, 0, 2, 2, 1]])
    buffers = [b"\xff\xd8one", bytearray(b"\xff\xd8three"), memoryview(b"\xff\xd8seven!!")]
    offsets, shapes = decoder.decode(buffers, windows, out, stream.cuda_stream)
    assert offsets.tolist() == [0, 600, 690] and offsets.dtype == shapes.dtype == torch.int64
    assert shapes.tolist() == [[10, 20, 3], [5, 6, 3], [2, 2, 3]]
    made = calls()
    p2 = int(made[0].split()[1])  # the pool grew by one for the third image
    params = (p0, p1, p2)
    rois = [f"roi {p} {left} {top} {w} {h}" for p, (top, left, h, w, _) in zip(params, windows.tolist())]
    images = [f"image {p} {len(b)} {out.data_ptr() + o} {w * 3} 0"
              for p, b, o, w in zip(params, buffers, offsets.tolist(), windows[:, 3].tolist())]
    batched = f"batched 3 {stream.cuda_stream}"
    assert made == [f"params {p2}", f"format {p2} 5"] + rois + ["init 3 1 5", batched] + images
    decoder.decode(buffers, windows.int(), out, stream.cuda_stream)  # same size: no new initialisation
    assert calls() == rois + [batched] + images
    with pytest.raises(nvjpeg.NvjpegError, match=r"^nvjpegDecodeBatchedEx: nvJPEG status 3 \(bad JPEG\)$"):
        decoder.decode([b"X"] + buffers[1:], windows, out, stream.cuda_stream)
    calls()
    decoder.decode(buffers, windows, out, stream.cuda_stream)  # after a failure: initialised again
    assert "init 3 1 5" in calls()
    decoder.decode(buffers[:1], windows[:1], out, stream.cuda_stream)
    assert calls() == [rois[0], "init 1 1 5", f"batched 1 {stream.cuda_stream}", images[0]]
    # Refused before any nvJPEG call: ValueError, nothing logged.
    refused = [("out holds 689 bytes, the batch needs 702", (buffers, windows, out[:689])),
               ("out must be a contiguous uint8 CUDA tensor", (buffers, windows, out.cpu())),
               ("out must be a contiguous uint8 CUDA tensor", (buffers, windows, out.view(10, 100)[:, :80])),
               ("out must be a contiguous uint8 CUDA tensor", (buffers, windows, out.float())),
               (r"of shape \[2, 5\]", (buffers[:2], windows, out)),
               ("height and width must be >= 1", (buffers, windows * torch.tensor([1, 1, 0, 1, 1]), out))]
    for message, args in refused:
        with pytest.raises(ValueError, match=message):
            decoder.decode(*args, stream.cuda_stream)
    assert calls() == []
    # The Python wrapper: the same native class, found through FASTLOAD_NVJPEG_LIB; numpy windows are fine.
    monkeypatch.setattr(nvjpeg, "_path", None)
    monkeypatch.setattr(nvjpeg, "_path_error", None)
    monkeypatch.setenv("FASTLOAD_NVJPEG_LIB", fake)
    wrapped = nvjpeg.HardwareDecoder(3)
    got = wrapped.decode(buffers, windows.numpy(), out, stream)
    assert torch.equal(got[0], offsets) and torch.equal(got[1], shapes)
    wrapped.close()
    calls()
    # close: every object destroyed once; idempotent; a closed decoder says so. Garbage collection closes too.
    decoder.close()
    assert calls() == [f"params_destroy {p}" for p in params] + [f"state_destroy {state}", f"destroy {handle}"]
    decoder.close()
    assert calls() == []
    with pytest.raises(nvjpeg.NvjpegError, match="the decoder is closed"):
        decoder.decode(buffers, windows, out, stream.cuda_stream)
    dropped = Native(fake, 1)
    made = [line.split() for line in calls()]
    del dropped
    gc.collect()
    assert calls() == [f"params_destroy {made[2][1]}", f"state_destroy {made[1][1]}", f"destroy {made[0][-1]}"]


def test_fork_waits_for_a_hardware_decode_in_flight(imagenet_dir):
    """A fork (a DataLoader starting its workers) never happens while a producer is inside the hardware decoder:
    it waits for the decoder's lock, and the child gets it unlocked."""
    import threading
    import time
    from fastload.loader import LoaderStats
    from fastload.producer import BatchMaker
    maker = BatchMaker(fl.FolderDataset(imagenet_dir), fl.RandomResizedCrop(32), 0, 1, "raise", True, 10**8,
                       LoaderStats())
    inside, released = threading.Event(), []

    def decode():  # stands for a producer inside nvjpegDecodeBatchedEx
        with maker._hardware_lock:
            inside.set()
            time.sleep(0.3)
            released.append(time.monotonic())
    t = threading.Thread(target=decode)
    t.start()
    inside.wait()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, f"{time.monotonic()} {int(maker._hardware_lock.locked())}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    forked_at, locked = os.read(read, 100).decode().split()
    t.join()
    assert float(forked_at) >= released[0] and locked == "0"
    assert not maker._hardware_lock.locked()


# ---- strict mode for the engines: damaged JPEGs take the CPU path (issue 19, item 1) --------------------------

def truncated_half_scan(data):
    """Cut at half its entropy-coded data, EOI re-appended: passes header and structure checks."""
    start = bj.scan_start(data)
    return data[:start + (len(data) - start - 2) // 2] + b"\xff\xd9"


def flipped_mid_scan(data):
    """16 consecutive bytes of the middle of the entropy-coded data XORed."""
    start = bj.scan_start(data)
    mid = start + (len(data) - start) // 2
    out = bytearray(data)
    for i in range(mid, mid + 16):
        out[i] ^= 0x5A
    return bytes(out)


def strict_cpu_refuses(data):
    info = ops.read_header(data)
    try:
        ops.decode_crop(data, 0, 0, info.height, info.width)
    except fl.DecodeError:
        return True
    return False


def damaged_jpegs(imagenet_dir):
    """{name: bytes}: corpus photos damaged in ways only a full entropy decode finds, each one the strict CPU
    decoder refuses (a flip may leave a file decodable, with wrong pixels nothing can detect: those are passed
    over)."""
    files = sorted(imagenet_dir.rglob("*.jpg"))
    out = {"bad_trunc.jpg": truncated_half_scan(files[0].read_bytes())}
    out["bad_flip.jpg"] = next(b for b in (flipped_mid_scan(f.read_bytes()) for f in files[1:])
                               if strict_cpu_refuses(b))
    assert strict_cpu_refuses(out["bad_trunc.jpg"])
    return out


needs_verify = pytest.mark.skipif(not hasattr(ops, "verify_jpegs"), reason="ops.verify_jpegs is not built yet")


@needs_verify
def test_engine_ready_passes_only_what_a_strict_decode_accepts_and_remembers(imagenet_dir, kinds, monkeypatch):
    good = [f.read_bytes() for f in sorted(imagenet_dir.rglob("*.jpg"))[:6]]
    damaged = list(damaged_jpegs(imagenet_dir).values())
    progressive = kinds["progressive"].read_bytes()
    buffers = good + damaged + [progressive, None]  # None: a read that failed
    indices = np.arange(len(buffers)) + 3  # positions in the batch are not sample indices
    state = np.full(20, UNKNOWN, dtype=np.int8)
    calls = []
    verify = ops.verify_jpegs
    monkeypatch.setattr(ops, "verify_jpegs", lambda b, *a, **k: calls.append(len(b)) or verify(b, *a, **k))
    ready = engine_ready(state, indices, buffers, threads=2)
    assert ready.tolist() == [True] * len(good) + [False] * (len(damaged) + 2)
    assert calls == [len(good) + len(damaged)]  # one batch call; the progressive file needs none
    assert state[indices].tolist() == [VERIFIED] * len(good) + [CORES] * (len(damaged) + 1) + [UNKNOWN]
    # Later batches (epochs) with the same samples: the verdicts are remembered, nothing is checked again.
    again = engine_ready(state, indices[::-1], buffers[::-1], threads=2)
    assert again.tolist() == ready[::-1].tolist() and calls == [len(good) + len(damaged)]


def test_engine_reads_of_files_have_the_native_readers_protections(imagenet_dir, tmp_path):
    """decoder="nvjpeg" reads folder files in Python: like the native reader it never blocks on a FIFO, takes
    regular files only, caps the size, and reports failures (the cores then read the file and name it)."""
    photo = sorted(imagenet_dir.rglob("*.jpg"))[0]
    assert _read_file(str(photo)) == (photo.read_bytes(), "")
    os.mkfifo(tmp_path / "pipe.jpg")  # no writer: a blocking open would hang here
    assert _read_file(str(tmp_path / "pipe.jpg")) == (None, "cannot read: not a regular file")
    assert _read_file(str(tmp_path)) == (None, "cannot read: not a regular file")
    assert _read_file(str(tmp_path / "gone.jpg")) == (None, "cannot read: No such file or directory")
    size = photo.stat().st_size
    assert _read_file(str(photo), max_bytes=size - 1) == (
        None, f"file is {size} bytes, over the per-image limit of {size - 1}")


def _has_hardware():
    return torch.cuda.is_available() and nvjpeg.available()[0]


hardware = pytest.mark.skipif(not _has_hardware(), reason="needs a GPU with a hardware JPEG decoder")


def psnr(a, b, peak=255.0):
    mse = float(((a.double() - b.double()) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(peak ** 2 / mse)


@hardware
def test_hardware_decode_is_close_to_libjpeg(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    idx = np.arange(len(ds))
    plan = fl.RandomResizedCrop(96, dct_downscale=False).plan(ds.heights, ds.widths, 0, 0, idx)
    files = [open(p, "rb").read() for p in ds.paths]
    decoder = nvjpeg.HardwareDecoder(len(files))
    stream = torch.cuda.Stream()
    out = torch.full((int((plan.windows[:, 2] * plan.windows[:, 3] * 3).sum()),), 7, dtype=torch.uint8, device="cuda")
    offsets, shapes = decoder.decode(files, plan.windows, out, stream)
    stream.synchronize()
    values = []
    for i, (top, left, h, w, _) in enumerate(plan.windows.tolist()):
        got = out[int(offsets[i]):int(offsets[i]) + h * w * 3].view(h, w, 3).cpu()
        values.append(psnr(got, ops.decode_crop(files[i], top, left, h, w)))
    assert np.median(values) >= 35 and min(values) >= 30, sorted(values)[:5]
    decoder.close()


def ctypes_decode(files, windows, out, stream):
    """The calls fastload.nvjpeg made through ctypes before the native decoder (up to commit 76edc84): the
    reference the native decoder must equal bit for bit (same library, same calls, same hardware)."""
    import ctypes
    lib = ctypes.CDLL(nvjpeg.library_path())

    def check(status):
        assert status == 0, f"nvJPEG status {status}"
    handle, state = ctypes.c_void_p(), ctypes.c_void_p()
    check(lib.nvjpegCreateEx(3, None, None, 0, ctypes.byref(handle)))  # NVJPEG_BACKEND_HARDWARE
    check(lib.nvjpegJpegStateCreate(handle, ctypes.byref(state)))
    n, win = len(files), windows.numpy()
    params = [ctypes.c_void_p() for _ in range(n)]
    for p, (top, left, h, w, _) in zip(params, win.tolist()):
        check(lib.nvjpegDecodeParamsCreate(handle, ctypes.byref(p)))
        check(lib.nvjpegDecodeParamsSetOutputFormat(p, 5))  # NVJPEG_OUTPUT_RGBI
        check(lib.nvjpegDecodeParamsSetROI(p, left, top, w, h))
    sizes = win[:, 2].astype(np.int64) * win[:, 3] * 3
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    images = np.zeros((n, 8), dtype=np.uint64)  # nvjpegImage_t: channel[4] pointers, then pitch[4]
    images[:, 0] = out.data_ptr() + offsets
    images[:, 4] = win[:, 3] * 3
    check(lib.nvjpegDecodeBatchedInitialize(handle, state, n, 1, 5))
    check(lib.nvjpegDecodeBatchedEx(handle, state, (ctypes.c_char_p * n)(*files),
                                    (ctypes.c_size_t * n)(*map(len, files)), ctypes.c_void_p(images.ctypes.data),
                                    (ctypes.c_void_p * n)(*[p.value for p in params]),
                                    ctypes.c_void_p(stream.cuda_stream)))
    stream.synchronize()
    for p in params:
        check(lib.nvjpegDecodeParamsDestroy(p))
    check(lib.nvjpegJpegStateDestroy(state))
    check(lib.nvjpegDestroy(handle))
    return offsets


@pytest.mark.cuda
@hardware
def test_hardware_decode_equals_the_ctypes_calls_it_replaced(imagenet_dir):
    """The native decoder's pixels are the old ctypes path's, bit for bit, batch after batch (the state reused,
    re-initialised for a new batch size), also after a batch nvJPEG refused."""
    ds = fl.FolderDataset(imagenet_dir)
    files = [open(p, "rb").read() for p in ds.paths]
    decoder = nvjpeg.HardwareDecoder(4)
    stream = torch.cuda.Stream()
    for seed, n in ((0, len(files)), (1, len(files)), (2, 5)):
        idx = np.arange(n)
        plan = fl.RandomResizedCrop(64, dct_downscale=False).plan(ds.heights[idx], ds.widths[idx], seed, 0, idx)
        nbytes = int((plan.windows[:, 2] * plan.windows[:, 3] * 3).sum())
        want = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
        got = torch.full((nbytes,), 7, dtype=torch.uint8, device="cuda")
        ref_offsets = ctypes_decode(files[:n], plan.windows, want, stream)
        offsets, shapes = decoder.decode(files[:n], plan.windows, got, stream)
        stream.synchronize()
        assert offsets.tolist() == ref_offsets.tolist()
        assert shapes.tolist() == [[h, w, 3] for h, w in plan.windows[:, 2:4].tolist()]
        assert torch.equal(got, want), seed
        try:  # not a JPEG: nvJPEG may refuse the batch (status in words) or decode garbage; the decoder goes on
            decoder.decode([b"\xff\xd8 not a JPEG" * 8] + files[1:n], plan.windows, got, stream)
            stream.synchronize()
        except nvjpeg.NvjpegError as e:
            assert "nvJPEG status" in str(e)
    decoder.close()
    decoder.close()


@hardware
def test_fastload_nvjpeg_batches_match_the_cpu_decoder(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    common = dict(batch_size=8, seed=3, crop=fl.RandomResizedCrop(64, dct_downscale=False), threads=2,
                  device="cuda", mean=None, std=None)
    cpu = fl.FastLoader(ds, decoder="cpu", **common)
    gpu = fl.FastLoader(ds, decoder="nvjpeg", **common)
    batches = list(zip(cpu, gpu))
    assert len(batches) == len(cpu)
    for (xc, yc), (xg, yg) in batches:
        assert torch.equal(yc, yg)
        assert not torch.isnan(xg).any()
        assert psnr(xg, xc, peak=1.0) >= 35
    assert gpu.stats()["gpu_decoded"] == len(ds) and gpu.stats()["fallback"] == 0


@hardware
def test_hybrid_batches_are_the_cpu_decoders_or_the_hardware_decoders_by_index(imagenet_dir):
    """decoder="hybrid": batch k of an epoch is exactly decoder="cpu"'s batch k when k % HYBRID_PERIOD >=
    HYBRID_ENGINE_BATCHES (today k % 5 == 4) and exactly decoder="nvjpeg"'s otherwise, whatever the timing, epoch
    after epoch."""
    ds = fl.FolderDataset(imagenet_dir)
    common = dict(batch_size=4, seed=5, crop=fl.RandomResizedCrop(48), device="cuda")
    loaders = {d: fl.FastLoader(ds, decoder=d, **common) for d in ("hybrid", "cpu", "nvjpeg")}
    period, engines = decoders.HYBRID_PERIOD, decoders.HYBRID_ENGINE_BATCHES
    assert loaders["hybrid"].workers == period and loaders["hybrid"].threads == max(1, fl.loader.usable_cores() // 3)
    for epoch in range(2):
        runs = {d: [(x.cpu(), y.cpu()) for x, y in loader] for d, loader in loaders.items()}
        assert len(runs["hybrid"]) == len(runs["cpu"]) >= 2 * period
        for k, (x, y) in enumerate(runs["hybrid"]):
            xr, yr = runs["cpu" if k % period >= engines else "nvjpeg"][k]
            assert torch.equal(y, yr) and torch.equal(x, xr), (epoch, k)
    cores_decoded = sum(len(y) for k, (_, y) in enumerate(runs["hybrid"]) if k % period >= engines)
    stats = loaders["hybrid"].stats()
    assert stats["gpu_decoded"] == stats["images"] - 2 * cores_decoded  # cumulative over the two epochs


@hardware
def test_auto_tries_each_decoder_in_the_loop_then_keeps_the_fastest(imagenet_dir, monkeypatch):
    """decoder="auto" on a GPU with engines: every batch the loop takes is exactly the batch decoder="cpu",
    "nvjpeg" or "hybrid" makes at that index, the one the trial was running (rule's first, then the others, one
    phase each), then the fastest measured keeps going; stats() says which and what it measured; a state_dict
    carries the choice, and a loader resumed from it measures nothing and decodes with the choice."""
    monkeypatch.setattr(decoders, "AUTO_SETTLE", 0)
    monkeypatch.setattr(decoders, "AUTO_WARMUP", 1)
    monkeypatch.setattr(decoders, "AUTO_MEASURE", 2)
    ds = fl.FolderDataset(imagenet_dir)
    common = dict(batch_size=8, seed=3, crop=fl.RandomResizedCrop(40), device="cuda")
    loader = fl.FastLoader(ds, decoder="auto", **common)
    refs = {d: fl.FastLoader(ds, decoder=d, **common) for d in decoders.KINDS}
    trial = loader._trial
    assert trial.candidates[0] == decoders.resolve("auto", torch.device("cuda"), loader._layout[0]).name
    assert sorted(trial.candidates) == sorted(decoders.KINDS) and loader.decoder == trial.candidates[0]
    made_by = []
    for epoch in range(4):
        expected = {d: [x.cpu() for x, _ in ref] for d, ref in refs.items()}
        it = iter(loader)
        for k in range(len(loader)):
            name = loader.decoder  # the decoder of the producers running now made the next batch
            x, _ = next(it)
            made_by.append(name)
            assert torch.equal(x.cpu(), expected[name][k]), (epoch, k, name)
        with pytest.raises(StopIteration):
            next(it)
    # 6 batches an epoch: phases of 3 (one untimed, two timed), one more where an epoch's first batch is timed;
    # then the choice, switched to once (no switch if it was measured last)
    phases = [name for i, name in enumerate(made_by) if i == 0 or made_by[i - 1] != name]
    stats = loader.stats()
    rates, chosen = stats["decoder_trial"]["rates"], stats["decoder_trial"]["chosen"]
    assert phases == trial.candidates + ([chosen] if chosen != trial.candidates[-1] else [])
    assert set(rates) == set(decoders.KINDS) and chosen == stats["decoder"]
    rule = trial.candidates[0]  # the fastest, unless within the margin of the rule's choice
    assert rates[chosen] == max(rates.values()) or chosen == rule
    assert rates[chosen] > rates[rule] * (1 + decoders.AUTO_MARGIN) or chosen == rule
    assert max(rates.values()) <= rates[rule] * (1 + decoders.AUTO_MARGIN) or chosen != rule
    # Resumed: the choice, at once (the first batch is already the chosen decoder's)
    state = loader.state_dict()
    assert state["decoder"] == chosen
    resumed = fl.FastLoader(ds, decoder="auto", **common)
    resumed.load_state_dict(state)
    assert resumed.decoder == chosen and resumed.stats()["decoder_trial"]["chosen"] == chosen
    x, _ = next(iter(resumed))
    refs[chosen].set_epoch(state["epoch"])
    assert torch.equal(x.cpu(), next(iter(refs[chosen]))[0].cpu())
    # Loaded mid-iteration: the running loop goes on to its epoch's end with its decoder, measuring no more; the
    # next iteration starts where the state says, with the state's choice. (The loader is made to start its trial
    # with another decoder than the choice, so the two differ.)
    other = next(name for name in decoders.KINDS if name != chosen)
    loading = fl.FastLoader(ds, decoder="auto", **common)
    loading._trial.candidates = [other] + [n for n in loading._trial.candidates if n != other]
    loading._use_decoder(decoders.KINDS[other])
    it = iter(loading)
    taken = [next(it) for _ in range(2)]
    loading.load_state_dict(state)
    assert len(taken) + len(list(it)) == len(loading) and loading.decoder == other
    assert loading.stats()["decoder_trial"]["rates"] == {}
    x, _ = next(iter(loading))
    expected = fl.FastLoader(ds, decoder=chosen, **common)
    expected.set_epoch(state["epoch"])
    assert loading.decoder == chosen and torch.equal(x.cpu(), next(iter(expected))[0].cpu())


@hardware
def test_other_kinds_and_damaged_records_take_the_cpu_path(imagenet_dir, tmp_path):
    # A progressive file is not for the hardware: the cores decode it, the engines the rest of its batch.
    root = tmp_path / "mixed"
    (root / "a").mkdir(parents=True)
    for i, f in enumerate(sorted(imagenet_dir.rglob("*.jpg"))[:7]):
        (root / "a" / f"{i}.jpg").write_bytes(f.read_bytes())
    from PIL import Image
    with Image.open(sorted(imagenet_dir.rglob("*.jpg"))[8]) as im:
        im.save(root / "a" / "p.jpg", quality=90, progressive=True)
    common = dict(batch_size=8, device="cuda", crop=fl.RandomResizedCrop(32, dct_downscale=False), mean=None,
                  std=None)
    loader = fl.FastLoader(fl.FolderDataset(root), decoder="nvjpeg", **common)
    (xg, yg), = list(loader)
    (xc, yc), = list(fl.FastLoader(fl.FolderDataset(root), decoder="cpu", **common))
    assert torch.equal(yg, yc) and psnr(xg, xc, peak=1.0) >= 35
    assert loader.stats()["gpu_decoded"] == 7  # counted as batches are handed out, not as made ahead
    progressive = next(i for i, p in enumerate(fl.FolderDataset(root).paths) if p.endswith("p.jpg"))
    assert loader._maker._decodable[progressive] == 0
    # A record whose bytes changed after packing: the CPU path finds the checksum and names the record.
    store = tmp_path / "s.lmdb"
    pack(imagenet_dir, store, progress=False, log=lambda m: None)
    rewrite_record(store, 5, flip_middle_byte)
    loader = fl.FastLoader(LMDBDataset(store), batch_size=8, shuffle=False, device="cuda", decoder="nvjpeg",
                           crop=fl.RandomResizedCrop(32))
    with pytest.raises(fl.DecodeError, match=r"\[5\].*checksum"):
        for _ in loader:
            pass


@hardware
def test_reserved_memory_flat_with_the_hardware_decoder(imagenet_dir):
    loader = fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=8, crop=fl.RandomResizedCrop(96),
                           device="cuda", decoder="nvjpeg")
    reserved = []
    for epoch in range(12):
        for x, y in loader:
            x.sum().item()
        reserved.append(torch.cuda.memory_reserved())
    # A slot's device buffer is sized in powers of two by the batches it has held, so it may still grow a step
    # when it first meets a larger batch (which batches a slot meets depends on the shuffle and, at the epoch
    # boundary, on timing); a leak grows every epoch. After the warm-up: at most one such step.
    assert len(set(reserved[3:])) <= 2, reserved
    # "auto" on a GPU with engines: the engines for a process with few cores, the cores from AUTO_CORES on
    cuda = torch.device("cuda")
    assert decoders.resolve("auto", cuda, 8).name == "nvjpeg" and decoders.resolve("auto", cuda, 4).name == "nvjpeg"
    assert decoders.resolve("auto", cuda, decoders.AUTO_CORES).name == "cpu"



@hardware
def test_dataloader_workers_start_after_the_hardware_decoder_ran(imagenet_dir):
    """A training script may run a torch DataLoader with forked workers (an evaluation set, a baseline) in the
    process where FastLoader(decoder="nvjpeg") ran, whose producers may still be alive: the workers must work."""
    loader = fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=8, crop=fl.RandomResizedCrop(32),
                           device="cuda", decoder="nvjpeg")
    list(loader)  # its next epoch's producers start meanwhile, and stay
    import torchvision
    import torchvision.transforms as T
    folder = torchvision.datasets.ImageFolder(str(imagenet_dir), transform=T.Compose([T.RandomResizedCrop(32),
                                                                                    T.PILToTensor()]))
    workers = torch.utils.data.DataLoader(folder, batch_size=8, num_workers=4, timeout=60, pin_memory=True)
    images = torch.cat([x for x, _ in workers])
    assert images.shape == (len(folder), 3, 32, 32)


@pytest.fixture()
def damaged_dir(imagenet_dir, tmp_path):
    """The corpus plus two JPEGs damaged before anyone indexed them: they pass the folder scan."""
    root = tmp_path / "damaged"
    for f in sorted(imagenet_dir.rglob("*.jpg")):
        (root / f.parent.name).mkdir(parents=True, exist_ok=True)
        (root / f.parent.name / f.name).write_bytes(f.read_bytes())
    first_class = sorted(p.name for p in root.iterdir())[0]
    for name, data in damaged_jpegs(imagenet_dir).items():
        (root / first_class / name).write_bytes(data)
    return root


@pytest.mark.cuda
@hardware
@pytest.mark.parametrize("decoder", ["nvjpeg", "hybrid"])
def test_engines_never_deliver_a_jpeg_the_strict_cpu_decoder_refuses(damaged_dir, decoder):
    """nvJPEG reports success on a truncated or damaged scan (the rows after the damage keep another sample's
    pixels). Every decoder must raise the CPU decoder's DecodeError, or skip the same samples and hand out the
    same labels, epoch after epoch (the second epoch uses the remembered verdicts)."""
    ds = fl.FolderDataset(damaged_dir)
    assert ds.skipped == [] and sum(p.endswith(("bad_trunc.jpg", "bad_flip.jpg")) for p in ds.paths) == 2
    common = dict(batch_size=8, shuffle=False, seed=1, crop=fl.RandomResizedCrop(48, dct_downscale=False),
                  device="cuda", mean=None, std=None)
    errors = {}
    for d in ("cpu", decoder):
        with pytest.raises(fl.DecodeError) as e:
            for _ in fl.FastLoader(ds, decoder=d, **common):
                pass
        errors[d] = (str(e.value), e.value.sample)
    assert errors[decoder] == errors["cpu"] and "bad_" in errors["cpu"][1], errors
    loaders = {d: fl.FastLoader(ds, decoder=d, on_error="skip", **common) for d in ("cpu", decoder)}
    for epoch in range(2):
        runs = {d: [(x.cpu(), y.cpu()) for x, y in loader] for d, loader in loaders.items()}
        assert len(runs[decoder]) == len(runs["cpu"]) == len(loaders["cpu"])
        for (xc, yc), (xg, yg) in zip(runs["cpu"], runs[decoder]):
            assert torch.equal(yc, yg), epoch
            for a, b in zip(xc, xg):  # every sample close to the CPU decoder's: no rows of another sample
                assert psnr(b, a, peak=1.0) >= 30, epoch
    stats = {d: loader.stats() for d, loader in loaders.items()}
    # A crop window that ends above the damage decodes fine (the decoder stops at the window's last row), so not
    # every epoch skips both files: the engines' path must skip exactly what the cores skip (at least one a epoch).
    assert stats[decoder]["skipped"] == stats["cpu"]["skipped"] >= 2
    if decoder == "nvjpeg":  # every good sample on the engines, the two damaged ones on the cores
        assert stats["nvjpeg"]["gpu_decoded"] == 2 * (len(ds) - 2)


@pytest.mark.cuda
@hardware
def test_files_gone_or_fifos_after_the_scan_are_named_or_skipped_with_the_engines(imagenet_dir, tmp_path):
    """decoder="nvjpeg" reads folder files itself: a file deleted after the scan, or a FIFO put in its place,
    gets the CPU path's DecodeError naming it (or is skipped and counted), never a FileNotFoundError or a hang."""
    root = tmp_path / "tree"
    for f in sorted(imagenet_dir.rglob("*.jpg")):
        (root / f.parent.name).mkdir(parents=True, exist_ok=True)
        (root / f.parent.name / f.name).write_bytes(f.read_bytes())
    ds = fl.FolderDataset(root)
    gone, fifo = ds.paths[5], ds.paths[9]
    os.unlink(gone)
    os.unlink(fifo)
    os.mkfifo(fifo)
    common = dict(batch_size=16, shuffle=False, crop=fl.RandomResizedCrop(32), device="cuda", decoder="nvjpeg",
                  timeout=60)
    with pytest.raises(fl.DecodeError, match=rf"{gone}: cannot read: No such file or directory") as e:
        list(fl.FastLoader(ds, **common))
    assert e.value.sample == gone
    skipping = fl.FastLoader(ds, on_error="skip", **common)
    assert sum(len(y) for _, y in skipping) == len(ds)
    assert skipping.stats()["skipped"] == 2 and skipping.stats()["gpu_decoded"] == len(ds) - 2
