#!/usr/bin/env python3
"""Benchmark matrix: rocmforge against llama.cpp over model families x weight types, same run.

For each family and file type it writes a synthetic model (`rocmforge synth`, reusing a file of
that name already there), runs llama.cpp's `llama-bench -o json` and `rocmforge bench` on it with
the same -p/-n/-r/-t, deletes the file unless --keep (files that were there before stay), and at
the end prints one table: family, type, file size, prompt (pp) and generation (tg) tokens per
second of both engines, their ratios (rocmforge / llama.cpp) and, with --gpu, the share of the
bandwidth limit rocmforge reports.

    scripts/bench_matrix.py                          # CPU, 7-8B shapes, every type (slow)
    scripts/bench_matrix.py --preset tiny -t 2 -p 64 -n 16 -r 2    # CPU smoke run
    scripts/bench_matrix.py --gpu --rocmforge ./rocmforge --llama-bench /tmp/llama/build/bin/llama-bench
    scripts/bench_matrix.py --rounds 3 --compare /tmp/rocmforge-main ...   # before/after, noisy CPU

With --rounds K the engines run in turn K times per file (llama.cpp, rocmforge, and the
--compare build when given), each time with the -r repetitions; the table gives each engine's
median over the rounds and the median of the per-round ratios, so a load change hits both sides
of a ratio alike. --compare adds a second rocmforge build's figures and ratios (before/after in
the same run).

On the GPU llama-bench runs with `-ngl 99 -fa 1` and rocmforge with `--device gpu --bandwidth`;
on the CPU with their defaults and `--device cpu`. Python 3 standard library only.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3"]
# The 7-8B shapes (gemma3: its 4B, the size nearest).
PRESETS = {
    "llama": "llama3-8b",
    "mistral": "mistral-7b",
    "qwen2": "qwen2-7b",
    "qwen3": "qwen3-8b",
    "gemma3": "gemma3-4b",
}
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K",
         "IQ4_XS", "IQ4_NL"]
# Vocabularies llama.cpp ships (`cargo xtask fetch-vocabs`): the output head's size follows them.
VOCABS = {
    "llama": "ggml-vocab-llama-bpe.gguf",
    "mistral": "ggml-vocab-llama-spm.gguf",
    "qwen2": "ggml-vocab-qwen2.gguf",
    "qwen3": "ggml-vocab-qwen2.gguf",
    "qwen3moe": "ggml-vocab-qwen2.gguf",
    # gpt-oss's own 201k-token vocabulary is not among them; Llama 3's 128k is the nearest size.
    "gpt-oss": "ggml-vocab-llama-bpe.gguf",
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    ap.add_argument("--types", default=",".join(TYPES),
                    help="comma-separated file types as `rocmforge synth --ftype` takes them")
    ap.add_argument("--preset", action="append", default=[],
                    help="PRESET for every family, or FAMILY=PRESET (repeatable); "
                         "default: the 7-8B shapes " + ", ".join(f"{k}={v}" for k, v in PRESETS.items()))
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gpu", action="store_true", help="run both engines on the GPU")
    ap.add_argument("--rocmforge", default=None,
                    help="the rocmforge CLI (default: target/ci/rocmforge, else rocmforge on PATH)")
    ap.add_argument("--llama-bench", default="/tmp/llama-cpu/build/bin/llama-bench",
                    help="llama.cpp's llama-bench (scripts/llamacpp.sh build or build-cpu)")
    ap.add_argument("--dir", default="/tmp/bench-matrix", help="where the models are written")
    ap.add_argument("--keep", action="store_true", help="keep the models this run wrote")
    ap.add_argument("--vocab-dir", default=os.environ.get("ROCMFORGE_VOCAB_DIR"),
                    help="llama.cpp's vocabulary GGUFs for real output-head sizes (default: "
                         "$ROCMFORGE_VOCAB_DIR; without: synth's 259-token vocabulary)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments")
    ap.add_argument("--rocmforge-args", default="", help="extra rocmforge bench arguments")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the engines in turn this many times per file; medians (noisy machines)")
    ap.add_argument("--compare", default=None,
                    help="a second rocmforge CLI (e.g. the previous build) measured in the same rounds")
    ap.add_argument("--json", help="also write the results here")
    return ap.parse_args()


def find_rocmforge(given):
    if given:
        return given
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "ci", "rocmforge")
    if os.path.exists(here):
        return os.path.normpath(here)
    found = shutil.which("rocmforge")
    if not found:
        sys.exit("no rocmforge CLI: pass --rocmforge (`cargo build -p server --profile ci`)")
    return found


def presets(args):
    out = {f: PRESETS.get(f, "tiny") for f in FAMILIES}
    for p in args.preset:
        if "=" in p:
            fam, name = p.split("=", 1)
            out[fam] = name
        else:
            out = {f: p for f in out}
    return out


def run(cmd):
    """Runs `cmd`; returns (stdout, error text or None)."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        return r.stdout, f"exit {r.returncode}: {tail}"
    return r.stdout, None


