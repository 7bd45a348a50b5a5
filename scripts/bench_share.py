#!/usr/bin/env python3
"""One image per host against a worker per rank, measured in the same run.

A BF16 model of --model-mb, one ulp moved at about 1% of its values per version, is published
for --versions versions (an anchor, then deltas) from this process to:

- one plain worker process (`deltacast worker`): what a single rank needs; a host of R ranks
  without sharing runs R of them;
- one sharing worker process (`deltacast worker --share`) with R reader processes attached
  (python/tests/share_reader.py, each reading every tensor of every version), for each R of --ranks.

Memory is the host's for deltacast, after the last version: the worker's whole PSS (from
/proc/PID/smaps_rollup) plus each reader's PSS of the shared image mappings (the rest of a reader
is the engine's). Bytes from the parent are the worker's deltacast_bytes_in_total. Medians over
--runs runs.

    PYTHONPATH=build/python python3 scripts/bench_share.py --model-mb 512 --ranks 1 2 4 8 --versions 3 --runs 3
"""

import argparse
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import deltacast

ROOT = Path(__file__).resolve().parent.parent
READER = ROOT / "python" / "tests" / "share_reader.py"
sys.path.insert(0, str(ROOT / "python" / "tests"))
from share_reader import bytes_in, image_memory, pss_total  # noqa: E402  the measures the test asserts on

DELTACAST = os.environ.get("DELTACAST_BIN", str(ROOT / "build" / "tools" / "deltacast"))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def versions(model_mb: int, count: int):
    tensors = max(1, model_mb // 32)
    elements = model_mb * (1 << 20) // (2 * tensors)
    g = torch.Generator().manual_seed(7)
    t = {f"layers.{i}.weight": torch.randn(elements, generator=g).to(torch.bfloat16) for i in range(tensors)}
    for k in range(count):
        yield t
        t = {n: x.clone() for n, x in t.items()}
        for x in t.values():
            x.view(torch.int16)[k::97] += 1


def read_line(proc, timeout: float) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError(f"reader {proc.pid} said nothing in {timeout} s")
    return json.loads(proc.stdout.readline())


def run(model_mb: int, count: int, ranks: int, workdir: str) -> dict:
    """One worker (sharing with `ranks` readers; ranks 0: a plain worker) through `count` versions."""
    port = free_port()
    sock = os.path.join(workdir, f"host-{ranks}.sock")
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        args = [DELTACAST, "worker", "--id", "w", "--parent", pub.listening, "--scrub-rate", "0", "--metrics", f"127.0.0.1:{port}",
                "--log-level", "warn"]
        if ranks:
            args += ["--share", sock]
        worker = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        readers = [subprocess.Popen([sys.executable, str(READER), sock, str(count)], stdout=subprocess.PIPE, text=True) for _ in range(ranks)]
        try:
            for number, tensors in enumerate(versions(model_mb, count), 1):
                pub.publish(tensors)
                pub.wait_ready(number, min_workers=1, timeout=300)
                for r in readers:
                    assert read_line(r, 300)["version"] == number
            time.sleep(0.5)
            worker_pss = pss_total(worker.pid)
            return {"pss": worker_pss + sum(image_memory(r.pid)["pss"] for r in readers), "bytes_in": bytes_in(port)}
        finally:
            for p in readers + [worker]:
                p.terminate()
                p.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-mb", type=int, default=512)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    results = {r: [] for r in [0] + a.ranks}
    with tempfile.TemporaryDirectory() as d:
        for k in range(a.runs):
            for ranks in [0] + a.ranks:
                log(f"run {k + 1}/{a.runs}: {'a plain worker' if ranks == 0 else f'{ranks} ranks on a sharing worker'}")
                results[ranks].append(run(a.model_mb, a.versions, ranks, d))
    single = {key: statistics.median(x[key] for x in results[0]) for key in ("pss", "bytes_in")}
    print(f"model {a.model_mb} MiB, {a.versions} versions (an anchor, then deltas), medians of {a.runs} runs")
    print(f"| host | deltacast PSS | vs one worker | bytes from the parent | vs one worker | a worker per rank instead: PSS, bytes |")
    print(f"|---|---|---|---|---|---|")
    print(f"| one plain worker | {single['pss'] / 2**20:.0f} MiB | 1.00x | {single['bytes_in'] / 2**20:.0f} MiB | 1.00x | |")
    for ranks in a.ranks:
        pss = statistics.median(x["pss"] for x in results[ranks])
        got = statistics.median(x["bytes_in"] for x in results[ranks])
        print(f"| {ranks} ranks attached | {pss / 2**20:.0f} MiB | **{pss / single['pss']:.2f}x** | {got / 2**20:.0f} MiB | "
              f"**{got / single['bytes_in']:.2f}x** | {ranks * single['pss'] / 2**20:.0f} MiB, {ranks * single['bytes_in'] / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
