#!/usr/bin/env python3
"""Hostile peers against real deltacast processes on 127.0.0.1.

Each case starts real `deltacast publish`/`relay`/`worker` processes, plays a hostile peer with
python3-zmq (a fake parent, a lying child, a forged trainer shard) or with raw TCP sockets (half
frames, silent connections, metrics clients that hang up), and checks that the node keeps the
bound docs/RUNTIME.md ("Security", "Runs", "Bounds on peers") promises. Every case asserts
something that fails if its protection is missing.

  fake-parent-heartbeat  a parent that says it has version 2^62
  fake-parent-huge-image a parent that sends a well-formed manifest of a 1 TiB image
  forged-parent-signed   parents that serve forged versions to a worker that trusts one key
  shard-injection        clients that pose as trainer shards with unsigned or foreign slices
  ready-for-other-id     a worker that reports for another id and for versions never published
  need-flood             a child that asks for every chunk again, 20 times a second
  anchor-beyond-newest   children that ask for an anchor newer than version 2^63
  partial-frames         connections that send most of a huge frame and stall
  idle-connections       300 connections that never speak
  big-ready-ids          300 messages carrying 0.9 MB node ids
  refused-keeps-sending  a refused child that sends a bad message every 50 ms
  metrics-early-close    metrics clients that hang up at once, and one that never asks
  plaintext-to-curve     plaintext and unknown-key clients of a CURVE relay
  shard-replay           a trainer shard's signed slice recorded in one run, replayed to the next
  origin-clock-behind    an origin restarted on a clock a minute behind its previous run's start
  replayed-run           a relay that keeps serving a signed run after the trainer restarted
  ledger-fill            a child filling the ledger with made-up workers, and a Leave for another's id
  many-partial-frames    120 connections that send most of an 8 MiB frame, stall and are closed
  relayed-need-flood     six children of a relay asking for missing versions, each within its limit
  wrong-trust-key        a worker whose trust key is not the publisher's
  huge-forged-manifest   a million-chunk manifest signed in name by another key
  metrics-scrapers       16 clients scraping an origin whose ledger holds 30,000 workers

Usage: python3 hostile_peers.py path/to/deltacast [case...]
Prints "PASS name" or "FAIL name: why" per case, then "N passed, M failed"; exits 1 on a failure.
Needs python3-zmq, python3-protobuf, protoc and libxxhash (all in scripts/setup.sh --test).
"""

import ctypes
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

try:
    import zmq
except ImportError:
    # python3-zmq and python3-protobuf are Debian's: another python3 first on PATH (pyenv, a venv)
    # does not see them, the system's does.
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.access("/usr/bin/python3", os.X_OK):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    print("hostile_peers.py needs python3-zmq (scripts/setup.sh --test installs it)", file=sys.stderr)
    sys.exit(1)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_DIR = os.path.join(ROOT, "transport", "proto")

# What the nodes are built with (runtime/include/deltacast/runtime/node.h, transport host.h).
VERSION_JUMP_MAX = 1 << 20
RESENDS_PER_CHUNK_MAX = 4
CHILD_TIMEOUT_S = 10.0  # NodeConfig::child_timeout_ms: a silent child is dropped and its connection closed
HELLO_TIMEOUT_S = 10.0
METRICS_TIMEOUT_S = 5.0

CASE_TIMEOUT_S = int(os.environ.get("HOSTILE_CASE_TIMEOUT", "90"))  # per case; ctest gives the whole run 600 s
pb = None  # the generated deltacast_pb2 module
ctx = None  # the zmq context
DC = None  # the deltacast binary
TMP = None  # this run's temp dir
PORT_BASE = 0
SHARED = {}  # checkpoints, anchors and their checksums, made once

