#!/usr/bin/env python3
"""Benchmarks of the Python package, each against a baseline measured in the same run.

1. publish: ``Publisher.publish`` of a torch state dict (the checkpoint already in memory, as in a
   trainer) against ``deltacast encode BASE NEW`` of the same checkpoint files: throughput ratio.
2. ready to tensors: from the moment a version became current at a worker (``Version.ready_us``)
   to every tensor iterated in Python, against the budget 1 ms + 2 us per tensor; the views are
   made in C++ (deltacast._torch_views), and the same versions' views made by torch calls from
   Python are the baseline.
3. patches: ``Version.patches`` + ``index_copy_`` into a second copy of the model against copying
   the whole model (``copy_`` of every tensor), with 2% of the BF16 values changed.

Medians of --runs runs. Usage: python3 scripts/bench_python.py --deltacast build/tools/deltacast
[--only publish|ready|patches]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import deltacast


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_safetensors(path: Path) -> dict:
    """{name: torch tensor} of a checkpoint, read with numpy (not deltacast)."""
    data = np.fromfile(path, dtype=np.uint8)
    n = int(data[:8].view(np.uint64)[0])
    header = json.loads(bytes(data[8:8 + n]))
    body = data[8 + n:]
    dtypes = {"BF16": (np.int16, torch.bfloat16), "F32": (np.float32, None), "F16": (np.float16, None), "I64": (np.int64, None),
              "I32": (np.int32, None), "U8": (np.uint8, None), "I8": (np.int8, None)}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        np_dtype, torch_dtype = dtypes[info["dtype"]]
        t = torch.from_numpy(body[begin:end].copy().view(np_dtype)).reshape(info["shape"])
        out[name] = t.view(torch_dtype) if torch_dtype else t
    return out


def bench_publish(exe: str, ckpts: list[Path], runs: int, work: Path) -> dict:
    image_bytes = sum(t.numel() * t.element_size() for t in load_safetensors(ckpts[0]).values())
    encode_s, publish_s = [], []
    for run in range(runs):
        for base, new in zip(ckpts, ckpts[1:]):
            start = time.perf_counter()
            subprocess.run([exe, "encode", "-q", str(base), str(new), "-o", str(work / "d.dcd")], check=True)
            encode_s.append(time.perf_counter() - start)
        states = [load_safetensors(c) for c in ckpts]
        with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
            pub.publish(states[0])  # the anchor: not what is compared
            for sd in states[1:]:
                start = time.perf_counter()
                pub.publish(sd)
                publish_s.append(time.perf_counter() - start)
        log(f"  publish run {run + 1}/{runs}: encode {statistics.median(encode_s):.3f} s, publish {statistics.median(publish_s):.3f} s")
    enc, pub = statistics.median(encode_s), statistics.median(publish_s)
    return {"image_bytes": image_bytes, "encode_gbps": image_bytes / enc / 1e9, "publish_gbps": image_bytes / pub / 1e9,
            "ratio": enc / pub}


def bench_ready_to_tensors(tensors: int, versions: int) -> dict:
    """A worker thread waits for each version and iterates its tensors; the publisher is in this
    process too (its encode runs on native threads)."""
    g = torch.Generator().manual_seed(1)
    sd = {f"layer.{i}.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16) for i in range(tensors)}
    latencies_ms, python_ms = [], []
    assert deltacast._views_in_cpp(), "deltacast._torch_views is not built (libtorch-dev) or not loadable here"
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("bench", [pub.listening], change_history=0) as w:
        pub.publish(sd)
        w.wait(1, timeout=60)
        for version in range(2, versions + 2):
            for t in list(sd.values())[:: max(1, tensors // 50)]:
                t.view(-1).view(torch.int16)[0] += 1
            pub.publish(sd)
            v = w.wait(version, timeout=60)
            count = sum(1 for _ in v.tensors())
            done_us = time.monotonic_ns() // 1000
            assert count == tensors
            latencies_ms.append((done_us - v.ready_us) / 1e3)
            # The baseline: the same version's views made by torch calls from Python, timed alone.
            start_ns = time.monotonic_ns()
            assert sum(1 for _ in v._python_tensors()) == tensors
            python_ms.append((time.monotonic_ns() - start_ns) / 1e6)
    median = statistics.median(latencies_ms)
    budget = 1.0 + 0.002 * tensors
    return {"tensors": tensors, "median_ms": median, "budget_ms": budget, "ratio": median / budget,
            "python_views_ms": statistics.median(python_ms)}


def bench_patches(model_bytes: int, fraction: float, runs: int) -> dict:
    g = torch.Generator().manual_seed(2)
    rows = 4096
    count = max(1, model_bytes // (rows * 1024 * 2))
    sd = {f"layer.{i}.weight": torch.randn(rows, 1024, generator=g).to(torch.bfloat16) for i in range(count)}
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("bench", [pub.listening]) as w:
        pub.publish(sd)
        v1 = w.wait(1, timeout=120)
        copy = {n: t.clone() for n, t in v1.tensors()}
        del v1
        for t in sd.values():
            flat = t.view(-1).view(torch.int16)
            idx = torch.randperm(flat.numel(), generator=g)[: int(flat.numel() * fraction)]
            flat[idx] += 1
        pub.publish(sd)
        v2 = w.wait(2, timeout=120)
        changed = sum(int(idx.numel()) for _, idx, _ in v2.patches())
        total = sum(t.numel() for t in sd.values())
        patch_s, full_s = [], []
        for _ in range(runs):
            target = {n: t.clone() for n, t in copy.items()}  # at version 1
            start = time.perf_counter()
            for name, idx, values in v2.patches():
                target[name].view(-1).index_copy_(0, idx, values)
            patch_s.append(time.perf_counter() - start)
            assert v2.verify(target) == []
            start = time.perf_counter()
            for name, t in v2.tensors():
                target[name].copy_(t)
            full_s.append(time.perf_counter() - start)
    p, f = statistics.median(patch_s), statistics.median(full_s)
    return {"model_bytes": total * 2, "changed": changed / total, "patch_ms": p * 1e3, "full_ms": f * 1e3, "ratio": f / p}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deltacast", default="deltacast", help="the deltacast executable")
    ap.add_argument("--size", default="512MB", help="checkpoint size for the publish benchmark")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", choices=["publish", "ready", "patches"], help="run one benchmark")
    args = ap.parse_args()
    run = lambda name: args.only in (None, name)  # noqa: E731
    if run("publish"):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            log(f"generating {args.size} checkpoints")
            subprocess.run([args.deltacast, "gen", "-q", "-o", str(work / "ckpt"), "--size", args.size, "--steps", "3"], check=True)
            ckpts = sorted((work / "ckpt").glob("*.safetensors"))
            log("publish vs deltacast encode")
            pub = bench_publish(args.deltacast, ckpts, args.runs, work)
        print(f"publish (torch state dict, {pub['image_bytes'] / 1e6:.0f} MB): {pub['publish_gbps']:.2f} GB/s vs deltacast encode "
              f"{pub['encode_gbps']:.2f} GB/s: {pub['ratio']:.2f}x (target >= 0.9x)")
    if run("ready"):
        log("ready to tensors")
        for n in (100, 1000, 10000):
            r = bench_ready_to_tensors(n, 20)
            print(f"ready to tensors iterated, {r['tensors']} tensors: {r['median_ms']:.2f} ms vs budget {r['budget_ms']:.1f} ms "
                  f"(1 ms + 2 us/tensor): {r['ratio']:.2f} of the budget; views made by torch calls from Python alone "
                  f"{r['python_views_ms']:.2f} ms", flush=True)
    if run("patches"):
        log("patches vs full copy")
        patch = bench_patches(512 << 20, 0.02, max(args.runs, 5))
        # What would cross PCIe to a GPU: 8 bytes of index and the value per change, against the model.
        moved = patch["changed"] * (8 + 2) / 2
        print(f"patches + index_copy_ ({patch['changed'] * 100:.1f}% changed, {patch['model_bytes'] / 1e6:.0f} MB, host memory): "
              f"{patch['patch_ms']:.1f} ms vs full copy {patch['full_ms']:.1f} ms: {patch['ratio']:.2f}x the speed; "
              f"bytes moved {moved * 100:.1f}% of the full copy's ({1 / moved:.1f}x fewer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
