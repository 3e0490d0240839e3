#!/usr/bin/env bash
# Serving benchmark, same run, same GGUF: `rocmforge serve` and llama.cpp's `llama-server`
# (llama.cpp 0c1e57098 as vendored in PyPI's llama-cpp-python 0.3.36, built here from its sdist),
# each measured by `rocmforge bench-serve` with the same load.
#
# Usage: scripts/bench_serve_llama.sh MODEL.gguf [cpu|cuda]
# Env: CONC (concurrency levels, default 1,8,32,64), REQUESTS (per level, 64), PROMPT (128),
#      OUTPUT (128), PARALLEL (server slots, default the largest level), CTX (per slot, 1024),
#      THREADS (CPU threads, default all), MIXED=1 (mixed lengths), WORK (build dir,
#      ~/.cache/rocmforge/llama-server), ROCMFORGE (binary, default target/release/rocmforge).
set -euo pipefail

model=${1:?usage: $0 MODEL.gguf [cpu|cuda]}
device=${2:-cpu}
conc=${CONC:-1,8,32,64}
requests=${REQUESTS:-64}
prompt=${PROMPT:-128}
output=${OUTPUT:-128}
parallel=${PARALLEL:-$(tr ',' '\n' <<<"$conc" | sort -n | tail -1)}
ctx=${CTX:-1024}
threads=${THREADS:-$(nproc)}
work=${WORK:-$HOME/.cache/rocmforge/llama-server}
rf=${ROCMFORGE:-target/release/rocmforge}
mixed=()
[[ ${MIXED:-0} == 1 ]] && mixed=(--mixed)

version=0.3.36
mkdir -p "$work"
server_bin=$work/build-$device/bin/llama-server
if [[ ! -x $server_bin ]]; then
  if [[ ! -d $work/llama_cpp_python-$version ]]; then
    python3 -m pip download "llama-cpp-python==$version" --no-binary :all: --no-deps -d "$work"
    tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
  fi
  src=$work/llama_cpp_python-$version/vendor/llama.cpp
  flags=(-DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release)
  [[ $device == cuda ]] && flags+=(-DGGML_CUDA=ON)
  cmake -S "$src" -B "$work/build-$device" "${flags[@]}"
  cmake --build "$work/build-$device" --target llama-server -j "$(nproc)"
fi

if [[ ! -x $rf ]]; then
  cargo build --release -p server --bin rocmforge
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