# ---- processes ------------------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    # A child outlives nothing of this script: killed with it, even by SIGKILL (ctest's timeout).
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Proc:
    live = []

    def __init__(self, name, args, logdir, env=None):
        self.name = name
        self.log_path = os.path.join(logdir, name + ".log")
        self.args = [str(a) for a in args]
        with open(self.log_path, "wb") as f:
            # A group of its own, killed whole: a wrapper (faketime) forks the node as its child.
            self.p = subprocess.Popen(self.args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=_die_with_parent, env=env, process_group=0)
        self.pid = self.p.pid
        Proc.live.append(self)

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_log(self, pattern, timeout, count=1):
        """Waits until `pattern` (a regex) occurs `count` times in the log; returns the last match or None."""
        rx = re.compile(pattern)
        deadline = time.time() + timeout
        while True:
            found = list(rx.finditer(self.log()))
            if len(found) >= count:
                return found[count - 1]
            if time.time() > deadline:
                return None
            time.sleep(0.1)

    def alive(self):
        return self.p.poll() is None

    def stat(self):
        """(cpu seconds, rss bytes) of the process, or (None, None) once it is gone."""
        try:
            with open("/proc/%d/stat" % self.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks = os.sysconf("SC_CLK_TCK")
            cpu = (int(fields[11]) + int(fields[12])) / ticks
            rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            return cpu, rss
        except (OSError, IndexError, ValueError):
            return None, None

    def cpu(self):
        return self.stat()[0]

    def rss(self):
        return self.stat()[1]

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the group outlives its leader when a wrapper forked
        except ProcessLookupError:
            pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self in Proc.live:
            Proc.live.remove(self)


def kill_all():
    for p in list(Proc.live):
        p.kill()


# ---- failures and timeouts ------------------------------------------------------------------------


class CaseFailed(Exception):
    pass


class CaseTimeout(Exception):
    pass


class Case:
    def __init__(self, name, index):
        self.name = name
        self.index = index
        self.dir = os.path.join(TMP, name)
        os.makedirs(self.dir)
        self.problems = []
        self.notes = []
        self.procs = []
        self.socks = []
        self.raw = []

    def port(self, k):
        return PORT_BASE + self.index * 10 + k

    def ep(self, k):
        return "tcp://127.0.0.1:%d" % self.port(k)

    def start(self, name, *args):
        p = Proc(name, [DC] + list(args), self.dir)
        self.procs.append(p)
        return p

    def expect(self, cond, why):
        if not cond:
            self.problems.append(why)
        return cond

    def require(self, cond, why):
        if not cond:
            self.problems.append(why)
            raise CaseFailed(why)

    def note(self, text):
        self.notes.append(text)

    def sock(self, kind, **opts):
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        for k, v in opts.items():
            s.setsockopt(getattr(zmq, k), v)
        self.socks.append(s)
        return s

    def tcp(self, port, timeout=5.0):
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.raw.append(s)
        return s

    def cleanup(self):
        for s in self.socks:
            try:
                s.close(linger=0)
            except zmq.ZMQError:
                pass
        for s in self.raw:
            try:
                s.close()
            except OSError:
                pass
        for p in self.procs:
            p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _on_alarm(signum, frame):
    raise CaseTimeout("case took more than %d s" % CASE_TIMEOUT_S)


def _on_term(signum, frame):
    raise SystemExit("stopped by signal %d" % signum)


# ---- wire messages ------------------------------------------------------------------------------


def envelope():
    e = pb.Envelope()
    e.protocol_version = int(os.environ.get("HOSTILE_PROTOCOL", "9"))  # runtime::kProtocolVersion (another to probe an older build)
    return e


def run_of(run):
    return run if run else (0, 0)


def m_hello(node_id, role=1, have=0, resume=False, run=None, serves=False):
    e = envelope()
    h = e.hello
    h.node_id = node_id.encode()
    h.role = role
    h.have_version = have
    h.resume = resume
    h.run.started_us, h.run.nonce = run_of(run)
    h.serves_children = serves
    return e.SerializeToString()


def m_welcome(newest, run=None):
    e = envelope()
    e.welcome.newest_version = newest
    e.welcome.run.started_us, e.welcome.run.nonce = run_of(run)
    return e.SerializeToString()


def m_heartbeat(newest, run=None):
    e = envelope()
    e.heartbeat.newest_version = newest
    e.heartbeat.run.started_us, e.heartbeat.run.nonce = run_of(run)
    return e.SerializeToString()


def m_manifest(version, anchor, shard=0, shards=0, published_us=0):
    e = envelope()
    e.manifest.key.version = version
    e.manifest.key.anchor = anchor
    e.manifest.published_us = published_us
    e.manifest.shard = shard
    e.manifest.shards = shards
    return e.SerializeToString()


def m_chunk(version, anchor, index, shard=0):
    e = envelope()
    e.chunk.key.version = version
    e.chunk.key.anchor = anchor
    e.chunk.index = index
    e.chunk.shard = shard
    return e.SerializeToString()


def m_need(version, anchor, chunks=(), want_anchor=False, again=False):
    e = envelope()
    e.need.key.version = version
    e.need.key.anchor = anchor
    e.need.chunks.extend(chunks)
    e.need.want_anchor = want_anchor
    e.need.again = again
    return e.SerializeToString()


def m_ready(node_id, version, checksum=0, run=None, error=""):
    e = envelope()
    r = e.ready
    r.node_id = node_id.encode()
    r.version = version
    r.checksum = checksum
    r.error = error.encode()
    r.run.started_us, r.run.nonce = run_of(run)
    return e.SerializeToString()


def m_leave(node_id, reason="done"):
    e = envelope()
    e.leave.node_id = node_id.encode()
    e.leave.reason = reason.encode()
    return e.SerializeToString()


def parse_env(frame):
    e = pb.Envelope()
    e.ParseFromString(bytes(frame))
    return e


def drain(sock, seconds, on_message=None, until_any=False):
    """Receives from `sock` for `seconds` (with until_any, only until something came); returns
    the messages, each a list of zmq frames."""
    out = []
    deadline = time.time() + seconds
    while True:
        left = deadline - time.time()
        if left <= 0 or (until_any and out):
            return out
        if not sock.poll(int(left * 1000) + 1):
            continue
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            out.append(frames)
            if on_message:
                on_message(frames)


# ---- formats (docs/FORMAT.md) ---------------------------------------------------------------------

_xxh = None


def xxh3(data):
    global _xxh
    if _xxh is None:
        for name in ("libxxhash.so.0", "libxxhash.so"):
            try:
                _xxh = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if _xxh is None:
            raise RuntimeError("libxxhash not found (scripts/setup.sh installs libxxhash-dev)")
        _xxh.XXH3_64bits.restype = ctypes.c_uint64
        _xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    data = bytes(data)
    return _xxh.XXH3_64bits(data, len(data))


def combine(size, hashes):
    return xxh3(struct.pack("<Q", size) + b"".join(struct.pack("<Q", h) for h in hashes))


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def string(s):
    s = s.encode() if isinstance(s, str) else s
    return varint(len(s)) + s


class Reader:
    def __init__(self, b):
        self.b = bytes(b)
        self.i = 0

    def fixed(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.i)[0]
        self.i += struct.calcsize(fmt)
        return v

    def raw(self, n):
        v = self.b[self.i:self.i + n]
        self.i += n
        return v

    def varint(self):
        n = shift = 0
        while True:
            c = self.b[self.i]
            self.i += 1
            n |= (c & 0x7F) << shift
            shift += 7
            if not c & 0x80:
                return n

    def string(self):
        return self.raw(self.varint())


def parse_manifest(b):
    r = Reader(b)
    m = {}
    if r.fixed("<I") != 0x4D464344:
        raise ValueError("not a manifest")
    m["format"] = r.fixed("<B")
    m["kind"] = r.fixed("<B")
    m["version"] = r.fixed("<Q")
    m["base_version"] = r.fixed("<Q")
    m["image_size"] = r.fixed("<Q")
    m["run"] = (0, 0)
    flags = 0
    if m["format"] in (2, 3, 4):
        m["run"] = (r.fixed("<Q"), r.fixed("<Q"))
        flags = r.fixed("<B")
    m["signed"] = bool(flags & 1)
    m["metadata"] = [(r.string(), r.string()) for _ in range(r.varint())]
    tensors = []
    for _ in range(r.varint()):
        name = r.string()
        dtype = r.fixed("<B")
        dims = [r.varint() for _ in range(r.varint())]
        tensors.append({"name": name, "dtype": dtype, "dims": dims, "offset": r.varint(), "nbytes": r.varint()})
    m["tensors"] = tensors
    chunks = []
    for _ in range(r.varint()):
        c = {"length": r.varint(), "payload_bytes": r.varint(), "payload_hash": r.fixed("<Q"), "content_hash": r.fixed("<Q")}
        c["base_hash"] = r.fixed("<Q") if m["kind"] == 0 else 0
        c["digest"] = r.raw(32) if m["signed"] else b""
        chunks.append(c)
    m["chunks"] = chunks
    m["base_checksum"] = r.fixed("<Q")
    m["version_checksum"] = r.fixed("<Q")
    if m["signed"]:
        m["signer"] = r.raw(32)
        m["signature"] = r.raw(64)
    if r.i != len(r.b):
        raise ValueError("trailing bytes after the manifest")
    return m


def write_manifest(m):
    """Serializes a manifest dict (as parse_manifest returns): in its format when that is 3 or 4
    (state hashes; 4 for anchors that may hold anchor v2 chunks), else format 2 if it has a run or
    is signed, else 1."""
    fmt = m["format"] if m.get("format") in (3, 4) else 2 if m["run"] != (0, 0) or m["signed"] else 1
    out = struct.pack("<IBBQQQ", 0x4D464344, fmt, m["kind"], m["version"], m["base_version"], m["image_size"])
    if fmt >= 2:
        out += struct.pack("<QQB", m["run"][0], m["run"][1], 1 if m["signed"] else 0)
    out += varint(len(m["metadata"])) + b"".join(string(k) + string(v) for k, v in m["metadata"])
    out += varint(len(m["tensors"]))
    for t in m["tensors"]:
        out += string(t["name"]) + bytes([t["dtype"]]) + varint(len(t["dims"])) + b"".join(varint(d) for d in t["dims"])
        out += varint(t["offset"]) + varint(t["nbytes"])
    out += varint(len(m["chunks"]))
    for c in m["chunks"]:
        out += varint(c["length"]) + varint(c["payload_bytes"]) + struct.pack("<QQ", c["payload_hash"], c["content_hash"])
        if m["kind"] == 0:
            out += struct.pack("<Q", c["base_hash"])
        if m["signed"]:
            out += c["digest"]
    out += struct.pack("<QQ", m["base_checksum"], m["version_checksum"])
    if m["signed"]:
        out += m["signer"] + m["signature"]
    return out


def read_container(path):
    """(manifest bytes, parsed manifest, [payloads]) of a .dcd file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"DELTACST":
        raise ValueError(path + ": not a container")
    mlen, mhash = struct.unpack_from("<QQ", data, 16)
    manifest = data[32:32 + mlen]
    if xxh3(manifest) != mhash:
        raise ValueError(path + ": manifest hash mismatch")
    m = parse_manifest(manifest)
    payloads, at = [], 32 + mlen
    for c in m["chunks"]:
        payloads.append(data[at:at + c["payload_bytes"]])
        at += c["payload_bytes"]
    if at != len(data):
        raise ValueError(path + ": trailing bytes")
    return manifest, m, payloads


def huge_anchor_manifest(version, image_size):
    """A well-formed, consistent format 1 anchor manifest of one U8 tensor over `image_size` bytes."""
    chunk = 1 << 31  # the largest chunk a manifest may list
    chunks = []
    for i in range(image_size // chunk):
        content = xxh3(b"content %d" % i)
        chunks.append({"length": chunk, "payload_bytes": 64, "payload_hash": xxh3(b"payload %d" % i), "content_hash": content,
                       "base_hash": 0, "digest": b""})
    m = {"kind": 1, "version": version, "base_version": 0, "image_size": image_size, "run": (0, 0), "signed": False,
         "metadata": [], "tensors": [{"name": "w", "dtype": 1, "dims": [image_size], "offset": 0, "nbytes": image_size}],
         "chunks": chunks, "base_checksum": 0, "version_checksum": combine(image_size, [c["content_hash"] for c in chunks])}
    return write_manifest(m)


# ---- shared inputs ------------------------------------------------------------------------------


def run_dc(*args, timeout=120):
    r = subprocess.run([DC] + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                       preexec_fn=_die_with_parent)
    if r.returncode != 0:
        raise CaseFailed("deltacast %s failed: %s" % (" ".join(str(a) for a in args), r.stdout.decode(errors="replace")[-500:]))
    return r.stdout.decode(errors="replace")


def shared():
    """Checkpoints (4, 16 MB), the anchor of each and its checksum: what every honest version must carry."""
    if SHARED:
        return SHARED
    d = os.path.join(TMP, "shared")
    os.makedirs(d)
    run_dc("gen", "-q", "-o", os.path.join(d, "ckpt"), "--size", "16MB", "--steps", "3")
    ckpts = sorted(os.path.join(d, "ckpt", f) for f in os.listdir(os.path.join(d, "ckpt")) if f.endswith(".safetensors"))
    expected, anchors = {}, {}
    for v, path in enumerate(ckpts, start=1):
        out = os.path.join(d, "a%d.dcd" % v)
        run_dc("encode", "-q", path, "-o", out, "--version", v)
        m = re.search(r"version checksum ([0-9a-f]+)", run_dc("inspect", out))
        expected[v] = m.group(1)
        anchors[v] = out
    # A tampered copy of the first checkpoint: a few bytes near its end changed.
    tampered = os.path.join(d, "tampered.safetensors")
    with open(ckpts[0], "rb") as f:
        data = bytearray(f.read())
    for i in range(len(data) - 4096, len(data), 97):
        data[i] ^= 0x01
    with open(tampered, "wb") as f:
        f.write(data)
    SHARED.update(dir=d, ckpts=ckpts, expected=expected, anchors=anchors, tampered=tampered)
    return SHARED


def ready_lines(proc):
    """[(version, checksum)] of a worker's "version N ready, checksum C" lines."""
    return [(int(v), c) for v, c in re.findall(r"version (\d+) ready, checksum ([0-9a-f]+)", proc.log())]


def check_versions(t, worker, newest, expected):
    got = ready_lines(worker)
    t.expect(any(v == newest for v, _ in got), "%s never reported version %d ready (reported %s)" % (worker.name, newest, got))
    for v, c in got:
        t.expect(expected.get(v) == c, "%s exposed version %d with checksum %s, the publisher's is %s" %
                 (worker.name, v, c, expected.get(v, "none")))


def start_origin(t, name="origin", port=0, extra=(), files=None):
    s = shared()
    args = ["publish", "--listen", t.ep(port), "--linger-ms", "600000"] + list(extra)
    args += s["ckpts"] if files is None else files
    p = t.start(name, *args)
    t.require(wait_until(lambda: listening(t.port(port)), 20), name + " did not start: " + p.log()[-300:])
    return p


def published_origin(t):
    """An origin with metrics on t.port(1) that has published the 4 shared versions."""
    origin = start_origin(t, extra=["--metrics", "127.0.0.1:%d" % t.port(1)])
    t.require(origin.wait_log(r"published version 4", 30) is not None, "the origin did not publish")
    return origin


def origin_run(t, port=0):
    """The run an origin publishes in, from its Welcome to a relay that holds nothing (and is sent nothing)."""
    probe = t.sock(zmq.DEALER)
    probe.connect(t.ep(port))
    probe.send(m_hello("run-probe", role=0))
    for frames in drain(probe, 2.0):
        e = parse_env(frames[0].bytes)
        if e.WhichOneof("body") == "welcome":
            probe.send(m_leave("run-probe"))
            return (e.welcome.run.started_us, e.welcome.run.nonce)
    raise CaseFailed("the origin did not welcome a relay")


def metrics(port, timeout=5.0):
    """(body text, seconds it took) of GET /metrics."""
    t0 = time.time()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            data += b
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return body.decode(errors="replace"), time.time() - t0, head.split(b"\r\n")[0].decode(errors="replace")


def metric(body, name):
    m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), body, re.M)
    return float(m.group(1)) if m else None


