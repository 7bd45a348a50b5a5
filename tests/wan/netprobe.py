"""Traffic for the WAN emulator's self-check (tests/wan/selfcheck.py), run inside a namespace.

    netprobe.py udp-echo PORT                      echo datagrams back until killed
    netprobe.py udp-ping HOST PORT COUNT GAP_MS    round trips of small datagrams -> JSON
    netprobe.py udp-sink PORT SECONDS              count datagrams, one-way delays -> JSON
    netprobe.py udp-blast HOST PORT MBIT SECONDS   send 1,400-byte datagrams at a rate -> JSON
    netprobe.py tcp-sink PORT                      read one connection to its end -> JSON
    netprobe.py tcp-source HOST PORT SECONDS CC    write as fast as TCP takes it, congestion
                                                   control CC (per socket: root may pick any) -> JSON
    netprobe.py tcp-sinks PORT FLOWS               read FLOWS connections to their ends -> JSON
    netprobe.py tcp-flows HOST PORT FLOWS BYTES CC BYTES over FLOWS new connections at once, an
                                                   equal share each -> JSON

Every datagram carries its send time (CLOCK_MONOTONIC, which all namespaces share), so the sink
sees one-way delays. The TCP source samples the kernel's TCP_INFO: the peer's advertised window
(tcpi_snd_wnd) and the smoothed RTT.
"""

import json
import socket
import statistics
import struct
import sys
import threading
import time

DATAGRAM_BYTES = 1400
TCP_INFO_BYTES = 232          # struct tcp_info as of Linux 5.4+ (linux/tcp.h)
TCPI_RTT_OFFSET = 68          # tcpi_rtt, microseconds
TCPI_SND_WND_OFFSET = 228     # tcpi_snd_wnd, bytes: the peer's advertised receive window


def now_ns() -> int:
    return time.monotonic_ns()


def udp_echo(port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    while True:
        data, peer = s.recvfrom(65536)
        s.sendto(data, peer)


def udp_ping(host: str, port: int, count: int, gap_ms: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2.0)
    rtts = []
    for i in range(count):
        sent = now_ns()
        s.sendto(struct.pack("!QQ", i, sent), (host, port))
        try:
            while True:
                data, _ = s.recvfrom(65536)
                seq, t = struct.unpack("!QQ", data[:16])
                if seq == i:
                    rtts.append((now_ns() - t) / 1e6)
                    break
        except socket.timeout:
            pass
        time.sleep(gap_ms / 1000)
    return {"sent": count, "answered": len(rtts), "rtt_ms_median": statistics.median(rtts) if rtts else None,
            "rtt_ms_min": min(rtts, default=None), "rtt_ms_max": max(rtts, default=None)}


def udp_sink(port: int, seconds: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("0.0.0.0", port))
    s.settimeout(0.2)
    got = nbytes = 0
    delays = []
    first = last = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        t = now_ns()
        first = first or t
        last = t
        got += 1
        nbytes += len(data)
        delays.append((t - struct.unpack("!Q", data[:8])[0]) / 1e6)
    return {"received": got, "bytes": nbytes, "first_ns": first, "last_ns": last,
            "one_way_ms_min": min(delays, default=None), "one_way_ms_max": max(delays, default=None)}


def udp_blast(host: str, port: int, mbit: float, seconds: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    gap_ns = DATAGRAM_BYTES * 8 * 1000 / mbit  # payload rate
    pad = bytes(DATAGRAM_BYTES - 8)
    start = now_ns()
    sent = 0
    end = start + int(seconds * 1e9)
    while True:
        t = now_ns()
        if t >= end:
            break
        due = start + int(sent * gap_ns)
        if t < due:
            if due - t > 200_000:
                time.sleep((due - t) / 1e9 / 2)
            continue
        s.sendto(struct.pack("!Q", t) + pad, (host, port))
        sent += 1
    return {"sent": sent, "bytes": sent * DATAGRAM_BYTES, "seconds": (now_ns() - start) / 1e9}


def tcp_sink(port: int) -> dict:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    conn, _ = srv.accept()
    total = 0
    marks = []  # (ns, bytes so far), every 100 ms
    next_mark = now_ns()
    buf = bytearray(1 << 20)
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        total += n
        t = now_ns()
        if t >= next_mark:
            marks.append((t, total))
            next_mark = t + 100_000_000
    marks.append((now_ns(), total))
    return {"bytes": total, "marks": marks}


def tcp_source(host: str, port: int, seconds: float, cc: str) -> dict:
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    s.settimeout(10)
    s.connect((host, port))
    s.settimeout(None)
    block = bytes(64 << 10)
    start = time.monotonic()
    samples = []  # (seconds since start, peer's window, smoothed RTT ms), every 100 ms
    next_sample = start
    sent = 0
    while (now := time.monotonic()) < start + seconds:
        sent += s.send(block)
        if now >= next_sample:
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
            samples.append((now - start, struct.unpack_from("I", info, TCPI_SND_WND_OFFSET)[0],
                            struct.unpack_from("I", info, TCPI_RTT_OFFSET)[0] / 1000))
            next_sample = now + 0.1
    s.close()
    return {"sent": sent, "samples": samples}


def tcp_sinks(port: int, flows: int) -> dict:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(flows)
    totals = [0] * flows

    def read(i: int, conn: socket.socket) -> None:
        buf = bytearray(1 << 20)
        while (n := conn.recv_into(buf)) > 0:
            totals[i] += n

    threads = []
    for i in range(flows):
        conn, _ = srv.accept()
        threads.append(threading.Thread(target=read, args=(i, conn)))
        threads[-1].start()
    for t in threads:
        t.join()
    return {"bytes": sum(totals)}


def tcp_flows(host: str, port: int, flows: int, total: int, cc: str) -> dict:
    socks = []
    for _ in range(flows):
        s = socket.socket()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        s.settimeout(10)
        s.connect((host, port))
        s.settimeout(None)
        socks.append(s)
    block = bytes(64 << 10)

    def write(s: socket.socket, n: int) -> None:
        while n > 0:
            n -= s.send(block[: min(len(block), n)])
        s.close()

    start = time.monotonic()
    threads = [threading.Thread(target=write, args=(s, total // flows)) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"sent": total // flows * flows, "seconds": time.monotonic() - start}


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "udp-echo":
        udp_echo(int(args[0]))
        return
    result = {
        "udp-ping": lambda: udp_ping(args[0], int(args[1]), int(args[2]), float(args[3])),
        "udp-sink": lambda: udp_sink(int(args[0]), float(args[1])),
        "udp-blast": lambda: udp_blast(args[0], int(args[1]), float(args[2]), float(args[3])),
        "tcp-sink": lambda: tcp_sink(int(args[0])),
        "tcp-source": lambda: tcp_source(args[0], int(args[1]), float(args[2]), args[3]),
        "tcp-sinks": lambda: tcp_sinks(int(args[0]), int(args[1])),
        "tcp-flows": lambda: tcp_flows(args[0], int(args[1]), int(args[2]), int(args[3]), args[4]),
    }[cmd]()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
