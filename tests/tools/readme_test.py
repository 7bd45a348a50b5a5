#!/usr/bin/env python3
"""Every command README.md shows is run, and exits 0.

The README's code blocks are read, and each command line in them must have an entry in RUNS
below, and each entry a line in the README: a command added to the README without a run here,
or changed there, fails this test. A run takes the README's own words and replaces their
placeholders (BASE.safetensors, tcp://origin:7100, ckpt/*.safetensors, ...) with files made
here and loopback ports. Commands whose README form takes minutes run on a stand-in of the same
shape, with the extra flags named in the entry: a 16 MB series for 10 GB, the four-region fleet
with 8 workers a region and 4 versions for 256 and 10 (those take 6.6 minutes; docs/BENCHMARKS.md
has that run).
Lines that other tests run are named with those tests (the install lines: install_tree and
install_packages; the test command: it is this suite).
Usage: readme_test.py path/to/deltacast [python-with-the-package]
"""
import glob
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

DC = os.path.abspath(sys.argv[1])
PYTHON = sys.argv[2] if len(sys.argv) > 2 else sys.executable
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TIMEOUT_S = 300


def readme_commands():
    """Every command line of README.md's code blocks, as its tokens joined by single spaces."""
    lines, block, pending = [], False, ""
    with open(os.path.join(ROOT, "README.md")) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if line.startswith("```"):
                block = not block
                continue
            if not block:
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            line, pending = pending + line, ""
            tokens = shlex.split(line, comments=True)
            if tokens:
                lines.append(" ".join(tokens))
    return lines


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner:
    def __init__(self, work):
        self.work = work
        self.procs = []
        self.failures = []

    def path(self, name):
        return os.path.join(self.work, name)

    def args(self, line, subs, extra=()):
        """The README line's tokens with placeholders replaced (a list value stands for several)."""
        out = []
        for t in shlex.split(line):
            v = subs.get(t, t)
            out += v if isinstance(v, list) else [v]
        out += [str(x) for x in extra]
        if out[0] == "deltacast":
            out[0] = DC
        elif out[0] == "python3":
            out[0] = PYTHON
        return out

    def run(self, line, subs=None, extra=(), cwd=None):
        cmd = self.args(line, subs or {}, extra)
        t0 = time.monotonic()
        p = subprocess.run(cmd, cwd=cwd or self.work, capture_output=True, text=True, timeout=TIMEOUT_S)
        print(f"  exit {p.returncode} in {time.monotonic() - t0:5.1f} s: {shlex.join(cmd)}", flush=True)
        if p.returncode != 0:
            self.failures.append(f"{line}\n  exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return p

    def start(self, line, subs=None, extra=(), name="server"):
        cmd = self.args(line, subs or {}, extra)
        log = open(self.path(name + ".log"), "w")
        print(f"  started: {shlex.join(cmd)}", flush=True)
        p = subprocess.Popen(cmd, cwd=self.work, stdout=log, stderr=subprocess.STDOUT, text=True)
        p.log_path = log.name
        self.procs.append(p)
        return p

    def wait(self, p, line):
        try:
            rc = p.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        print(f"  exit {rc}: {line}", flush=True)
        if rc != 0:
            self.failures.append(f"{line}\n  exit {rc}\n{open(p.log_path).read()[-3000:]}")

    def stop(self, p, line):
        """A server the README leaves running: it is up until now and exits 0 when told to stop."""
        if p.poll() is not None:
            self.failures.append(f"{line}\n  exited early ({p.returncode})\n{open(p.log_path).read()[-3000:]}")
            return
        p.send_signal(signal.SIGTERM)
        self.wait(p, line)

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def same(self, a, b, what):
        if open(a, "rb").read() != open(b, "rb").read():
            self.failures.append(f"{what}: {a} differs from {b}")


# ---- the runs, one per README line (or group of lines run together) ----------------------------

def series(r):
    """A 16 MB series of three checkpoints, a delta and an anchor of it, and keys."""
    subprocess.run([DC, "gen", "-q", "-o", r.path("ckpt"), "--size", "16MB", "--steps", "2", "--lr", "1e-6"], check=True,
                   capture_output=True)
    c = sorted(glob.glob(r.path("ckpt/*.safetensors")))
    subprocess.run([DC, "encode", "-q", c[0], c[1], "-o", r.path("d01")], check=True, capture_output=True)
    subprocess.run([DC, "encode", "-q", c[1], "-o", r.path("a1")], check=True, capture_output=True)
    subprocess.run([DC, "keygen", "--sign", "-o", r.path("signer.key")], check=True, capture_output=True)
    return c


def files(r, c):
    return {"BASE.safetensors": c[0], "NEW.safetensors": c[1], "OLDER": c[0], "OLDER]": c[0], "[--prev": "--prev",
            "D": r.path("d01"), "A": r.path("a1"), "FILE": r.path("d01"), "[CHECKPOINTS...]": c, "DIR": r.path("gen"),
            "trainer.key": r.path("signer.key")}


def run_gen(r, c, line):
    r.run(line, dict(files(r, c), **{"10GB": "16MB"}), extra=["-q"])


def run_encode_delta(r, c, line):
    r.run(line, dict(files(r, c), D=r.path("d-readme")))
    r.run(line, dict(files(r, c), D=r.path("d-readme")), extra=["--codec", "v3"])


def run_encode_anchor(r, c, line):
    r.run(line, dict(files(r, c), A=r.path("a-readme")))


def run_decode_delta(r, c, line):
    r.run(line, dict(files(r, c), **{"NEW.safetensors": r.path("new-from-delta.safetensors")}))
    r.same(r.path("new-from-delta.safetensors"), c[1], "decode of a delta")


def run_decode_anchor(r, c, line):
    r.run(line, dict(files(r, c), **{"NEW.safetensors": r.path("new-from-anchor.safetensors")}))
    r.same(r.path("new-from-anchor.safetensors"), c[1], "decode of an anchor")


def run_signed(r, c, line):
    r.run(line, dict(files(r, c), A=r.path("a-signed")))
    p = subprocess.run([DC, "decode", r.path("a-signed"), "--trust-key", r.path("signer.key"), "-o", r.path("s.safetensors")],
                       capture_output=True, text=True)
    if p.returncode != 0:
        r.failures.append(f"decode --trust-key of the signed anchor: {p.stderr}")


def run_plain(r, c, line, extra=()):
    r.run(line, files(r, c), extra=extra)


def run_fleet(r, c, lines):
    """publish, relay, worker and status together: a version series from the origin through a
    relay to a worker that saves it, the relay's metrics read by status."""
    publish, relay, worker, status = lines
    origin, relay_port, metrics = free_port(), free_port(), free_port()
    ends = {"tcp://0.0.0.0:7100": f"tcp://127.0.0.1:{origin}", "tcp://0.0.0.0:7101": f"tcp://127.0.0.1:{relay_port}",
            "tcp://origin:7100": f"tcp://127.0.0.1:{origin}", "tcp://relay-eu:7101": f"tcp://127.0.0.1:{relay_port}",
            "tcp://relay-eu2:7101": f"tcp://127.0.0.1:{free_port()}", "ckpt/*.safetensors": c,
            "/var/lib/deltacast": r.path("saved"), "127.0.0.1:9100": f"127.0.0.1:{metrics}"}
    rp = r.start(relay, ends, extra=["--metrics", f"127.0.0.1:{metrics}", "--log-level", "warn"], name="relay")
    wp = r.start(worker, ends, extra=["--exit-after-version", len(c), "--log-level", "warn"], name="worker")
    pp = r.start(publish, ends, extra=["--wait-workers", 1, "--log-level", "warn"], name="publish")
    r.wait(wp, worker)
    r.same(os.path.join(r.path("saved"), f"host-1-v{len(c)}.safetensors"), c[-1], "the worker's saved version")
    r.run(status, ends)
    r.wait(pp, publish)
    r.stop(rp, relay)


def run_keygen(r, c, line):
    r.run(line, {"node.key": r.path("node.key"), "trainer.key": r.path("trainer.key")})


def run_fleet_init(r, c, line):
    fleet = {"origin": {"region": "a", "uplink": "10Gbit"},
             "defaults": {"lan": {"latency_ms": 0.1, "bandwidth": "10Gbit"},
                          "worker_nic": {"uplink": "10Gbit", "downlink": "10Gbit"},
                          "relay_nic": {"uplink": "10Gbit", "downlink": "10Gbit"}},
             "regions": [{"name": "a", "workers": 2, "relays": 1, "worker_relays": False}]}
    json.dump(fleet, open(r.path("fleet.json"), "w"))
    json.dump({"origin": "tcp://127.0.0.1:7100", "a.relay-0": "tcp://127.0.0.1:7101"}, open(r.path("endpoints.json"), "w"))
    r.run(line, {"fleet/": r.path("fleet"), "fleet.json": r.path("fleet.json"), "endpoints.json": r.path("endpoints.json")})


SCENARIO = os.path.join(ROOT, "sim", "scenarios", "four-regions.json")


def run_plan(r, c, line):
    r.run(line, {"sim/scenarios/four-regions.json": SCENARIO})


def run_sim(r, c, line):
    sc = json.load(open(SCENARIO))
    for region in sc["fleet"]["regions"]:
        region["workers"] = 8
    sc["run"]["versions"] = 4
    json.dump(sc, open(r.path("four-regions-small.json"), "w"))
    r.run(line, {"sim/scenarios/four-regions.json": r.path("four-regions-small.json")})


def run_examples(r, c, lines):
    """The training loop and a rollout process, as the README runs them, for 3 steps not 20."""
    train, rollout = lines
    port = f"tcp://127.0.0.1:{free_port()}"
    subs = {"tcp://127.0.0.1:7100": port, "examples/train_publish.py": os.path.join(ROOT, "examples", "train_publish.py"),
            "examples/rollout.py": os.path.join(ROOT, "examples", "rollout.py"), "20": "3", "21": "4"}
    tp = r.start(train, subs, name="train")
    rp = r.start(rollout, subs, name="rollout")
    r.wait(rp, rollout)
    r.wait(tp, train)


def run_shards(r, c, line):
    r.run(line, {"tcp://127.0.0.1:7101": f"tcp://127.0.0.1:{free_port()}", "10": "2",
                 "examples/train_shards.py": os.path.join(ROOT, "examples", "train_shards.py")})


def run_demo(r, c, line):
    r.run(line, {"scripts/demo.sh": os.path.join(ROOT, "scripts", "demo.sh")}, extra=["--bin", DC, "--size", "16MB", "--steps", "2"])


def elsewhere(test):
    def note(r, c, line):
        print(f"  run by {test}: {line}", flush=True)
    return note


RUNS = [
    (("bash scripts/demo.sh",), run_demo),
    (("bash scripts/test.sh",), elsewhere("the suite itself (.ci/run)")),
    (("deltacast gen -o DIR --size 10GB --steps 4 --lr 1e-6",), run_gen),
    (("deltacast encode BASE.safetensors NEW.safetensors -o D",), run_encode_delta),
    (("deltacast encode NEW.safetensors -o A",), run_encode_anchor),
    (("deltacast decode BASE.safetensors D -o NEW.safetensors",), run_decode_delta),
    (("deltacast decode A -o NEW.safetensors",), run_decode_anchor),
    (("deltacast encode --sign-key trainer.key NEW.safetensors -o A",), run_signed),
    (("deltacast inspect FILE",), run_plain),
    (("deltacast inspect --entropy BASE NEW [--prev OLDER]",),
     lambda r, c, line: r.run(line, dict(files(r, c), BASE=c[1], NEW=c[2], OLDER=c[0], **{"OLDER]": c[0]}))),
    (("deltacast bench [CHECKPOINTS...]",), lambda r, c, line: r.run(line, {"[CHECKPOINTS...]": c[:2]}, ["--runs", 1])),
    (("deltacast bench --end-to-end [CHECKPOINTS...]",), lambda r, c, line: run_plain(r, c, line, ["--runs", 1])),
    (("deltacast bench-worker",), lambda r, c, line: run_plain(r, c, line, ["--size", "16MB", "--runs", 1, "-q"])),
    (("deltacast publish --listen tcp://0.0.0.0:7100 ckpt/*.safetensors",
      "deltacast relay --id relay-eu --listen tcp://0.0.0.0:7101 --parent tcp://origin:7100",
      "deltacast worker --id host-1 --parent tcp://relay-eu:7101 --parent tcp://relay-eu2:7101 --out-dir /var/lib/deltacast",
      "deltacast status 127.0.0.1:9100"), run_fleet),
    (("deltacast keygen -o node.key",), run_keygen),
    (("deltacast keygen --sign -o trainer.key",), run_keygen),
    (("deltacast fleet-init -o fleet/ --fleet fleet.json --endpoints endpoints.json",), run_fleet_init),
    (("deltacast bench-net",),
     lambda r, c, line: r.run(line, extra=["--size", "8MB", "--runs", 1, "--chunk-sizes", "1MiB", "--port", free_port()])),
    (("deltacast plan sim/scenarios/four-regions.json",), run_plan),
    (("deltacast plan sim/scenarios/four-regions.json --trees 1",), run_plan),
    (("deltacast sim sim/scenarios/four-regions.json --strategy all",), run_sim),
    (("python3 examples/train_publish.py --listen tcp://127.0.0.1:7100 --steps 20 --wait-workers 1",
      "python3 examples/rollout.py --id rollout-0 --parent tcp://127.0.0.1:7100 --until 21"), run_examples),
    (("python3 examples/train_shards.py --listen tcp://127.0.0.1:7101 --layout fsdp --ranks 4 --steps 10 --check",), run_shards),
    (("cmake --install build --prefix /usr/local",), elsewhere("install_tree")),
    (("(cd build && cpack -G DEB) && apt-get install ./build/*.deb",), elsewhere("install_packages")),
    (("cc rollout.c $(pkg-config --cflags --libs deltacast)",), elsewhere("install_tree (tests/install/embed.c)")),
    (("find_package(deltacast REQUIRED)",), elsewhere("install_tree")),
    (("target_link_libraries(rollout PRIVATE deltacast::deltacast)",), elsewhere("install_tree")),
]


def main():
    shown = readme_commands()
    covered = [line for lines, _ in RUNS for line in lines]
    missing = [line for line in shown if line not in covered]
    stale = [line for line in covered if line not in shown]
    failures = [f"README.md shows a command this test does not run: {line}" for line in missing]
    failures += [f"this test runs a command README.md no longer shows: {line}" for line in stale]
    with tempfile.TemporaryDirectory(prefix="readme-test-") as work:
        r = Runner(work)
        try:
            c = series(r)
            for lines, run in RUNS:
                if any(line in stale for line in lines):
                    continue
                run(r, c, lines if len(lines) > 1 else lines[0])
        finally:
            r.cleanup()
        failures += r.failures
    for f in failures:
        print("FAILED:", f)
    print(f"{len(shown)} README command lines, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
