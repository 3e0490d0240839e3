#!/usr/bin/env bash
# llama.cpp's references for model/tests/embed_models.rs: writes the tiny synthetic encoders
# (`model::synth::embed_spec`, through the test with ROCMFORGE_SYNTH_OUT), runs llama.cpp's
# llama-embedding on each prompt with each pooling (CPU, 2 threads, flash attention off,
# euclidean normalisation) and writes model/tests/data/embed_NAME.json.
#
#   scripts/embed_goldens.sh [LLAMA_DIR] [NAME...]
#
# LLAMA_DIR: llama.cpp's source with a CPU build in LLAMA_DIR/build (default /tmp/llama-cpu;
# `cmake --build LLAMA_DIR/build --target llama-embedding` if its bin/ lacks llama-embedding).
# NAME: the encoders to redo (default all). Needs ROCMFORGE_VOCAB_DIR (default
# ~/.cache/rocmforge/vocabs, from `cargo xtask fetch-vocabs`).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA=${1:-/tmp/llama-cpu}
shift || true
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(bert nomic-bert)
export ROCMFORGE_VOCAB_DIR=${ROCMFORGE_VOCAB_DIR:-$HOME/.cache/rocmforge/vocabs}
PROMPTS=("The quick brown fox jumps over the lazy dog." "Hello world" "what is the capital of France?")
POOLINGS=(none mean cls last)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# The test writes every file before comparing; it fails where a reference is missing or stale.
ROCMFORGE_SYNTH_OUT=$OUT cargo test -q --profile ci -p rocmforge-model --test embed_models \
  >/dev/null 2>&1 || true
REF=$("$LLAMA/build/bin/llama-embedding" --version 2>&1 | sed -n "s/^version: //p" | head -n 1)
for name in "${NAMES[@]}"; do
  m="$OUT/embed-$name.gguf"
  for i in "${!PROMPTS[@]}"; do
    for p in "${POOLINGS[@]}"; do
      # llama-embedding's output goes through its asynchronous log and is now and then cut
      # short at exit: run it again until the output parses.
      for _ in 1 2 3 4 5; do
        "$LLAMA/build/bin/llama-embedding" -m "$m" -p "${PROMPTS[$i]}" --pooling "$p" \
          --embd-normalize 2 --embd-output-format array -t 2 -c 64 -fa off \
          2>"$OUT/$name-$i-$p.log" >"$OUT/$name-$i-$p.json" || true
        python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$OUT/$name-$i-$p.json" \
          2>/dev/null && break
      done
    done
  done
  python3 - "$OUT" "$m" "$name" "llama.cpp $REF" "${PROMPTS[@]}" \
    >"model/tests/data/embed_$name.json" <<'PY'
import hashlib, json, sys
out_dir, model, name, ref = sys.argv[1:5]
texts = sys.argv[5:]
prompts = []
for i, text in enumerate(texts):
    emb = {}
    for p in ("none", "mean", "cls", "last"):
        a = json.load(open(f"{out_dir}/{name}-{i}-{p}.json"))
        emb[p] = a if p == "none" else a[0]
    prompts.append({"text": text, "embeddings": emb})
out = {
    "reference": ref + " llama-embedding, CPU, -fa off, 2 threads, --embd-normalize 2",
    "model_sha256": hashlib.sha256(open(model, "rb").read()).hexdigest(),
    "command": "model::synth::write(&embed_spec(\"%s\"), vocab, out); scripts/embed_goldens.sh" % name,
    "pooling_type": {"bert": "cls", "nomic-bert": "mean"}[name],
}
head = json.dumps(out, indent=1)[:-2]
print(head + ',\n "prompts": [\n  ' + ",\n  ".join(json.dumps(p) for p in prompts) + "\n ]\n}")
PY
  echo "model/tests/data/embed_$name.json"
done
