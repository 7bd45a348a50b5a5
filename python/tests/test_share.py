"""One image per host: a CLI worker shares its versions (--share), the ranks of a host attach
from their own processes and read every version bit for bit from the one image, and a rank
killed mid-read leaks nothing."""
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import deltacast
from conftest import DELTACAST, free_port
from share_reader import bytes_in, image_mappings, pss_total, next_version as step

READER = Path(__file__).with_name("share_reader.py")
TENSORS, ELEMENTS = 14, 8 << 20  # 224 MiB of BF16


def model(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.weight": torch.randn(ELEMENTS, generator=g).to(torch.bfloat16) for i in range(TENSORS)}


def digests(tensors: dict) -> dict:
    return {n: hashlib.blake2b(memoryview(t.view(torch.int16).numpy()), digest_size=16).hexdigest() for n, t in tensors.items()}


def read_line(proc: subprocess.Popen, timeout: float) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            assert line, f"reader {proc.pid} exited ({proc.poll()})"
            return json.loads(line)
    raise TimeoutError(f"reader {proc.pid} said nothing in {timeout} s")


def test_four_ranks_share_one_image_and_a_rank_killed_mid_read_leaks_nothing(processes, tmp_path):
    sock = str(tmp_path / "host.sock")
    env = dict(os.environ)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        ports = {"host-0": free_port(), "plain": free_port()}
        worker = processes.start(DELTACAST, "worker", "--id", "host-0", "--parent", pub.listening, "--share", sock, "--scrub-rate", "0",
                                 "--metrics", f"127.0.0.1:{ports['host-0']}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # What a single rank's worker needs, in the same run: the baseline of the figures below.
        plain = processes.start(DELTACAST, "worker", "--id", "plain", "--parent", pub.listening, "--scrub-rate", "0",
                                "--metrics", f"127.0.0.1:{ports['plain']}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tensors = model(1)
        image_bytes = TENSORS * ELEMENTS * 2
        pub.publish(tensors)
        readers = [processes.start(sys.executable, READER, sock, 3, stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)]
        slow = processes.start(sys.executable, READER, sock, 3, "--slow", stdout=subprocess.PIPE, text=True, env=env)
        for number in range(1, 4):
            expected = digests(tensors)
            if number == 1:
                assert read_line(slow, 120) == {"reading": 1}
                time.sleep(1.0)  # some tensors read, most not
                slow.send_signal(signal.SIGKILL)
                slow.wait(timeout=10)
            for r in readers:
                line = read_line(r, 120)
                assert line["version"] == number
                assert line["digests"] == expected, f"reader {r.pid}: version {number} differs from what was published"
                # Each rank maps the whole image, and pays a share of it, not a copy.
                assert line["memory"]["rss"] >= 0.95 * image_bytes
            pub.wait_ready(number, min_workers=2, timeout=120)
            if number < 3:
                tensors = step(tensors, number)
                pub.publish(tensors)
        assert worker.poll() is None, "the worker died"
        # The host holds two images at most (the version and the one before), whatever the number of
        # ranks, and the killed rank's version was let go of: no third image. The worker holds one
        # version from its parent, so the parent serves one copy.
        processes_pss = [image_mappings(worker.pid)] + [image_mappings(r.pid) for r in readers]
        inodes = {inode for maps in processes_pss for inode, _, _ in maps}
        total_pss = sum(pss for maps in processes_pss for _, pss, _ in maps)
        assert len(inodes) <= 2, f"{len(inodes)} shared images on the host"
        assert total_pss <= 2.05 * image_bytes, f"the host's shared images take {total_pss / 2**20:.0f} MiB for one of {image_bytes / 2**20:.0f}"
        # Against the single worker: the host's PSS (the worker's whole, the ranks' shared images)
        # and the bytes from the parent.
        host_pss = pss_total(worker.pid) + sum(pss for maps in processes_pss[1:] for _, pss, _ in maps)
        single_pss = pss_total(plain.pid)
        assert host_pss <= 1.1 * single_pss, f"4 ranks: {host_pss / 2**20:.0f} MiB of PSS against {single_pss / 2**20:.0f} MiB for one worker"
        host_bytes, single_bytes = bytes_in(ports["host-0"]), bytes_in(ports["plain"])
        assert 0 < host_bytes <= 1.05 * single_bytes, (host_bytes, single_bytes)
        assert sorted(pub.ledger()) == ["host-0", "plain"], pub.ledger()
        for r in readers:
            assert r.wait(timeout=60) == 0


def test_attach_to_nothing_and_share_with_in_place_are_refused(tmp_path):
    with pytest.raises(deltacast.Error, match="--share"):
        deltacast.attach(tmp_path / "nobody.sock", timeout=0.2)
    with pytest.raises(deltacast.Error, match="in_place"):
        deltacast.Worker("w", [f"tcp://127.0.0.1:{free_port()}"], share=tmp_path / "s.sock", in_place=True)


def test_a_rank_keeps_what_it_holds_while_the_hosts_worker_restarts_and_attaches_again(tmp_path):
    sock = tmp_path / "host.sock"
    tensors = {"w": torch.arange(4096, dtype=torch.float32).to(torch.bfloat16)}
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        worker = deltacast.Worker("host", [pub.listening], share=sock, state_dir=tmp_path / "state")
        pub.publish(tensors)
        rank = deltacast.attach(sock)
        held = rank.wait(1, timeout=30)
        assert rank.disconnected is None
        worker.close()
        with pytest.raises(TimeoutError):
            rank.wait(2, timeout=1)
        assert "went away" in rank.disconnected
        assert rank.wait(1, timeout=1).number == 1  # what it holds is there
        assert torch.equal(dict(held.tensors())["w"], tensors["w"])
        # The worker restarts on the same path (from its saved version): the rank attaches again.
        worker = deltacast.Worker("host", [pub.listening], share=sock, state_dir=tmp_path / "state")
        first, tensors = tensors, {"w": tensors["w"] + 1}
        pub.publish(tensors)
        v2 = rank.wait(2, timeout=30)
        assert rank.disconnected is None
        assert torch.equal(dict(v2.tensors())["w"], tensors["w"])
        assert torch.equal(dict(held.tensors())["w"], first["w"])
        rank.close()
        worker.close()


def test_attach_without_a_time_limit_waits_for_the_worker_to_start(tmp_path):
    sock = tmp_path / "host.sock"
    got = []
    waiter = threading.Thread(target=lambda: got.append(deltacast.attach(sock, timeout=None)))
    waiter.start()
    time.sleep(0.5)
    assert not got, "attached to a socket nobody serves"
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("host", [pub.listening], share=sock):
        waiter.join(timeout=30)
        assert got, "attach(timeout=None) gave up before the worker started"
        pub.publish({"w": torch.ones(64, dtype=torch.bfloat16)})
        assert got[0].wait(1, timeout=30).number == 1
        got[0].close()
