#!/usr/bin/env bash
# The memory estimate against the run, on the GPU machine (issue "Memory estimates that match the
# run"): for each model, context and cap, `rocmforge generate` with a prompt longer than one batch
# (so the first pass is a full batch), then
#   - the estimated GPU total against what the allocator holds at the end of the run (within 5%),
#   - the card's peak (nvidia-smi, 50 ms polls, less what was in use before) within the cap,
#   - under a cap that leaves layers on the CPU: one more layer (`-ngl placed+1`, no cap) peaks
#     above the cap, so the plan placed the most layers that fit.
#
#   scripts/check_estimates.sh MODEL.gguf [MODEL.gguf ...]
#
# Environment: ROCMFORGE (default target/release/rocmforge), CTXS (default "4096 8192"), CAPS
# (default "none 2G 3G 6G"), GPUS (default 0: the GPUs the runs may use, as CUDA/HIP visible
# devices; with several, `--device auto` splits layers over them, the cap is per GPU and the peak
# is the largest of theirs), LOGS (a folder that keeps every run's output, with the estimate's
# workspace terms logged, as MODEL-CTX-CAP[-ngl N].log), FILL (1: prompts of about 90% of the
# context, see `prompt` below). Prints one row per run and exits 1 if any check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
# The estimate's workspace terms, for the kept logs.
[ -z "${LOGS:-}" ] || export ROCMFORGE_LOG=${ROCMFORGE_LOG:-warn,rocmforge_model::engine=debug}

rf=${ROCMFORGE:-target/release/rocmforge}
gpus=${GPUS:-0}
export CUDA_VISIBLE_DEVICES=$gpus HIP_VISIBLE_DEVICES=$gpus
ctxs=${CTXS:-4096 8192}
caps=${CAPS:-none 2G 3G 6G}
[ $# -ge 1 ] || { sed -n 2,13p "$0"; exit 2; }
command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: run this on the GPU machine" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# About 700 tokens with any vocabulary: longer than the default batch of 512. With FILL=1, about
# 90% of each context instead (written per context below), so that the last prompt chunk attends
# over nearly all of it, where the attention's scratch is largest (worth it for small models,
# whose scratch is a larger share; slow with layers on the CPU).
prompt() {
  local n=100
  [ "${FILL:-0}" = 1 ] && n=$(( $1 * 9 / 10 / 11 ))
  for _ in $(seq 1 "$n"); do printf 'the quick brown fox jumps over the lazy dog. '; done > "$work/prompt.txt"
}

# "index, MiB" per visible GPU.
used() { nvidia-smi -i "$gpus" --query-gpu=index,memory.used --format=csv,noheader,nounits; }
to_mib() {
  case "$1" in
    *G) echo $(( ${1%G} * 1024 )) ;;
    *M) echo "${1%M}" ;;
  esac
}

# run ARGS...: runs generate (with --stats: the memory at the end), leaves its stderr in $work/log and the card's peak (MiB over the
# use before) in $peak.
run() {
  local base sp
  used > "$work/base"
  nvidia-smi -i "$gpus" --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 50 > "$work/smi" 2>/dev/null &
  sp=$!
  timeout 300 "$rf" generate --device auto -f "$work/prompt.txt" -n 4 --temp 0 --stats "$@" \
    > /dev/null 2> "$work/log"
  local rc=$?
  if [ -n "${LOGS:-}" ]; then
    mkdir -p "$LOGS"
    cp "$work/log" "$LOGS/$(echo "$*" | tr -c 'A-Za-z0-9.\n-' '_').log"
  fi
  sleep 0.2
  kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null
  # Per GPU: the largest use seen less the use before; then the largest of the GPUs.
  peak=$(awk -F', *' 'NR == FNR { base[$1] = $2; next } { d = $2 - base[$1]; if (d > m) m = d } END { print m + 0 }' \
    "$work/base" "$work/smi")
  return $rc
}

fail=0
printf '%-28s %-6s %-5s %-9s %9s %9s %7s %9s %s\n' model ctx cap layers estimate allocated diff peak check
for m in "$@"; do
  name=$(basename "$m" .gguf)
  for c in $ctxs; do
    prompt "$c"
    for cap in $caps; do
      args=(-m "$m" -c "$c")
      [ "$cap" = none ] || args+=(--gpu-mem-limit "$cap")
      if ! run "${args[@]}"; then
        printf '%-28s %-6s %-5s run failed: %s\n' "$name" "$c" "$cap" "$(grep -i error "$work/log" | head -1)"
        fail=1
        continue
      fi
      layers=$(grep -o 'layers on GPU: [0-9]*/[0-9]*' "$work/log" | head -1 | cut -d' ' -f4)
      head_gpu=$(grep -c 'output head on GPU' "$work/log")
      est=$(grep -o 'total [0-9.]* MiB' "$work/log" | head -1 | awk '{print $2}')
      # At the end of the run (`--stats`): allocations only grow, so this is the run's largest.
      alloc=$(grep -o 'GPU memory allocated: [0-9.]* MiB' "$work/log" | tail -1 | awk '{print $4}')
      if [ -z "$est" ] || [ -z "$alloc" ]; then
        printf '%-28s %-6s %-5s no plan or no GPU pass in the output\n' "$name" "$c" "$cap"
        fail=1
        continue
      fi
      diff=$(awk -v e="$est" -v a="$alloc" 'BEGIN { printf "%+.1f%%", (e - a) / a * 100 }')
      check=ok
      awk -v e="$est" -v a="$alloc" 'BEGIN { exit !(e >= a * 0.95 && e <= a * 1.05) }' || check="estimate off by $diff"
      if [ "$cap" != none ] && [ "$peak" -gt "$(to_mib "$cap")" ]; then
        check="peak over the cap"
      fi
      printf '%-28s %-6s %-5s %-9s %9s %9s %7s %9s %s\n' "$name" "$c" "$cap" "$layers$([ "$head_gpu" = 1 ] && echo +out)" \
        "$est" "$alloc" "$diff" "$peak" "$check"
      [ "$check" = ok ] || fail=1
      # One more layer than placed (or the output head), without the cap, must not fit under it.
      placed=${layers%/*}
      total=${layers#*/}
      more_ngl=
      if [ "$placed" -lt "$total" ]; then
        more_ngl=$((placed + 1))
      elif [ "$head_gpu" = 0 ]; then
        more_ngl=$((total + 1))
      fi
      if [ "$cap" != none ] && [ -n "$more_ngl" ]; then
        if run -m "$m" -c "$c" -ngl "$more_ngl"; then
          more="ok"
          [ "$peak" -gt "$(to_mib "$cap")" ] || { more="fits: the plan left a layer out"; fail=1; }
          printf '%-28s %-6s %-5s %-9s %9s %9s %7s %9s %s\n' "$name" "$c" "$cap" "-ngl $more_ngl" - - - "$peak" "$more"
        fi
      fi
    done
  done
done
exit $fail