def synth(args, rf, fam, preset, ftype, path):
    cmd = [rf, "synth", "--arch", fam, "--preset", preset, "--ftype", ftype.lower(),
           "--seed", str(args.seed), "-o", path]
    vocab = VOCABS.get(fam)
    if args.vocab_dir and vocab and os.path.exists(os.path.join(args.vocab_dir, vocab)):
        cmd += ["--vocab", os.path.join(args.vocab_dir, vocab)]
    _, err = run(cmd)
    return err


def llama_bench(args, path):
    cmd = [args.llama_bench, "-m", path, "-p", str(args.n_prompt), "-n", str(args.n_gen),
           "-r", str(args.reps), "-t", str(args.threads), "-o", "json"]
    if args.gpu:
        cmd += ["-ngl", "99", "-fa", "1"]
    cmd += args.llama_args.split()
    out, err = run(cmd)
    res = {}
    if err:
        res["error"] = err
        return res
    try:
        for row in json.loads(out):
            key = "pp" if row.get("n_gen", 0) == 0 else "tg"
            res[key] = row["avg_ts"]
    except (ValueError, KeyError, TypeError) as e:
        res["error"] = f"unreadable llama-bench output: {e}"
    return res


ROW = re.compile(r"^\|.*\|\s*(pp|tg)(\d+)\s*\|\s*([0-9.]+)\s*±")
BW = re.compile(r"^tg(\d+): [0-9.]+ t/s, ([0-9.]+)% of the bandwidth limit")


def rocmforge_bench(args, rf, path):
    cmd = [rf, "bench", "-m", path, "-p", str(args.n_prompt), "-n", str(args.n_gen),
           "-r", str(args.reps), "-t", str(args.threads)]
    cmd += ["--device", "gpu", "--bandwidth"] if args.gpu else ["--device", "cpu"]
    cmd += args.rocmforge_args.split()
    out, err = run(cmd)
    res = {}
    if err:
        res["error"] = err
        return res
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            res[m.group(1)] = float(m.group(3))
        m = BW.match(line)
        if m:
            res["bw"] = float(m.group(2))
    if "pp" not in res and "tg" not in res:
        res["error"] = "no results in rocmforge bench output"
    return res


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def measure(args, rf, path):
    """Runs every engine `args.rounds` times in turn on `path`; returns (per-engine results with
    median t/s, per-round ratio medians)."""
    engines = [("llama", lambda: llama_bench(args, path)),
               ("rocmforge", lambda: rocmforge_bench(args, rf, path))]
    if args.compare:
        engines.append(("compare", lambda: rocmforge_bench(args, args.compare, path)))
    runs = {name: [] for name, _ in engines}
    for _ in range(max(args.rounds, 1)):
        for name, fn in engines:
            runs[name].append(fn())
    out = {}
    for name, rs in runs.items():
        res = {}
        for key in ("pp", "tg", "bw"):
            v = median([r.get(key) for r in rs])
            if v is not None:
                res[key] = v
        errs = [r["error"] for r in rs if r.get("error")]
        if errs:
            res["error"] = errs[0]
        out[name] = res
    ratios = {}
    for key in ("pp", "tg"):
        for num, den in (("rocmforge", "llama"), ("rocmforge", "compare"), ("compare", "llama")):
            if num in runs and den in runs:
                ratios[f"{key} {num}/{den}"] = median(
                    [ratio(a.get(key), b.get(key)) for a, b in zip(runs[num], runs[den])])
    return out, ratios


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def size(n):
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def ratio(a, b):
    return None if a is None or not b else a / b


