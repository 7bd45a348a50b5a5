#!/usr/bin/env python3
"""A torch training loop that publishes its weights to a deltacast fleet after every step.

A small Llama-shaped transformer (checkpoint names as in HF) learns a toy next-token task with
AdamW on the CPU. Master weights stay in float32; every step publishes their BF16 cast, as RL
trainers do for their rollout engines. Relays and workers connect to --listen.

    python3 examples/train_publish.py --listen tcp://127.0.0.1:7100 --steps 20
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

import deltacast
from tiny_llama import TinyLlama, batch

# BF16 bit patterns a value comparison would get wrong: NaN payloads, -0, infinities, subnormals.
SPECIAL_BF16 = [0x7FC1, 0xFFA0, 0x7F81, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x007F]


def weights(model, special):
    """What is published: the BF16 cast of every parameter (and the special values, if asked)."""
    out = {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}
    if special is not None:
        out["special_values"] = special.view(torch.bfloat16)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True, help="endpoint relays and workers connect to")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--wait-workers", type=int, default=0, help="wait until this many workers hold each version")
    ap.add_argument("--special-values", action="store_true", help="also publish a tensor of NaN payloads, -0, inf, subnormals")
    ap.add_argument("--dump-dir", help="save each published version (torch.save) for checking")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    model = TinyLlama()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    special = torch.tensor(SPECIAL_BF16 * 4, dtype=torch.int32).to(torch.int16) if args.special_values else None
    dump = Path(args.dump_dir) if args.dump_dir else None
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
    with deltacast.Publisher(args.listen) as pub:
        print(f"publishing on {pub.listening}, run {pub.run}", flush=True)
        previous = None
        for step in range(args.steps + 1):
            if step > 0:
                tokens = batch(512, g)
                loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, 512), tokens[:, 1:].reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
                if special is not None:
                    special[step % special.numel()] ^= 1  # a NaN payload or subnormal bit moves
            published = weights(model, special)
            start = time.perf_counter()
            version = pub.publish(published)
            took_ms = (time.perf_counter() - start) * 1e3
            if dump:
                torch.save({n: t.clone() for n, t in published.items()}, dump / f"v{version}.pt")
            changed = ""
            if previous is not None:
                total = sum(t.numel() for t in published.values())
                diff = sum(int((a.view(torch.int16) != previous[n].view(torch.int16)).sum()) for n, a in published.items())
                changed = f", {100.0 * diff / total:.2f}% of BF16 values changed"
            loss_text = f"loss {loss.item():.4f}, " if step > 0 else ""
            print(f"step {step}: {loss_text}published version {version} in {took_ms:.1f} ms{changed}", flush=True)
            previous = {n: t.clone() for n, t in published.items()}
            if args.wait_workers:
                d = pub.wait_ready(version, min_workers=args.wait_workers, timeout=120)
                print(f"  version {version} ready on {d.workers_ready} workers, publish to ready {d.max_ms} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
