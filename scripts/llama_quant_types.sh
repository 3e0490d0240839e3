#!/usr/bin/env bash
# The per-tensor types llama.cpp's llama-quantize picks for each file type on synthetic models,
# the table model/tests/data/llama_quant_types.txt pins (`synth::tests` compares ours to it).
#
#   scripts/llama_quant_types.sh [LLAMA_DIR] [ROCMFORGE] > model/tests/data/llama_quant_types.txt
#
# LLAMA_DIR: a llama.cpp tree built for the CPU with llama-quantize in build/bin
# (`scripts/llamacpp.sh build-cpu /tmp/llama-cpu`; default /tmp/llama-cpu); its gguf-py reads
# the outputs (needs numpy). ROCMFORGE: the CLI (default target/ci/rocmforge) writes the F16
# inputs (built-in vocabulary, seed 42). Lines: arch preset FTYPE tensor type-per-layer...
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA=${1:-/tmp/llama-cpu}
RF=${2:-target/ci/rocmforge}
QUANTIZE=${QUANTIZE:-$LLAMA/build/bin/llama-quantize}
FTYPES=(Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for model in "llama tiny" "gemma3 gemma3-270m" "mixtral tiny-moe"; do
  read -r arch preset <<<"$model"
  "$RF" synth --arch "$arch" --preset "$preset" --ftype f16 --seed 42 -o "$work/in.gguf" >/dev/null 2>&1
  for ft in "${FTYPES[@]}"; do
    "$QUANTIZE" "$work/in.gguf" "$work/out.gguf" "$ft" 2 >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
    PYTHONPATH="$LLAMA/gguf-py" python3 - "$work/out.gguf" "$arch" "$preset" "$ft" <<'PY'
import re, sys
from gguf import GGUFReader
path, arch, preset, ft = sys.argv[1:5]
kinds = {}
for t in GGUFReader(path).tensors:
    ty = t.tensor_type.name
    if ty == "F32":
        continue
    m = re.match(r"blk\.(\d+)\.(.*)\.weight$", t.name)
    kind, layer = (m.group(2), int(m.group(1))) if m else (t.name[: -len(".weight")], 0)
    kinds.setdefault(kind, {})[layer] = ty
for kind in sorted(kinds):
    print(arch, preset, ft, kind, *(kinds[kind][i] for i in sorted(kinds[kind])))
PY
  done
done
