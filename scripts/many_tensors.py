#!/usr/bin/env python3
"""Two consecutive checkpoints of many tiny tensors (docs/BENCHMARKS.md, "Many small tensors").

    python3 scripts/many_tensors.py --tensors 200000 -o DIR    # DIR/A.safetensors, DIR/B.safetensors

The layout is what MoE checkpoints are full of: per-expert biases and norms of one element, 80%
BF16, 17.5% F32 and 2.5% of zero size, so the codec sees hundreds of thousands of tensors and
segments in a tiny image. B is A after one step: about a third of the BF16 values move by one
ulp, half the F32 values change some of their 4 lowest mantissa bits.

The header is written as deltacast writes it (compact JSON, tensors in offset order, padded
with spaces to 8 bytes), so `deltacast decode` must give back B byte for byte. Python 3
standard library only.
"""
import argparse
import json
import os
import random
import struct


def layout(count):
    """[(name, dtype, shape)] in image order."""
    out = []
    for i in range(count):
        layer, expert = divmod(i, 256)
        if i % 40 == 39:
            out.append((f"model.layers.{layer}.mlp.experts.{expert}.scale_pad", "BF16", [0]))
        elif i % 5 == 4:
            out.append((f"model.layers.{layer}.mlp.experts.{expert}.router_bias", "F32", [1]))
        else:
            out.append((f"model.layers.{layer}.mlp.experts.{expert}.norm", "BF16", [1]))
    return out


def header(tensors, metadata):
    entries = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape in tensors:
        nbytes = (2 if dtype == "BF16" else 4) * (shape[0] if shape else 1)
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def bf16(x):
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


def images(tensors, seed):
    rng = random.Random(seed)
    a, b = bytearray(), bytearray()
    for _, dtype, shape in tensors:
        if shape == [0]:
            continue
        if dtype == "BF16":
            v = bf16(rng.gauss(1.0, 0.05))
            w = v
            if rng.random() < 0.3:
                w = v + 1 if rng.random() < 0.5 else v - 1
            a += struct.pack("<H", v)
            b += struct.pack("<H", w)
        else:
            v = struct.unpack("<I", struct.pack("<f", rng.gauss(0.0, 0.01)))[0]
            w = v ^ rng.getrandbits(4) if rng.random() < 0.5 else v
            a += struct.pack("<I", v)
            b += struct.pack("<I", w)
    return bytes(a), bytes(b)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensors", type=int, default=200000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("-o", "--out", required=True, help="output directory")
    o = p.parse_args()
    os.makedirs(o.out, exist_ok=True)
    tensors = layout(o.tensors)
    a, b = images(tensors, o.seed)
    for name, data, step in (("A", a, "0"), ("B", b, "1")):
        with open(os.path.join(o.out, name + ".safetensors"), "wb") as f:
            f.write(header(tensors, {"format": "pt", "step": step}))
            f.write(data)
    print(f"{o.out}: {len(tensors)} tensors, {len(a)} bytes of data per checkpoint")


if __name__ == "__main__":
    main()
