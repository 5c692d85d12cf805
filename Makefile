# fastload: `make demo` and `make test` set everything up on a fresh machine (Debian/Ubuntu, x86-64).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# libjpeg-turbo's headers: libjpeg62-turbo-dev on Debian, libjpeg-turbo8-dev on Ubuntu
JPEG_DEV := $(shell grep -qsE '^(ID|ID_LIKE)=.*ubuntu' /etc/os-release && echo libjpeg-turbo8-dev || echo libjpeg62-turbo-dev)
APT_PACKAGES := $(JPEG_DEV) libturbojpeg0-dev libjpeg-turbo-progs zlib1g-dev
TORCH := torch==2.14.1 torchvision==0.29.1
NATIVE := $(wildcard fastload/native/*.cpp fastload/native/*.h fastload/native/*.cu) setup.py
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# CUDA kernels compile whenever a toolkit is there, GPU or not: CI catches CUDA compile errors.
ifneq ($(wildcard /usr/local/cuda-13.0/bin/nvcc),)
export CUDA_HOME ?= /usr/local/cuda-13.0
endif
DATA ?= data

.PHONY: setup system build test demo clean
setup: system $(VENV)/.built

system:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages: $$missing"; \
	  $(SUDO) apt-get install -y -q $$missing >/dev/null || \
	    { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q $$missing >/dev/null; }; \
	fi

$(VENV)/.deps: pyproject.toml
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q $(TORCH) ninja pybind11
	@touch $@

$(VENV)/.built: $(VENV)/.deps $(NATIVE)
	$(PIP) install -q --no-build-isolation -e '.[dev]'
	@touch $@

build: $(VENV)/.built

test: setup
	$(PY) -m pytest -q tests

demo: setup
	$(PY) -m bench.demo --data $(DATA)

clean:
	rm -rf build *.egg-info fastload/_C*.so $(VENV)/.built

# ---- hardening (issue 8): fuzzing, sanitizer builds, leak check. Everything is built under build/ (git-ignored).
# `make fuzz` fuzzes fastload/native/jpeg_decoder.cpp (read_header + decode_window, single and 2-thread batch)
# and jpeg_transcode.cpp (add_restart_markers: the re-encoded file must decode to the original's pixels) with
# libFuzzer + ASan + UBSan against an instrumented libjpeg-turbo (Debian's source; the system -ljpeg when apt
# has no deb-src entry). `make fuzz-tsan` replays the corpus under ThreadSanitizer. `make asan-test` builds
# fastload._C with ASan + UBSan (FASTLOAD_SANITIZE=1) into build/asan and runs the decoder and warp tests on it,
# then the leak check. None of this is part of `make test`.
FUZZ_SECONDS ?= 600
FUZZ_RSS_MB ?= 2048
FUZZ_TIMEOUT ?= 30
FUZZ_DIR := build/fuzz
FUZZ_NATIVE ?= fastload/native
FUZZ_SRCS := $(FUZZ_NATIVE)/jpeg_decoder.cpp $(FUZZ_NATIVE)/jpeg_regions.cpp $(FUZZ_NATIVE)/jpeg_transcode.cpp
FUZZ_CXXFLAGS := -std=c++17 -O1 -g -fno-omit-frame-pointer -I$(FUZZ_NATIVE)
FUZZ_ARGS := -dict=fuzz/jpeg.dict -rss_limit_mb=$(FUZZ_RSS_MB) -timeout=$(FUZZ_TIMEOUT) -print_final_stats=1
ASAN_DIR := build/asan
# libstdc++ preloaded too: ASan's __cxa_throw interceptor must find it at start-up (python does not link it).
ASAN_LIB = $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libstdc++.so)
ASAN_ENV = LD_PRELOAD="$(ASAN_LIB)" ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 FASTLOAD_ASAN_LIB=$(ASAN_DIR)

.PHONY: clang fuzz-build fuzz fuzz-tsan asan-build asan-test leak-check
clang:
	@command -v clang++ >/dev/null && command -v cmake >/dev/null && \
	  [ -n "$$(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a | grep /)" ] || \
	  { echo "installing clang, compiler-rt, cmake"; \
	    $(SUDO) apt-get install -y -q clang libclang-rt-dev cmake >/dev/null 2>&1 || \
	    { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q clang libclang-rt-dev cmake >/dev/null; }; }

# The instrumented libjpeg (built once) or, failing that, the system one; then the fuzz and leak-check binaries.
fuzz-build: clang
	@mkdir -p $(FUZZ_DIR)
	@if fuzz/build_libjpeg.sh $(FUZZ_DIR)/libjpeg; then \
	  jpeg="-I$(FUZZ_DIR)/libjpeg/include $(FUZZ_DIR)/libjpeg/lib/libjpeg.a"; cov=libjpeg-turbo+fastload; \
	else jpeg="-ljpeg"; cov="fastload only (system libjpeg is not instrumented)"; fi; \
	clang++ $(FUZZ_CXXFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  fuzz/fuzz_decode.cpp $(FUZZ_SRCS) $$jpeg -lpthread -o $(FUZZ_DIR)/fuzz_decode && \
	clang++ $(FUZZ_CXXFLAGS) -fsanitize=address,undefined -fno-sanitize-recover=undefined \
	  fuzz/leak_check.cpp $(FUZZ_SRCS) $$jpeg -o $(FUZZ_DIR)/leak_check && \
	echo "built $(FUZZ_DIR)/fuzz_decode and $(FUZZ_DIR)/leak_check (coverage: $$cov)"

$(FUZZ_DIR)/seeds/.done: fuzz/make_seeds.py bench/corpus.py
	@rm -rf $(FUZZ_DIR)/seeds
	$(PY) fuzz/make_seeds.py $(FUZZ_DIR)/seeds
	@touch $@

# Fuzzes for FUZZ_SECONDS (default 600) at nice 10; the corpus grows in build/fuzz/corpus across runs, findings
# land in build/fuzz/artifacts/ (make them regression inputs: tests/data/fuzz_regressions/).
fuzz: fuzz-build $(FUZZ_DIR)/seeds/.done
	@mkdir -p $(FUZZ_DIR)/corpus $(FUZZ_DIR)/artifacts
	@echo "fuzzing for $(FUZZ_SECONDS) s; log in $(FUZZ_DIR)/fuzz.log"
	@nice -n 10 $(FUZZ_DIR)/fuzz_decode $(FUZZ_DIR)/corpus $(FUZZ_DIR)/seeds $(FUZZ_ARGS) \
	  -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=$(FUZZ_DIR)/artifacts/ > $(FUZZ_DIR)/fuzz.log 2>&1; \
	rc=$$?; grep -E "^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::|ERROR|runtime error|invariant|Test unit written" $(FUZZ_DIR)/fuzz.log; \
	echo "corpus: $$(ls $(FUZZ_DIR)/corpus | wc -l) files"; exit $$rc

# ThreadSanitizer replay of seeds, corpus and regressions (batch inputs decode 2 windows on 2 threads), without
# libFuzzer (its coverage counters race by design); system libjpeg, so races are looked for in fastload's code.
fuzz-tsan: clang $(FUZZ_DIR)/seeds/.done
	clang++ $(FUZZ_CXXFLAGS) -fsanitize=thread fuzz/fuzz_decode.cpp fuzz/replay_main.cpp \
	  $(FUZZ_SRCS) -ljpeg -lpthread -o $(FUZZ_DIR)/fuzz_decode_tsan
	TSAN_OPTIONS=halt_on_error=1:abort_on_error=1 nice -n 10 $(FUZZ_DIR)/fuzz_decode_tsan $(FUZZ_DIR)/seeds \
	  $$(ls -d $(FUZZ_DIR)/corpus 2>/dev/null) tests/data/fuzz_regressions

# LeakSanitizer over thousands of failing decodes (truncations, byte flips, bad windows of every seed kind).
leak-check: fuzz-build $(FUZZ_DIR)/seeds/.done
	ASAN_OPTIONS=detect_leaks=1 $(FUZZ_DIR)/leak_check $(FUZZ_DIR)/seeds

# fastload._C with ASan + UBSan (gcc), CPU kernels only, out of tree; the checkout's own build is not touched.
asan-build: system $(VENV)/.deps
	FASTLOAD_SANITIZE=1 FASTLOAD_NO_CUDA=1 nice -n 10 $(PY) setup.py -q build_ext --build-lib $(ASAN_DIR) \
	  --build-temp $(ASAN_DIR)-tmp

ASAN_TESTS ?= tests/test_decode.py tests/test_seekable.py tests/test_warp.py tests/test_fuzz_regressions.py tests/test_faults.py
asan-test: asan-build leak-check
	@$(ASAN_ENV) PYTHONPATH=fuzz/asan_site $(PY) -c "import fastload.native as n; print('fastload._C under test:', n.C.__file__)"
	$(ASAN_ENV) PYTHONPATH=fuzz/asan_site $(PY) -m pytest -q -p no:cacheprovider $(ASAN_TESTS) \
	  --deselect tests/test_decode.py::test_failing_decodes_do_not_grow_memory
	$(ASAN_ENV) PYTHONPATH=fuzz/asan_site nice -n 10 $(PY) fuzz/replay_python.py tests/data/fuzz_regressions \
	  $$(ls -d $(FUZZ_DIR)/seeds $(FUZZ_DIR)/corpus 2>/dev/null)
# (that test measures resident memory, which ASan's quarantine makes grow by design: leak-check covers leaks)
