"""A WAN of network namespaces for tests and benchmarks (docs/SIM.md, "The WAN emulator").

    with Wan(emulator, {"origin": "us", "relay-eu": "eu", "w1": "eu"},
             wan=[{"a": "us", "b": "eu", "delay_ms": 75, "rate_mbit": 200, "queue_bytes": 4 << 20}],
             sysctls={"net.ipv4.tcp_rmem": "4096 131072 1048576"}) as net:
        net.spawn("origin", ["deltacast", "origin", ...])     # runs inside origin's namespace
        net.addr("origin")                                    # 10.77.0.1
        net.set_wan("us", "eu", loss=1)                       # cut the link; loss=0 mends it
        net.stats()                                           # the emulator's counters

Each node gets a network namespace of its own (named dcw<pid>-<n>, so that runs do not meet)
with `lo` and a TUN device `wan0` that tests/wan/wan_emulator carries to the others. `sysctls`
are set in every namespace (net.ipv4.* and net.core.* keys that the kernel keeps per namespace).
Closing, an exception, SIGINT or SIGTERM stops every process spawned, the emulator and the
namespaces; namespaces that a killed run left behind are removed by the next one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

NETNS_DIR = Path("/run/netns")
PREFIX = "dcw"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL)


def remove_stale_namespaces() -> None:
    """Deletes the namespaces of runs whose process is gone."""
    if not NETNS_DIR.is_dir():
        return
    for ns in NETNS_DIR.iterdir():
        name = ns.name
        if not name.startswith(PREFIX) or "-" not in name:
            continue
        pid = name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)


class Wan:
    def __init__(self, emulator: str, nodes: dict[str, str], *, wan: list[dict], lan: Optional[dict] = None,
                 sysctls: Optional[dict[str, str]] = None, mtu: int = 1500, seed: int = 1):
        if os.geteuid() != 0:
            raise PermissionError("the WAN emulator needs root (network namespaces, TUN devices)")
        if len(nodes) > 250:
            raise ValueError("at most 250 nodes")
        remove_stale_namespaces()
        self._names = list(nodes)
        self._netns = {name: f"{PREFIX}{os.getpid()}-{i}" for i, name in enumerate(self._names)}
        self._addr = {name: f"10.77.{(i + 1) // 256}.{(i + 1) % 256}" for i, name in enumerate(self._names)}
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._emulator: Optional[subprocess.Popen] = None
        self._dir = tempfile.TemporaryDirectory(prefix="dcwan-")
        self._old_handlers = {}
        try:
            self._install_signal_handlers()
            for name in self._names:
                _ip("netns", "add", self._netns[name])
            for key, value in (sysctls or {}).items():
                self.sysctl(key, value)
            config = {"mtu": mtu, "seed": seed, "lan": lan or {"delay_ms": 0.05, "rate_mbit": 0, "queue_bytes": 16 << 20},
                      "wan": wan,
                      "nodes": [{"name": n, "netns": self._netns[n], "addr": self._addr[n], "region": nodes[n]} for n in self._names]}
            path = Path(self._dir.name) / "wan.json"
            path.write_text(json.dumps(config))
            self._emulator = subprocess.Popen([emulator, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = self._emulator.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"wan_emulator did not start (exit {self._emulator.wait(timeout=10)})")
        except BaseException:
            self.close()
            raise

    # --- use ---

    def addr(self, node: str) -> str:
        return self._addr[node]

    def netns(self, node: str) -> str:
        return self._netns[node]

    def command(self, node: str, argv: list[str]) -> list[str]:
        """argv run inside the node's namespace."""
        return ["ip", "netns", "exec", self._netns[node], *argv]

    def spawn(self, node: str, argv: list[str], **popen) -> subprocess.Popen:
        """Starts argv inside the node's namespace; close() stops it (its whole process group)."""
        p = subprocess.Popen(self.command(node, argv), start_new_session=True, **popen)
        self._procs.append(p)
        return p

    def run(self, node: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(node, argv), **kw)

    def sysctl(self, key: str, value: str, nodes: Optional[list[str]] = None) -> None:
        for node in nodes or self._names:
            subprocess.run(self.command(node, ["sysctl", "-q", "-w", f"{key}={value}"]), check=True)

    def _ask(self, line: str) -> str:
        with self._lock:
            self._emulator.stdin.write(line + "\n")
            self._emulator.stdin.flush()
            return self._emulator.stdout.readline().strip()

    def set_wan(self, region_a: str, region_b: str, **spec: float) -> None:
        """Changes the WAN link between two regions, both directions (delay_ms, rate_mbit,
        queue_bytes, loss, jitter_ms); loss=1 cuts it."""
        answer = self._ask(" ".join(["set", region_a, region_b, *(f"{k}={v}" for k, v in spec.items())]))
        if answer != "ok":
            raise RuntimeError(f"wan_emulator: {answer}")

    def stats(self) -> dict:
        return json.loads(self._ask("stats"))

    def emulator_pid(self) -> int:
        """The emulator's process id (for its CPU time in /proc)."""
        return self._emulator.pid

    # --- teardown ---

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum, _frame):
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, stop)

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self._procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self._procs = []
        if self._emulator is not None:
            if self._emulator.poll() is None:
                self._emulator.terminate()
            try:
                self._emulator.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._emulator.kill()
                self._emulator.wait()
            self._emulator = None
        for ns in self._netns.values():
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        self._dir.cleanup()
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}

    def __enter__(self) -> "Wan":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
