#!/usr/bin/env bash
# rocmforge batched-bench against llama.cpp's llama-batched-bench: same GGUF, same machine, same
# run. llama.cpp comes from scripts/llamacpp.sh (the llama-cpp-python 0.3.36 sdist, llama.cpp
# 0c1e57098): `scripts/llamacpp.sh prepare` here, then `build` (CUDA, on the GPU machine) or
# `build-cpu` into LLAMA_DIR.
#
#   scripts/compare_batched_bench.sh MODEL.gguf [flags for both, e.g. -t 2 or -ngl 99]
#
# Environment: LLAMA_DIR (default /tmp/llama), ROCMFORGE (default target/release/rocmforge),
# NPP / NTG / NPL (default 128 / 128 / 1,2,4,8), LLAMA_FA (flash attention flag for llama.cpp,
# default 0 on the CPU: its reference path; pass 1 with CUDA as the issue's comparison asks).
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:?usage: $0 MODEL.gguf [flags...]}
shift
llama=${LLAMA_DIR:-/tmp/llama}/build/bin/llama-batched-bench
rf=${ROCMFORGE:-target/release/rocmforge}
npp=${NPP:-128}
ntg=${NTG:-128}
npl=${NPL:-1,2,4,8}
[ -x "$llama" ] || { echo "no $llama: run scripts/llamacpp.sh prepare, then build or build-cpu" >&2; exit 1; }
[ -x "$rf" ] || { echo "no $rf: cargo build --release -p rocmforge-server" >&2; exit 1; }

echo "== llama.cpp llama-batched-bench =="
"$llama" -m "$model" -npp "$npp" -ntg "$ntg" -npl "$npl" -fa "${LLAMA_FA:-0}" "$@"
echo
echo "== rocmforge batched-bench =="
"$rf" batched-bench -m "$model" -npp "$npp" -ntg "$ntg" -npl "$npl" "$@"
