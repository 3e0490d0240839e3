#!/usr/bin/env python3
"""Oracle helper for the gguf crate's tests: runs the official `gguf` Python package (and numpy
for the few types it has no converter for) on inputs the Rust tests prepare.

Commands:
  dequant DIR   DIR/manifest.txt lines "TYPE_ID IN OUT": dequantize IN's raw blocks, write f32 to OUT
  quant DIR     DIR/manifest.txt lines "TYPE_ID IN OUT": quantize IN's f32 values, write bytes to OUT
  dump FILE OUT [DIR NAME...]  read FILE with GGUFReader, write its canonical listing to OUT
                (and dequantize the named tensors into DIR/NAME.f32, sharing one parse)
  tensors FILE DIR NAME...  dequantize the named tensors of FILE into DIR/NAME.f32
  bench DIR REPEAT  DIR/manifest.txt "TYPE_ID IN OUT": time gguf-py dequantization, print "TYPE_ID seconds"
"""
import sys
import time

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf import quants


def numpy_dequant(qtype, raw):
    """Types gguf-py has no dequantizer for, in plain numpy with ggml's formulas."""
    if qtype == Q.F64:
        return raw.view(np.float64).astype(np.float32)
    if qtype == Q.I8:
        return raw.view(np.int8).astype(np.float32)
    if qtype == Q.I16:
        return raw.view(np.int16).astype(np.float32)
    if qtype == Q.I32:
        return raw.view(np.int32).astype(np.float32)
    if qtype == Q.I64:
        return raw.view(np.int64).astype(np.float32)
    if qtype == Q.Q8_1:
        b = raw.reshape(-1, 36)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (b[:, 4:].copy().view(np.int8).astype(np.float32) * d).ravel()
    if qtype == getattr(Q, "Q1_0", None):
        # ggml's dequantize_row_q1_0: bit j%8 of byte j/8 selects +d or -d.
        b = raw.reshape(-1, 18)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        bits = np.unpackbits(b[:, 2:], axis=1, bitorder="little").astype(bool)
        return np.where(bits, d, -d).astype(np.float32).ravel()
    if qtype == Q2_0_ID:
        # ggml's dequantize_row_q2_0: bits 2*(j%4) of byte j/4, value (q - 1) * d.
        b = raw.reshape(-1, 18)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = np.stack([(b[:, 2:] >> (2 * k)) & 3 for k in range(4)], axis=-1).reshape(-1, 64)
        return ((q.astype(np.float32) - 1.0) * d).ravel()
    if qtype == Q.Q8_K:
        b = raw.reshape(-1, 292)
        d = b[:, 0:4].copy().view(np.float32)
        return (d * b[:, 4:260].copy().view(np.int8).astype(np.float32)).ravel()
    return None


def dequant(qtype, raw):
    out = numpy_dequant(qtype, raw)
    if out is not None:
        return out, "numpy"
    return quants.dequantize(raw, qtype).astype(np.float32, copy=False).ravel(), "gguf-py"


def manifest(d):
    with open(f"{d}/manifest.txt") as f:
        for line in f:
            t, i, o = line.split()
            yield qtype_of(int(t)), i, o


# ggml type ids newer than this gguf-py's enum (ggml.h: GGML_TYPE_Q2_0 = 42).
Q2_0_ID = 42


def qtype_of(t):
    return Q(t) if t in Q._value2member_map_ else t


def cmd_dequant(d):
    for qtype, i, o in manifest(d):
        raw = np.fromfile(i, dtype=np.uint8)
        out, who = dequant(qtype, raw)
        out.astype(np.float32).tofile(o)
        print(getattr(qtype, "name", qtype), who)


def cmd_quant(d):
    for qtype, i, o in manifest(d):
        x = np.fromfile(i, dtype=np.float32).reshape(-1, 256)
        quants.quantize(x, qtype).tofile(o)


def canon(parts, i, vtype):
    """Canonical text of one value starting at parts[i]; returns (text, next index)."""
    vtype = V(int(vtype))
    if vtype == V.STRING:
        return "str:" + bytes(parts[i + 1]).hex(), i + 2
    if vtype == V.ARRAY:
        itype = int(parts[i][0])
        n = int(parts[i + 1][0])
        j = i + 2
        items = []
        for _ in range(n):
            t, j = canon(parts, j, itype)
            items.append(t)
        return f"arr{itype}({n})[" + ",".join(items) + "]", j
    v = parts[i][0]
    if vtype == V.FLOAT32:
        return "f32:%08x" % int(np.float32(v).view(np.uint32)), i + 1
    if vtype == V.FLOAT64:
        return "f64:%016x" % int(np.float64(v).view(np.uint64)), i + 1
    if vtype == V.BOOL:
        return "bool:%d" % int(bool(v)), i + 1
    return "%d:%d" % (int(vtype), int(v)), i + 1


def cmd_dump(path, out, d=None, names=()):
    r = gguf.GGUFReader(path)
    if d is not None:
        tensors_of(r, d, names)
    lines = []
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            if name == "GGUF.version":
                lines.append("version\t%d" % int(field.parts[0][0]))
            continue
        text, _ = canon(field.parts, 3, int(field.parts[2][0]))
        lines.append(f"kv\t{name}\t{text}")
    lines.append("alignment\t%d" % r.alignment)
    lines.append("data_offset\t%d" % r.data_offset)
    for t in r.tensors:
        dims = ",".join(str(int(x)) for x in t.shape)
        lines.append(f"tensor\t{t.name}\t{int(t.tensor_type)}\t{dims}\t{t.n_bytes}\t{t.data_offset}")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def cmd_tensors(path, d, names):
    tensors_of(gguf.GGUFReader(path), d, names)


def tensors_of(r, d, names):
    by_name = {t.name: t for t in r.tensors}
    for n in names:
        t = by_name[n]
        raw = np.ascontiguousarray(t.data).view(np.uint8).ravel()
        out, _ = dequant(t.tensor_type, raw)
        out.tofile(f"{d}/{n}.f32")


def cmd_bench(d, repeat):
    for qtype, i, _ in manifest(d):
        raw = np.fromfile(i, dtype=np.uint8)
        dequant(qtype, raw)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            dequant(qtype, raw)
            best = min(best, time.perf_counter() - t0)
        print(int(qtype), best, flush=True)


def main():
    cmd = sys.argv[1]
    if cmd == "dequant":
        cmd_dequant(sys.argv[2])
    elif cmd == "quant":
        cmd_quant(sys.argv[2])
    elif cmd == "dump":
        cmd_dump(sys.argv[2], sys.argv[3], *(sys.argv[4:5]), names=sys.argv[5:])
    elif cmd == "tensors":
        cmd_tensors(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif cmd == "bench":
        cmd_bench(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
