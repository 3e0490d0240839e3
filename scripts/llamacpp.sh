#!/usr/bin/env bash
# llama.cpp, the reference engine, from the source vendored in PyPI's llama-cpp-python 0.3.36
# (llama.cpp 0c1e57098), for same-run comparisons with rocmforge.
#
#   scripts/llamacpp.sh prepare          here: download the sdist (sha256 checked), pack the
#                                        llama.cpp sources (no models, docs) into
#                                        .device/llama/src.tar.xz (about 10 MB) to carry
#   scripts/llamacpp.sh build [DIR]      on the GPU machine: unpack and build with CUDA for sm_90
#                                        (llama-bench, llama-batched-bench, llama-server, llama-quantize,
#                                        llama-perplexity) into DIR (/tmp/llama); about 6-7 min
#   scripts/llamacpp.sh build-cpu [DIR]  the same, CPU only (this machine kind: AVX2/AVX-512)
#
# The binaries land in DIR/build/bin. Runs of both engines are scripted beside their benchmarks
# (scripts/compare_*.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
URL=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$VERSION.tar.gz
TARGETS=(llama-bench llama-batched-bench llama-server llama-perplexity llama-cli llama-quantize)

prepare() {
  local work; work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  curl -sSL -o "$work/sdist.tar.gz" "$URL"
  echo "$SHA256  $work/sdist.tar.gz" | sha256sum -c --quiet
  tar xzf "$work/sdist.tar.gz" -C "$work"
  mkdir -p .device/llama
  tar cJf .device/llama/src.tar.xz -C "$work/llama_cpp_python-$VERSION/vendor" \
    --exclude='llama.cpp/models' --exclude='llama.cpp/docs' --exclude='llama.cpp/.git' llama.cpp
  ls -la .device/llama/src.tar.xz
}

build() {
  local dir=${2:-/tmp/llama} cuda=$1
  mkdir -p "$dir"
  tar xJf .device/llama/src.tar.xz -C "$dir" --strip-components=1
  local flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF)
  if [ "$cuda" = 1 ]; then
    flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
  fi
  cmake -S "$dir" -B "$dir/build" "${flags[@]}" >"$dir/cmake.log" 2>&1 || { tail -30 "$dir/cmake.log"; exit 1; }
  cmake --build "$dir/build" -j"$(nproc)" --target "${TARGETS[@]}" >"$dir/build.log" 2>&1 ||
    { tail -40 "$dir/build.log"; exit 1; }
  ls "$dir/build/bin"
}

case "${1:-}" in
  prepare) prepare ;;
  build) build 1 "${2:-}" ;;
  build-cpu) build 0 "${2:-}" ;;
  *) sed -n 2,16p "$0"; exit 2 ;;
esac
