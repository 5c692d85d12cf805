#!/usr/bin/env bash
# Builds libjpeg-turbo (the version Debian ships, from Debian's source package) instrumented for the fuzzer:
# clang, ASan + UBSan, libFuzzer coverage (-fsanitize=fuzzer-no-link), no SIMD (assembly is never instrumented).
# Usage: fuzz/build_libjpeg.sh OUT_DIR   -> OUT_DIR/lib/libjpeg.a and OUT_DIR/include/
# Exits 3 when the source cannot be had (no deb-src entry for apt): the fuzz target then links the system
# libjpeg (-ljpeg), uninstrumented: fuzzing still runs, with coverage feedback from fastload's code only.
set -euo pipefail
out=$(realpath -m "$1")
[ -f "$out/lib/libjpeg.a" ] && exit 0
work="$out-src"
mkdir -p "$work"
cd "$work"
if ! ls libjpeg-turbo-*/CMakeLists.txt >/dev/null 2>&1; then
  ver=$(dpkg-query -W -f='${source:Version}' libjpeg62-turbo 2>/dev/null || true)
  if ! apt-get source -q --download-only "libjpeg-turbo${ver:+=$ver}" >/dev/null 2>&1; then
    echo "build_libjpeg.sh: no libjpeg-turbo source from apt (add a deb-src entry to /etc/apt/sources.list.d" \
         "and run apt-get update to fuzz an instrumented libjpeg)" >&2
    exit 3
  fi
  tar xzf libjpeg-turbo_*.orig.tar.gz
fi
src=$(dirname "$(ls libjpeg-turbo-*/CMakeLists.txt | head -1)")
flags="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fsanitize=fuzzer-no-link"
cmake -S "$src" -B build -G "Unix Makefiles" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_C_FLAGS="$flags" -DWITH_SIMD=0 -DENABLE_SHARED=0 -DWITH_TURBOJPEG=0 -DWITH_JAVA=0 \
  -DCMAKE_INSTALL_PREFIX="$out" >/dev/null
make -C build -j"$(nproc)" jpeg-static >/dev/null
mkdir -p "$out/lib" "$out/include"
cp build/libjpeg.a "$out/lib/"
cp build/jconfig.h "$src/jpeglib.h" "$src/jmorecfg.h" "$src/jerror.h" "$out/include/"
echo "instrumented libjpeg-turbo $(basename "$src") in $out"
