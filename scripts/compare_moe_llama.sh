#!/usr/bin/env bash
# Mixture-of-experts models on the CPU against llama.cpp's CPU build, on the same synthetic GGUFs
# (`rocmforge synth --preset tiny-moe`, seed 42): greedy continuations (--temp 0) and
# perplexity (non-flash-attention path, 2 threads, 128-token chunks).
#
#   scripts/compare_moe_llama.sh [LLAMA_BIN] [ROCMFORGE] [OUT_DIR]
#
# With `--gpu` first, the speed on the GPU machine instead, same run, same GGUFs: the
# Qwen3-30B-A3B shape at Q4_K_M and the gpt-oss-20b shape (MXFP4 experts, Q8_0 elsewhere),
# llama.cpp's CUDA build (`llama-bench -ngl 99 -fa 1`) against `rocmforge bench --device gpu
# --bandwidth` (whose bandwidth limit counts the experts a token uses, not every expert), tg128
# and pp512, through scripts/bench_matrix.py:
#
#   scripts/compare_moe_llama.sh --gpu [LLAMA_BENCH] [ROCMFORGE] [OUT_DIR]
#
# LLAMA_BENCH defaults to /tmp/llama/build/bin/llama-bench (`scripts/llamacpp.sh build`),
# ROCMFORGE to ./rocmforge, OUT_DIR (where the models are written and kept, about 18 and 13 GB) to
# /tmp/moe-bench; REPS (default 3) sets -r. Vocabularies from $ROCMFORGE_VOCAB_DIR when set
# (real output-head sizes: Qwen2's for Qwen3, Llama 3's for gpt-oss).
#
# LLAMA_BIN: llama.cpp's binaries (default /tmp/llama-cpu/build/bin) with llama-completion and
# llama-perplexity: `scripts/llamacpp.sh build-cpu /tmp/llama-cpu` then
# `cmake --build /tmp/llama-cpu/build --target llama-completion llama-perplexity`.
# ROCMFORGE: the CLI (default target/ci/rocmforge: `cargo build -p rocmforge-server --profile ci`).
# Prints one line per model and check; exits 1 when a greedy continuation differs.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--gpu" ]; then
  LB=${2:-/tmp/llama/build/bin/llama-bench}
  RF=${3:-./rocmforge}
  OUT=${4:-/tmp/moe-bench}
  REPS=${REPS:-3}
  for spec in "qwen3moe qwen3-30b-a3b Q4_K_M" "gpt-oss gpt-oss-20b Q8_0"; do
    read -r arch preset ftype <<<"$spec"
    python3 scripts/bench_matrix.py --gpu --families "$arch" --preset "$arch=$preset" \
      --types "$ftype" -p 512 -n 128 -r "$REPS" --rocmforge "$RF" --llama-bench "$LB" \
      --dir "$OUT" --keep --json "$OUT/$arch-$preset-$ftype.json"
  done
  exit 0
fi

BIN=${1:-/tmp/llama-cpu/build/bin}
RF=${2:-target/ci/rocmforge}
OUT=${3:-$(mktemp -d)}
PROMPT="The quick brown fox jumps over the lazy dog"
N=32
CTX=128
CHUNKS=4
TEXT=README.md
mkdir -p "$OUT"
fail=0

for arch in mixtral qwen3moe; do
  for ftype in q4_k_m q8_0; do
    m="$OUT/$arch-$ftype.gguf"
    "$RF" synth --arch "$arch" --preset tiny-moe --ftype "$ftype" --seed 42 -o "$m" >/dev/null
    # Greedy continuations: the generated text after the prompt.
    "$BIN/llama-completion" -m "$m" -p "$PROMPT" -n "$N" --temp 0 -t 2 -c 256 -fa off \
      -no-cnv --no-warmup --simple-io 2>/dev/null </dev/null >"$OUT/$arch-$ftype.llama.txt" || true
    "$RF" generate -m "$m" -p "$PROMPT" -n "$N" --temp 0 -t 2 -c 256 --device cpu \
      2>/dev/null >"$OUT/$arch-$ftype.rf.txt"
    # The built-in byte-level vocabulary yields bytes that are not whole UTF-8 characters:
    # llama.cpp prints them raw, rocmforge as U+FFFD, so both are compared decoded lossily.
    if python3 - "$OUT/$arch-$ftype.llama.txt" "$OUT/$arch-$ftype.rf.txt" <<'PY'
import sys
a, b = (open(p, "rb").read().decode("utf-8", "replace").strip() for p in sys.argv[1:3])
sys.exit(0 if a == b else 1)
PY
    then
      echo "$arch $ftype greedy: equal"
    else
      echo "$arch $ftype greedy: DIFFERENT"
      od -c "$OUT/$arch-$ftype.llama.txt" | head -5
      od -c "$OUT/$arch-$ftype.rf.txt" | head -5
      fail=1
    fi
    lp=$("$BIN/llama-perplexity" -m "$m" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t 2 -fa off \
      2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
    rp=$("$RF" perplexity -m "$m" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t 2 --device cpu \
      2>/dev/null | sed -n 's/^perplexity: \([0-9.]*\).*/\1/p')
    echo "$arch $ftype perplexity: llama.cpp $lp rocmforge $rp"
  done
done
exit $fail
