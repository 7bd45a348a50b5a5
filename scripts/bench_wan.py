#!/usr/bin/env python3
"""How much of a long fat link the runtime fills, under kernel TCP (docs/BENCHMARKS.md, "Long fat links").

An origin in one region, a relay and a worker in another, across one emulated WAN link
(tests/wan: RATE, DELAY one way, a drop-tail queue of one bandwidth-delay product) whose
product is 4x the largest window the kernel may open (the namespaces' tcp_rmem/tcp_wmem
maximum). The checkpoints are `deltacast gen --lr 1e-2` steps, whose deltas change 99% of the
values, so each version moves most of the model's size over the link:
  - warm: versions back to back (the next is published when the worker holds the previous);
  - after idle: versions published --idle-s apart, so each follows a silent link
    (tcp_slow_start_after_idle=1, the kernel's default).
For each version the link's delivered bytes are sampled every 20 ms; the version's rate is the
bytes from 1% to 99% of them over the time between (the span the link was busy with it),
against the link rate (the ratio). The
baseline, in the same run: one TCP connection (tests/wan/netprobe.py) over the same link.

With --direct the worker, with default settings, has the origin across the link as its parent
(no relay), and a second baseline is measured the same way in the same run: --flows plain TCP
connections (default 8) carrying a version's bytes between them, three times; each version's
rate is also given against their median (the ratio to plain flows).

Usage (root): python3 scripts/bench_wan.py --deltacast build/tools/deltacast --emulator build/tests/wan_emulator
              [--rate-mbit 200] [--delay-ms 75] [--size 128MB] [--versions 3] [--idle-s 60] [--direct [--flows 8]]
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "wan"))
from wan import Wan  # noqa: E402

PROBE = str(ROOT / "tests" / "wan" / "netprobe.py")
WINDOW_SHARE = 0.62  # the window the kernel advertises, over tcp_rmem's maximum, at MTU 1500 (tests/wan/selfcheck.py)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class LinkSampler:
    """(monotonic seconds, bytes delivered) of one link, every `period_s`, on a thread."""

    def __init__(self, net: Wan, link: str, period_s: float = 0.02):
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(net, link, period_s), daemon=True)
        self._thread.start()

    def _run(self, net: Wan, link: str, period_s: float) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), net.stats()["links"].get(link, {}).get("delivered_bytes", 0)))
            time.sleep(period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def busy(self, after: float, until: float) -> dict:
        """What the link delivered between two moments: the bytes from the last sample at 1% of
        them to the first at 99%, and the time between those samples (the heartbeats and
        announcements of an idle link before and after stay out of it)."""
        s = [x for x in self.samples if after <= x[0] <= until]
        if len(s) < 2 or s[-1][1] == s[0][1]:
            return {"seconds": 0.0, "bytes": 0}
        base, total = s[0][1], s[-1][1] - s[0][1]
        first = max(i for i in range(len(s)) if s[i][1] - base <= 0.01 * total)
        last = min(i for i in range(len(s)) if s[i][1] - base >= 0.99 * total)
        return {"seconds": s[last][0] - s[first][0], "bytes": s[last][1] - s[first][1]}


class ReadyLines:
    """A worker's output, copied to a file, with the moment each 'version N ready' line came."""

    def __init__(self, stream, path: Path):
        self.ready: list[tuple[float, int, int]] = []  # (monotonic seconds, version, ms after publish)
        self._thread = threading.Thread(target=self._run, args=(stream, path), daemon=True)
        self._thread.start()

    def _run(self, stream, path: Path) -> None:
        with open(path, "w") as out:
            for line in stream:
                out.write(line)
                m = re.search(r"version (\d+) ready, checksum \w+, (\d+) ms after publish", line)
                if m:
                    self.ready.append((time.monotonic(), int(m.group(1)), int(m.group(2))))

    def join(self) -> None:
        self._thread.join(timeout=30)


