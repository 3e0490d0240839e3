#!/usr/bin/env bash
# llama.cpp's references for model/tests/family_logits.rs: writes the tiny synthetic family files
# (`model::synth::family_spec`, through the test with ROCMFORGE_SYNTH_OUT), runs llama.cpp's CPU
# path on each (scripts/llama_logits.c: top-20 logits after each prompt, 16 greedy tokens with
# their top-2 gaps, 2 threads, flash attention off) and writes model/tests/data/family_NAME.json.
#
#   scripts/family_goldens.sh [LLAMA_DIR] [NAME...]
#
# LLAMA_DIR: llama.cpp's source with a CPU build in LLAMA_DIR/build (default /tmp/llama-cpu:
# `scripts/llamacpp.sh build-cpu /tmp/llama-cpu`); its libllama is linked. NAME: the families
# to redo (default all).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA=${1:-/tmp/llama-cpu}
shift || true
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(phi3 phi3-long gpt-oss olmo2 granite)
N_CTX=256
N_GREEDY=16
PROMPTS=("The quick brown fox jumps over the lazy dog" "Hello world" "1, 2, 3, 4, 5,")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

cc -O2 -Wall -I"$LLAMA/include" -I"$LLAMA/ggml/include" scripts/llama_logits.c \
  -L"$LLAMA/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$LLAMA/build/bin" -o "$OUT/llama_logits"
# The test writes every file before comparing; it fails where a reference is missing or stale.
ROCMFORGE_SYNTH_OUT=$OUT cargo test -q --profile ci -p model --test family_logits \
  >/dev/null 2>&1 || true
REF="0c1e57098 (llama-cpp-python 0.3.36)"
for name in "${NAMES[@]}"; do
  m="$OUT/family-$name.gguf"
  "$OUT/llama_logits" "$m" "$N_CTX" "$N_GREEDY" "${PROMPTS[@]}" >"$OUT/$name.json"
  python3 - "$OUT/$name.json" "$m" "$name" "llama.cpp $REF" >"model/tests/data/family_$name.json" <<'PY'
import hashlib, json, sys
d = json.load(open(sys.argv[1]))
out = {
    "reference": sys.argv[4] + " CPU, -fa off, 2 threads (scripts/llama_logits.c)",
    "model_sha256": hashlib.sha256(open(sys.argv[2], "rb").read()).hexdigest(),
    "command": "model::synth::write(&family_spec(\"%s\"), None, out); scripts/family_goldens.sh" % sys.argv[3],
}
out.update(d)
prompts = out.pop("prompts")
head = json.dumps(out, indent=1)[:-2]
print(head + ',\n "prompts": [\n  ' + ",\n  ".join(json.dumps(p) for p in prompts) + "\n ]\n}")
PY
  echo "model/tests/data/family_$name.json"
done
