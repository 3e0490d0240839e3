#!/usr/bin/env bash
# rocmforge batched-bench against llama.cpp's llama-batched-bench on the same GGUF, same machine,
# same run.
#
# llama.cpp is the copy vendored in PyPI's llama-cpp-python sdist (0.3.36: llama.cpp 0c1e57098,
# the reference of DESIGN.md), fetched with pip and built here with cmake: CPU by default,
# CUDA with LLAMA_CUDA=1 (then run both with `-ngl 99`; llama.cpp's side gets `-fa 1`).
#
# Usage:
#   scripts/batched_bench_vs_llama_cpp.sh MODEL.gguf [extra flags for both, e.g. -t 2]
# Environment:
#   WORK        build folder (default: target/llama-cpp)
#   ROCMFORGE   rocmforge binary (default: target/release/rocmforge, built if missing)
#   NPP NTG NPL the lists (default 128 / 128 / 1,2,4,8)
#   LLAMA_CUDA  1: build llama.cpp with CUDA (sm_90) and pass -fa 1 to it
set -euo pipefail

model=${1:?usage: $0 MODEL.gguf [flags...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$root/target/llama-cpp}
version=0.3.36
npp=${NPP:-128}
ntg=${NTG:-128}
npl=${NPL:-1,2,4,8}

mkdir -p "$work"
src=$work/llama_cpp_python-$version/vendor/llama.cpp
if [ ! -d "$src" ]; then
    python3 -m pip download "llama-cpp-python==$version" --no-binary :all: --no-deps -d "$work"
    tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
fi
build=$work/build${LLAMA_CUDA:+-cuda}
bench=$build/bin/llama-batched-bench
llama_flags=()
if [ ! -x "$bench" ]; then
    cmake_args=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF)
    if [ "${LLAMA_CUDA:-}" = 1 ]; then
        cmake_args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
    fi
    cmake -S "$src" -B "$build" "${cmake_args[@]}"
    cmake --build "$build" --target llama-batched-bench -j "$(nproc)"
fi
if [ "${LLAMA_CUDA:-}" = 1 ]; then
    llama_flags+=(-fa 1)
fi

rf=${ROCMFORGE:-$root/target/release/rocmforge}
if [ ! -x "$rf" ]; then
    cargo build --release -p model --bin rocmforge --manifest-path "$root/Cargo.toml"
fi

echo "== llama.cpp llama-batched-bench ($version) =="
"$bench" -m "$model" -npp "$npp" -ntg "$ntg" -npl "$npl" "${llama_flags[@]}" "$@"
echo
echo "== rocmforge batched-bench =="
"$rf" batched-bench -m "$model" -npp "$npp" -ntg "$ntg" -npl "$npl" "$@"
