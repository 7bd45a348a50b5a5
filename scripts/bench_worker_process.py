#!/usr/bin/env python3
"""A worker process's CPU per version against its apply kernel (docs/BENCHMARKS.md, "A worker
process's CPU per version").

The kernel: `deltacast bench-worker` for the same model size and density, "sparse in place"
(one core applying a delta into the image). The process: `deltacast publish` and `deltacast
worker --in-place --scrub-rate 0` on loopback, a version every --interval-ms; for each version
after the first delta, the worker process's CPU from one ready line to the next, every thread's
(/proc/PID/task/*/schedstat), grouped by thread name: what the loop, the task pool, ZeroMQ's I/O
thread and the others spent. The idle cost (CPU a second while the worker holds its version and
receives nothing) is measured after the last version and shown as its share of an interval.
Each figure is the median over the timed versions; --runs repeats the whole and takes medians.

Usage: scripts/bench_worker_process.py [--bin build/tools/deltacast] [--size 256MB] [--lr 1e-6]
                                       [--versions 8] [--interval-ms 3000] [--runs 3]
"""
import argparse
import collections
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench_idle import free_port  # scripts/, beside this one


def threads_cpu_ns(pid):
    """Thread name -> CPU ns, every thread of the process (a name's threads summed)."""
    out = collections.Counter()
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            name = open(f"{task}/comm").read().strip()
            ns = int(open(f"{task}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
        out[re.sub(r"\d+$", "N", name)] += ns
    return out


def kernel_ms(dc, size, lr):
    out = subprocess.run([dc, "bench-worker", "--size", size, "--lr", str(lr), "--steps", "2", "--runs", "5", "-q"],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 6 and cells[0] == f"{lr:g}":
            return float(cells[6]), cells[1]  # sparse in place, changed %
    raise RuntimeError(f"no row for lr {lr} in bench-worker's output:\n{out}")


def one_run(args, work, run):
    ckpt = os.path.join(work, "ckpt")
    if not os.path.isdir(ckpt):
        subprocess.run([args.bin, "gen", "-q", "-o", ckpt, "--size", args.size, "--lr", str(args.lr), "--steps", str(args.versions - 1)],
                       check=True, stdout=subprocess.DEVNULL)
    ckpts = sorted(glob.glob(os.path.join(ckpt, "*.safetensors")))
    port = free_port()
    worker = subprocess.Popen([args.bin, "worker", "--id", "w", "--parent", f"tcp://127.0.0.1:{port}", "--in-place", "--scrub-rate", "0",
                               "--log-level", "warn"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks = {}  # version -> (monotonic s, thread name -> CPU ns) at its ready line

    def read():
        for line in worker.stdout:
            m = re.search(r"version (\d+) ready", line)
            if m:
                marks[int(m.group(1))] = (time.monotonic(), threads_cpu_ns(worker.pid))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # The publisher stays (--linger-ms) while the idle cost is measured after the last version.
    publish = subprocess.Popen([args.bin, "publish", "--listen", f"tcp://127.0.0.1:{port}", "--wait-workers", "1", "--interval-ms",
                                str(args.interval_ms), "--linger-ms", str(args.interval_ms + 5000), "--log-level", "warn", *ckpts],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60 + len(ckpts) * args.interval_ms / 1000
    while len(marks) < len(ckpts) and time.monotonic() < deadline and publish.poll() is None:
        time.sleep(0.1)
    if len(marks) < len(ckpts):
        worker.kill()
        publish.kill()
        raise RuntimeError(f"run {run}: the worker reported versions {sorted(marks)} of {len(ckpts)}; publish: {publish.stderr.read()[-800:]}")
    # Idle: the worker holds the last version and hears only its parent's heartbeats. Measured
    # over the same length as an interval.
    time.sleep(1)
    before = threads_cpu_ns(worker.pid)
    time.sleep(args.interval_ms / 1000)
    idle = threads_cpu_ns(worker.pid)
    idle.subtract(before)
    idle_ms = sum(idle.values()) / 1e6
    worker.terminate()
    worker.wait(timeout=30)
    publish.wait(timeout=60)
    per_version = []
    for v in range(3, len(ckpts) + 1):  # versions 1 (the anchor) and 2 (the first delta) warm up
        cpu = marks[v][1].copy()
        cpu.subtract(marks[v - 1][1])
        per_version.append({k: n / 1e6 for k, n in cpu.items() if n > 0})
    return per_version, idle_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/tools/deltacast")
    ap.add_argument("--size", default="256MB")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--versions", type=int, default=8)
    ap.add_argument("--interval-ms", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"kernel: bench-worker --size {args.size} --lr {args.lr:g}", file=sys.stderr, flush=True)
    kernel, changed = kernel_ms(args.bin, args.size, args.lr)
    totals, idles, by_thread = [], [], collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="dc-worker-process-") as work:
        for run in range(1, args.runs + 1):
            print(f"run {run} of {args.runs}: {args.versions} versions {args.interval_ms} ms apart", file=sys.stderr, flush=True)
            versions, idle = one_run(args, work, run)
            idles.append(idle)
            for v in versions:
                totals.append(sum(v.values()))
                for name in set().union(*versions):
                    by_thread[name].append(v.get(name, 0.0))
    total = statistics.median(totals)
    idle = statistics.median(idles)
    print(f"model {args.size}, lr {args.lr:g} ({changed} changed), a version every {args.interval_ms} ms, worker --in-place --scrub-rate 0")
    print(f"kernel (bench-worker, sparse in place): {kernel:.1f} ms")
    print(f"worker process, CPU per version (median of {len(totals)} versions in {args.runs} runs): {total:.1f} ms, "
          f"{total / kernel:.2f}x the kernel")
    print(f"  of which idle (its timers, {idle / (args.interval_ms / 1000):.1f} ms a second): {idle:.1f} ms")
    for name, values in sorted(by_thread.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  thread {name}: {statistics.median(values):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