def established(port):
    """Connections ESTABLISHED to 127.0.0.1:port (the listener's side), as `ss -tn` counts them."""
    if shutil.which("ss"):
        r = subprocess.run(["ss", "-Htn", "state", "established", "( sport = :%d )" % port], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
        if r.returncode == 0:
            return len([ln for ln in r.stdout.decode().splitlines() if ln.strip()])
    n = 0
    with open("/proc/net/tcp") as f:
        for ln in f.readlines()[1:]:
            parts = ln.split()
            if parts[3] == "01" and int(parts[1].split(":")[1], 16) == port:
                n += 1
    return n


def listening(port):
    """True once something listens on 127.0.0.1:port (or on every address)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for ln in f.readlines()[1:]:
                    parts = ln.split()
                    if parts[3] == "0A" and int(parts[1].split(":")[1], 16) == port:
                        return True
        except OSError:
            pass
    return False


def wait_until(cond, timeout, step=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


# ---- cases ----------------------------------------------------------------------------------------


def case_fake_parent_heartbeat(t):
    """A fake parent serves a worker version 1, then says it has version 2^62 (a Heartbeat, then the
    Welcome of every new link), then the most a parent may claim (version 1 + version_jump_max)."""
    s = shared()
    manifest, _, payloads = read_container(s["anchors"][1])
    fake = t.sock(zmq.ROUTER)
    fake.bind(t.ep(0))
    w = t.start("worker", "worker", "--id", "w1", "--parent", t.ep(0))
    phase = "serve"
    hellos = {"serve": 0, "claim": 0, "most": 0}
    needs = 0
    ident = None
    cpu0 = tcpu = None
    peak_rss = 0
    last_hb = 0.0
    t0 = time.time()
    claim_t = most_t = None
    while time.time() - t0 < 25:
        now = time.time()
        if phase == "serve" and re.search(r"version 1 ready", w.log()):
            phase, claim_t = "claim", now
            cpu0, tcpu = w.cpu(), now
            if ident is not None:
                fake.send_multipart([ident, m_heartbeat(1 << 62)])
        elif phase == "claim" and now - claim_t > 3.0:
            phase, most_t = "most", now
        elif phase == "most" and now - most_t > 2.5:
            break
        if ident is not None and now - last_hb > 0.25:
            last_hb = now
            fake.send_multipart([ident, m_heartbeat({"serve": 1, "claim": 1 << 62, "most": 1 + VERSION_JUMP_MAX}[phase])])
        if phase != "serve":
            peak_rss = max(peak_rss, w.rss() or 0)
        if not fake.poll(50):
            continue
        frames = fake.recv_multipart()
        body = parse_env(frames[1]).WhichOneof("body") if len(frames) >= 2 else None
        if body == "need" and phase == "most":
            needs += 1
        if body != "hello":
            continue
        ident = frames[0]
        hellos[phase] += 1
        if phase == "serve":
            fake.send_multipart([ident, m_welcome(1)])
            fake.send_multipart([ident, m_manifest(1, True, published_us=int(time.time() * 1e6)), manifest])
            for i, p in enumerate(payloads):
                fake.send_multipart([ident, m_chunk(1, True, i), p])
        else:
            fake.send_multipart([ident, m_welcome(1 << 62 if phase == "claim" else 1 + VERSION_JUMP_MAX)])
    t.require(hellos["serve"] > 0, "the worker never said Hello to its parent")
    t.require(phase != "serve", "the worker did not take version 1 from the fake parent: " + w.log()[-300:])
    cpu1 = w.cpu()
    t.require(w.alive() and cpu1 is not None, "the worker died: " + w.log()[-400:])
    busy = (cpu1 - cpu0) / (time.time() - tcpu)
    t.note("after the claims: worker CPU %.0f%% of a core, peak RSS %.0f MB, Hellos %s, %d Needs in 2.5 s at 1 + version_jump_max" %
           (100 * busy, peak_rss / 1e6, hellos, needs))
    t.expect(busy < 0.25, "the worker used %.0f%% of a core after the claims" % (100 * busy))
    t.expect(peak_rss < 300e6, "the worker's RSS reached %.0f MB" % (peak_rss / 1e6))
    t.expect(re.search(r"parent \S+ dropped: it claims version %d" % (1 << 62), w.log()) is not None,
             "the worker did not log that it dropped the parent")
    t.expect(hellos["claim"] + hellos["most"] <= 15, "the worker reconnected %d times in 5.5 s (a busy reconnect loop)" %
             (hellos["claim"] + hellos["most"]))
    t.expect(needs <= 500, "the worker sent %d Needs in 2.5 s to a parent claiming 2^20 versions" % needs)
    ts = time.time()
    w.p.send_signal(signal.SIGTERM)
    try:
        w.p.wait(timeout=4)
        t.note("exited %.1f s after SIGTERM" % (time.time() - ts))
    except subprocess.TimeoutExpired:
        t.expect(False, "the worker did not exit within 4 s of SIGTERM")


def case_fake_parent_huge_image(t):
    """A fake parent sends a consistent manifest of a 1 TiB image; the real origin is the second parent."""
    s = shared()
    fake = t.sock(zmq.ROUTER)
    fake.bind(t.ep(0))
    start_origin(t, port=1)
    w = t.start("worker", "worker", "--id", "w1", "--parent", t.ep(0), "--parent", t.ep(1), "--exit-after-version", "4")
    huge = huge_anchor_manifest(1, 1 << 40)
    # The manifest checks out as a whole (this is what a parser sees before any limit).
    parsed = parse_manifest(huge)
    t.require(parsed["version_checksum"] == combine(parsed["image_size"], [c["content_hash"] for c in parsed["chunks"]]),
              "the test's own manifest is not consistent")
    served = 0
    t0, first = time.time(), None
    ident = None
    last_hb = 0.0
    # Serve it (Welcome, Manifest, heartbeats) for 3 s from the first Hello, to every link the
    # worker opens; then fall silent.
    while (time.time() - first < 3.0) if first else (time.time() - t0 < 30.0):
        if fake.poll(50):
            frames = fake.recv_multipart()
            if len(frames) >= 2 and parse_env(frames[1]).WhichOneof("body") == "hello":
                first = first or time.time()
                ident = frames[0]
                fake.send_multipart([ident, m_welcome(1)])
                fake.send_multipart([ident, m_manifest(1, True, published_us=int(time.time() * 1e6)), huge])
                for i in range(4):
                    fake.send_multipart([ident, m_chunk(1, True, i), b"\0" * 64])
                served += 1
        if ident is not None and time.time() - last_hb > 0.25:
            last_hb = time.time()
            fake.send_multipart([ident, m_heartbeat(1)])
    t.require(served > 0, "the worker never said Hello to the fake parent")
    fake.close(linger=0)
    t.expect(w.wait_log(r"version 4 ready", 30) is not None, "the worker did not get version 4 from the real origin")
    log = w.log()
    t.expect("bad_alloc" not in log and "terminate" not in log and "Aborted" not in log, "the worker crashed: " + log[-300:])
    t.expect(w.p.poll() in (None, 0), "the worker exited with %s" % w.p.poll())
    t.expect(re.search(r"image of %d bytes, above the limit" % (1 << 40), log) is not None or
             re.search(r"cannot allocate %d" % (1 << 40), log) is not None, "no refusal of the 1 TiB image logged")
    check_versions(t, w, 4, s["expected"])


def sequenced(frame, stream, seq, payload_bytes=0):
    """A message of a numbered parent link: `frame` (an Envelope) with its stream and number."""
    e = pb.Envelope()
    e.ParseFromString(frame)
    e.stream, e.seq, e.payload_bytes = stream, seq, payload_bytes
    return e.SerializeToString()


def m_part(stream, seq):
    e = envelope()
    e.stream, e.seq = stream, seq
    e.part.SetInParent()
    return e.SerializeToString()


def case_fake_parent_parts(t):
    """A fake parent numbers its messages and sends payloads in parts that lie: a chunk claiming a
    2^62-byte payload, parts without their message, parts far ahead of the stream, a part that
    overruns what its message announced; then it falls silent. The real origin is the second
    parent."""
    s = shared()
    fake = t.sock(zmq.ROUTER)
    fake.bind(t.ep(0))
    start_origin(t, port=1)
    w = t.start("worker", "worker", "--id", "w1", "--parent", t.ep(0), "--parent", t.ep(1), "--exit-after-version", "4")
    stream = 0x5eed
    served = 0
    # Three seconds of lies from the first Hello (a worker under a sanitizer on a loaded host can
    # take seconds to start).
    t0, first = time.time(), None
    while (time.time() - first < 3.0) if first else (time.time() - t0 < 30.0):
        if not fake.poll(50):
            continue
        frames = fake.recv_multipart()
        if len(frames) < 2 or parse_env(frames[1]).WhichOneof("body") != "hello":
            continue
        ident = frames[0]
        served += 1
        first = first or time.time()
        fake.send_multipart([ident, sequenced(m_welcome(1), stream, 1)])
        fake.send_multipart([ident, sequenced(m_chunk(1, True, 0), stream, 2, payload_bytes=1 << 62), b"\0" * 1024])
        for seq in range(3, 40):  # parts of a message that was refused
            fake.send_multipart([ident, m_part(stream, seq), b"\1" * 65536])
        for seq in range(1 << 20, (1 << 20) + 64):  # far ahead: held, bounded, then given up on
            fake.send_multipart([ident, m_part(stream, seq), b"\2" * 65536])
        fake.send_multipart([ident, sequenced(m_chunk(1, True, 1), stream, 40, payload_bytes=2048), b"\0" * 1024])
        fake.send_multipart([ident, m_part(stream, 41), b"\3" * 4096])  # more than the 1024 announced
        fake.send_multipart([ident, m_part(0, 0), b"\4" * 16])  # a part outside the stream
    t.require(served > 0, "the worker never said Hello to the fake parent")
    fake.close(linger=0)
    t.expect(w.wait_log(r"version 4 ready", 40) is not None, "the worker did not get version 4 from the real origin")
    log = w.log()
    t.expect("bad_alloc" not in log and "terminate" not in log and "Aborted" not in log, "the worker crashed: " + log[-300:])
    t.expect(w.p.poll() in (None, 0), "the worker exited with %s" % w.p.poll())
    t.expect(re.search(r"payload parts did not all come|a payload (part|in parts)", log) is not None,
             "no dropped parts logged: " + log[-400:])
    check_versions(t, w, 4, s["expected"])


def case_forged_parent_signed(t):
    """Workers trusting the origin's key; first parents serve forgeries: unsigned v99, a bad signature
    that names the trusted key, and a rogue origin signing with its own key."""
    s = shared()
    key = os.path.join(t.dir, "sign.key")
    pub = run_dc("keygen", "--sign", "-o", key).strip().split()[-1]
    rogue_key = os.path.join(t.dir, "rogue.key")
    run_dc("keygen", "--sign", "-o", rogue_key)
    t.require(re.fullmatch(r"[0-9a-f]{64}", pub) is not None, "keygen --sign printed no public key: " + pub)
    start_origin(t, port=1, extra=["--sign-key", key])
    start_origin(t, name="rogue", port=2, extra=["--sign-key", rogue_key], files=[s["tampered"]])
    forged_path = os.path.join(t.dir, "forged.dcd")
    run_dc("encode", "-q", s["tampered"], "-o", forged_path, "--version", "99")
    forged, fm, payloads = read_container(forged_path)
    t.require(fm["version"] == 99 and fm["kind"] == 1, "the forged anchor is not version 99")
    # The same forgery, signed in name: format 2, digests, the trusted key as signer, a made-up signature.
    bad = dict(fm, run=origin_run(t, port=1), signed=True, signer=bytes.fromhex(pub), signature=os.urandom(64))
    bad["chunks"] = [dict(c, digest=hashlib.blake2b(p, digest_size=32).digest()) for c, p in zip(fm["chunks"], payloads)]
    badsig = write_manifest(bad)
    fake = t.sock(zmq.ROUTER)
    fake.bind(t.ep(0))
    workers = {
        "unsigned": t.start("w-unsigned", "worker", "--id", "w-unsigned", "--trust-key", pub, "--parent", t.ep(0), "--parent", t.ep(1)),
        "badsig": t.start("w-badsig", "worker", "--id", "w-badsig", "--trust-key", pub, "--parent", t.ep(0), "--parent", t.ep(1)),
        "rogue": t.start("w-rogue", "worker", "--id", "w-rogue", "--trust-key", key, "--parent", t.ep(2), "--parent", t.ep(1)),
    }
    served = set()
    t0 = time.time()
    while time.time() - t0 < 4.0:
        if not fake.poll(100):
            continue
        frames = fake.recv_multipart()
        if len(frames) < 2 or parse_env(frames[1]).WhichOneof("body") != "hello":
            continue
        who = parse_env(frames[1]).hello.node_id.decode()
        manifest = forged if who == "w-unsigned" else badsig
        fake.send_multipart([frames[0], m_welcome(99, bad["run"] if who == "w-badsig" else None)])
        fake.send_multipart([frames[0], m_manifest(99, True, published_us=int(time.time() * 1e6)), manifest])
        for i, p in enumerate(payloads):
            fake.send_multipart([frames[0], m_chunk(99, True, i), p])
        served.add(who)
    t.expect(served == {"w-unsigned", "w-badsig"}, "the fake parent served only %s" % sorted(served))
    refusals = {"unsigned": r"is not signed, and this node trusts only signed versions",
                "badsig": r"the signature does not verify",
                "rogue": r"is signed by key"}
    deadline = time.time() + 30
    for kind, w in workers.items():
        t.expect(w.wait_log(r"version 4 ready", max(1, deadline - time.time())) is not None,
                 "%s did not get version 4 from the real origin" % w.name)
        log = w.log()
        t.expect(re.search(r"version 99 ready", log) is None, "%s exposed the forged version 99" % w.name)
        t.expect(re.search(refusals[kind], log) is not None, "%s did not log the refusal (%s)" % (w.name, refusals[kind]))
        check_versions(t, w, 4, s["expected"])


def case_shard_injection(t):
    """An origin merging one shard signed by K; clients pose as that shard with unsigned slices, a bad
    signature naming K, and a real shard publisher signing with another key."""
    s = shared()
    key = os.path.join(t.dir, "shard.key")
    pub = run_dc("keygen", "--sign", "-o", key).strip().split()[-1]
    other = os.path.join(t.dir, "other.key")
    run_dc("keygen", "--sign", "-o", other)
    origin = t.start("origin", "publish", "--listen", t.ep(0), "--expect-shards", "1", "--shard-key", pub)
    t.require(wait_until(lambda: listening(t.port(0)), 20), "the origin did not start")
    w = t.start("worker", "worker", "--id", "w1", "--parent", t.ep(0), "--exit-after-version", "4")
    # The anchor of a tampered checkpoint as slice 0 of 1 of version 1.
    tampered_path = os.path.join(t.dir, "t1.dcd")
    run_dc("encode", "-q", s["tampered"], "-o", tampered_path, "--version", "1")
    forged, fm, payloads = read_container(tampered_path)
    bad = dict(fm, run=(int(time.time() * 1e6), 1), signed=True, signer=bytes.fromhex(pub), signature=os.urandom(64))
    bad["chunks"] = [dict(c, digest=hashlib.blake2b(p, digest_size=32).digest()) for c, p in zip(fm["chunks"], payloads)]
    for n, manifest in enumerate([forged, write_manifest(bad)]):
        c = t.sock(zmq.DEALER)
        c.connect(t.ep(0))
        c.send(m_hello("trainer-0", role=2))
        c.send_multipart([m_manifest(1, True, shard=0, shards=1), manifest])
        for i, p in enumerate(payloads):
            c.send_multipart([m_chunk(1, True, i, shard=0), p])
        drain(c, 1.0)
    rogue = t.start("rogue-shard", "publish", "--shard", "0/1", "--parent", t.ep(0), "--sign-key", other, "--linger-ms", "20000",
                    s["tampered"])
    # Until the origin refused the rogue's slice (it encodes its checkpoint first: seconds on a
    # loaded host under the sanitizers), or a minute.
    origin.wait_log(r"slice 0 of v1\S* is not signed by shard 0.s key: .*manifest of v1 is signed by key", 60)
    rogue.kill()
    t.expect(re.search(r"merged version", origin.log()) is None, "the origin merged a forged slice: " +
             "; ".join(re.findall(r"merged version[^\n]*", origin.log())))
    t.expect(re.search(r"slice 0 of v1\S* is not signed by shard 0.s key: .*manifest of v1 is not signed", origin.log()) is not None, "no refusal of the unsigned slice logged")
    t.expect(re.search(r"slice 0 of v1\S* is not signed by shard 0.s key: .*manifest of v1: the signature does not verify", origin.log()) is not None,
             "no refusal of the badly signed slice logged")
    t.expect(re.search(r"slice 0 of v1\S* is not signed by shard 0.s key: .*manifest of v1 is signed by key", origin.log()) is not None,
             "no refusal of the slice signed by another key logged")
    t.expect(not ready_lines(w), "the worker exposed a forged version: %s" % ready_lines(w))
    t.start("shard", "publish", "--shard", "0/1", "--parent", t.ep(0), "--sign-key", key, "--linger-ms", "20000", *s["ckpts"])
    t.expect(origin.wait_log(r"merged version 4 from 1 shards", 40) is not None, "the real shard's versions were not merged")
    t.expect(w.wait_log(r"version 4 ready", 20) is not None, "the worker did not get the real merged version 4")
    check_versions(t, w, 4, s["expected"])


def case_shard_replay(t):
    """A client records a trainer shard's slice, properly signed by shard 0's key, in one run of the
    origin (played here by a fake origin), and replays it to the origin's next run."""
    s = shared()
    key = os.path.join(t.dir, "shard.key")
    pub = run_dc("keygen", "--sign", "-o", key).strip().split()[-1]
    recorder = t.sock(zmq.ROUTER)
    recorder.bind(t.ep(2))
    old_run = (int(time.time() * 1e6) - 60_000_000, 0x0123456789ABCDEF)
    t.start("shard-then", "publish", "--shard", "0/1", "--parent", t.ep(2), "--sign-key", key, "--linger-ms", "20000", s["ckpts"][0])
    recorded, t0, last = [], time.time(), None
    while time.time() - t0 < 60 and not (last and time.time() - last > 1.5):  # the whole slice, then quiet
        if not recorder.poll(100):
            continue
        frames = recorder.recv_multipart()
        body = parse_env(frames[1]).WhichOneof("body")
        if body == "hello":
            recorder.send_multipart([frames[0], m_welcome(0, old_run)])
        elif body in ("manifest", "chunk"):
            recorded.append(frames[1:])
            last = time.time()
        recorder.send_multipart([frames[0], m_heartbeat(0, old_run)])
    t.require(recorded and parse_env(recorded[0][0]).WhichOneof("body") == "manifest", "the shard sent no slice to record")
    origin = t.start("origin", "publish", "--listen", t.ep(0), "--expect-shards", "1", "--shard-key", pub)
    t.require(wait_until(lambda: listening(t.port(0)), 20), "the origin did not start")
    w = t.start("worker", "worker", "--id", "w1", "--parent", t.ep(0))
    replayer = t.sock(zmq.DEALER)
    mon = replayer.get_monitor_socket(zmq.EVENT_DISCONNECTED)  # before it connects: the drop may come at once
    t.socks.append(mon)
    replayer.connect(t.ep(0))
    replayer.send(m_hello("trainer-0", role=2))
    for frames in recorded:
        replayer.send_multipart(frames)
    refused = origin.wait_log(r"slice 0 of v1\S* belongs to run [0-9a-f-]+, this origin merges run", 10)
    t.expect(refused is not None, "the origin did not refuse the replayed slice of another run")
    t.expect(mon.poll(3000) != 0, "the origin kept the replaying client attached; its log: " + origin.log()[-800:])
    time.sleep(1.0)
    t.expect(re.search(r"merged v", origin.log()) is None, "the origin merged the replayed slice: " +
             "; ".join(re.findall(r"merged v[^\n]*", origin.log())))
    t.expect(not ready_lines(w), "the worker exposed a replayed version: %s" % ready_lines(w))


def case_origin_clock_behind(t):
    """The trainer restarts its origin on a host whose clock is a minute behind (faketime), after
    a run that started seconds ago: the new run must still be newer, and say so."""
    if not shutil.which("faketime"):
        raise CaseFailed("faketime is not installed (scripts/setup.sh --test installs it)")
    s = shared()
    key = os.path.join(t.dir, "sign.key")
    pub = run_dc("keygen", "--sign", "-o", key).strip().split()[-1]
    first = start_origin(t, extra=["--sign-key", key], files=s["ckpts"][:2])
    w1 = t.start("w1", "worker", "--id", "w1", "--trust-key", pub, "--parent", t.ep(0))
    t.require(w1.wait_log(r"version 2 ready", 30) is not None, "w1 did not get the first run's version 2")
    first.kill()
    behind = Proc("origin-behind", ["faketime", "-f", "-60s", DC, "publish", "--listen", t.ep(0), "--linger-ms", "600000",
                                    "--sign-key", key, "--metrics", "127.0.0.1:%d" % t.port(1)] + s["ckpts"], t.dir,
                  # An ASan build wants its runtime first; libfaketime's preload comes before it.
                  env=dict(os.environ, FAKETIME_DONT_FAKE_MONOTONIC="1",
                           ASAN_OPTIONS=":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))))
    t.procs.append(behind)
    t.require(wait_until(lambda: listening(t.port(0)), 20), "the origin on a slow clock did not start: " + behind.log()[-300:])
    m = behind.wait_log(r"this host's clock is (\d+) s behind the start of the previous run", 10)
    t.expect(m is not None and 40 <= int(m.group(1)) <= 70, "the origin did not log how far its clock is behind: " + behind.log()[-400:])
    body, _, _ = metrics(t.port(1))
    lag = metric(body, "deltacast_origin_clock_behind_seconds")
    t.expect(lag is not None and lag >= 40, "deltacast_origin_clock_behind_seconds is %s" % lag)
    # w1, on the first run's version 2, moves to the new run; a worker that joins gets it too.
    t.expect(w1.wait_log(r"version 4 ready", 30) is not None, "w1 stayed on the old run: " + w1.log()[-400:])
    w2 = t.start("w2", "worker", "--id", "w2", "--trust-key", pub, "--parent", t.ep(0))
    t.expect(w2.wait_log(r"version 4 ready", 30) is not None, "a worker joining after the restart did not get the new run")
    check_versions(t, w2, 4, s["expected"])


def case_replayed_run(t):
    """A relay that recorded a signed run keeps serving it after the trainer restarted (its origin is
    gone): a fresh worker that trusts the key must not expose the old run once its statements are
    older than freshness_ms_max, and must fail over to the current run's origin."""
    s = shared()
    key = os.path.join(t.dir, "sign.key")
    pub = run_dc("keygen", "--sign", "-o", key).strip().split()[-1]
    old = start_origin(t, port=1, extra=["--sign-key", key])
    t.start("replayer", "relay", "--id", "replayer", "--listen", t.ep(2), "--parent", t.ep(1))
    w0 = t.start("w0", "worker", "--id", "w0", "--trust-key", pub, "--parent", t.ep(2))
    t.require(w0.wait_log(r"version 4 ready", 30) is not None, "the relay did not serve the old run")
    w0.kill()
    old.kill()
    time.sleep(4.0)  # the old run's last statement is older than the worker's bound
    start_origin(t, port=3, extra=["--sign-key", key], files=s["ckpts"][:2])
    config = os.path.join(t.dir, "w.json")
    with open(config, "w") as f:
        json.dump({"id": "w", "parents": [t.ep(2), t.ep(3)], "trust_keys": [pub], "limits": {"freshness_ms_max": 3000}}, f)
    w = t.start("w", "worker", "--config", config)
    t.expect(w.wait_log(r"version 2 ready", 40) is not None, "the worker did not fail over to the current run: " + w.log()[-500:])
    time.sleep(1.0)
    got = ready_lines(w)
    t.expect(all(v <= 2 for v, _ in got), "the worker exposed the replayed run: %s" % got)
    check_versions(t, w, 2, s["expected"])
    t.expect(re.search(r"gave no timestamp statement within freshness_ms_max", w.log()) is not None,
             "the worker did not say why it left the replaying relay")


def watched_worker(t, name, run):
    """A worker socket that said Hello to the origin, and a monitor that sees it disconnected."""
    w = t.sock(zmq.DEALER)
    mon = w.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    t.socks.append(mon)
    w.connect(t.ep(0))
    w.send(m_hello(name, role=1, have=4, resume=True, run=run))
    return w, mon


def case_ready_for_other_id(t):
    """A worker "a" reports Ready for "b" at version 999; another reports itself at a version never published."""
    origin = published_origin(t)
    run = origin_run(t)
    a, mon = watched_worker(t, "a", run)
    got = drain(a, 1.0)
    t.require(any(parse_env(f[0].bytes).WhichOneof("body") == "welcome" for f in got), "the origin did not welcome a")
    a.send(m_ready("b", 999, checksum=0x1234, run=run))
    disconnected = mon.poll(3000) != 0
    t.expect(disconnected, "a was not disconnected after reporting for b")
    drain(a, 0.5)
    later = drain(a, 1.5)
    t.expect(not any(parse_env(f[0].bytes).WhichOneof("body") == "heartbeat" for f in later),
             "the origin still sends heartbeats to a")
    c = t.sock(zmq.DEALER)
    c.connect(t.ep(0))
    c.send(m_hello("c", role=1, have=4, resume=True, run=run))
    drain(c, 0.5)
    c.send(m_ready("c", 999, checksum=0x1234, run=run))
    drain(c, 1.0)
    body, _, _ = metrics(t.port(1))
    t.expect('worker="b"' not in body, "the fleet ledger lists worker b: " + "; ".join(
        ln for ln in body.splitlines() if 'worker="b"' in ln))
    t.expect(not re.search(r'deltacast_worker_version\{[^}]*worker="c"[^}]*\} 999', body),
             "the fleet ledger shows worker c at version 999, never published")
    t.expect(re.search(r"child a dropped: sent a Ready for node 'b'", origin.log()) is not None, "no log of dropping a")


def case_ledger_fill(t):
    """A child that says it relays reports for 15,000 made-up workers; another child sends Leave for
    an honest worker's id."""
    origin = published_origin(t)
    run = origin_run(t)
    honest = t.start("honest", "worker", "--id", "honest", "--parent", t.ep(0))
    t.require(honest.wait_log(r"version 4 ready", 30) is not None, "the honest worker got nothing")
    filler = t.sock(zmq.DEALER, SNDTIMEO=5000)
    filler.connect(t.ep(0))
    filler.send(m_hello("filler", role=0, serves=True))
    drain(filler, 0.5)
    sent = 0
    for i in range(15000):
        try:
            filler.send(m_ready("made-up-%05d" % i, 0, error="x"))
            sent += 1
        except zmq.Again:
            break
        if i % 500 == 0:
            drain(filler, 0.01)
    leaver = t.sock(zmq.DEALER)
    leaver.connect(t.ep(0))
    leaver.send(m_hello("leaver", role=0, serves=True))
    drain(leaver, 0.5)
    leaver.send(m_leave("honest", "not mine to say"))
    drain(leaver, 1.0)
    body, took, status = metrics(t.port(1))
    listed = len(re.findall(r'^deltacast_worker_version\{', body, re.M))
    refused = metric(body, "deltacast_reports_refused_total")
    t.note("%d reports sent; %d workers in the ledger, %s reports refused; /metrics %s, %d bytes in %.2f s" %
           (sent, listed, refused, status, len(body), took))
    t.expect(status.endswith("200 OK"), "/metrics answered " + status)
    t.expect(listed <= 10001 + 1, "one child filled the ledger beyond its share: %d workers listed" % listed)
    t.expect(refused is not None and refused >= 1, "no report was refused (deltacast_reports_refused_total %s)" % refused)
    t.expect(re.search(r'deltacast_worker_left\{[^}]*worker="honest"', body) is None, "another child's Leave marked the honest worker as left")
    t.expect(re.search(r'deltacast_worker_version\{[^}]*worker="honest"[^}]*\} 4', body) is not None, "the honest worker is not in the ledger at v4")


def case_need_flood(t):
    """Hello, then a Need for every chunk of every version, again=true, every 50 ms for 10 s."""
    origin = published_origin(t)
    body, _, _ = metrics(t.port(1))
    cache_bytes = metric(body, "deltacast_cache_bytes")
    out0 = metric(body, "deltacast_bytes_out_total") or 0
    c = t.sock(zmq.DEALER, RCVHWM=0)
    c.connect(t.ep(0))
    c.send(m_hello("flood", role=1))
    chunks = {}
    received = [0]

    def note(frames):
        received[0] += sum(len(f.bytes) for f in frames)
        e = parse_env(frames[0].bytes)
        if e.WhichOneof("body") == "manifest" and len(frames) > 1:
            k = e.manifest.key
            chunks[(k.version, k.anchor)] = len(parse_manifest(frames[1].bytes)["chunks"])

    drain(c, 1.5, note)
    t.require(len(chunks) >= 4, "the origin's catch-up did not send 4 versions (got %s)" % sorted(chunks))
    needs = 0
    t0 = time.time()
    while time.time() - t0 < 10.0:
        for (v, anchor), n in chunks.items():
            c.send(m_need(v, anchor, range(n), again=True))
            needs += 1
        drain(c, 0.05, note)
    drain(c, 1.0, note)
    body, _, _ = metrics(t.port(1))
    out = metric(body, "deltacast_bytes_out_total") - out0
    bound = cache_bytes * (1 + RESENDS_PER_CHUNK_MAX) + (1 << 20)
    t.note("%d Needs; origin bytes_out %.1f MB for versions of %.1f MB (bound %.1f MB); received %.1f MB" %
           (needs, out / 1e6, cache_bytes / 1e6, bound / 1e6, received[0] / 1e6))
    t.expect(out <= bound, "the origin sent %.1f MB to one child, more than (1 + resends_per_chunk_max) x %.1f MB" %
             (out / 1e6, cache_bytes / 1e6))
    t.expect(origin.alive(), "the origin died")


def case_relayed_need_flood(t):
    """Six children of a relay each ask for versions the relay does not have, 150 Needs a second
    (under the relay's own limit for each): the relay must not pass them on faster than its parent
    takes from it."""
    origin = published_origin(t)
    relay = t.start("relay", "relay", "--id", "relay", "--listen", t.ep(2), "--parent", t.ep(0), "--metrics", "127.0.0.1:%d" % t.port(3))
    honest = t.start("honest", "worker", "--id", "honest", "--parent", t.ep(2))
    t.require(honest.wait_log(r"version 4 ready", 30) is not None, "the honest worker got nothing through the relay")
    kids = []
    for k in range(6):
        c = t.sock(zmq.DEALER, SNDTIMEO=1000)
        c.connect(t.ep(2))
        c.send(m_hello("asker-%d" % k, role=1, have=4, resume=True))
        kids.append(c)
    for c in kids:
        drain(c, 0.2)
    needs, t0 = 0, time.time()
    while time.time() - t0 < 8.0:
        tick = time.time()
        for k, c in enumerate(kids):
            for j in range(15):  # 15 every 100 ms: 150 a second each
                try:
                    c.send(m_need(10 + (needs + j + k) % 200, False))
                except zmq.Again:
                    pass
            needs += 15
        for c in kids:
            drain(c, 0.0)
        time.sleep(max(0.0, 0.1 - (time.time() - tick)))
    body, _, _ = metrics(t.port(3))
    failovers = metric(body, "deltacast_parent_failovers_total")
    t.note("%d Needs from 6 children in 8 s; the relay's parent failovers: %s" % (needs, failovers))
    t.expect(re.search(r"child relay dropped: more than \d+ Need messages a second", origin.log()) is None,
             "the origin dropped the relay for the Needs it passed on")
    t.expect(failovers == 0, "the relay lost its parent %s times" % failovers)
    t.expect(relay.alive() and origin.alive(), "a node died")


def case_wrong_trust_key(t):
    """A worker configured with the wrong trust key: it must back off, say what to fix, and not
    take the anchor again and again."""
    s = shared()
    key = os.path.join(t.dir, "sign.key")
    run_dc("keygen", "--sign", "-o", key)
    wrong = run_dc("keygen", "--sign", "-o", os.path.join(t.dir, "wrong.key")).strip().split()[-1]
    origin = start_origin(t, extra=["--sign-key", key, "--metrics", "127.0.0.1:%d" % t.port(1)])
    t.require(origin.wait_log(r"published version 4", 30) is not None, "the origin did not publish")
    body, _, _ = metrics(t.port(1))
    out0, cache = metric(body, "deltacast_bytes_out_total") or 0, metric(body, "deltacast_cache_bytes") or 0
    w = t.start("w", "worker", "--id", "w", "--trust-key", wrong, "--parent", t.ep(0))
    time.sleep(20)
    body, _, _ = metrics(t.port(1))
    out = (metric(body, "deltacast_bytes_out_total") or 0) - out0
    waits = [int(x) for x in re.findall(r"dropped, next try in (\d+) ms", w.log())]
    t.note("origin sent %.1f MB in 20 s (its cache: %.1f MB); the worker's waits: %s" % (out / 1e6, cache / 1e6, waits))
    t.expect(out < 2 * cache + (4 << 20), "the origin sent %.1f MB to a worker that refuses its versions" % (out / 1e6))
    t.expect(len(waits) >= 3 and waits == sorted(waits) and waits[-1] > waits[0], "the worker did not back off: %s" % waits)
    t.expect(len(waits) <= 8, "the worker retried %d times in 20 s" % len(waits))
    t.expect(re.search(r"is this node's trust key the publisher's", w.log()) is not None, "the worker did not say what to fix")
    t.expect(not ready_lines(w), "the worker exposed a version it does not trust")


def case_anchor_beyond_newest(t):
    """Children ask for an anchor newer than version 2^63 (and than newest + 1), over and over for 5 s."""
    origin = published_origin(t)
    run = origin_run(t)
    time.sleep(0.5)
    body, _, _ = metrics(t.port(1))
    cache0 = metric(body, "deltacast_cache_bytes")
    cpu0, t0 = origin.cpu(), time.time()
    n = 0
    while time.time() - t0 < 5.0:
        c = t.sock(zmq.DEALER)
        c.connect(t.ep(0))
        c.send(m_hello("anc-%d" % n, role=1, have=4, resume=True, run=run))
        for _ in range(5):
            c.send(m_need(1 << 63, True, want_anchor=True))
            c.send(m_need(5, True, want_anchor=True))
            drain(c, 0.05)
        c.close(linger=0)
        t.socks.remove(c)
        n += 1
    cpu = origin.cpu() - cpu0
    body, _, _ = metrics(t.port(1))
    cache1 = metric(body, "deltacast_cache_bytes")
    t.note("%d children, origin CPU %.2f s in %.1f s, cache %.1f -> %.1f MB" % (n, cpu, time.time() - t0, cache0 / 1e6, cache1 / 1e6))
    t.expect(cache1 == cache0, "the origin made an anchor (its cache grew from %.1f to %.1f MB)" % (cache0 / 1e6, cache1 / 1e6))
    t.expect(cpu < 1.0, "the origin used %.2f s of CPU in 5 s" % cpu)
    t.expect(len(re.findall(r"published version", origin.log())) == 4, "the origin published more than its 4 versions")
    t.expect(origin.alive(), "the origin died")


ZMTP_GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31


def zmtp_ready():
    prop = bytes([11]) + b"Socket-Type" + struct.pack(">I", 6) + b"DEALER"
    body = b"\x05READY" + prop
    return bytes([0x04, len(body)]) + body


def zmtp_handshake(sock, seconds=3.0):
    """Greeting and READY (NULL mechanism, as a DEALER), then the peer's greeting and READY: a message
    sent before the peer's READY arrives would be taken for a command and refused."""
    sock.sendall(ZMTP_GREETING + zmtp_ready())
    sock.settimeout(seconds)
    data = b""
    while len(data) < 66 or len(data) < 66 + data[65]:
        b = sock.recv(4096)
        if not b:
            raise CaseFailed("the relay closed a connection during the ZMTP handshake")
        data += b
    return data


def zmtp_welcomed(sock, seconds):
    """Reads what a ZMTP 3.0 peer sent (greeting, commands, messages) until a Welcome comes; True if one did."""
    sock.settimeout(0.2)
    data = b""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            b = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return False
        if not b:
            return False
        data += b
        at = 0
        while at + 2 <= len(data):
            flags = data[at]
            if flags & 0x02:
                if at + 9 > len(data):
                    break
                size, head = struct.unpack_from(">Q", data, at + 1)[0], 9
            else:
                size, head = data[at + 1], 2
            if at + head + size > len(data):
                break
            body = data[at + head:at + head + size]
            at += head + size
            if not flags & 0x04:
                try:
                    if parse_env(body).WhichOneof("body") == "welcome":
                        return True
                except Exception:
                    pass
    return False


def closed_by_peer(sock):
    """True once the peer has closed the connection (reads and drops what it sent)."""
    sock.setblocking(False)
    try:
        while True:
            b = sock.recv(65536)
            if not b:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def case_partial_frames(t):
    """Raw ZMTP 3.0 connections: 3 declare a 1 TiB frame and stream into it; 3 declare a frame within
    what a child may send (child_message_bytes_max, 8 MiB), send most of it and stall."""
    relay = t.start("relay", "relay", "--id", "relay", "--listen", t.ep(1), "--parent", t.ep(0))
    t.require(wait_until(lambda: listening(t.port(1)), 20), "the relay did not start")
    rss0 = relay.rss()
    block = b"\0" * (1 << 20)
    peak = [rss0]

    def sample():
        r = relay.rss()
        if r:
            peak[0] = max(peak[0], r)
        return r

    # Beyond the message bound: cut off after the header, nothing of it held.
    early = 0
    for _ in range(3):
        s = t.tcp(t.port(1))
        sent = 0
        zmtp_handshake(s)
        s.settimeout(10)
        try:
            s.sendall(b"\x02" + struct.pack(">Q", 1 << 40))
            while sent < 600 << 20:
                s.sendall(block)
                sent += len(block)
                if sent % (32 << 20) == 0 and (sample() or 0) > 1 << 30:
                    break
        except (ConnectionResetError, BrokenPipeError):
            early += 1
        except socket.timeout:
            pass  # the relay stopped reading: not closed
        t.note("1 TiB frame: %d MiB sent before the relay closed the connection" % (sent >> 20))
        sample()
    t.expect(early == 3, "%d of 3 connections declaring a 1 TiB frame were not closed while sending" % (3 - early))
    t.require(relay.alive(), "the relay died: " + relay.log()[-400:])
    # Within the bound: held while it arrives, closed once the peer falls silent. Two of them say
    # Hello first, so no Hello timeout closes them: only the node's child timeout does.
    stalled = []
    for k in range(3):
        s = t.tcp(t.port(1))
        hello = m_hello("stall-%d" % k, role=1) if k < 2 else b""
        zmtp_handshake(s)
        s.settimeout(10)
        s.sendall((bytes([0, len(hello)]) + hello if hello else b"") + b"\x02" + struct.pack(">Q", 6 << 20))
        for _ in range(5):
            s.sendall(block)
        if hello:
            t.expect(zmtp_welcomed(s, 3.0), "the relay did not welcome stall-%d" % k)
        stalled.append(s)
        sample()
    stall_t = time.time()
    closed_at = {}
    while time.time() - stall_t < CHILD_TIMEOUT_S + 6 and len(closed_at) < len(stalled):
        sample()
        for i, s in enumerate(stalled):
            if i not in closed_at and closed_by_peer(s):
                closed_at[i] = time.time() - stall_t
        time.sleep(0.2)
    time.sleep(0.5)
    after = sample()
    t.note("relay RSS %.0f MB at start, peak %.0f MB, %.0f MB after; stalled connections (2 after a Hello) closed after %s s" %
           (rss0 / 1e6, peak[0] / 1e6, (after or 0) / 1e6, [round(closed_at[i], 1) if i in closed_at else None for i in range(3)]))
    t.expect(peak[0] < 1 << 30, "the relay's RSS reached %.0f MB" % (peak[0] / 1e6))
    t.expect(len(closed_at) == 3, "%d of 3 stalled connections still open %.0f s after they fell silent" %
             (3 - len(closed_at), CHILD_TIMEOUT_S + 6))
    t.expect(after is not None and after < rss0 + (100 << 20), "the relay kept %.0f MB after the connections closed" %
             (((after or 0) - rss0) / 1e6))
    t.expect(relay.alive(), "the relay died")


def case_many_partial_frames(t):
    """120 raw ZMTP connections that never say Hello, each sending 7 MiB of an 8 MiB frame and
    stalling: once the relay closed them (hello_timeout_ms), their memory goes back to the system."""
    config = os.path.join(t.dir, "relay.json")
    with open(config, "w") as f:
        json.dump({"id": "relay", "listen": t.ep(1), "parents": [t.ep(0)], "limits": {"hello_timeout_ms": 3000}}, f)
    relay = t.start("relay", "relay", "--config", config)
    t.require(wait_until(lambda: listening(t.port(1)), 20), "the relay did not start")
    time.sleep(0.5)
    rss0 = relay.rss()
    block = b"\0" * (1 << 20)
    socks, peak = [], rss0
    for _ in range(120):
        s = t.tcp(t.port(1))
        zmtp_handshake(s)
        s.settimeout(10)
        try:
            s.sendall(b"\x02" + struct.pack(">Q", (8 << 20) - 4096))
            for _ in range(7):
                s.sendall(block)
        except (ConnectionResetError, BrokenPipeError, socket.timeout):
            pass
        socks.append(s)
        peak = max(peak, relay.rss() or 0)
    closed = wait_until(lambda: all(closed_by_peer(s) for s in socks), 20, step=0.5)
    time.sleep(3.0)  # the host trims at most once a second
    after = relay.rss() or 0
    t.note("relay RSS %.0f MB at start, peak %.0f MB, %.0f MB after 120 stalled frames were closed" % (rss0 / 1e6, peak / 1e6, after / 1e6))
    t.expect(closed, "the relay kept connections that never said Hello past hello_timeout_ms")
    t.expect(peak > rss0 + (300 << 20), "the frames never took memory (peak %.0f MB): the case measures nothing" % (peak / 1e6))
    t.expect(after < rss0 + (150 << 20), "the relay kept %.0f MB after the connections closed" % ((after - rss0) / 1e6))
    t.expect(relay.alive(), "the relay died")


def case_huge_forged_manifest(t):
    """A forged parent sends a worker that trusts a key a manifest of a million chunks, signed in name
    by another key: refused from its header, before its tables are parsed (they end in a wrong
    checksum, which a parser would report first)."""
    s = shared()
    key = os.path.join(t.dir, "sign.key")
    pub = run_dc("keygen", "--sign", "-o", key).strip().split()[-1]
    start_origin(t, port=1, extra=["--sign-key", key])
    n = 1 << 20
    content, payload = xxh3(b"content"), xxh3(b"payload")
    digest = hashlib.blake2b(b"payload", digest_size=32).digest()
    header = struct.pack("<IBBQQQQQB", 0x4D464344, 2, 1, 1, 0, n, int(time.time() * 1e6), 7, 1)
    tables = varint(0) + varint(1) + string("w") + bytes([1]) + varint(1) + varint(n) + varint(0) + varint(n)
    entry = varint(1) + varint(7) + struct.pack("<QQ", payload, content) + digest
    checksum = xxh3(struct.pack("<Q", n) + struct.pack("<Q", content) * n) ^ 1  # wrong: only a parse finds out
    manifest = header + tables + varint(n) + entry * n + struct.pack("<QQ", 0, checksum) + os.urandom(32) + os.urandom(64)
    fake = t.sock(zmq.ROUTER)
    fake.bind(t.ep(0))
    # The forged parent alone first: the CPU measured is what the forged manifests cost, not the
    # real versions (an anchor decoded under a sanitizer takes a second). Then one that fails
    # over to the real origin.
    # This fake sends the manifest as one 52 MB message (a real parent sends it in parts of
    # stripe_part_bytes, each heard as traffic), which says nothing until all of it is here: on
    # a loaded host under a sanitizer that took over parent_timeout_ms (2 s), and the worker gave
    # the parent up before reading it. The case is about what a forged manifest costs: a longer
    # timeout.
    config = os.path.join(t.dir, "w1.json")
    with open(config, "w") as f:
        json.dump({"id": "w1", "parents": [t.ep(0)], "trust_keys": [pub], "timing": {"parent_timeout_ms": 20000}}, f)
    w = t.start("worker", "worker", "--config", config)
    t.require(wait_until(lambda: w.rss() is not None, 5), "the worker did not start")
    cpu0, rss0 = w.stat()
    peak, served, t0, first = rss0, 0, time.time(), None
    # 6 s from its first Hello (a worker under a sanitizer on a loaded host can take seconds to
    # start; what it spent before the Hello is not counted).
    while (time.time() - first < 6.0) if first else (time.time() - t0 < 30.0):
        if fake.poll(50):
            frames = fake.recv_multipart()
            # Once: the CPU bound is for one forged manifest (the worker comes back after its back-off).
            if served == 0 and len(frames) >= 2 and parse_env(frames[1]).WhichOneof("body") == "hello":
                first = time.time()
                cpu0, rss0 = w.stat()
                peak = rss0
                fake.send_multipart([frames[0], m_welcome(1)])
                fake.send_multipart([frames[0], m_manifest(1, True, published_us=int(time.time() * 1e6)), manifest])
                served += 1
        peak = max(peak, w.rss() or 0)
    cpu = (w.cpu() or cpu0) - cpu0
    t.note("a %.0f MB manifest of %d chunks served %d times: worker CPU %.2f s in 6 s, RSS %.0f MB at start, peak %.0f MB" %
           (len(manifest) / 1e6, n, served, cpu, rss0 / 1e6, peak / 1e6))
    t.require(served > 0, "the worker never said Hello to the forged parent")
    t.expect(re.search(r"manifest of v1 is signed by key [0-9a-f]+, which this node does not trust", w.log()) is not None,
             "the worker did not refuse the manifest for its signer (it parsed the tables first?)")
    t.expect(re.search(r"manifest of v1/anchor: .*checksum", w.log()) is None, "the worker parsed the forged manifest's tables")
    t.expect(cpu < 1.5, "the worker spent %.2f s of CPU on a forged manifest" % cpu)
    t.expect(peak < rss0 + (400 << 20), "the forged manifest took the worker from %.0f to %.0f MB" % (rss0 / 1e6, peak / 1e6))
    w.kill()
    w2 = t.start("worker2", "worker", "--id", "w2", "--trust-key", pub, "--parent", t.ep(0), "--parent", t.ep(1))
    deadline = time.time() + 30
    while time.time() < deadline and w2.wait_log(r"version 4 ready", 0.1) is None:
        if fake.poll(50):
            frames = fake.recv_multipart()
            if len(frames) >= 2 and parse_env(frames[1]).WhichOneof("body") == "hello":
                fake.send_multipart([frames[0], m_welcome(1)])
                fake.send_multipart([frames[0], m_manifest(1, True, published_us=int(time.time() * 1e6)), manifest])
    t.expect(w2.wait_log(r"version 4 ready", 1) is not None, "the worker did not get version 4 from the real origin")
    check_versions(t, w2, 4, s["expected"])


# Run as `python3 -c SCRAPERS PORT CLIENTS SECONDS`: CLIENTS threads GET /metrics until SECONDS
# have passed; prints how many reports came whole.
SCRAPERS = r"""
import socket, sys, threading, time
port, clients, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
done, end = [], time.time() + seconds

def scrape():
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                data = bytearray()
                while (b := s.recv(1 << 20)):
                    data += b
            if data.startswith(b"HTTP/1.0 200"):
                done.append(len(data))
        except OSError:
            pass

threads = [threading.Thread(target=scrape) for _ in range(clients)]
for th in threads:
    th.start()
for th in threads:
    th.join()
print(len(done))
"""


def case_metrics_scrapers(t):
    """Three children that relay fill the ledger with 30,000 workers; 16 clients scrape /metrics
    over and over for 8 s: the origin's loop must go on answering its children."""
    origin = published_origin(t)
    for k in range(3):
        filler = t.sock(zmq.DEALER, SNDTIMEO=5000)
        filler.connect(t.ep(0))
        filler.send(m_hello("filler-%d" % k, role=0, serves=True))
        drain(filler, 0.2)
        for i in range(10000):
            filler.send(m_ready("w-%d-%05d-%s" % (k, i, "x" * 60), 0, error="a last error of some length " * 3))
            if i % 1000 == 0:
                drain(filler, 0.01)
    probe = t.sock(zmq.DEALER)
    probe.connect(t.ep(0))
    probe.send(m_hello("probe", role=1, have=4, resume=True, run=origin_run(t)))
    drain(probe, 0.5)
    body, took, _ = metrics(t.port(1), timeout=30)

    def heartbeat_gaps(seconds):
        gaps, last, t0 = [], time.time(), time.time()
        while time.time() - t0 < seconds:
            if probe.poll(100):
                f = probe.recv_multipart()
                if parse_env(f[0]).WhichOneof("body") == "heartbeat":
                    now = time.time()
                    gaps.append(now - last)
                    last = now
        return gaps

    # What this host gives without scrapers (a sanitizer build, a loaded machine), first.
    quiet = max(heartbeat_gaps(3.0) or [0.0])
    # The scrapers run in a process of their own: in this one, 16 threads copying 22 MB reports
    # would hold the interpreter lock and delay the probe's own reads, which is not the origin's doing.
    scrapers = subprocess.Popen([sys.executable, "-c", SCRAPERS, str(t.port(1)), "16", "8.0"], stdout=subprocess.PIPE, text=True)
    gaps = heartbeat_gaps(8.0)
    scrapes = scrapers.communicate(timeout=60)[0].strip()
    worst = max(gaps) if gaps else None
    t.note("ledger report %.1f MB in %.2f s; %s scrapes by 16 clients in 8 s; the origin's heartbeats to a child at most %.2f s apart "
           "(%.2f s without scrapers)" % (len(body) / 1e6, took, scrapes, worst or -1, quiet))
    t.expect(scrapers.returncode == 0 and int(scrapes or 0) > 16, "the scrapers did not get their reports: %r" % scrapes)
    t.expect(worst is not None and worst < quiet + 0.6, "the origin's loop stalled: heartbeats %.2f s apart (%.2f s without scrapers)" %
             (worst or -1, quiet))
    t.expect(re.search(r"the event loop stalled", origin.log()) is None, "the origin logged a stalled loop")
    t.expect(origin.alive(), "the origin died")


def case_idle_connections(t):
    """300 TCP connections to a relay that never speak; a real worker joins meanwhile."""
    s = shared()
    start_origin(t)
    relay = t.start("relay", "relay", "--id", "relay", "--listen", t.ep(1), "--parent", t.ep(0))
    t.require(wait_until(lambda: listening(t.port(1)), 20), "the relay did not start")
    port = t.port(1)
    t0 = time.time()
    idle = []
    for _ in range(300):
        idle.append(t.tcp(port))
    opened = time.time() - t0
    wait_until(lambda: established(port) >= 300, 3)
    n0 = established(port)
    w = t.start("worker", "worker", "--id", "w1", "--parent", t.ep(1), "--exit-after-version", "4")
    t.expect(w.wait_log(r"version 4 ready", 30) is not None, "the worker got nothing through the relay")
    check_versions(t, w, 4, s["expected"])
    closed = wait_until(lambda: established(port) <= 1, HELLO_TIMEOUT_S + 5 - (time.time() - t0), 0.25)
    n1 = established(port)
    took = time.time() - t0
    t.note("%d established after opening 300 (in %.1f s); %d left %.1f s later" % (n0, opened, n1, took))
    t.expect(n0 >= 300, "only %d of the 300 connections were established" % n0)
    t.expect(closed, "%d connections still established %.0f s after they opened (hello_timeout_ms is %.0f s)" %
             (n1, took, HELLO_TIMEOUT_S))
    t.expect(relay.alive(), "the relay died")


def case_big_ready_ids(t):
    """300 messages with 0.9 MB node ids: Readys from children that say they relay, and Hellos."""
    origin = published_origin(t)
    run = origin_run(t)
    time.sleep(0.5)
    rss0 = origin.rss()
    big = "x" * 900000
    peak = rss0
    # Each message waits for the origin's answer (a Refuse): what is measured is what the origin
    # keeps of a message, not how far its loop lags behind a sender on a busy machine
    # (child_queue_messages_max bounds that; test_host.cc shows it). A refused child is let go:
    # its connection closes leave_linger_ms after the Refuse (moved by later refusals, by one
    # linger at most), and a message that crosses that close on the wire is lost with it. So a
    # message without an answer counts against the origin only when its connection stayed open.
    unanswered = cut_off = 0

    def answered(c, mon):
        nonlocal unanswered, cut_off
        if drain(c, 3.0, until_any=True):
            return
        if drain(mon, 0.05):
            cut_off += 1
        else:
            unanswered += 1

    for k in range(3):
        c = t.sock(zmq.DEALER)
        mon = c.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        t.socks.append(mon)
        c.connect(t.ep(0))
        c.send(m_hello("relay-%d" % k, role=0, have=4, resume=True, run=run, serves=True))
        drain(c, 0.3)
        for i in range(70):
            drain(mon, 0.01)  # a close before this message does not explain its loss
            c.send(m_ready(big[:-i - 1] + "%d" % i, 4, checksum=1, run=run))
            answered(c, mon)
        peak = max(peak, origin.rss() or 0)
    for k in range(90):
        c = t.sock(zmq.DEALER)
        mon = c.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        t.socks.append(mon)
        c.connect(t.ep(0))
        c.send(m_hello(big[:-k - 1] + "%d" % k, role=1, serves=True))
        c.send(m_ready(big, 4, run=run))
        answered(c, mon)
        if k % 10 == 0:
            peak = max(peak, origin.rss() or 0)
    time.sleep(2.0)
    peak = max(peak, origin.rss() or 0)
    body, took, status = metrics(t.port(1))
    dropped = len(re.findall(r"dropped a message from child", origin.log()))
    t.note("%d messages refused, %d lost in a close, %d without an answer; origin RSS %.0f MB, peak %.0f MB; "
           "/metrics %d bytes in %.0f ms" % (dropped, cut_off, unanswered, rss0 / 1e6, peak / 1e6, len(body), took * 1e3))
    t.expect(unanswered == 0, "%d of the 300 oversized messages got no Refuse on an open connection" % unanswered)
    t.expect(cut_off <= 30, "%d of the 300 oversized messages were lost in a close" % cut_off)
    t.expect(dropped >= 250, "only %d of the 300 oversized messages reached the origin's checks" % dropped)
    t.expect(peak - rss0 < 100e6, "the origin's RSS grew by %.0f MB" % ((peak - rss0) / 1e6))
    t.expect(len(body) < 256 << 10 and "xxxxxxxx" not in body, "/metrics is %d bytes or lists the big ids" % len(body))
    t.expect(took < 1.0 and status.endswith("200 OK"), "/metrics answered %r in %.2f s" % (status, took))
    t.expect(origin.alive(), "the origin died")


def case_refused_keeps_sending(t):
    """A child refused for an oversized message that sends one every 50 ms: cut off all the same."""
    origin = published_origin(t)
    run = origin_run(t)
    c, mon = watched_worker(t, "pest", run)
    drain(c, 0.5)
    big = "x" * 900000  # a node id past the wire's bound: each message is refused
    t0 = time.time()
    cut = None
    sent = 0
    while time.time() - t0 < 5.0:
        try:
            c.send(m_ready(big + "%d" % sent, 4, checksum=1, run=run), zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            pass
        if mon.poll(50):
            cut = time.time() - t0
            break
    t.note("%d messages sent; cut off after %s" % (sent, "%.2f s" % cut if cut is not None else "never"))
    # Each refusal moves the connection's close to leave its Refuse time to go out, but by one
    # linger (200 ms) at most: the connection closes within about 400 ms of the first.
    t.expect(cut is not None and cut < 2.0, "the origin kept the connection of a child it refused %d times" % sent)
    t.expect(origin.alive(), "the origin died")


def case_metrics_early_close(t):
    """200 metrics clients that ask and hang up at once (half with a reset); one that never asks."""
    origin = start_origin(t, extra=["--metrics", "127.0.0.1:%d" % t.port(1)])
    port = t.port(1)
    for i in range(200):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        if i % 2 == 0:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, not a close
        elif i % 4 == 1:
            time.sleep(0.002)  # the origin may be writing by now
        s.close()
    time.sleep(0.5)
    t.require(origin.alive(), "the origin died (exit %s%s): %s" % (
        origin.p.poll(), ", SIGPIPE" if origin.p.poll() == -signal.SIGPIPE else "", origin.log()[-300:]))
    body, took, status = metrics(port)
    t.expect(status.endswith("200 OK") and "deltacast_bytes_out_total" in body, "/metrics no longer answers: %r" % status)
    s = t.tcp(port, timeout=METRICS_TIMEOUT_S + 5)
    t0 = time.time()
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
    took = time.time() - t0
    t.note("a silent metrics connection was closed after %.1f s" % took)
    t.expect(took <= METRICS_TIMEOUT_S + 2, "a silent metrics connection stayed open %.1f s" % took)
    t.expect(origin.alive(), "the origin died")


def case_plaintext_to_curve(t):
    """A CURVE relay; a plaintext client and a CURVE client with a key it does not allow."""
    keyf = os.path.join(t.dir, "relay.key")
    relay_pub = run_dc("keygen", "-o", keyf).strip().split()[-1]
    allowed_pub, _ = zmq.curve_keypair()
    relay = t.start("relay", "relay", "--id", "relay", "--listen", t.ep(1), "--parent", t.ep(0), "--keys", keyf,
                    "--parent-key", relay_pub, "--allow-key", allowed_pub.decode())
    t.require(wait_until(lambda: listening(t.port(1)), 20), "the relay did not start")
    plain = t.sock(zmq.DEALER)
    plain.connect(t.ep(1))
    plain.send(m_hello("plain", role=1))
    pub, sec = zmq.curve_keypair()
    stranger = t.sock(zmq.DEALER, CURVE_SERVERKEY=relay_pub.encode(), CURVE_PUBLICKEY=pub, CURVE_SECRETKEY=sec)
    stranger.connect(t.ep(1))
    stranger.send(m_hello("stranger", role=1))
    got = drain(plain, 2.5) + drain(stranger, 0.5)
    t.expect(not got, "the relay answered a client it should refuse (%d messages)" % len(got))
    t.expect(relay.wait_log(r"refused a peer at .*(handshake|protocol|mechanism)", 3) is not None,
             "the relay did not log the plaintext client's refusal")
    t.expect(relay.wait_log(r"refused a peer whose key %s" % re.escape(pub.decode()), 3) is not None,
             "the relay did not log the unknown key's refusal")
    t.expect(relay.alive(), "the relay died")


CASES = [
    ("fake-parent-heartbeat", case_fake_parent_heartbeat),
    ("fake-parent-huge-image", case_fake_parent_huge_image),
    ("fake-parent-parts", case_fake_parent_parts),
    ("forged-parent-signed", case_forged_parent_signed),
    ("shard-injection", case_shard_injection),
    ("ready-for-other-id", case_ready_for_other_id),
    ("need-flood", case_need_flood),
    ("anchor-beyond-newest", case_anchor_beyond_newest),
    ("partial-frames", case_partial_frames),
    ("idle-connections", case_idle_connections),
    ("big-ready-ids", case_big_ready_ids),
    ("refused-keeps-sending", case_refused_keeps_sending),
    ("metrics-early-close", case_metrics_early_close),
    ("plaintext-to-curve", case_plaintext_to_curve),
    ("shard-replay", case_shard_replay),
    ("origin-clock-behind", case_origin_clock_behind),
    ("replayed-run", case_replayed_run),
    ("ledger-fill", case_ledger_fill),
    ("many-partial-frames", case_many_partial_frames),
    ("relayed-need-flood", case_relayed_need_flood),
    ("wrong-trust-key", case_wrong_trust_key),
    ("huge-forged-manifest", case_huge_forged_manifest),
    ("metrics-scrapers", case_metrics_scrapers),
]


def claim_port_block():
    """A block of 200 loopback ports for this run (each case takes 10), claimed as
    tests/port_block.sh claims them for the shell scripts: below the kernel's ephemeral range,
    held by an flock for as long as this process lives, passed over when something listens in it.
    Returns the block's first port, or None."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    if ephemeral_low < 30000:
        print("the kernel's ephemeral ports start at %d, among the tests' (10000-29999)" % ephemeral_low, file=sys.stderr)
        return None
    for i in range(100):
        n = (os.getpid() + i) % 100
        f = open(os.path.join(tempfile.gettempdir(), "deltacast-ports.%d.lock" % n), "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        base = 10000 + n * 200
        if all(_port_free(base + k) for k in range(200)):
            _held_locks.append(f)
            return base
        f.close()
    print("no free block of 200 loopback ports in 10000-29999", file=sys.stderr)
    return None


_held_locks = []


def _port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the nodes bind: only a listener counts
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def main(argv):
    global pb, ctx, DC, TMP, PORT_BASE
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 2
    DC = os.path.abspath(argv[1])
    names = argv[2:] or [n for n, _ in CASES]
    known = dict(CASES)
    for n in names:
        if n not in known:
            print("unknown case %s; cases: %s" % (n, " ".join(known)), file=sys.stderr)
            return 2
    if not os.access(DC, os.X_OK):
        print("not an executable: " + DC, file=sys.stderr)
        return 2
    # Cases open hundreds of sockets: a soft limit of 1024 open files would make connects fail
    # quietly inside zmq's I/O thread (it retries), not with an error here.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    PORT_BASE = claim_port_block()
    if PORT_BASE is None:
        return 1
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGALRM, _on_alarm)
    # Named after this process: what a run killed by SIGKILL left behind is removed by the next one.
    for stale in os.listdir(tempfile.gettempdir()):
        m = re.fullmatch(r"hostile_peers\.(\d+)\..*", stale)
        if m and not os.path.exists("/proc/" + m.group(1)):
            shutil.rmtree(os.path.join(tempfile.gettempdir(), stale), ignore_errors=True)
    TMP = tempfile.mkdtemp(prefix="hostile_peers.%d." % os.getpid())
    passed = failed = 0
    started = time.time()
    try:
        subprocess.run(["protoc", "--python_out=" + TMP, "-I", PROTO_DIR, os.path.join(PROTO_DIR, "deltacast.proto")], check=True)
        sys.path.insert(0, TMP)
        import deltacast_pb2
        pb = deltacast_pb2
        for name in names:
            index = [n for n, _ in CASES].index(name)
            t = Case(name, index)
            # A context (and I/O thread) per case: what one case's hundreds of sockets leave to
            # the context to finish cannot hold up the next case's connections.
            ctx = zmq.Context()
            t0 = time.time()
            signal.alarm(CASE_TIMEOUT_S)
            try:
                known[name](t)
            except CaseFailed as e:
                if str(e) not in t.problems:
                    t.problems.append(str(e))
            except CaseTimeout as e:
                t.problems.append(str(e))
            except Exception as e:  # a bug here, or the node answered something unparseable
                t.problems.append("%s: %s" % (type(e).__name__, e))
                traceback.print_exc()
            finally:
                signal.alarm(0)
            took = time.time() - t0
            if t.problems:
                failed += 1
                print("FAIL %s: %s (%.1f s)" % (name, "; ".join(t.problems), took))
            else:
                passed += 1
                print("PASS %s (%.1f s)" % (name, took))
            if t.problems or os.environ.get("HOSTILE_VERBOSE"):  # the processes' last words
                print("  --- this script: %d open files" % len(os.listdir("/proc/self/fd")))
                for p in t.procs:
                    tail = p.log().splitlines()[-int(os.environ.get("HOSTILE_VERBOSE") or 8):]
                    print("  --- %s (%s)" % (p.name, "running" if p.alive() else "exit %s" % p.p.poll()))
                    for ln in tail:
                        print("  " + ln[:300])
            for n in t.notes:
                print("  " + n)
            sys.stdout.flush()
            t.cleanup()
            ctx.destroy(linger=0)
            ctx = None
    finally:
        signal.alarm(0)
        kill_all()
        if ctx is not None:
            ctx.destroy(linger=0)
        shutil.rmtree(TMP, ignore_errors=True)
    print("run time %.0f s" % (time.time() - started))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
