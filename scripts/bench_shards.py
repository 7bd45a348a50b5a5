#!/usr/bin/env python3
"""Trainer shards against one publisher, each measured in the same run.

A BF16 model of --model-mb, about 2% of its values moved by one ulp per version, is published
for --versions versions to a worker in this process, two ways:

- sharded: --shards processes, each holding a dim-0 range of every tensor and publishing it as a
  trainer shard (deltacast.Rows) to an origin in this process (Publisher(expect_shards=N));
- whole: one process holding the whole model and publishing it (Publisher(listen)).

Each publishing process reports its peak RSS over its slice: its whole peak RSS less what it had
before it allocated its tensors (so the trainer's own copy counts), what the publisher adds on
top of the tensors, and its RSS after the last version (a delta) on the same terms. Publish to ready: from the moment the publishing processes call publish()
(together, after a barrier) to the worker's ready time for that version; medians over the
versions after the first (an anchor), then over --runs runs.

    PYTHONPATH=build/python python3 scripts/bench_shards.py --model-mb 1024 --shards 4 --versions 6 --runs 3
"""

import argparse
import multiprocessing as mp
import statistics
import sys
import time

import torch

import deltacast

ROWS = 1024  # rows of each tensor; columns follow from the model size


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def status_bytes(field: str) -> int:
    """A size from /proc/self/status: VmRSS now, VmHWM the peak of this process image (getrusage's
    ru_maxrss also counts the parent's pages a spawned process had before exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def model_part(model_mb: int, tensors: int, shard: int, shards: int) -> dict:
    """Shard `shard`'s dim-0 range of every tensor (the whole model when shards == 1)."""
    cols = model_mb * (1 << 20) // (2 * tensors * ROWS)
    per = -(-ROWS // shards)
    start, end = shard * per, min(ROWS, (shard + 1) * per)
    out = {}
    for t in range(tensors):
        g = torch.Generator().manual_seed(1000 * t + shard)
        out[f"layers.{t}.weight"] = (torch.randn(end - start, cols, generator=g, dtype=torch.bfloat16), start)
    return out


def publisher_process(args, shard, shards, endpoint, barrier, ready_version, reports):
    """Publishes its part of each version after the barrier; reports publish start times and memory."""
    base = status_bytes("VmRSS")
    part = model_part(args.model_mb, args.tensors, shard, shards)
    slice_bytes = sum(t.numel() * 2 for t, _ in part.values())
    held = status_bytes("VmRSS")
    kw = dict(origin=endpoint, shard=(shard, shards)) if shards > 1 else dict(listen=endpoint)
    with deltacast.Publisher(**kw) as pub:
        for v in range(1, args.versions + 1):
            if v > 1:
                for t, _ in part.values():
                    flat = t.view(-1).view(torch.int16)
                    flat[v % 50::50] += 1
            while ready_version.value < v - 1:
                time.sleep(0.001)
            barrier.wait()
            t0 = time.monotonic()
            if shards > 1:
                pub.publish({n: deltacast.Rows(t, start, ROWS) for n, (t, start) in part.items()}, version=v)
            else:
                pub.publish({n: t for n, (t, _) in part.items()}, version=v)
            reports.put(("start", shard, v, t0))
        while ready_version.value < args.versions:
            time.sleep(0.01)
        peak, end = status_bytes("VmHWM"), status_bytes("VmRSS")
        reports.put(("memory", shard, slice_bytes, (peak - base) / slice_bytes, (peak - held) / slice_bytes, (end - base) / slice_bytes))


def run_once(args, shards: int) -> dict:
    """One run with `shards` publishing processes: publish-to-ready per version and memory per process."""
    ctx = mp.get_context("spawn")
    barrier, ready_version, reports = ctx.Barrier(shards), ctx.Value("q", 0), ctx.Queue()
    origin = deltacast.Publisher("tcp://127.0.0.1:0", expect_shards=shards) if shards > 1 else None
    endpoint = origin.listening if origin else f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=publisher_process, args=(args, s, shards, endpoint, barrier, ready_version, reports)) for s in range(shards)]
    for p in procs:
        p.start()
    starts, memory, ready = {}, [], {}
    try:
        with deltacast.Worker("bench-worker", [endpoint], in_place=True) as w:
            for v in range(1, args.versions + 1):
                # Not kept: an in-place worker updates only once its readers let the version go.
                ready[v] = w.wait(v, timeout=args.timeout).ready_us / 1e6
                ready_version.value = v
            while len(memory) < shards or len([k for k in starts if k[1] <= args.versions]) < shards * args.versions:
                item = reports.get(timeout=args.timeout)
                if item[0] == "start":
                    starts[(item[1], item[2])] = item[3]
                elif item[0] == "memory":
                    memory.append(item[1:])
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        if origin:
            origin.close()
    to_ready = [ready[v] - min(starts[(s, v)] for s in range(shards)) for v in range(2, args.versions + 1)]
    return {"to_ready_s": statistics.median(to_ready), "peak_over_slice": max(m[2] for m in memory),
            "added_over_slice": max(m[3] for m in memory), "end_over_slice": max(m[4] for m in memory), "slice_mb": memory[0][1] / (1 << 20)}


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-mb", type=int, default=1024)
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--versions", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    results = {"sharded": [], "whole": []}
    for run in range(args.runs):
        for name, shards in (("sharded", args.shards), ("whole", 1)):
            r = run_once(args, shards)
            results[name].append(r)
            log(f"run {run + 1}/{args.runs} {name}: publish to ready {r['to_ready_s'] * 1e3:.0f} ms, peak RSS "
                f"{r['peak_over_slice']:.2f}x its {r['slice_mb']:.0f} MB slice ({r['added_over_slice']:.2f}x on top of its tensors), "
                f"RSS after the last delta {r['end_over_slice']:.2f}x")
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in results.items()}
    s, w = med["sharded"], med["whole"]
    ratios = sorted(a["to_ready_s"] / b["to_ready_s"] for a, b in zip(results["sharded"], results["whole"]))
    print(f"| figure | {args.shards} trainer shards | one publisher, whole model | ratio |")
    print("|---|---|---|---|")
    print(f"| publish to ready, median of versions 2-{args.versions} | {s['to_ready_s'] * 1e3:.0f} ms | {w['to_ready_s'] * 1e3:.0f} ms | "
          f"**{statistics.median(ratios):.2f}x** ({ratios[0]:.2f}-{ratios[-1]:.2f}) |")
    print(f"| peak RSS over the process's slice ({s['slice_mb']:.0f} MB / {w['slice_mb']:.0f} MB) | {s['peak_over_slice']:.2f}x | "
          f"{w['peak_over_slice']:.2f}x | target <= 2.2x |")
    print(f"| the same, less the trainer's own tensors | {s['added_over_slice']:.2f}x | {w['added_over_slice']:.2f}x | |")
    print(f"| RSS after the last delta over the slice | {s['end_over_slice']:.2f}x | {w['end_over_slice']:.2f}x | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
