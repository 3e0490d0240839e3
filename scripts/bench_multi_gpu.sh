#!/usr/bin/env bash
# Several GPUs on one host: rocmforge `bench` (tg128, pp512) on one GPU, with `-sm layer` and
# with `-sm tensor` over the GPUs of $GPUS (partial sums by NCCL, and by peer copies), against
# llama.cpp's CUDA build (`-sm layer` and `-sm row`, flash attention on) on the same GPUs and
# the same synthetic GGUFs (`rocmforge synth`, seed 42), all in one run on the same machine.
#
#   scripts/bench_multi_gpu.sh [LLAMA_BIN] [ROCMFORGE] [OUT_DIR]
#
# LLAMA_BIN: llama.cpp's binaries with llama-bench (default /tmp/llama/build/bin:
# `scripts/llamacpp.sh build`). ROCMFORGE: the CLI (default target/release/rocmforge).
# OUT_DIR: where the GGUFs and logs go (default /tmp/bench-multi-gpu; the models are reused
# when present). PRESETS (env): the synth presets to run (default "llama3-8b llama3-70b"; a
# preset this build does not know, or a model that does not fit, is reported and skipped).
# REPS (env): repetitions per test (default 3). VOCAB (env): a GGUF whose vocabulary the
# models get (`synth --vocab`; default: synth's built-in one). GPUS (env): the GPUs to split
# over, as `--devices` takes them (default 0,1; the one-GPU runs use the first). FTYPES (env):
# the weight types to synthesize (default q4_k_m; e.g. "q4_k_m q8_0"). MODES (env): rocmforge's
# runs (default "none layer tensor tensor-peer"; none: one GPU; tensor: small all-reduces by the
# one-shot peer all-reduce where it works, NCCL for the rest; tensor-nccl: NCCL for every
# all-reduce; tensor-peer: partial sums by peer copies to the main GPU). LLAMA_ONE (env): 0 skips
# llama.cpp's one-GPU run (default 1).
#
# Prints each engine's tables; the logs keep the device plans.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${1:-/tmp/llama/build/bin}
RF=${2:-target/release/rocmforge}
OUT=${3:-/tmp/bench-multi-gpu}
PRESETS=${PRESETS:-"llama3-8b llama3-70b"}
REPS=${REPS:-3}
GPUS=${GPUS:-0,1}
FTYPES=${FTYPES:-q4_k_m}
FIRST=${GPUS%%,*}
MODES=${MODES:-"none layer tensor tensor-peer"}
LLAMA_ONE=${LLAMA_ONE:-1}
# The device machines forbid NVLink multicast; children inherit it.
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"

for preset in $PRESETS; do
for ftype in $FTYPES; do
  m="$OUT/$preset-$ftype.gguf"
  tag="$preset-$ftype"
  if [ ! -s "$m" ]; then
    echo "== synth $preset $ftype"
    vocab=(); if [ -n "${VOCAB:-}" ]; then vocab=(--vocab "$VOCAB"); fi
    if ! "$RF" synth --arch llama --preset "$preset" --ftype "$ftype" --seed 42 "${vocab[@]}" \
      -o "$m" >"$OUT/$tag-synth.log" 2>&1; then
      echo "$tag: synth failed (see $OUT/$tag-synth.log), skipped"
      tail -3 "$OUT/$tag-synth.log"
      rm -f "$m"
      continue
    fi
  fi
  ls -la "$m"
  # tensor-peer: the tensor split summing its partials by peer copies instead of NCCL.
  for mode in $MODES; do
    coll=1
    case "$mode" in
      none) gpus=(--split-mode none --devices "$FIRST") ;;
      tensor-peer) gpus=(--split-mode tensor --devices "$GPUS"); coll=0 ;;
      tensor-nccl) gpus=(--split-mode tensor --devices "$GPUS"); coll=nccl ;;
      *) gpus=(--split-mode "$mode" --devices "$GPUS") ;;
    esac
    echo "== rocmforge $tag ${gpus[*]} (ROCMFORGE_TP_COLLECTIVE=$coll)"
    ROCMFORGE_TP_COLLECTIVE=$coll "$RF" bench -m "$m" --device gpu -p 512 -n 128 -r "$REPS" "${gpus[@]}" \
      2>"$OUT/$tag-rf-$mode.log" ||
      { echo "rocmforge $tag $mode failed:"; tail -5 "$OUT/$tag-rf-$mode.log"; }
  done
  if [ -x "$BIN/llama-bench" ]; then
    if [ "$LLAMA_ONE" = 1 ]; then
      echo "== llama.cpp $tag, 1 GPU ($FIRST)"
      CUDA_VISIBLE_DEVICES=$FIRST "$BIN/llama-bench" -m "$m" -p 512 -n 128 -r "$REPS" -ngl 99 -fa 1 \
        2>"$OUT/$tag-llama-1.log" || { echo "llama.cpp 1 GPU failed:"; tail -5 "$OUT/$tag-llama-1.log"; }
    fi
    for sm in layer row; do
      echo "== llama.cpp $tag -sm $sm, GPUs $GPUS"
      CUDA_VISIBLE_DEVICES=$GPUS "$BIN/llama-bench" -m "$m" -p 512 -n 128 -r "$REPS" -ngl 99 -fa 1 \
        -sm "$sm" 2>"$OUT/$tag-llama-$sm.log" ||
        { echo "llama.cpp -sm $sm failed:"; tail -5 "$OUT/$tag-llama-$sm.log"; }
    done
  else
    echo "no $BIN/llama-bench: llama.cpp skipped (scripts/llamacpp.sh build)"
  fi
done
done
