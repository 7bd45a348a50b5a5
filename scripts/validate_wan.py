#!/usr/bin/env python3
"""The simulator against kernel TCP on long links (docs/SIM.md, "Validation against real processes").

Real processes over the WAN emulator (tests/wan; root), then the same fleet in the simulator;
prints the measured and predicted publish-to-ready times and their ratio:

    origin (region o) --30 ms--- r1: relay -> 2 workers
                      --37.5 ms- r2: relay -> 2 workers      WAN links of RATE, one-way delays;
                      --75 ms--- r3: relay -> 2 workers      LAN links of LAN_RATE, LAN_DELAY

Every namespace runs Reno with tcp_slow_start_after_idle=1 (the kernel's default), and its
tcp_rmem/tcp_wmem maximum is set so that one connection's window (0.62 of the maximum at MTU
1500: tests/wan/selfcheck.py) is a quarter of the longest link's bandwidth-delay product. At
25 Mbit/s one connection then carries 15.6, 12.5 and 6.2 Mbit/s on the three links, and eight
fill them. The queues hold more than 8 windows, so nothing is dropped. Each round publishes
`deltacast gen` checkpoints (publish waits until every worker holds a version, then
--interval-ms), so every version starts on idle connections, from slow start.

Why 25 Mbit/s and not 100: decoding costs a worker about 23 ms of CPU per MB of delta, and the
emulator and relays about 10 ns per byte per link; with three regions receiving at 100 Mbit/s
at once the fleet needs more than this machine's two cores (measured: 100% busy, the links at
45-58 Mbit/s with 8 stripes), so the comparison would be of CPU, not of TCP. At 25 Mbit/s the
cores are under half busy. (--rate-mbit 100 --size 128MB --lr 5e-5 runs the larger setting.)
Chunks are publish's default 4 MiB: a striped link sends large payloads in 256 KiB parts spread
over its connections (docs/RUNTIME.md, "Striped links").

For each invocation and each --stripes setting (the relays' connections to the origin, held
there with --stripes-start as the simulator holds them; 1 is the runtime without striped
links) a round:
  1. measures one core's decode rate (tests/tools/decode_rate, one process per worker at once,
     as scripts/validate_sim.sh does) before and after the fleet runs;
  2. runs the fleet; checks that each relay holds S connections to the origin and the window
     the kernel advertises on them, and samples each WAN link's delivered bytes (each
     version's rate over the link is printed next to the bound: S windows per round trip);
  3. takes the CPU that moving bytes cost while versions are on their way (the relays' and the
     emulator's, over the bytes they moved, as validate_sim.sh does with the shaper) and
     simulates the same fleet, model and TCP (run.tcp: one connection's window, Reno, slow
     start after idle; run.stripes), publishing at the measured period, every node on one host
     of this machine's cores;
  4. compares, over versions 3..N (version 1 is the anchor the simulated workers start from,
     2 the first delta): the median over versions of the median worker, and of the slowest
     worker. Within 15% of the measured figure is a pass.

Usage (root): scripts/validate_wan.py [--invocations 3] [--stripes 1,8] [--build DIR] [--size 32MB]
              [--lr 4e-4] [--versions 7] [--interval-ms 12000] [--rate-mbit 25] [--keep] [--json FILE]
Exit status 0 when every round of every setting passes.
"""

import argparse
import json
import math
import os
import re
import shutil
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

WINDOW_SHARE = 0.62  # the window the kernel advertises over tcp_rmem's maximum, at MTU 1500 (tests/wan/selfcheck.py)
PAYLOAD_SHARE = 1448 / 1500  # TCP payload per 1500-byte packet: the emulator's rates count whole IP packets
TOLERANCE = 0.15
REGIONS = [("r1", 30.0), ("r2", 37.5), ("r3", 75.0)]  # (name, one-way delay from the origin's region in ms)
WORKERS_PER_REGION = 2
ORIGIN_PORT, RELAY_PORT = 7100, 7101
FAST_NIC = "100Gbit"
READY = re.compile(r"version (\d+) ready, checksum \w+, (\d+) ms after publish.*process CPU (\d+) ms")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def median_rank(values: list[float]) -> float:
    """The median by the nearest-rank rule (the lower of the two middle values), as the
    simulator's p50 and validate_sim.sh take it."""
    s = sorted(values)
    return s[max(0, math.ceil(len(s) / 2) - 1)]


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMG]?)(i?)B?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text}")
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base ** " KMG".index((m.group(2) or " ").upper()))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mbit(x: float) -> str:
    return f"{x:.3f}Mbit"


