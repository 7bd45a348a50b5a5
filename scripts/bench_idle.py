#!/usr/bin/env python3
"""What an idle worker costs: CPU a second of a `deltacast worker` that holds its version and
receives nothing but heartbeats, for each --scrub-rate given (0: the scrub off).

For each model size: a checkpoint from `deltacast gen`, a publisher serving it on loopback, and
a worker that takes it; once the worker holds the version and a few seconds passed, its
process's CPU time (every thread's, from /proc/PID/task/*/schedstat) over --seconds. Each rate
runs --runs times, alternating rates (and binaries, with --baseline-bin: another build, for
before and after figures measured in the same run); the median is printed, with the scrub's cost
over the scrub-off run of the same binary.
Usage: scripts/bench_idle.py [--bin build/tools/deltacast] [--baseline-bin OLD/deltacast]
                             [--sizes 16MB,1GB] [--rates 0,48MiB]
"""
import argparse
import glob
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_ns(pid):
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(open(path).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


def idle_cpu_ms_per_s(dc, ckpt, rate, seconds, work):
    """The worker's CPU ms a second while idle, at this scrub rate."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    log = os.path.join(work, "worker.log")
    pub = subprocess.Popen([dc, "publish", "--listen", endpoint, ckpt, "--linger-ms", "100000000", "--log-level", "warn"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([dc, "worker", "--id", "idle", "--parent", endpoint, "--scrub-rate", rate, "--log-level", "warn"],
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "version 1 ready" not in open(log).read():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker never took version 1:\n{open(log).read()}")
            time.sleep(0.2)
        time.sleep(3)  # the version's last messages and the first scrub batches settle
        c0, t0 = process_cpu_ns(worker.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = process_cpu_ns(worker.pid), time.monotonic()
        return (c1 - c0) / 1e6 / (t1 - t0)
    finally:
        for p in (worker, pub):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/tools/deltacast")
    ap.add_argument("--baseline-bin", help="another build, measured in turn with --bin")
    ap.add_argument("--sizes", default="16MB,1GB", help="model sizes (deltacast gen --size), comma-separated")
    ap.add_argument("--rates", default="0,48MiB", help="--scrub-rate values, comma-separated (0: off)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    a = ap.parse_args()
    bins = {"this build": os.path.abspath(a.bin)}
    if a.baseline_bin:
        bins["baseline"] = os.path.abspath(a.baseline_bin)
    rates = a.rates.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as work:
        print("| build | model | --scrub-rate | worker CPU, ms a second: median (runs) | over the scrub off, % of a core |")
        print("|---|---|---|---|---|")
        for size in a.sizes.split(","):
            out = os.path.join(work, size)
            subprocess.run([bins["this build"], "gen", "-q", "-o", out, "--size", size, "--steps", "1"], check=True, capture_output=True)
            ckpt = sorted(glob.glob(os.path.join(out, "*.safetensors")))[0]
            runs = {(b, r): [] for b in bins for r in rates}
            for i in range(a.runs):
                for b, dc in bins.items():
                    for r in rates:
                        runs[(b, r)].append(idle_cpu_ms_per_s(dc, ckpt, r, a.seconds, work))
                        print(f"  {size} round {i + 1}, {b}, scrub {r}: {runs[(b, r)][-1]:.2f} ms/s", file=sys.stderr, flush=True)
            for b in bins:
                off = statistics.median(runs[(b, rates[0])])
                for r in rates:
                    m = statistics.median(runs[(b, r)])
                    over = "" if r == rates[0] else f"{(m - off) / 10:.2f}%"
                    print(f"| {b} | {size} | {r} | {m:.2f} ({', '.join(f'{x:.2f}' for x in runs[(b, r)])}) | {over} |", flush=True)


if __name__ == "__main__":
    main()
