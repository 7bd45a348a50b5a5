"""Fleets of deltacast processes on the emulated WAN (tests/wan; root).

    versions = make_versions(dc, work, size="24MB", lr=1e-3, count=4)   # checkpoints and their checksums
    log = Log(proc)                                                     # a process's output, kept as it comes
    with RegionsFleet(dc, emulator, work, trees=2, ...) as fleet:     # three regions from fleet-init
        fleet.start(versions)
        fleet.ready(4, 120)

`RegionsFleet` is three regions joined pairwise by WAN links: us with the origin and a worker,
eu and ap with a relay and some workers each. `deltacast fleet-init --trees N` plans it and
writes every node's config (CURVE keys, signed versions); every node runs from its config in a
namespace of its own. With one tree, eu and ap each receive over their own link from us. With
two, half of every version's chunks cross us>eu and then eu>ap, the other half us>ap and then
ap>eu, so each region receives at twice one link's rate (docs/TOPOLOGY.md).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from wan import Wan

READY = re.compile(r"version (\d+) ready, checksum ([0-9a-f]+)(?:, (\d+) ms after publish)?")


class Log:
    """A process's output kept as it comes, to wait for lines and read them afterwards."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()

    def wait_for(self, pattern: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while not any(re.search(pattern, l) for l in self.lines):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def ready(self) -> list[tuple[int, str, int]]:
        """(version, checksum, ms after publish or -1) of every 'version N ready' line so far."""
        with self._cv:
            found = [READY.search(l) for l in self.lines]
        return [(int(m.group(1)), m.group(2), int(m.group(3) or -1)) for m in found if m]


@dataclass
class Versions:
    checkpoints: list[Path]
    checksums: dict[int, str]   # version -> the publisher's checksum
    bytes: dict[int, int]       # version -> its encoded size as published: version 1 an anchor, the rest deltas


def make_versions(dc: str, work: Path, *, size: str, lr: float, count: int) -> Versions:
    """`count` checkpoints from `deltacast gen`, each one's version checksum and encoded size."""
    subprocess.run([dc, "gen", "-q", "-o", str(work / "ckpt"), "--size", size, "--lr", str(lr), "--steps", str(count - 1)],
                   check=True, stdout=subprocess.DEVNULL)
    ckpts = sorted((work / "ckpt").glob("*.safetensors"))
    checksums, sizes = {}, {}
    for v, ckpt in enumerate(ckpts, 1):
        base = [str(ckpts[v - 2])] if v > 1 else []
        out_file = work / "v.dcd"
        subprocess.run([dc, "encode", "-q", *base, str(ckpt), "-o", str(out_file), "--version", str(v)],
                       check=True, stdout=subprocess.DEVNULL)
        out = subprocess.run([dc, "inspect", str(out_file)], check=True, capture_output=True, text=True).stdout
        checksums[v] = re.search(r"version checksum ([0-9a-f]+)", out).group(1)
        sizes[v] = out_file.stat().st_size
        out_file.unlink()
    return Versions(ckpts, checksums, sizes)


def check_exposed(name: str, log: Log, versions: Versions) -> list[str]:
    """What is wrong with what a worker exposed: it must be exactly versions 1..N, each with the
    publisher's checksum."""
    failures = []
    seen = log.ready()
    for v, checksum, _ in seen:
        if versions.checksums.get(v) != checksum:
            failures.append(f"{name} exposed version {v} with checksum {checksum}, the publisher's is {versions.checksums.get(v)}")
    if sorted(v for v, _, _ in seen) != list(range(1, len(versions.checkpoints) + 1)):
        failures.append(f"{name} exposed versions {[v for v, _, _ in seen]}, not 1..{len(versions.checkpoints)}")
    return failures


def verdict(name: str, failures: list[str]) -> int:
    """Prints the failures and PASS or their count; the test's exit status."""
    for f in failures:
        print("FAIL", f)
    print(f"PASS {name}" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


class RegionsFleet:
    """Three regions on the WAN emulator, planned and configured by `deltacast fleet-init`."""

    PORT = 7100
    PAIRS = (("us", "eu"), ("us", "ap"), ("eu", "ap"))

    def __init__(self, dc: str, emulator: str, work: Path, *, trees: int | str, rate_mbit: float, delay_ms: float,
                 workers: int, sysctls: dict[str, str] | None = None, timing: dict[str, int] | None = None):
        self.dc, self.work, self.rate_mbit, self.delay_ms = dc, work / f"fleet-{trees}", rate_mbit, delay_ms
        self.work.mkdir(parents=True, exist_ok=True)
        regions = [{"name": "us", "workers": 1, "relays": 0}] + \
                  [{"name": r, "workers": workers, "relays": 1} for r in ("eu", "ap")]
        description = {
            "origin": {"region": "us", "uplink": "10Gbit"}, "fanout_max": 8,
            "defaults": {"lan": {"latency_ms": 0.1, "bandwidth": "10Gbit"},
                         "worker_nic": {"uplink": "10Gbit", "downlink": "10Gbit"},
                         "relay_nic": {"uplink": "10Gbit", "downlink": "10Gbit"}, "worker_relays": False},
            "regions": regions,
            "wan": [{"between": pair, "latency_ms": delay_ms, "bandwidth": f"{rate_mbit:g}Mbit"}
                    for pair in self.PAIRS]}
        self.nodes = {"origin": "us", "us.w0": "us"}
        for r in ("eu", "ap"):
            self.nodes[f"{r}.relay-0"] = r
            self.nodes.update({f"{r}.w{i}": r for i in range(workers)})
        self.workers = [n for n in self.nodes if ".w" in n]
        (self.work / "fleet.json").write_text(json.dumps(description, indent=2))
        wan = [{"a": a, "b": b, "delay_ms": delay_ms, "rate_mbit": rate_mbit, "queue_bytes": self._bdp(rate_mbit)}
               for a, b in self.PAIRS]
        self.net = Wan(emulator, self.nodes, wan=wan, sysctls=sysctls)
        try:
            endpoints = {n: f"tcp://{self.net.addr(n)}:{self.PORT}" for n in self.nodes}
            (self.work / "endpoints.json").write_text(json.dumps(endpoints))
            init = subprocess.run([dc, "fleet-init", "-o", str(self.work / "configs"), "--fleet", str(self.work / "fleet.json"),
                                   "--endpoints", str(self.work / "endpoints.json"), "--trees", str(trees),
                                   *(["--timing", json.dumps(timing)] if timing else [])],
                                  capture_output=True, text=True)
            if init.returncode != 0:
                raise RuntimeError(f"fleet-init failed: {init.stderr}")
            self.plan = init.stdout
            self.trees = len(json.loads((self.work / "configs" / "eu.w0.json").read_text()).get("trees", [None]))
            self.logs: dict[str, Log] = {}
            self.procs: dict[str, subprocess.Popen] = {}
        except BaseException:
            self.net.close()
            raise

    def _spawn(self, node: str, argv: list[str]) -> None:
        self.procs[node] = self.net.spawn(node, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.logs[node] = Log(self.procs[node])

    def start(self, versions: Versions, *publish_args: str, node_args: tuple[str, ...] = ()) -> None:
        """Relays, then workers (each exits after the last version), then the origin publishing
        every checkpoint. `node_args` go to every relay and worker."""
        config = lambda n: str(self.work / "configs" / f"{n}.json")  # noqa: E731
        for n in self.nodes:
            if ".relay-" in n:
                self._spawn(n, [self.dc, "relay", "--config", config(n), *node_args])
        for n in self.workers:
            self._spawn(n, [self.dc, "worker", "--config", config(n), "--exit-after-version", str(len(versions.checkpoints)),
                            *node_args])
        self._spawn("origin", [self.dc, "publish", "--config", config("origin"), *publish_args, *map(str, versions.checkpoints)])

    def ready(self, version: int, timeout_s: float) -> bool:
        """Whether every worker reported `version` ready within the time."""
        deadline = time.monotonic() + timeout_s
        return all(self.logs[w].wait_for(rf"version {version} ready", max(0.0, deadline - time.monotonic())) for w in self.workers)

    def _bdp(self, rate_mbit: float) -> int:
        return int(rate_mbit * 1e6 / 8 * 2 * self.delay_ms / 1e3)

    def set_rate(self, rate_mbit: float) -> None:
        """Every WAN link to `rate_mbit`, with a drop-tail queue of one bandwidth-delay product."""
        for a, b in self.PAIRS:
            self.net.set_wan(a, b, rate_mbit=rate_mbit, queue_bytes=self._bdp(rate_mbit))

    def delivered(self, link: str) -> int:
        return self.net.stats()["links"].get(link, {}).get("delivered_bytes", 0)

    def wait_delivered(self, link: str, grown_bytes: int, timeout_s: float) -> bool:
        """Waits until `link` ("us>eu") delivered `grown_bytes` more than now."""
        start, deadline = self.delivered(link), time.monotonic() + timeout_s
        while self.delivered(link) - start < grown_bytes:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def check_workers(self, versions: Versions) -> list[str]:
        return [f for w in self.workers for f in check_exposed(w, self.logs[w], versions)]

    def tails(self, lines: int = 15) -> str:
        return "\n".join(f"--- {n}\n" + "\n".join(log.lines[-lines:]) for n, log in self.logs.items())

    def close(self) -> None:
        self.net.close()

    def __enter__(self) -> "RegionsFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
