# fastload: `make demo` and `make test` set everything up on a fresh machine (Debian/Ubuntu, x86-64).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
APT_PACKAGES := libjpeg62-turbo-dev libturbojpeg0-dev libjpeg-turbo-progs
TORCH := torch==2.14.1 torchvision==0.29.1
NATIVE := $(wildcard fastload/native/*.cpp fastload/native/*.h fastload/native/*.cu) setup.py
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# CUDA kernels compile whenever a toolkit is there, GPU or not: CI catches CUDA compile errors.
ifneq ($(wildcard /usr/local/cuda-13.0/bin/nvcc),)
export CUDA_HOME ?= /usr/local/cuda-13.0
endif
DATA ?= data

.PHONY: setup system build test demo bench clean
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
