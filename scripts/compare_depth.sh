#!/usr/bin/env bash
# Decode at depth: `rocmforge bench -d` against llama.cpp's `llama-bench -d` (CUDA build, -ngl 99
# -fa 1), same GGUF, same machine, same run: the synthetic Llama-3-8B shape at Q4_K_M, its
# context length written as long as the deepest test needs (`rocmforge synth --ctx`; the
# preset's 8192 would refuse `-d 32768`). Each test generates N tokens after DEPTHS positions of
# random tokens (filled untimed), as llama-bench's `-d` does.
#
#   scripts/compare_depth.sh [OUT_DIR]
#
# llama.cpp comes from scripts/llamacpp.sh (`prepare` here, `build` on the GPU machine, into
# LLAMA_DIR). Environment: LLAMA_DIR (default /tmp/llama), ROCMFORGE (default
# target/release/rocmforge), DEPTHS (default 0,8192,32768), N (default 32), REPS (default 2),
# STACKS (rocmforge's --gpu-stack kernels to run, default "auto"; e.g. "short split auto" to time
# decode_stack against decode_stack_split at every depth), VOCAB (a GGUF whose tokenizer the model
# takes, e.g. llama.cpp's ggml-vocab-llama-bpe.gguf: Llama 3's 128k-token output head; default the
# minimal byte-level vocabulary). OUT_DIR (default /tmp/depth-bench) keeps the model (about 5 GB)
# between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-/tmp/depth-bench}
llama=${LLAMA_DIR:-/tmp/llama}/build/bin/llama-bench
rf=${ROCMFORGE:-target/release/rocmforge}
depths=${DEPTHS:-0,8192,32768}
n=${N:-32}
reps=${REPS:-2}
stacks=${STACKS:-auto}
[ -x "$llama" ] || { echo "no $llama: run scripts/llamacpp.sh prepare, then build" >&2; exit 1; }
[ -x "$rf" ] || { echo "no $rf: cargo build --release -p rocmforge-server" >&2; exit 1; }

deepest=$(tr ',' '\n' <<<"$depths" | sort -n | tail -1)
# The deepest test's positions plus its tokens, with room to spare.
ctx=$((deepest + n + 1024))
model="$out/llama3-8b-q4_k_m-ctx$ctx${VOCAB:+-$(basename "$VOCAB" .gguf)}.gguf"
mkdir -p "$out"
if [ ! -f "$model" ]; then
  "$rf" synth --arch llama --preset llama3-8b --ftype q4_k_m --seed 42 --ctx "$ctx" \
    ${VOCAB:+--vocab "$VOCAB"} -o "$model"
fi

echo "== llama.cpp llama-bench (CUDA, -fa 1) =="
"$llama" -m "$model" -ngl 99 -fa 1 -p 0 -n "$n" -d "$depths" -r "$reps"
for k in $stacks; do
  echo
  echo "== rocmforge bench (--gpu-stack $k) =="
  "$rf" bench -m "$model" --device gpu --gpu-stack "$k" -p 0 -n "$n" -d "$depths" -r "$reps"
done
