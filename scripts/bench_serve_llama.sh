#!/usr/bin/env bash
# Serving benchmark, same run, same GGUF: `rocmforge serve` and llama.cpp's `llama-server`
# (llama.cpp 0c1e57098 as vendored in PyPI's llama-cpp-python 0.3.36, built here from its sdist),
# each measured by `rocmforge bench-serve` with the same load.
#
# Usage: scripts/bench_serve_llama.sh MODEL.gguf [cpu|cuda]
# The issue's CPU comparison (Gemma 3 270M, 4 slots, 2 threads, concurrency 4):
#   CONC=4 PARALLEL=4 THREADS=2 scripts/bench_serve_llama.sh gemma-3-270m-q4_k_m.gguf cpu
# Env: CONC (concurrency levels, default 1,8,32,64), REQUESTS (per level, 64), PROMPT (128),
#      OUTPUT (128), PARALLEL (server slots, default the largest level), CTX (per slot, 1024),
#      THREADS (CPU threads, default all), RANGE_RATIO (mixed lengths as vLLM's random dataset:
#      uniform in mean*(1-R)..mean*(1+R); MIXED=1 is 0.5), SEED (1), LLAMA_DIR (llama.cpp build
#      of scripts/llamacpp.sh, default /tmp/llama-DEVICE), ROCMFORGE (binary, default
#      target/release/rocmforge).
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:?usage: $0 MODEL.gguf [cpu|cuda]}
device=${2:-cpu}
conc=${CONC:-1,8,32,64}
requests=${REQUESTS:-64}
prompt=${PROMPT:-128}
output=${OUTPUT:-128}
parallel=${PARALLEL:-$(tr ',' '\n' <<<"$conc" | sort -n | tail -1)}
ctx=${CTX:-1024}
threads=${THREADS:-$(nproc)}
rf=${ROCMFORGE:-target/release/rocmforge}
ratio=${RANGE_RATIO:-0}
[[ ${MIXED:-0} == 1 ]] && ratio=0.5
mixed=(--range-ratio "$ratio" --seed "${SEED:-1}")

# llama.cpp from scripts/llamacpp.sh (the sdist prepared here, built where the benchmark runs).
llama=${LLAMA_DIR:-/tmp/llama-$device}
server_bin=$llama/build/bin/llama-server
if [[ ! -x $server_bin ]]; then
  [[ -f .device/llama/src.tar.xz ]] || bash scripts/llamacpp.sh prepare
  if [[ $device == cuda ]]; then
    bash scripts/llamacpp.sh build "$llama"
  else
    bash scripts/llamacpp.sh build-cpu "$llama"
  fi
fi

if [[ ! -x $rf ]]; then
  cargo build --release -p rocmforge-server --bin rocmforge
fi

wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server on port $1 never became ready" >&2
  return 1
}

bench() {
  "$rf" bench-serve --url "http://127.0.0.1:$1" --concurrency "$conc" --requests "$requests" \
    --prompt-tokens "$prompt" --output-tokens "$output" "${mixed[@]}"
}

if [[ $device == cuda ]]; then
  rf_dev=(--device gpu -ngl 999)
  ll_dev=(-ngl 99 -fa on)
else
  rf_dev=(--device cpu)
  ll_dev=(-ngl 0 -fa off)
fi

echo "=== rocmforge serve ($device, $parallel slots x $ctx context)"
"$rf" serve -m "$model" --port 18080 --parallel "$parallel" -c "$ctx" -t "$threads" "${rf_dev[@]}" &
rf_pid=$!
trap 'kill $rf_pid 2>/dev/null || true' EXIT
wait_ready 18080
bench 18080
kill "$rf_pid"; wait "$rf_pid" 2>/dev/null || true

echo "=== llama-server ($device, $parallel slots x $ctx context)"
"$server_bin" -m "$model" --port 18081 -np "$parallel" -c $((ctx * parallel)) -t "$threads" \
  "${ll_dev[@]}" >/dev/null 2>&1 &
ll_pid=$!
trap 'kill $ll_pid 2>/dev/null || true' EXIT
wait_ready 18081
bench 18081
kill "$ll_pid"; wait "$ll_pid" 2>/dev/null || true
