#!/usr/bin/env bash
# Runs one libFuzzer target as JOBS parallel jobs of RUNS executions each and prints the total
# executions libFuzzer counted, for fuzz campaigns on a many-core machine without a Rust toolchain
# (the device machine). Build the target here first, e.g. for model/fuzz's targets:
#   cargo xtask fuzz --runs 1 --sanitizer none model_config tokenizer
# which leaves target/fuzz-none-model-fuzz/x86_64-unknown-linux-gnu/release/{model_config,tokenizer}
# and the seeds in model/fuzz/corpus/<target>.
# Usage: scripts/fuzz_parallel.sh BINARY CORPUS_DIR RUNS_PER_JOB JOBS [libFuzzer flags...]
# A crash stops that job with its input saved as crash-* in the working directory and makes this
# script exit non-zero; the job logs are fuzz-<n>.log in LOG_DIR (default: a temporary folder).
set -euo pipefail
bin=$1 corpus=$2 runs=$3 jobs=$4
shift 4
log_dir=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$log_dir"
bin=$(realpath "$bin")
corpus=$(realpath "$corpus")
start=$(date +%s)
status=0
(cd "$log_dir" && "$bin" "$corpus" -runs="$runs" -jobs="$jobs" -workers="$jobs" "$@") >"$log_dir/main.log" 2>&1 || status=$?
total=0
crashes=0
for f in "$log_dir"/fuzz-*.log; do
    n=$(sed -n 's/^Done \([0-9]*\) runs in.*/\1/p' "$f" | tail -1)
    if [ -z "$n" ]; then
        crashes=$((crashes + 1))
        echo "== $f ended without libFuzzer's Done line:"
        tail -30 "$f"
    else
        total=$((total + n))
    fi
done
echo "$(basename "$bin"): $total executions in $(($(date +%s) - start)) s by $jobs jobs, $crashes job(s) without Done, libFuzzer exit $status"
[ "$status" -eq 0 ] && [ "$crashes" -eq 0 ]
