#!/usr/bin/env python3
"""The WAN emulator checked against its own specification (docs/SIM.md, "The WAN emulator").

Two namespaces, one WAN link between them (DELAY one way, RATE, a drop-tail queue of QUEUE
bytes), kernel TCP and UDP end to end:
  1. round trip: the median UDP round trip is 2 x DELAY within 1 ms;
  2. one long TCP flow with a window smaller than the link's bandwidth-delay product reaches
     window / RTT within 10% (the window as the kernel advertised it, from TCP_INFO);
  3. one long TCP flow with a window larger than the bandwidth-delay product reaches the link
     rate (TCP payload: 1448 of every 1500 bytes) within 10%;
  4. random loss: the share of packets lost matches the setting within 4 standard deviations;
  5. the queue: UDP offered at twice the rate leaves at the rate (within 5%), the queue never
     holds more than QUEUE bytes, and the longest the emulator held a packet is DELAY plus
     QUEUE at the rate (within 10%). The slowest one-way delay the receiving process saw is
     printed too: it adds the hosts' own queues.

Usage: tests/wan/selfcheck.py --emulator build/tests/wan_emulator [--delay-ms 30] [--rate-mbit 100]
       [--cc cubic] [--seconds 8]       (root; exits 1 if a check fails)
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wan import Wan  # noqa: E402

PROBE = str(Path(__file__).resolve().parent / "netprobe.py")
PAYLOAD_SHARE = 1448 / 1500  # TCP payload per 1500-byte packet (IPv4 + TCP with timestamps: 52 bytes)


def probe(net: Wan, node: str, *args) -> dict:
    out = net.run(node, [sys.executable, PROBE, *map(str, args)], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def spawn_probe(net: Wan, node: str, *args) -> subprocess.Popen:
    return net.spawn(node, [sys.executable, PROBE, *map(str, args)], stdout=subprocess.PIPE, text=True)


def link_stats(net: Wan) -> dict:
    return net.stats()["links"]["left>right"]


def tcp_flow(net: Wan, seconds: float, warmup_s: float, cc: str) -> dict:
    """One TCP connection left -> right for `seconds`; throughput after `warmup_s`."""
    sink = spawn_probe(net, "right", "tcp-sink", 5001)
    time.sleep(0.3)
    source = probe(net, "left", "tcp-source", net.addr("right"), 5001, seconds, cc)
    marks = json.loads(sink.communicate(timeout=60)[0])["marks"]
    t0 = marks[0][0] + warmup_s * 1e9
    steady = [m for m in marks if m[0] >= t0]
    rate_bps = (steady[-2][1] - steady[0][1]) * 8 / ((steady[-2][0] - steady[0][0]) / 1e9)  # up to the last full sample
    samples = [s for s in source["samples"] if s[0] >= warmup_s]
    return {"mbit": rate_bps / 1e6, "snd_wnd": statistics.median(s[1] for s in samples),
            "srtt_ms": statistics.median(s[2] for s in samples)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emulator", required=True)
    ap.add_argument("--delay-ms", type=float, default=30)
    ap.add_argument("--rate-mbit", type=float, default=100)
    ap.add_argument("--cc", default="cubic", help="the TCP flows' congestion control")
    ap.add_argument("--seconds", type=float, default=8, help="length of each TCP flow")
    ap.add_argument("--loss", type=float, default=0.02)
    args = ap.parse_args()
    delay, rate = args.delay_ms, args.rate_mbit
    rtt_s = 2 * delay / 1e3
    bdp = rate * 1e6 / 8 * rtt_s
    queue = int(bdp)  # one bandwidth-delay product
    results = []

    def check(name: str, measured: float, expected: float, ok: bool, unit: str) -> None:
        results.append((name, measured, expected, ok, unit))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {measured:.3f} {unit} (expected {expected:.3f} {unit})", flush=True)

    wan = [{"a": "left", "b": "right", "delay_ms": delay, "rate_mbit": rate, "queue_bytes": queue}]
    sysctls = {"net.ipv4.tcp_wmem": f"4096 65536 {64 << 20}"}
    with Wan(args.emulator, {"left": "left", "right": "right"}, wan=wan, sysctls=sysctls) as net:
        print(f"link: {delay} ms one way, {rate} Mbit/s, queue {queue} bytes (one BDP), {args.cc}", flush=True)
        # 1. Round trip.
        spawn_probe(net, "right", "udp-echo", 5000)
        time.sleep(0.3)
        ping = probe(net, "left", "udp-ping", net.addr("right"), 5000, 50, 20)
        check("UDP round trip, median", ping["rtt_ms_median"], 2 * delay, abs(ping["rtt_ms_median"] - 2 * delay) <= 1.0, "ms")

        # 2. A window smaller than the bandwidth-delay product: a quarter of it.
        window_max = int(bdp / 4)
        net.sysctl("net.ipv4.tcp_rmem", f"4096 131072 {window_max}", ["right"])
        flow = tcp_flow(net, args.seconds, 3.0, args.cc)
        expected = min(rate * PAYLOAD_SHARE, flow["snd_wnd"] * 8 / rtt_s / 1e6)
        print(f"     (tcp_rmem max {window_max} bytes; advertised window {flow['snd_wnd']:.0f} bytes, srtt {flow['srtt_ms']:.1f} ms)")
        check("TCP flow, window-bound", flow["mbit"], expected, abs(flow["mbit"] / expected - 1) <= 0.10, "Mbit/s")

        # 3. A window larger than it.
        net.sysctl("net.ipv4.tcp_rmem", f"4096 131072 {int(bdp * 8)}", ["right"])
        flow = tcp_flow(net, args.seconds, 3.0, args.cc)
        expected = min(rate * PAYLOAD_SHARE, flow["snd_wnd"] * 8 / rtt_s / 1e6)
        print(f"     (tcp_rmem max {int(bdp * 8)} bytes; advertised window {flow['snd_wnd']:.0f} bytes, srtt {flow['srtt_ms']:.1f} ms)")
        check("TCP flow, rate-bound", flow["mbit"], expected, abs(flow["mbit"] / expected - 1) <= 0.10, "Mbit/s")

        # 4. Random loss, UDP at a fifth of the rate.
        net.set_wan("left", "right", loss=args.loss)
        before = link_stats(net)
        sink = spawn_probe(net, "right", "udp-sink", 5002, 4.5)
        time.sleep(0.3)
        probe(net, "left", "udp-blast", net.addr("right"), 5002, rate / 5, 3)
        received = json.loads(sink.communicate(timeout=60)[0])["received"]
        after = link_stats(net)
        crossed = (after["packets_in"] - before["packets_in"]) - (after["queue_drops"] - before["queue_drops"])
        lost = after["loss_drops"] - before["loss_drops"]
        sigma = math.sqrt(args.loss * (1 - args.loss) / crossed)
        check("random loss, share of packets", lost / crossed, args.loss, abs(lost / crossed - args.loss) <= 4 * sigma, "")
        # Within 2: the link may also carry a straggler of the TCP flows before.
        check("datagrams received = delivered", received, after["delivered"] - before["delivered"],
              abs(received - (after["delivered"] - before["delivered"])) <= 2, "")
        net.set_wan("left", "right", loss=0)

        # 5. The queue, UDP at twice the rate.
        before = link_stats(net)
        sink = spawn_probe(net, "right", "udp-sink", 5003, 4.5)
        time.sleep(0.3)
        blast = probe(net, "left", "udp-blast", net.addr("right"), 5003, rate * 2, 3)
        got = json.loads(sink.communicate(timeout=60)[0])
        after = link_stats(net)
        line_mbit = (after["delivered_bytes"] - before["delivered_bytes"]) * 8 / ((got["last_ns"] - got["first_ns"]) / 1e9) / 1e6
        check("queue: rate out of an overloaded link", line_mbit, rate, abs(line_mbit / rate - 1) <= 0.05, "Mbit/s")
        check("queue: most bytes held", after["backlog_bytes_max"], queue, after["backlog_bytes_max"] <= queue, "bytes")
        drops = after["queue_drops"] - before["queue_drops"]
        check("queue: datagrams dropped = offered - delivered", drops, blast["sent"] - (after["delivered"] - before["delivered"]),
              drops == blast["sent"] - (after["delivered"] - before["delivered"]) and drops > 0, "")
        worst = delay + queue * 8 / (rate * 1e3)
        check("queue: longest a packet was held", after["hold_ms_max"], worst, abs(after["hold_ms_max"] / worst - 1) <= 0.10, "ms")
        print(f"     (slowest one-way delay seen by the receiving process: {got['one_way_ms_max']:.1f} ms; "
              f"the emulator's latest write after a packet's time: {after['late_ms_max']:.2f} ms)")
        unrouted = net.stats()["unrouted"]
        print(f"     (packets no link carried, the kernel's IPv6 chatter: {unrouted})")
    failed = [r for r in results if not r[3]]
    print(f"{len(results) - len(failed)} of {len(results)} checks hold")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
