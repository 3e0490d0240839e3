#!/usr/bin/env bash
# Same-run decode comparison of two rocmforge builds on the GPU machine (e.g. before and after a
# restructuring that must not change speed): writes the synthetic Llama-3-8B-shape Q4_K_M model
# with the new build's `synth`, then runs `bench` of each build in turn, interleaved ROUNDS times.
#
#   scripts/decode_ab.sh OLD_BIN NEW_BIN [ROUNDS=2] [VOCAB=.device/ggml-vocab-llama-bpe.gguf]
#
# Prints each run's table (tg128, share of the bandwidth limit measured in the same run).
set -euo pipefail
old=$1 new=$2 rounds=${3:-2} vocab=${4:-.device/ggml-vocab-llama-bpe.gguf}
model=${MODEL:-/tmp/m8b.gguf}
if [ ! -f "$model" ]; then
  vocab_args=()
  [ -f "$vocab" ] && vocab_args=(--vocab "$vocab")
  "$new" synth --arch llama --preset llama3-8b --ftype q4_k_m "${vocab_args[@]}" -o "$model"
fi
for r in $(seq "$rounds"); do
  for side in old new; do
    bin=$old; [ "$side" = new ] && bin=$new
    echo "== round $r: $side ($bin)"
    "$bin" bench -m "$model" --device gpu -p 0 -n 128 -r 2 --bandwidth
  done
done
