#!/usr/bin/env python3
"""A rollout process that keeps its own copy of the model current through deltacast patches.

The copy stands in for an engine's GPU-resident weights: the first version is copied whole, every
later one is applied with ``index_copy_`` from ``Version.patches`` (only the changed values move),
and ``Version.verify`` checks the copy bit for bit after each update.

    python3 examples/rollout.py --id rollout-0 --parent tcp://127.0.0.1:7100 --until 21
"""

import argparse
import sys
import time
from pathlib import Path

import torch

import deltacast


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--id", required=True)
    ap.add_argument("--parent", action="append", required=True, help="parent endpoint (repeat: fallbacks)")
    ap.add_argument("--until", type=int, required=True, help="stop after applying this version")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each version")
    ap.add_argument("--dump-dir", help="save the copy after each version (torch.save) for checking")
    args = ap.parse_args()

    dump = Path(args.dump_dir) if args.dump_dir else None
    model = None  # name -> this process's own tensor
    held = 0
    with deltacast.Worker(args.id, args.parent) as worker:
        while held < args.until:
            v = worker.wait(held + 1, timeout=args.timeout)
            start = time.perf_counter()
            try:
                patches = list(v.patches(since=held)) if model is not None else None
            except deltacast.Error:
                patches = None  # the worker's history does not reach back (it restarted, or an anchor came)
            if patches is None:
                model = {name: t.clone() for name, t in v.tensors()}
                how = "copied whole"
            else:
                for name, idx, values in patches:
                    model[name].view(-1).index_copy_(0, idx, values)
                how = f"{sum(idx.numel() for _, idx, _ in patches)} values patched"
            took_ms = (time.perf_counter() - start) * 1e3
            differ = v.verify(model)
            if differ:
                print(f"{args.id}: version {v.number} does not match after the update: {differ[:5]}", file=sys.stderr)
                return 1
            print(f"{args.id}: version {v.number} from {held}: {how} in {took_ms:.1f} ms, verified", flush=True)
            held = v.number
            if dump:
                dump.mkdir(parents=True, exist_ok=True)
                torch.save(model, dump / f"{args.id}-v{held}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
