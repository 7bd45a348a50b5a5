#!/usr/bin/env python3
"""A fleet over an emulated WAN link under kernel TCP (tests/wan; root).

An origin in one region; a relay and two workers in another, 75 ms one way from it, on a
100 Mbit/s link whose bandwidth-delay product (1.9 MB) is 4x the largest window the
namespaces' tcp_rmem/tcp_wmem let one connection open, so the relay's link, with default
settings, is window-bound and must size itself to several connections. Every namespace defaults to Reno; the origin runs its children's connections with
--congestion-control (BBR where the kernel has it, else CUBIC), and the relay, without the
flag, its children's on BBR too (the default, auto), which they must show. Versions
1-2 go over the clean link; version 3 over a link losing 2% of its packets;
during version 4 the link is cut for 3 s (loss 1) and then mended. Every worker must expose every
version with the publisher's checksum, and nothing else, with no help from outside.

Usage: emulated_fleet_test.py DELTACAST WAN_EMULATOR
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import Log, check_exposed, make_versions, verdict  # noqa: E402
from wan import Wan  # noqa: E402

VERSIONS = 4
DELAY_MS, RATE_MBIT = 75, 100
BDP = RATE_MBIT * 1e6 / 8 * 2 * DELAY_MS / 1e3
WINDOW_SHARE = 0.62  # the kernel's advertised window over tcp_rmem's maximum at MTU 1500 (selfcheck.py)
RMEM_MAX = int(BDP / 4 / WINDOW_SHARE)


def main() -> int:
    dc, emulator = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory(prefix="dcwan-fleet-") as tmp:
        work = Path(tmp)
        versions = make_versions(dc, work, size="24MB", lr=1e-3, count=VERSIONS)
        ckpts = versions.checkpoints
        wan = [{"a": "us", "b": "eu", "delay_ms": DELAY_MS, "rate_mbit": RATE_MBIT, "queue_bytes": int(BDP)}]
        sysctls = {"net.ipv4.tcp_rmem": f"4096 131072 {RMEM_MAX}", "net.ipv4.tcp_wmem": f"4096 16384 {RMEM_MAX}",
                   "net.ipv4.tcp_congestion_control": "reno"}
        available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
        origin_cc = "bbr" if "bbr" in available else "cubic"
        nodes = {"origin": "us", "relay": "eu", "w1": "eu", "w2": "eu"}
        with Wan(emulator, nodes, wan=wan, sysctls=sysctls) as net:
            print(f"link {RATE_MBIT} Mbit/s, {DELAY_MS} ms one way: bandwidth-delay product {BDP / 1e6:.2f} MB, "
                  f"4x the window tcp_rmem max {RMEM_MAX} allows", flush=True)
            origin_ep = f"tcp://{net.addr('origin')}:7100"
            relay_ep = f"tcp://{net.addr('relay')}:7101"
            relay = net.spawn("relay", [dc, "relay", "--id", "relay", "--listen", "tcp://0.0.0.0:7101", "--parent", origin_ep],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            relay_log = Log(relay)
            logs = {}
            for w in ("w1", "w2"):
                p = net.spawn(w, [dc, "worker", "--id", w, "--parent", relay_ep, "--exit-after-version", str(VERSIONS)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                logs[w] = Log(p)
            publish = net.spawn("origin", [dc, "publish", "--listen", "tcp://0.0.0.0:7100", "--congestion-control", origin_cc,
                                           "--wait-workers", "2",
                                           "--wait-timeout-ms", "120000", "--interval-ms", "1500", "--linger-ms", "1000",
                                           *map(str, ckpts)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            publish_log = Log(publish)

            def ready(v: int, timeout_s: float) -> bool:
                return all(logs[w].wait_for(rf"version {v} ready", timeout_s) for w in logs)

            if not ready(2, 120):
                failures.append("versions 1-2 did not reach both workers over the clean link")
            # The relay's link to the origin sized itself (default settings): more than one
            # connection, as the window is a quarter of the link's product, and runs on the
            # origin's --congestion-control, not the namespace's Reno.
            ss = net.run("origin", ["ss", "-Htin", "state", "established", "( sport = :7100 )"], capture_output=True, text=True)
            infos = [l for l in ss.stdout.splitlines() if "rtt:" in l]
            on_cc = sum(1 for l in infos if f" {origin_cc} " in f" {l} ")
            print(f"connections from the relay to the origin: {len(infos)}, {on_cc} of them on {origin_cc}", flush=True)
            if not 2 <= len(infos) <= 8:
                failures.append(f"the relay holds {len(infos)} connections to the origin: its link did not size itself to 2 to 8")
            if on_cc != len(infos):
                failures.append(f"{len(infos) - on_cc} of the origin's connections are not on {origin_cc}")
            # The relay sets no --congestion-control: by default (auto) its children's connections
            # are on BBR where the kernel has it, whatever the namespace's default (Reno).
            auto_cc = "bbr" if "bbr" in available else "reno"
            ss = net.run("relay", ["ss", "-Htin", "state", "established", "( sport = :7101 )"], capture_output=True, text=True)
            infos = [l for l in ss.stdout.splitlines() if "rtt:" in l]
            on_auto = sum(1 for l in infos if f" {auto_cc} " in f" {l} ")
            print(f"connections from the workers to the relay: {len(infos)}, {on_auto} of them on {auto_cc} (the default, auto)", flush=True)
            if len(infos) != 2 or on_auto != len(infos):
                failures.append(f"the relay's default congestion control: {on_auto} of {len(infos)} worker connections on {auto_cc}")
            net.set_wan("us", "eu", loss=0.02)
            if not ready(3, 120):
                failures.append("version 3 did not reach both workers over a link losing 2%")
            lost_at_2pct = net.stats()["links"]["us>eu"]["loss_drops"]
            net.set_wan("us", "eu", loss=0)
            # Cut the link once version 4 is on its way (a megabyte of it crossed), for 3 s.
            start = net.stats()["links"]["us>eu"]["delivered_bytes"]
            deadline = time.monotonic() + 60
            while net.stats()["links"]["us>eu"]["delivered_bytes"] - start < (1 << 20) and time.monotonic() < deadline:
                time.sleep(0.02)
            net.set_wan("us", "eu", loss=1)
            time.sleep(3)
            dropped_in_cut = net.stats()["links"]["us>eu"]["loss_drops"] - lost_at_2pct
            net.set_wan("us", "eu", loss=0)
            if not ready(4, 180):
                failures.append("version 4 did not reach both workers after the cut")
            if publish.wait(timeout=120) != 0:
                failures.append(f"publish exited {publish.returncode}")
            stats = net.stats()["links"]
            print(f"packets lost on the link: {lost_at_2pct} at 2% (version 3), {dropped_in_cut} in the 3 s cut (version 4)")
            if lost_at_2pct == 0 or dropped_in_cut == 0:
                failures.append("the link lost nothing: the loss and the cut did not happen")
            for w, log in logs.items():
                failures += check_exposed(w, log, versions)
            print(f"link us>eu: {stats['us>eu']['delivered_bytes'] / 1e6:.1f} MB delivered, {stats['us>eu']['queue_drops']} queue drops")
            if failures:
                for name, log in [("publish", publish_log), ("relay", relay_log), *logs.items()]:
                    print(f"--- {name}\n" + "\n".join(log.lines[-15:]))
    return verdict("emulated WAN fleet", failures)


if __name__ == "__main__":
    sys.exit(main())