# ---- the model ------------------------------------------------------------------------------------


def make_model(args, dc: str, work: Path) -> dict:
    """Checkpoints, and what the simulator needs from them: image size, the deltas' mean
    compressed size, chunks per version."""
    say(f"model: deltacast gen --size {args.size} --lr {args.lr}, {args.versions} versions")
    subprocess.run([dc, "gen", "-q", "-o", str(work / "ckpt"), "--size", args.size, "--lr", str(args.lr),
                    "--steps", str(args.versions - 1)], check=True, stdout=subprocess.DEVNULL)
    ckpts = sorted((work / "ckpt").glob("*.safetensors"))
    image_bytes = ckpts[0].stat().st_size
    sizes, chunks = [], 0
    for base, new in zip(ckpts, ckpts[1:]):
        line = subprocess.run([dc, "encode", str(base), str(new), "-o", str(work / "d.dcd"), "-q", "--chunk-size", args.chunk_size], check=True,
                              capture_output=True, text=True).stdout
        sizes.append((work / "d.dcd").stat().st_size)
        chunks = int(re.search(r": (\d+) chunks", line).group(1))
    subprocess.run([dc, "encode", str(ckpts[0]), "-o", str(work / "a.dcd"), "-q", "--chunk-size", args.chunk_size], check=True,
                   stdout=subprocess.DEVNULL)
    anchor_bytes = (work / "a.dcd").stat().st_size
    (work / "d.dcd").unlink()
    (work / "a.dcd").unlink()
    model = {"ckpts": ckpts, "image_bytes": image_bytes, "delta_bytes": statistics.mean(sizes), "chunks": chunks,
             "anchor_bytes": anchor_bytes}
    say(f"   image {image_bytes / 1e6:.1f} MB; deltas {model['delta_bytes'] / 1e6:.2f} MB compressed "
        f"({min(sizes) / 1e6:.2f}-{max(sizes) / 1e6:.2f}) in {chunks} chunks; anchor {anchor_bytes / 1e6:.1f} MB")
    return model


# ---- one core's decode rate (as scripts/validate_sim.sh) -----------------------------------------------


