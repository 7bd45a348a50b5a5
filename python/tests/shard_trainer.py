#!/usr/bin/env python3
"""One trainer shard of the 4-shard test (test_publisher.py), as its own process: it publishes
its slice of versions FIRST..LAST of a deterministic model to the origin, numbering each version
by its step, then stays until it is stopped (a trainer shard's slices go on their way after
publish() returns).

    shard_trainer.py ORIGIN SHARD FIRST LAST [--step-s S]

The model (model_at) is what the shards together hold: some tensors split into dim-0 ranges
across the shards (uneven ones too), others whole on one shard."""

import argparse
import sys
import time

import torch

import deltacast

SHARDS = 4
# name: (shape, how it is split): "rows" into 4 dim-0 ranges, or the shard that holds it whole.
TENSORS = {
    "embed.weight": ((1030, 96), "rows"),
    "norm.weight": ((96,), 3),
    "layers.0.mlp.weight": ((515, 96), "rows"),
    "layers.0.bias": ((515,), 1),
    "lm_head.weight": ((1030, 96), "rows"),
}


def model_at(step: int) -> dict:
    """The whole model at `step`: seeded values, and each step moves about 2% of them by one ulp."""
    g = torch.Generator().manual_seed(11)
    out = {name: torch.randn(*shape, generator=g).to(torch.bfloat16) for name, (shape, _) in TENSORS.items()}
    for s in range(2, step + 1):
        gs = torch.Generator().manual_seed(1000 + s)
        for t in out.values():
            flat = t.view(-1).view(torch.int16)
            idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=gs)
            flat[idx] += 1
    return out


def row_range(rows: int, shard: int) -> tuple:
    """Shard `shard`'s rows [start, end): torch.chunk's split, as FSDP's Shard(0) makes it."""
    per = -(-rows // SHARDS)
    return min(rows, shard * per), min(rows, (shard + 1) * per)


def slice_at(step: int, shard: int) -> dict:
    out = {}
    for name, t in model_at(step).items():
        split = TENSORS[name][1]
        if split == "rows":
            start, end = row_range(t.shape[0], shard)
            out[name] = deltacast.Rows(t[start:end].clone(), start, t.shape[0])
        elif split == shard:
            out[name] = t
    return out


def merged_names() -> list:
    """The tensors of a merged version in order: as they first appear in shard 0, 1, ..."""
    names = []
    for shard in range(SHARDS):
        names += [n for n, (_, split) in TENSORS.items() if (split == "rows" or split == shard) and n not in names]
    return names


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("origin")
    ap.add_argument("shard", type=int)
    ap.add_argument("first", type=int)
    ap.add_argument("last", type=int)
    ap.add_argument("--step-s", type=float, default=0.0)
    a = ap.parse_args()
    with deltacast.Publisher(origin=a.origin, shard=(a.shard, SHARDS)) as pub:
        for step in range(a.first, a.last + 1):
            pub.publish(slice_at(step, a.shard), version=step)
            print("published", step, flush=True)
            time.sleep(a.step_s)
        print("done", flush=True)
        while True:
            time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