def table(rows, gpu, compare):
    head = ["family", "type", "size", "pp llama.cpp", "pp rocmforge", "pp ratio",
            "tg llama.cpp", "tg rocmforge", "tg ratio"]
    if compare:
        head += ["pp compare", "pp ratio (compare)", "tg compare", "tg ratio (compare)"]
    if gpu:
        head.append("tg bandwidth share")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    notes = []
    for r in rows:
        lb, rb, cb = r["llama"], r["rocmforge"], r.get("compare", {})
        rat = r.get("ratios", {})

        def rt(key, num, a, b):
            # The median of per-round ratios when rounds ran, else the ratio of the figures.
            v = rat.get(f"{key} {num}/llama")
            return fmt(v if v is not None else ratio(a.get(key), b.get(key)), ".2f")

        cells = [r["family"] + (f" ({r['preset']})" if r["preset"] else ""), r["type"],
                 size(r["size"]),
                 fmt(lb.get("pp")), fmt(rb.get("pp")), rt("pp", "rocmforge", rb, lb),
                 fmt(lb.get("tg")), fmt(rb.get("tg")), rt("tg", "rocmforge", rb, lb)]
        if compare:
            cells += [fmt(cb.get("pp")), rt("pp", "compare", cb, lb),
                      fmt(cb.get("tg")), rt("tg", "compare", cb, lb)]
        if gpu:
            cells.append(fmt(rb.get("bw")) + ("%" if rb.get("bw") is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
        for who, res in (("synth", r.get("synth_error") and {"error": r["synth_error"]} or {}),
                         ("llama.cpp", lb), ("rocmforge", rb), ("compare", cb)):
            if res.get("error"):
                notes.append(f"{r['family']} {r['type']}: {who}: {res['error']}")
    return "\n".join(lines + ([""] + notes if notes else []))


def main():
    args = parse_args()
    rf = find_rocmforge(args.rocmforge)
    if not os.path.exists(args.llama_bench):
        sys.exit(f"no llama-bench at {args.llama_bench}: pass --llama-bench "
                 "(scripts/llamacpp.sh build-cpu /tmp/llama-cpu)")
    os.makedirs(args.dir, exist_ok=True)
    shapes = presets(args)
    rows = []
    for fam in args.families.split(","):
        for ty in args.types.split(","):
            preset = shapes.get(fam, "tiny")
            path = os.path.join(args.dir, f"{fam}-{preset}-{ty.lower()}.gguf")
            existed = os.path.exists(path)
            row = {"family": fam, "preset": preset, "type": ty, "size": None,
                   "llama": {}, "rocmforge": {}}
            t0 = time.time()
            err = None if existed else synth(args, rf, fam, preset, ty, path)
            if err:
                row["synth_error"] = err
            else:
                row["size"] = os.path.getsize(path)
                res, row["ratios"] = measure(args, rf, path)
                row.update(res)
                if not existed and not args.keep:
                    os.remove(path)
            rows.append(row)
            lb, rb = row["llama"], row["rocmforge"]
            print(f"{fam} {preset} {ty}: pp {fmt(lb.get('pp'))} / {fmt(rb.get('pp'))}, "
                  f"tg {fmt(lb.get('tg'))} / {fmt(rb.get('tg'))} t/s (llama.cpp / rocmforge), "
                  f"{time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"-p {args.n_prompt} -n {args.n_gen} -r {args.reps} -t {args.threads}, "
          f"{'GPU' if args.gpu else 'CPU'}; t/s; ratio = rocmforge / llama.cpp"
          + (f"; medians of {args.rounds} rounds" if args.rounds > 1 else "")
          + (f"; compare = {args.compare}" if args.compare else ""))
    print(table(rows, args.gpu, args.compare))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
