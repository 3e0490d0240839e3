#!/usr/bin/env python3
"""Golden reference files for rocmforge's model tests, computed by llama.cpp.

The reference is llama.cpp 0c1e57098 as vendored in PyPI's llama-cpp-python 0.3.36, driven
through its Python bindings (greedy = argmax of the raw logits, n_threads 2) and its
`llama-perplexity` tool. Outputs go to model/tests/data/ (see the README there for formats).

Setup used (see model/tests/data/README.md for the exact commands):
  sdist:  pip download llama-cpp-python==0.3.36 --no-binary :all: --no-deps  (or PyPI's JSON API)
  lib:    cmake build of the vendored llama.cpp (BUILD_SHARED_LIBS=ON, GGML_NATIVE=ON) giving
          libllama.so, llama-perplexity, llama-bench; bindings installed with
          CMAKE_ARGS="-DLLAMA_BUILD=OFF" pip install llama_cpp_python-0.3.36.tar.gz and pointed
          at that build with LLAMA_CPP_LIB_PATH=<build>/bin (same source, built once).

Usage:
  scripts/make_goldens.py gemma  --model gemma-3-270m-q4_k_m.gguf
  scripts/make_goldens.py synth  --model synth-llama.gguf --name llama --command "<how it was made>"
                                  (names: model::synth::GOLDEN_NAMES, e.g. llama-yarn, gemma2)
  scripts/make_goldens.py perplexity --model gemma.gguf --bin <build>/bin/llama-perplexity
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "tests", "data")
REFERENCE = "llama.cpp 0c1e57098 (llama-cpp-python 0.3.36)"

# Texts for the tokenizer comparison: ASCII, whitespace runs, newlines, code, numbers,
# unicode (accents, CJK, emoji, RTL), byte-fallback material and Gemma's turn markers.
TOKENIZER_TEXTS = [
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "",
    " ",
    "   ",
    "\t",
    "\n",
    "\n\n\n",
    "a  b   c    d",
    "line one\nline two\r\nline three\n\n  indented\tand\ttabs",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "3.14159 2718281828 1,000,000 -42 0x1F 1e-9 2026-11-21",
    "1 12 123 1234 12345 123456 1234567",
    "Café naïve résumé Ångström façade",
    "Привет, мир! Ελληνικά Русский",
    "你好，世界。日本語のテキスト、한국어 텍스트",
    "emoji: 🦙🚀👍🏽 ❤️ 🇩🇪 😀😃😄",
    "مرحبا بالعالم",
    "\u200b zero\u00a0width\u2003spaces\u3000here",
    "ǅ ǈ ǋ ﬁ ﬂ Ⅻ ½ ² ∑ ∞ ≠ → ←",
    "'s 're 've 'll 'd 'm 't I'M YOU'RE don't",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text with bos inside <eos> and <pad>",
    "<unknown_tag> <b>bold</b> <start_of_turn",
    "https://example.com/path?query=1&x=y#frag",
    "    leading spaces and trailing spaces    ",
    "The quick brown fox jumps over the lazy dog. " * 3,
]

PROMPTS = [
    {"text": "The capital of France is", "parse_special": False},
    {"text": "Once upon a time, in a small village by the sea,", "parse_special": False},
    {"text": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", "parse_special": False},
    {"text": "The three primary colors are", "parse_special": False},
    {"text": "Q: What is 17 times 23?\nA:", "parse_special": False},
    {"text": "Les fleurs du jardin sont", "parse_special": False},
    {"text": "<start_of_turn>user\nWrite a haiku about the moon.<end_of_turn>\n<start_of_turn>model\n", "parse_special": True},
    {"text": "1, 2, 3, 4, 5,", "parse_special": False},
    {"text": "In 1969, the first humans to walk on the Moon were", "parse_special": False},
    {"text": "import numpy as np\n\nx = np.linspace(0, 1, 100)\n", "parse_special": False},
]

N_GREEDY = 64
TOP_K_GEMMA = 20
TOP_K_SYNTH = 50


def load(model, n_ctx=512):
    from llama_cpp import Llama

    return Llama(model, n_ctx=n_ctx, n_threads=2, n_threads_batch=2, logits_all=True, verbose=False, seed=0)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def top_k(logits, k):
    idx = np.argsort(-logits, kind="stable")[:k]
    return [[int(i), float(logits[i])] for i in idx]


def stats(logits):
    return {
        "mean": float(np.mean(logits)),
        "std": float(np.std(logits)),
        "min": float(np.min(logits)),
        "max": float(np.max(logits)),
        "argmax": int(np.argmax(logits)),
    }


def greedy(llm, prompt_ids, n):
    """Prompt in one batch, then argmax token by token; per step the token and top-2 gap."""
    llm.reset()
    llm.eval(prompt_ids)
    last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    first_logits = last.copy()
    tokens, gaps = [], []
    for _ in range(n):
        order = np.argsort(-last, kind="stable")[:2]
        tok = int(order[0])
        tokens.append(tok)
        gaps.append(round(float(last[order[0]] - last[order[1]]), 5))
        llm.eval([tok])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return first_logits, tokens, gaps


def write(name, obj):
    path = os.path.join(DATA, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("wrote", path, os.path.getsize(path), "bytes")


def cmd_gemma(a):
    llm = load(a.model)
    cases = []
    for text in TOKENIZER_TEXTS:
        b = text.encode("utf-8")
        cases.append({
            "text": text,
            "plain": llm.tokenize(b, add_bos=False, special=False),
            "bos": llm.tokenize(b, add_bos=True, special=False),
            "bos_special": llm.tokenize(b, add_bos=True, special=True),
        })
    write("gemma3_tokenizer.json", {
        "reference": REFERENCE,
        "model_sha256": sha256(a.model),
        "cases": cases,
    })
    prompts = []
    for p in PROMPTS:
        ids = llm.tokenize(p["text"].encode("utf-8"), add_bos=True, special=p["parse_special"])
        logits, tokens, gaps = greedy(llm, ids, N_GREEDY)
        prompts.append({
            "text": p["text"],
            "parse_special": p["parse_special"],
            "prompt_ids": ids,
            "top_k": top_k(logits, TOP_K_GEMMA),
            "stats": stats(logits),
            "greedy": tokens,
            "gap": gaps,
        })
        print(repr(p["text"][:30]), "->", repr(llm.detokenize(tokens).decode("utf-8", "replace")[:60]))
    write("gemma3_greedy.json", {
        "reference": REFERENCE,
        "model_sha256": sha256(a.model),
        "n_threads": 2,
        "prompts": prompts,
    })


SYNTH_PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x * 2\n",
]


def cmd_synth(a):
    llm = load(a.model, n_ctx=256)
    prompts = []
    for text in SYNTH_PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        logits, tokens, gaps = greedy(llm, ids, 16)
        prompts.append({
            "text": text,
            "prompt_ids": ids,
            "top_k": top_k(logits, TOP_K_SYNTH),
            "stats": stats(logits),
            "greedy": tokens,
            "gap": gaps,
        })
    write(f"synth_{a.name}.json", {
        "reference": REFERENCE,
        "model_sha256": sha256(a.model),
        "command": a.command,
        "n_vocab": llm.n_vocab(),
        "prompts": prompts,
    })


def cmd_perplexity(a):
    text = os.path.join(DATA, "perplexity.txt")
    # Flash attention off: llama.cpp's default ("auto") turns it on for the CPU, where it
    # accumulates V in f16; the logit goldens (Python bindings) and our CPU backend follow the
    # matrix-product attention path (q and probabilities rounded to f16, f32 sums).
    cmd = [a.bin, "-m", a.model, "-f", text, "-c", str(a.ctx), "-t", "2", "-b", str(a.ctx * 4), "-fa", "off"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    log = res.stdout + res.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    if not m:
        sys.exit("no final estimate in llama-perplexity output:\n" + log[-3000:])
    chunks = re.search(r"calculating perplexity over (\d+) chunks", log)
    write("gemma3_perplexity.json", {
        "reference": REFERENCE,
        "model_sha256": sha256(a.model),
        "text": "perplexity.txt",
        "text_sha256": sha256(text),
        "command": "llama-perplexity -m <gemma> -f model/tests/data/perplexity.txt -c %d -t 2 -b %d -fa off" % (a.ctx, a.ctx * 4),
        "n_ctx": a.ctx,
        "n_chunks": int(chunks.group(1)) if chunks else None,
        "ppl": float(m.group(1)),
        "ppl_stderr": float(m.group(2)),
    })


def cmd_bpe_default(a):
    """The `default` BPE pre-tokenizer (no vocabulary in llama.cpp's test set uses it): the
    gpt-2 test vocabulary with tokenizer.ggml.pre rewritten to "default" (metadata only)."""
    from llama_cpp import Llama

    llm = Llama(a.model, vocab_only=True, verbose=False)
    texts = list(TOKENIZER_TEXTS)
    with open(a.inp, encoding="utf-8") as f:
        texts += f.read().split("\n__ggml_vocab_test__\n")
    cases = [{"text": t, "ids": llm.tokenize(t.encode("utf-8"), add_bos=False, special=False)} for t in texts]
    write("bpe_default_pre.json", {
        "reference": REFERENCE,
        "vocab": "ggml-vocab-gpt-2.gguf with tokenizer.ggml.pre = default",
        "cases": cases,
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gemma")
    g.add_argument("--model", required=True)
    s = sub.add_parser("synth")
    s.add_argument("--model", required=True)
    s.add_argument("--name", required=True)
    s.add_argument("--command", required=True)
    p = sub.add_parser("perplexity")
    p.add_argument("--model", required=True)
    p.add_argument("--bin", required=True)
    p.add_argument("--ctx", type=int, default=128)
    d = sub.add_parser("bpe-default")
    d.add_argument("--model", required=True, help="ggml-vocab-gpt-2.gguf with tokenizer.ggml.pre set to default")
    d.add_argument("--inp", required=True, help="ggml-vocab-gpt-2.gguf.inp")
    a = ap.parse_args()
    {"gemma": cmd_gemma, "synth": cmd_synth, "perplexity": cmd_perplexity, "bpe-default": cmd_bpe_default}[a.cmd](a)


if __name__ == "__main__":
    main()