def one_connection(net: Wan, seconds: float, cc: str) -> dict:
    sink = net.spawn("worker", [sys.executable, PROBE, "tcp-sink", "5001"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    out = net.run("origin", [sys.executable, PROBE, "tcp-source", net.addr("worker"), "5001", str(seconds), cc],
                  capture_output=True, text=True, timeout=seconds + 60, check=True)
    marks = json.loads(sink.communicate(timeout=60)[0])["marks"]
    samples = json.loads(out.stdout)["samples"]
    steady = [m for m in marks if m[0] >= marks[0][0] + 3e9]
    mbit = (steady[-2][1] - steady[0][1]) * 8 / ((steady[-2][0] - steady[0][0]) / 1e9) / 1e6
    return {"mbit": mbit, "window": statistics.median(s[1] for s in samples if s[0] >= 3)}


def plain_flows(args, net: Wan, total_bytes: int) -> dict:
    """--flows plain TCP connections carrying total_bytes between them, through the same link and
    measured by the same sampler as the runtime's versions."""
    sink = net.spawn("worker", [sys.executable, PROBE, "tcp-sinks", "5002", str(args.flows)], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    sampler = LinkSampler(net, "origin>eu")
    start = time.monotonic()
    net.run("origin", [sys.executable, PROBE, "tcp-flows", net.addr("worker"), "5002", str(args.flows), str(total_bytes), args.cc],
            capture_output=True, text=True, timeout=600, check=True)
    sink.communicate(timeout=120)
    time.sleep(0.2)
    sampler.stop()
    span = sampler.busy(start, time.monotonic())
    return {"seconds": span["seconds"], "bytes": span["bytes"],
            "ratio": span["bytes"] / span["seconds"] / (args.rate_mbit * 1e6 / 8) if span["seconds"] else 0.0}


def run_fleet(args, net: Wan, ckpts: list[Path], interval_ms: int, work: Path, label: str) -> list[dict]:
    """Publishes every checkpoint to relay -> worker (--direct: to the worker); the link's rate per version."""
    dc = args.deltacast
    port = 7100
    relay = None
    if not args.direct:
        relay = net.spawn("relay", [dc, "relay", "--id", "relay", "--listen", f"tcp://0.0.0.0:{port + 1}",
                                    "--parent", f"tcp://{net.addr('origin')}:{port}", "--log-level", "warn",
                                    *(["--stripes", str(args.stripes), "--stripes-start", str(args.stripes)] if args.stripes else [])],
                          stdout=open(work / f"{label}-relay.log", "w"), stderr=subprocess.STDOUT)
    parent = f"tcp://{net.addr('origin')}:{port}" if args.direct else f"tcp://{net.addr('relay')}:{port + 1}"
    worker = net.spawn("worker", [dc, "worker", "--id", "worker", "--parent", parent,
                                  "--exit-after-version", str(len(ckpts)), "--log-level", "warn"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = ReadyLines(worker.stdout, work / f"{label}-worker.log")
    sampler = LinkSampler(net, "origin>eu")
    start = time.monotonic()
    publish = net.run("origin", [dc, "publish", "--listen", f"tcp://0.0.0.0:{port}",
                                 *(["--congestion-control", args.origin_cc] if args.origin_cc else []), "--wait-workers", "1", "--wait-timeout-ms", "600000", "--interval-ms", str(interval_ms),
                                 "--linger-ms", "500", *map(str, ckpts)],
                      capture_output=True, text=True, timeout=3600)
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        if relay:
            relay.terminate()
        lines.join()
        tail = "\n".join((work / f"{label}-{n}.log").read_text().splitlines()[-15:] for n in ("relay", "worker") if (work / f"{label}-{n}.log").exists())
        raise RuntimeError(f"the worker did not get every version within 60 s of the last publish; publish said:\n"
                           f"{publish.stdout[-1500:]}{publish.stderr[-1500:]}\nrelay, worker:\n{tail}")
    lines.join()
    sampler.stop()
    if relay:
        relay.terminate()
    if publish.returncode != 0:
        raise RuntimeError(f"publish failed: {publish.stderr[-2000:]}")
    if [v for _, v, _ in lines.ready] != list(range(1, len(ckpts) + 1)):
        raise RuntimeError(f"the worker did not report every version: {lines.ready}")
    # Each version is published once the worker holds the one before: its bytes cross the link
    # between the two ready lines.
    rate_bytes = args.rate_mbit * 1e6 / 8
    out, after = [], start
    for t, version, ms in lines.ready:
        span = sampler.busy(after, t)
        out.append({"version": version, "seconds": span["seconds"], "bytes": span["bytes"],
                    "ratio": span["bytes"] / span["seconds"] / rate_bytes if span["seconds"] else 0.0,
                    "publish_to_ready_ms": ms})
        after = t
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deltacast", default=str(ROOT / "build" / "tools" / "deltacast"))
    ap.add_argument("--emulator", default=str(ROOT / "build" / "tests" / "wan_emulator"))
    ap.add_argument("--rate-mbit", type=float, default=200)
    ap.add_argument("--delay-ms", type=float, default=75)
    ap.add_argument("--size", default="128MB")
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=60)
    ap.add_argument("--cc", default="reno",
                    help="the namespaces' congestion control: reno (slow start after idle applies) or bbr (exempt); "
                         "any in the host's net.ipv4.tcp_allowed_congestion_control")
    ap.add_argument("--stripes", type=int, help="the relay's connections to the origin, held (--stripes and --stripes-start; "
                    "default: the link sizes itself); 1 is one connection, the runtime before striped links")
    ap.add_argument("--origin-cc", help="the origin's --congestion-control for the connections it accepts (default: none given)")
    ap.add_argument("--direct", action="store_true", help="the worker's parent is the origin, across the link; also measures --flows plain flows")
    ap.add_argument("--flows", type=int, default=8, help="with --direct: the plain TCP connections of the second baseline")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    rtt_s = 2 * args.delay_ms / 1e3
    bdp = args.rate_mbit * 1e6 / 8 * rtt_s
    rmem_max = int(bdp / 4 / WINDOW_SHARE)
    with tempfile.TemporaryDirectory(prefix="dcwan-bench-") as tmp:
        work = Path(tmp)
        log(f"generating {args.versions} checkpoints of {args.size}")
        subprocess.run([args.deltacast, "gen", "-q", "-o", str(work / "ckpt"), "--size", args.size, "--lr", "1e-2",
                        "--steps", str(args.versions - 1)], check=True, stdout=subprocess.DEVNULL)
        ckpts = sorted((work / "ckpt").glob("*.safetensors"))
        args.image_bytes = ckpts[0].stat().st_size
        wan = [{"a": "origin", "b": "eu", "delay_ms": args.delay_ms, "rate_mbit": args.rate_mbit, "queue_bytes": int(bdp)}]
        sysctls = {"net.ipv4.tcp_rmem": f"4096 131072 {rmem_max}", "net.ipv4.tcp_wmem": f"4096 16384 {rmem_max}",
                   "net.ipv4.tcp_slow_start_after_idle": "1", "net.ipv4.tcp_congestion_control": args.cc}
        nodes = {"origin": "origin", "relay": "eu", "worker": "eu"}
        with Wan(args.emulator, nodes, wan=wan, sysctls=sysctls) as net:
            log(f"link {args.rate_mbit:g} Mbit/s, {args.delay_ms:g} ms one way: bandwidth-delay product {bdp / 1e6:.2f} MB; "
                f"tcp_rmem/tcp_wmem max {rmem_max} bytes")
            log("one TCP connection, 10 s")
            single = one_connection(net, 10, args.cc)
            log(f"  {single['mbit']:.1f} Mbit/s, window {single['window']} bytes "
                f"(bandwidth-delay product / window: {bdp / single['window']:.1f})")
            log(f"runtime, {args.versions} versions back to back")
            warm = run_fleet(args, net, ckpts, 0, work, "warm")
            log(f"runtime, {args.versions} versions {args.idle_s:g} s apart")
            idle = run_fleet(args, net, ckpts, int(args.idle_s * 1000), work, "idle")
            flows = []
            if args.direct:
                version_bytes = int(statistics.median(r["bytes"] for r in warm + idle))
                for i in range(3):
                    log(f"{args.flows} plain TCP flows of {version_bytes / 1e6:.0f} MB ({i + 1} of 3)")
                    flows.append(plain_flows(args, net, version_bytes))
                    log(f"  {flows[-1]['ratio']:.2f} of the link rate")
    flows_ratio = statistics.median(f["ratio"] for f in flows) if flows else 0.0
    print(f"link: {args.rate_mbit:g} Mbit/s, {args.delay_ms:g} ms one way, bandwidth-delay product {bdp / 1e6:.2f} MB, "
          f"largest window {single['window'] / 1e6:.2f} MB ({bdp / single['window']:.1f}x smaller), {args.cc}, "
          f"{'worker, default settings, its parent the origin' if args.direct else 'relay --stripes ' + (str(args.stripes) + ' (held)' if args.stripes else 'default (the link sizes itself)')}"
          f"{', origin --congestion-control ' + args.origin_cc if args.origin_cc else ''}")
    print(f"one TCP connection: {single['mbit']:.1f} Mbit/s, {single['mbit'] / args.rate_mbit:.2f} of the link rate")
    if flows:
        print(f"{args.flows} plain TCP flows of a version's bytes: " + ", ".join(f"{f['ratio']:.2f}" for f in flows) +
              f" of the link rate (median {flows_ratio:.2f})")
    for label, rows in (("back to back", warm), (f"after {args.idle_s:g} s idle", idle)):
        for r in rows:
            tail = "" if label == "back to back" or r["version"] > 1 else " (the first version: a new connection)"
            against = f", {r['ratio'] / flows_ratio:.2f} of {args.flows} plain flows" if flows_ratio else ""
            print(f"runtime, {label}, version {r['version']}: {r['bytes'] / 1e6:.0f} MB in {r['seconds']:.2f} s, "
                  f"{r['ratio']:.2f} of the link rate{against}{tail}")
    if args.json:
        Path(args.json).write_text(json.dumps({"single": single, "warm": warm, "idle": idle, "flows": flows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
