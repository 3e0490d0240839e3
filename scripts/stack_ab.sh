#!/usr/bin/env bash
# Same-run decode speed of the persistent decode stack's kernels on the GPU machine (issue 41:
# the portable kernel, which AMD GPUs run, within 90% of the NVIDIA-specific one on NVIDIA):
# writes the synthetic Llama-3-8B-shape Q4_K_M model with the build's `synth`, then runs `bench`
# (tg128) with `--gpu-stack native`, `portable` and `off` in turn, interleaved ROUNDS times.
#
#   scripts/stack_ab.sh [BIN=target/release/rocmforge] [ROUNDS=2] [VOCAB=.device/ggml-vocab-llama-bpe.gguf]
#
# Prints each run's table (tg128, share of the bandwidth limit measured in the same run), then
# one line per kernel with its best tokens/s and the portable kernel's share of native's.
set -euo pipefail
bin=${1:-target/release/rocmforge} rounds=${2:-2} vocab=${3:-.device/ggml-vocab-llama-bpe.gguf}
model=${MODEL:-/tmp/m8b.gguf}
if [ ! -f "$model" ]; then
  vocab_args=()
  [ -f "$vocab" ] && vocab_args=(--vocab "$vocab")
  "$bin" synth --arch llama --preset llama3-8b --ftype q4_k_m "${vocab_args[@]}" -o "$model"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for r in $(seq "$rounds"); do
  for k in native portable off; do
    echo "== round $r: --gpu-stack $k"
    "$bin" bench -m "$model" --device gpu -p 0 -n 128 -r 2 --bandwidth --gpu-stack "$k" | tee /dev/stderr |
      awk -v k="$k" '/tg128/ { for (i = 2; i <= NF; i++) if ($i == "±") v = $(i - 1); print k, v }' >> "$log"
  done
done
# The tokens/s column: the mean before the "±" on the tg128 line.
awk '{ if ($2 > best[$1]) best[$1] = $2 }
     END {
       for (k in best) printf "best tg128 %-8s %8.2f t/s\n", k, best[k]
       if (best["native"] > 0) printf "portable / native: %.1f%%\n", 100 * best["portable"] / best["native"]
     }' "$log"
