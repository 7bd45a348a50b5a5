#!/usr/bin/env python3
"""Make a series of real training checkpoints: a Llama-shaped transformer trained with torch's
AdamW on the CPU, its float32 master weights cast to BF16 after every step, as RL trainers
publish them. Each checkpoint is a safetensors file, step-000000.safetensors and on, as
`deltacast gen` names them, so every bench command and `deltacast inspect --entropy` takes them.

The model is examples/tiny_llama.py's, wider. The default series, 5 checkpoints of 336 MB with
about 2.4% of values changed a step, takes 3 minutes on 2 cores; --size small (42 MB) a few
seconds a step:

    python3 scripts/adamw_series.py -o adamw

The first --warmup steps are trained but not written: Adam's first steps move every weight by
about the learning rate (its moments are still empty), which a trainer's later steps do not.
"""

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from tiny_llama import TinyLlama, batch  # noqa: E402

SIZES = {  # name: (vocab, dim, layers, heads, ffn)
    "tiny": (512, 128, 2, 4, 344),
    "small": (8192, 512, 4, 8, 1376),
    "base": (32000, 1024, 8, 16, 2816),
}


def save_bf16(path: Path, tensors: dict) -> int:
    """Writes `tensors` (BF16, contiguous) as one safetensors file; returns its size."""
    header, offset = {}, 0
    for name, t in tensors.items():
        n = t.numel() * 2
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in tensors.values():
            f.write(t.contiguous().view(torch.int16).numpy().tobytes())
    tmp.replace(path)
    return 8 + len(text) + offset


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out", required=True, help="directory for the checkpoints")
    ap.add_argument("--size", choices=sorted(SIZES), default="base", help="tiny: 1 MB, small: 42 MB, base: 336 MB a checkpoint")
    ap.add_argument("--steps", type=int, default=4, help="checkpoints after the first")
    ap.add_argument("--warmup", type=int, default=10, help="steps trained before the first checkpoint")
    ap.add_argument("--lr", type=float, default=3e-6)
    ap.add_argument("--batch", type=int, default=1, help="sequences a step (64 tokens each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: one a core)")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        ap.error("--steps must be at least 1, --warmup and --batch not negative")
    torch.set_num_threads(args.threads or os.cpu_count() or 1)

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    vocab, dim, layers, heads, ffn = SIZES[args.size]
    model = TinyLlama(vocab=vocab, dim=dim, layers=layers, heads=heads, ffn=ffn)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params = sum(p.numel() for p in model.parameters())
    total = args.warmup + args.steps
    print(f"{args.size}: {params / 1e6:.1f} M parameters, {params * 2 / 1e6:.0f} MB a checkpoint; "
          f"{args.warmup} warm-up steps, then {args.steps + 1} checkpoints", flush=True)
    previous = None
    start = time.perf_counter()
    for step in range(total + 1):
        if step > 0:
            tokens = batch(vocab, g, size=args.batch, length=64)
            loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if step < args.warmup:
            print(f"\rwarm-up {step + 1}/{args.warmup}", end="", flush=True)
            continue
        index = step - args.warmup
        with torch.no_grad():
            weights = {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}
        save_bf16(out / f"step-{index:06d}.safetensors", weights)
        changed = ""
        if previous is not None:
            moved = sum(int((w.view(torch.int16) != previous[n].view(torch.int16)).sum()) for n, w in weights.items())
            changed = f", {100.0 * moved / params:.3f}% of values changed"
        previous = weights
        print(f"\rcheckpoint {index}/{args.steps} ({time.perf_counter() - start:.0f} s){changed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