def decode_rate(bin_dir: Path, model: dict, work: Path, processes: int) -> float:
    """The median rate (image bytes/s) of `processes` decode_rate copies decoding at once."""
    barrier = work / "go"
    barrier.unlink(missing_ok=True)
    base, new = model["ckpts"][-2], model["ckpts"][-1]
    procs = [subprocess.Popen([str(bin_dir / "decode_rate"), str(base), str(new), "--seconds", "3", "--barrier", str(barrier)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    try:
        for p in procs:  # each prints "armed" once it has encoded, then waits for the barrier
            if p.stdout.readline().strip() != "armed":
                raise RuntimeError(f"decode_rate did not arm: {p.communicate()[1]}")
        barrier.touch()
        rates = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"decode_rate failed: {err}")
            rates.append(float(re.search(r"([0-9.e+]+) bytes/s", out).group(1)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return median_rank(rates)


# ---- the emulated fleet ----------------------------------------------------------------------------


class Worker:
    """A worker's output copied to a file, with (monotonic seconds, ms after publish, CPU ms)
    of each version's ready line."""

    def __init__(self, name: str, proc, path: Path):
        self.name, self.proc = name, proc
        self.ready: dict[int, tuple[float, int, int]] = {}
        self._thread = threading.Thread(target=self._read, args=(proc.stdout, path), daemon=True)
        self._thread.start()

    def _read(self, stream, path: Path) -> None:
        with open(path, "w") as out:
            for line in stream:
                out.write(line)
                out.flush()
                m = READY.search(line)
                if m:
                    self.ready[int(m.group(1))] = (time.monotonic(), int(m.group(2)), int(m.group(3)))

    def join(self) -> None:
        self._thread.join(timeout=30)


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks of every core so far (/proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(f) - f[3] - f[4], sum(f)


class Sampler:
    """Every `period_s`, on a thread: (monotonic seconds, {link: delivered bytes}, the host's
    busy and total CPU ticks, the relays' and the emulator's CPU seconds)."""

    def __init__(self, net: Wan, relay_pids: list[int], period_s: float = 0.05):
        self.samples: list[tuple[float, dict, int, int, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(net, relay_pids, period_s), daemon=True)
        self._thread.start()

    def _run(self, net: Wan, relay_pids: list[int], period_s: float) -> None:
        emulator = net.emulator_pid()
        while not self._stop.is_set():
            links = net.stats()["links"]
            self.samples.append((time.monotonic(), {k: v["delivered_bytes"] for k, v in links.items()}, *cpu_jiffies(),
                                 sum(cpu_seconds(p) for p in relay_pids), cpu_seconds(emulator)))
            time.sleep(period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def span(self, after: float, until: float) -> list:
        return [x for x in self.samples if after <= x[0] <= until]

    def cpu_busy(self, after: float, until: float) -> float:
        """The share of the host's cores busy between two moments."""
        s = self.span(after, until)
        return (s[-1][2] - s[0][2]) / (s[-1][3] - s[0][3]) if len(s) >= 2 and s[-1][3] > s[0][3] else 0.0

    def moving_cost(self, after: float, until: float, relay_link) -> tuple[float, float, int, int]:
        """Between two moments: the relays' and the emulator's CPU seconds, the bytes into and
        out of the relays (links for which relay_link(name) holds) and the bytes of every link."""
        s = self.span(after, until)
        if len(s) < 2:
            return 0.0, 0.0, 0, 0
        a, b = s[0], s[-1]
        moved = {k: b[1][k] - a[1].get(k, 0) for k in b[1]}
        return (b[4] - a[4], b[5] - a[5], sum(v for k, v in moved.items() if relay_link(k)), sum(moved.values()))

    def rate_bps(self, link: str, after: float, until: float) -> float:
        """A link's rate (IP bytes/s) while busy between two moments: the bytes from the last
        sample at 1% of them to the first at 99%, over the time between (as scripts/bench_wan.py)."""
        s = [(x[0], x[1].get(link, 0)) for x in self.span(after, until)]
        if len(s) < 2 or s[-1][1] == s[0][1]:
            return 0.0
        base, total = s[0][1], s[-1][1] - s[0][1]
        first = max(i for i in range(len(s)) if s[i][1] - base <= 0.01 * total)
        last = min(i for i in range(len(s)) if s[i][1] - base >= 0.99 * total)
        return (s[last][1] - s[first][1]) / (s[last][0] - s[first][0]) if last > first else 0.0


def fleet_nodes() -> dict[str, str]:
    nodes = {"origin": "o"}
    for region, _ in REGIONS:
        nodes[f"{region}-relay"] = region
        for i in range(1, WORKERS_PER_REGION + 1):
            nodes[f"{region}-w{i}"] = region
    return nodes


def origin_connections(net: Wan) -> tuple[dict[str, int], list[int]]:
    """The origin's established connections per relay, and the windows its peers advertise
    (ss's snd_wnd, where the kernel reports it)."""
    out = net.run("origin", ["ss", "-Htin", "state", "established", f"( sport = :{ORIGIN_PORT} )"],
                  capture_output=True, text=True, check=True).stdout
    by_addr = {net.addr(f"{r}-relay"): r for r, _ in REGIONS}
    counts = {r: 0 for r, _ in REGIONS}
    windows = []
    # Each connection: a line with the addresses, then (-i) a line of TCP_INFO fields; -H drops the header.
    for line in out.splitlines():
        m = re.search(r"\s(\d+\.\d+\.\d+\.\d+):\d+\s*$", line)
        if m and m.group(1) in by_addr:
            counts[by_addr[m.group(1)]] += 1
        w = re.search(r"\bsnd_wnd:(\d+)", line)
        if w:
            windows.append(int(w.group(1)))
    return counts, windows


def run_fleet(args, bins: Path, model: dict, stripes: int, rmem_max: int, work: Path, label: str) -> dict:
    """One emulated fleet: every version to every worker. Returns what was measured."""
    dc = str(bins / "deltacast")
    rate, queue = args.rate_mbit, args.queue_bytes
    wan = [{"a": "o", "b": r, "delay_ms": d, "rate_mbit": rate, "queue_bytes": queue} for r, d in REGIONS]
    lan = {"delay_ms": args.lan_delay_ms, "rate_mbit": args.lan_rate_mbit, "queue_bytes": queue}
    sysctls = {"net.ipv4.tcp_rmem": f"4096 {min(131072, rmem_max)} {rmem_max}", "net.ipv4.tcp_wmem": f"4096 16384 {rmem_max}",
               "net.ipv4.tcp_congestion_control": "reno", "net.ipv4.tcp_slow_start_after_idle": "1"}
    nodes = fleet_nodes()
    versions = len(model["ckpts"])
    log = args.log_level
    out: dict = {"stripes": stripes}
    with Wan(str(bins / "wan_emulator"), nodes, wan=wan, lan=lan, sysctls=sysctls) as net:
        origin_ep = f"tcp://{net.addr('origin')}:{ORIGIN_PORT}"
        relays, workers = {}, []
        for region, _ in REGIONS:
            relays[region] = net.spawn(f"{region}-relay", [dc, "relay", "--id", f"{region}-relay", "--listen", f"tcp://0.0.0.0:{RELAY_PORT}",
                                                          "--parent", origin_ep, "--stripes", str(stripes), "--stripes-start", str(stripes), "--log-level", log],
                                       stdout=open(work / f"{label}-{region}-relay.log", "w"), stderr=subprocess.STDOUT)
            relay_ep = f"tcp://{net.addr(f'{region}-relay')}:{RELAY_PORT}"
            for i in range(1, WORKERS_PER_REGION + 1):
                name = f"{region}-w{i}"
                p = net.spawn(name, [dc, "worker", "--id", name, "--parent", relay_ep, "--exit-after-version", str(versions),
                                     "--log-level", log], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                workers.append(Worker(name, p, work / f"{label}-{name}.log"))
        sampler = Sampler(net, [p.pid for p in relays.values()])
        publish = net.spawn("origin", [dc, "publish", "--listen", f"tcp://0.0.0.0:{ORIGIN_PORT}", "--wait-workers", str(len(workers)),
                                       "--wait-timeout-ms", "600000", "--interval-ms", str(args.interval_ms), "--linger-ms", "1000",
                                       "--chunk-size", args.chunk_size,
                                       "--log-level", log, *map(str, model["ckpts"])],
                            stdout=open(work / f"{label}-publish.log", "w"), stderr=subprocess.STDOUT)
        # Follow the versions as they become ready everywhere; the connections once version 2 is.
        announced, deadline = 0, time.monotonic() + args.timeout_s
        while announced < versions:
            if time.monotonic() > deadline or publish.poll() not in (None, 0):
                raise RuntimeError(f"{label}: version {announced + 1} did not reach every worker "
                                   f"(publish {'exited ' + str(publish.returncode) if publish.poll() is not None else 'still running'}; logs in {work})")
            v = announced + 1
            if all(v in w.ready for w in workers):
                times = sorted(w.ready[v][1] / 1e3 for w in workers)
                say(f"   {label}: version {v} ready at every worker, {times[0]:.2f}-{times[-1]:.2f} s after publish")
                announced = v
                if v == 2:
                    out["connections"], out["windows"] = origin_connections(net)
                    ws = out["windows"]
                    say(f"   {label}: the origin holds {', '.join(f'{n} from {r}' for r, n in out['connections'].items())} "
                        f"(--stripes {stripes}); advertised windows "
                        + (f"median {statistics.median(ws):,.0f} bytes, {min(ws):,}-{max(ws):,}" if ws else "not reported by ss"))
                continue
            time.sleep(0.1)
        if publish.wait(timeout=60) != 0:
            raise RuntimeError(f"{label}: publish exited {publish.returncode} (logs in {work})")
        for w in workers:
            w.proc.wait(timeout=30)
            w.join()
        sampler.stop()
        for region, p in relays.items():
            if Path(f"/proc/{p.pid}/comm").read_text().strip() != "deltacast":
                raise RuntimeError(f"{label}: {region}'s relay is not running as deltacast (pid {p.pid})")
        stats = net.stats()
        links = stats["links"]
        # A node that hears nothing from its parent for parent_timeout_ms (2 s) reconnects:
        # expected never here.
        out["parent_silences"] = sum(1 for f in work.glob(f"{label}-*.log") for line in f.read_text().splitlines()
                                     if "[warning]" in line and " silent for " in line)
        out["late_ms_max"] = max(l["late_ms_max"] for l in links.values())
        out["drops"] = sum(l["queue_drops"] + l["loss_drops"] + l["write_drops"] for l in links.values()) + stats["overflow_drops"]
        out["backlog_bytes_max"] = {r: links[f"o>{r}"]["backlog_bytes_max"] for r, _ in REGIONS}

    # Publish to ready per (version, worker); each version's rate over each WAN link.
    out["ready_ms"] = {v: {w.name: w.ready[v][1] for w in workers} for v in range(1, versions + 1)}
    published = {v: statistics.median(w.ready[v][0] - w.ready[v][1] / 1e3 for w in workers) for v in range(1, versions + 1)}
    done = {v: max(w.ready[v][0] for w in workers) for v in range(1, versions + 1)}
    measured = range(3, versions + 1)
    # The simulated trainer publishes every step period: the measured one (publish waits for
    # every worker, then --interval-ms, then encodes the next).
    out["period_s"] = statistics.median(published[v] - published[v - 1] for v in measured)
    out["cpu_busy"] = statistics.median(sampler.cpu_busy(published[v], done[v]) for v in measured)
    # What moving bytes cost while the measured versions were on their way: the relays' CPU
    # over the bytes into and out of them (their region's WAN link both ways, only the relay
    # talks to the origin, and their LAN links), plus the emulator's over every byte delivered,
    # counted at both ends of its link (the simulator charges net_ns_per_byte at the sender
    # and at the receiver), as validate_sim.sh does with the shaper.
    relay_link = lambda name: any(end.endswith("-relay") or end in relays for end in name.split(">"))  # noqa: E731
    costs = [sampler.moving_cost(published[v], done[v], relay_link) for v in measured]
    relay_cpu, emulator_cpu, relay_bytes, all_bytes = (sum(c[i] for c in costs) for i in range(4))
    out["relay_cpu_s"], out["emulator_cpu_s"], out["bytes_moved"] = relay_cpu, emulator_cpu, all_bytes
    out["net_ns_per_byte"] = (relay_cpu / max(relay_bytes, 1) + emulator_cpu / max(2 * all_bytes, 1)) * 1e9
    out["link_mbit"] = {}
    for region, _ in REGIONS:
        rates = []
        for v in range(3, versions + 1):
            done = max(w.ready[v][0] for w in workers if w.name.startswith(region + "-"))
            rates.append(sampler.rate_bps(f"o>{region}", published[v] - 0.05, done + 0.05) * 8 / 1e6)
        out["link_mbit"][region] = statistics.median(rates)
    # The workers' own CPU per measured version (their "process CPU" lines), median over workers.
    out["worker_cpu_ms"] = median_rank([(w.ready[versions][2] - w.ready[2][2]) / (versions - 2) for w in workers])
    return out


# ---- the simulated twin ------------------------------------------------------------------------------


def scenario(args, model: dict, stripes: int, window_bytes: int, period_s: float, core_decode_bps: float, net_ns: float,
             cores: int) -> dict:
    """The same fleet for `deltacast sim`: the emulator's rates as TCP payload rates (it counts
    whole 1500-byte packets), every NIC fast (the emulator has none), every node on one host
    of this machine's cores."""
    run = {"versions": len(model["ckpts"]), "step_period_s": round(period_s, 2), "decode": f"{core_decode_bps / 1e6:.1f}MB/s",
           "settle_s": 60, "cpu": {"cores": cores, "one_host": True, "net_ns_per_byte": round(net_ns, 3)}}
    if not args.sim_without_tcp:
        run["tcp"] = {"window_bytes": window_bytes, "congestion_control": "reno", "slow_start_after_idle": True}
        run["stripes"] = {"relay": stripes, "worker": 1}
    return {
        "name": f"WAN validation: origin, 3 regions of a relay and {WORKERS_PER_REGION} workers, --stripes {stripes}",
        "fleet": {
            "origin": {"region": "o", "uplink": FAST_NIC},
            "defaults": {
                "lan": {"latency_ms": args.lan_delay_ms, "bandwidth": mbit(args.lan_rate_mbit * PAYLOAD_SHARE)},
                "worker_nic": {"uplink": FAST_NIC, "downlink": FAST_NIC},
                "relay_nic": {"uplink": FAST_NIC, "downlink": FAST_NIC},
                "worker_relays": False,
            },
            "regions": [{"name": "o", "workers": 0, "relays": 0}]
                       + [{"name": r, "workers": WORKERS_PER_REGION, "relays": 1} for r, _ in REGIONS],
            "wan": [{"between": ["o", r], "latency_ms": d, "bandwidth": mbit(args.rate_mbit * PAYLOAD_SHARE)} for r, d in REGIONS],
        },
        "model": {"parameters": model["image_bytes"] // 2, "delta_fraction": round(model["delta_bytes"] / model["image_bytes"], 6),
                  "chunks": model["chunks"]},
        "run": run,
    }


def simulate(bins: Path, spec: dict, path: Path) -> tuple[dict | None, str]:
    """(p50, max, bound in seconds) of the cut-through relay tree, or None and why."""
    path.write_text(json.dumps(spec, indent=2) + "\n")
    p = subprocess.run([str(bins / "deltacast"), "sim", str(path), "--seed", "1", "--svg", str(path.with_suffix(".svg"))],
                       capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("cut-through relay tree"):
            f = line.split()
            return {"p50_s": float(f[-11]), "max_s": float(f[-9]), "bound_s": float(f[-8])}, ""
    said = (p.stderr.strip() or p.stdout.strip()).splitlines()
    return None, said[-1] if said else f"exit {p.returncode}"


# ---- rounds and the report -----------------------------------------------------------------------------


def verdict(ratio: float | None) -> str:
    if ratio is None:
        return "NO PREDICTION"
    return "PASS" if abs(ratio - 1) <= TOLERANCE else "FAIL"


def run_round(args, bins: Path, model: dict, stripes: int, invocation: int, rmem_max: int, window_bytes: int, work: Path) -> dict:
    label = f"inv{invocation}-s{stripes}"
    workers = len(REGIONS) * WORKERS_PER_REGION
    cores = os.cpu_count() or 1
    say(f"invocation {invocation}, --stripes {stripes}: decode rate before the fleet")
    before = decode_rate(bins, model, work, workers)
    say(f"invocation {invocation}, --stripes {stripes}: the emulated fleet ({len(model['ckpts'])} versions, {args.interval_ms} ms apart)")
    m = run_fleet(args, bins, model, stripes, rmem_max, work, label)
    say(f"invocation {invocation}, --stripes {stripes}: decode rate after the fleet")
    after = decode_rate(bins, model, work, workers)
    decode_bps = (before + after) / 2
    core_decode_bps = decode_bps * workers / min(workers, cores)
    spec = scenario(args, model, stripes, window_bytes, m["period_s"], core_decode_bps, m["net_ns_per_byte"], cores)
    sim, why = simulate(bins, spec, work / f"{label}-scenario.json")

    versions = len(model["ckpts"])
    v_p50 = [median_rank(list(m["ready_ms"][v].values())) / 1e3 for v in range(3, versions + 1)]
    v_max = [max(m["ready_ms"][v].values()) / 1e3 for v in range(3, versions + 1)]
    meas_p50, meas_max = median_rank(v_p50), median_rank(v_max)
    r = {"invocation": invocation, "stripes": stripes, "measured_p50_s": meas_p50, "measured_max_s": meas_max,
         "versions_p50_s": v_p50, "versions_max_s": v_max, "decode_bps_before": before, "decode_bps_after": after,
         "core_decode_bps": core_decode_bps, "sim": sim, "sim_error": why, "scenario": spec,
         **{k: m[k] for k in ("connections", "windows", "link_mbit", "net_ns_per_byte", "relay_cpu_s", "emulator_cpu_s", "bytes_moved", "period_s", "parent_silences",
                               "late_ms_max", "drops", "backlog_bytes_max", "worker_cpu_ms", "cpu_busy")}}
    r["ratio_p50"] = sim["p50_s"] / meas_p50 if sim else None
    r["ratio_max"] = sim["max_s"] / meas_max if sim else None

    # The round's report.
    print(f"\n== invocation {invocation}, --stripes {stripes}")
    print(f"   decode {decode_bps / 1e9:.2f} GB/s per worker with {workers} decoding at once ({before / 1e9:.2f} before, "
          f"{after / 1e9:.2f} after), {core_decode_bps / 1e9:.2f} per core; each worker's CPU per version {m['worker_cpu_ms']:.0f} ms "
          f"(at that rate: {model['image_bytes'] / core_decode_bps * 1e3:.0f} ms)")
    print(f"   the host's {cores} cores {m['cpu_busy']:.0%} busy while a version was on its way (median over versions 3-{versions})")
    print(f"   moving bytes {m['net_ns_per_byte']:.2f} ns/byte (while versions 3-{versions} were on their way: relays {m['relay_cpu_s']:.2f} s "
          f"of CPU, emulator {m['emulator_cpu_s']:.2f} s, {m['bytes_moved'] / 1e6:.0f} MB over the links); versions published every "
          f"{m['period_s']:.2f} s")
    print(f"   emulator at most {m['late_ms_max']:.2f} ms late; {m['drops']} packets dropped; most queued "
          + ", ".join(f"{r_}: {b / 1e6:.2f} MB" for r_, b in m["backlog_bytes_max"].items())
          + f"; parents found silent (reconnects): {m['parent_silences']}")
    expected = []
    for region, delay in REGIONS:
        bound = min(args.rate_mbit, stripes * window_bytes * 8 / (2 * delay / 1e3) / 1e6 / PAYLOAD_SHARE)
        expected.append(f"o>{region} {m['link_mbit'][region]:.1f} Mbit/s (bound {bound:.1f})")
    print(f"   each version over the WAN links, median: {', '.join(expected)}  "
          f"[bound: {stripes} window{'s' if stripes > 1 else ''} per round trip, at most the line's {args.rate_mbit:g}]")
    ok_conn = all(n == stripes for n in m["connections"].values())
    print(f"   connections to the origin: {', '.join(f'{r_} {n}' for r_, n in m['connections'].items())} "
          f"({'as' if ok_conn else 'NOT as'} --stripes {stripes})")
    print(f"   measured versions 3-{versions}: median worker {'/'.join(f'{x:.2f}' for x in v_p50)} s, "
          f"slowest {'/'.join(f'{x:.2f}' for x in v_max)} s")
    if not sim:
        print(f"   the simulator gave no prediction: {why}")
    print(f"   {'publish to ready':<18} {'measured':>9} {'simulated':>10} {'sim/meas':>9}  within {TOLERANCE:.0%}")
    for name, meas, key, ratio in (("median worker", meas_p50, "p50_s", r["ratio_p50"]), ("slowest worker", meas_max, "max_s", r["ratio_max"])):
        simulated = f"{sim[key]:9.2f}s" if sim else f"{'-':>10}"
        print(f"   {name:<18} {meas:8.2f}s {simulated} {ratio if ratio is not None else float('nan'):9.3f}  {verdict(ratio)}")
    if not ok_conn:
        r["ratio_p50"] = r["ratio_max"] = None
        r["sim_error"] = "the relays did not hold --stripes connections"
    print(flush=True)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--invocations", type=int, default=3, help="rounds per --stripes setting (the acceptance wants 3 or more)")
    ap.add_argument("--stripes", default="1,8", help="the relays' --stripes settings to compare, comma separated")
    ap.add_argument("--build", default=str(ROOT / "build"), help="build folder with tools/deltacast, tests/wan_emulator, tests/decode_rate")
    ap.add_argument("--size", default="32MB", help="deltacast gen --size")
    ap.add_argument("--lr", type=float, default=4e-4, help="deltacast gen --lr (4e-4 at 32MB: deltas of 8.5 MB)")
    ap.add_argument("--chunk-size", default="4MiB", help="publish's --chunk-size")
    ap.add_argument("--versions", type=int, default=7, help="versions published; 3..N are compared")
    ap.add_argument("--interval-ms", type=int, default=12000, help="publish's pause after every worker holds a version")
    ap.add_argument("--rate-mbit", type=float, default=25, help="each WAN link's rate (see above: at 100 the fleet is CPU-bound here)")
    ap.add_argument("--lan-rate-mbit", type=float, default=1000, help="each relay-worker link's rate")
    ap.add_argument("--lan-delay-ms", type=float, default=0.1, help="each relay-worker link's one-way delay")
    ap.add_argument("--window-bytes", type=int, help="one connection's largest window (default: a quarter of the longest "
                    "link's bandwidth-delay product); tcp_rmem/tcp_wmem max = this / 0.62")
    ap.add_argument("--queue-bytes", type=parse_bytes, default=4 << 20, help="every link's drop-tail queue (default 4 MiB: 8 windows fit)")
    ap.add_argument("--timeout-s", type=float, default=900, help="give a round up after this long")
    ap.add_argument("--sim-without-tcp", action="store_true", help="leave run.tcp and run.stripes out of the scenario "
                    "(a simulator without the TCP model)")
    ap.add_argument("--log-level", default="warn", help="the nodes' --log-level")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, scenarios, checkpoints)")
    ap.add_argument("--json", help="write every round's figures here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("validate_wan.py needs root (network namespaces, TUN devices)", file=sys.stderr)
        return 2
    stripes_list = [int(s) for s in args.stripes.split(",")]
    if args.versions < 3:
        ap.error("--versions must be at least 3 (versions 3..N are compared)")
    longest_ms = max(d for _, d in REGIONS)
    window_bytes = args.window_bytes or int(args.rate_mbit * 1e6 / 8 * 2 * longest_ms / 1e3 / 4)
    rmem_max = int(window_bytes / WINDOW_SHARE)
    window_bytes = int(rmem_max * WINDOW_SHARE)
    if max(stripes_list) * window_bytes > args.queue_bytes:
        say(f"note: {max(stripes_list)} windows ({max(stripes_list) * window_bytes / 1e6:.2f} MB) exceed the queue "
            f"({args.queue_bytes / 1e6:.2f} MB): the links may drop")

    work = Path(tempfile.mkdtemp(prefix="dcwan-validate-"))
    results = []
    try:
        # One copy of the binaries for the whole run, so a rebuild meanwhile does not mix versions.
        build = Path(args.build)
        bins = work / "bin"
        bins.mkdir()
        for rel in ("tools/deltacast", "tests/wan_emulator", "tests/decode_rate"):
            if not (build / rel).exists():
                print(f"missing {build / rel} (build with -DDELTACAST_TESTS=ON)", file=sys.stderr)
                return 2
            shutil.copy2(build / rel, bins)
        say(f"fleet: origin (region o); {', '.join(f'{r} {d:g} ms' for r, d in REGIONS)} one way, {args.rate_mbit:g} Mbit/s, "
            f"queue {args.queue_bytes / 1e6:.2f} MB; each a relay and {WORKERS_PER_REGION} workers on {args.lan_rate_mbit:g} Mbit/s, "
            f"{args.lan_delay_ms:g} ms LAN links")
        say(f"TCP: Reno, slow start after idle; tcp_rmem/tcp_wmem max {rmem_max:,} bytes, one window {window_bytes:,} bytes: "
            + ", ".join(f"{r} {window_bytes * 8 / (2 * d / 1e3) / 1e6:.1f} Mbit/s" for r, d in REGIONS) + " per connection")
        say(f"work folder {work}")
        model = make_model(args, str(bins / "deltacast"), work)
        for invocation in range(1, args.invocations + 1):
            for stripes in stripes_list:
                results.append(run_round(args, bins, model, stripes, invocation, rmem_max, window_bytes, work))
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    except RuntimeError as e:  # a fleet that did not deliver: its logs stay for a look
        say(f"FAIL: {e}")
        args.keep = True
        return 1
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    # Summary: every invocation within the tolerance, median and slowest worker, per setting.
    print(f"\nsummary: publish to ready over versions 3-{args.versions} (median over versions), one column per invocation")
    print(f"{'--stripes':>9}  {'worker':<8} {'measured s':<24} {'simulated s':<24} {'sim/meas':<24} verdict")
    all_pass = True
    for stripes in stripes_list:
        rows = [r for r in results if r["stripes"] == stripes]
        for name, key in (("median", "p50"), ("slowest", "max")):
            meas = " ".join(f"{r[f'measured_{key}_s']:.2f}" for r in rows)
            sim = " ".join(f"{r['sim'][key + '_s']:.2f}" if r["sim"] else "-" for r in rows)
            ratios = " ".join(f"{r[f'ratio_{key}']:.3f}" if r[f"ratio_{key}"] is not None else "-" for r in rows)
            ok = bool(rows) and all(verdict(r[f"ratio_{key}"]) == "PASS" for r in rows)
            all_pass &= ok
            print(f"{stripes:>9}  {name:<8} {meas:<24} {sim:<24} {ratios:<24} {'PASS' if ok else 'FAIL'}")
    if args.invocations < 3:
        print(f"(the acceptance asks for at least 3 invocations; this run had {args.invocations})")
    print(f"{'PASS' if all_pass else 'FAIL'}: simulated within {TOLERANCE:.0%} of measured, median and slowest worker, in every invocation")
    return 0 if all_pass else 1


if __name__ == "__main__":
    sys.exit(main())
