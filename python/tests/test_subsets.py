"""Hosts that hold only what they serve: workers subscribed to some tensors, in a fleet of
processes with a relay, get every version bit-exact on their tensors and receive only their
share of it; the relay takes the union of what its children serve."""
import hashlib
import json
import struct
import subprocess
import time

import pytest
import torch

import deltacast
from conftest import DELTACAST, free_endpoint, free_port
from share_reader import bytes_in, next_version as step

TENSORS, ELEMENTS = 16, 1 << 20  # 32 MiB of BF16, 2 MiB a tensor


def model(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i:02d}.weight": torch.randn(ELEMENTS, generator=g).to(torch.bfloat16) for i in range(TENSORS)}


def digest(array) -> str:
    return hashlib.blake2b(memoryview(array), digest_size=16).hexdigest()


def wait_for(pred, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(what)


def safetensors_names(path) -> set:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k for k in header if k != "__metadata__"}


def holds_first_eight(version, tensors):
    """The version holds layers 00-07 and nothing else, each bit for bit as published."""
    got = dict(version.numpy_tensors())
    assert sorted(got) == [f"layers.{i:02d}.weight" for i in range(8)]
    for name, array in got.items():
        assert digest(array) == digest(tensors[name].view(torch.int16).numpy()), f"v{version.number} {name}"


def test_subset_workers_behind_a_relay_get_their_tensors_only(processes, tmp_path):
    eighth = [f"layers.0[01].*"]               # 2 of 16 tensors
    half = ["layers.0[0-7].*"]                 # 8 of 16
    ports = {n: free_port() for n in ("relay", "eighth", "half", "whole")}
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        relay = free_endpoint()
        processes.start(DELTACAST, "relay", "--id", "relay", "--listen", relay, "--parent", pub.listening, "--log-level", "warn",
                        "--metrics", f"127.0.0.1:{ports['relay']}")
        # The baseline: a worker of the whole model, straight under the publisher (not under the
        # relay, whose union would then be every tensor).
        processes.start(DELTACAST, "worker", "--id", "whole", "--parent", pub.listening, "--scrub-rate", "0",
                        "--metrics", f"127.0.0.1:{ports['whole']}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.start(DELTACAST, "worker", "--id", "eighth", "--parent", relay, "--tensors", eighth[0], "--out-dir", str(tmp_path / "eighth"),
                        "--metrics", f"127.0.0.1:{ports['eighth']}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with deltacast.Worker("half", [relay], tensors=half, state_dir=tmp_path / "half", metrics=f"127.0.0.1:{ports['half']}") as w:
            tensors = model(3)
            for number in range(1, 4):
                if number > 1:
                    tensors = step(tensors, number)
                pub.publish(tensors)
                v = w.wait(number, timeout=120)
                assert v.number == number
                holds_first_eight(v, tensors)
                pub.wait_ready(number, min_workers=3, timeout=120)
            # Bytes from the parent, against the whole worker of the same run: each subset at most
            # its fraction of them and 5% more.
            whole = bytes_in(ports["whole"])
            for name, fraction in (("eighth", 1 / 8), ("half", 1 / 2)):
                got = bytes_in(ports[name])
                print(f"{name}: {got} bytes from its parent, {got / whole:.3f} of the whole worker's {whole}")
                assert 0.8 * fraction * whole <= got <= (fraction + 0.05) * whole, (name, got, whole)
            # The relay took the union of its children's tensors (the half includes the eighth).
            assert bytes_in(ports["relay"]) <= (1 / 2 + 0.05) * whole, (bytes_in(ports["relay"]), whole)
            # Saved: the subset's tensors, packed.
            wait_for(lambda: list((tmp_path / "half").glob("*.safetensors")), 30, "the half worker saved nothing")
        saved = sorted((tmp_path / "half").glob("*.safetensors"))
        assert safetensors_names(saved[-1]) == {f"layers.{i:02d}.weight" for i in range(8)}
        eighth_saved = wait_for(lambda: sorted((tmp_path / "eighth").glob("*.safetensors")), 30, "the eighth worker saved nothing")
        assert safetensors_names(eighth_saved[-1]) == {"layers.00.weight", "layers.01.weight"}
        assert sorted(pub.ledger()) == ["eighth", "half", "whole"]


def test_a_subset_that_does_not_check_is_refused():
    with pytest.raises(deltacast.Error, match="tensors"):
        deltacast.Worker("w", ["tcp://127.0.0.1:1"], tensors=[""])
    with pytest.raises(deltacast.Error, match="tensors"):
        deltacast.Worker.settings("w", ["tcp://127.0.0.1:1"], tensors=["x" * 2000])
    assert deltacast.Worker.settings("w", ["tcp://127.0.0.1:1"], tensors="layers.*")["tensors"] == ["layers.*"]


def test_a_worker_whose_tensors_grow_takes_only_what_it_lacks(processes, tmp_path):
    eighth, half = ["layers.0[01].*"], ["layers.0[0-7].*"]
    ports = {n: free_port() for n in ("grows", "whole")}
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        processes.start(DELTACAST, "worker", "--id", "whole", "--parent", pub.listening, "--scrub-rate", "0",
                        "--metrics", f"127.0.0.1:{ports['whole']}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with deltacast.Worker("grows", [pub.listening], tensors=eighth, state_dir=tmp_path / "grows",
                              metrics=f"127.0.0.1:{ports['grows']}") as w:
            tensors = model(5)
            anchor_bytes = 0
            for number in range(1, 4):
                if number > 1:
                    tensors = step(tensors, number)
                pub.publish(tensors)
                assert w.wait(number, timeout=120).number == number
                pub.wait_ready(number, min_workers=2, timeout=120)
                if number == 1:
                    anchor_bytes = bytes_in(ports["whole"])
            whole_before, before = bytes_in(ports["whole"]), bytes_in(ports["grows"])
            w.set_tensors(half)
            assert sorted(name for name, _ in w.current().numpy_tensors()) == ["layers.00.weight", "layers.01.weight"]
            for number in (4, 5):
                tensors = step(tensors, number)
                pub.publish(tensors)
                v = w.wait(number, timeout=120)
                assert v.number == number
                holds_first_eight(v, tensors)
                # Version 4 came partly whole: no base to patch from; version 5 is a delta again.
                assert v.base_number == (0 if number == 4 else 4)
                pub.wait_ready(number, min_workers=2, timeout=120)
            # What it took: the 6 new tensors' chunks of anchor 1 and deltas 2 and 3, then half of
            # deltas 4 and 5; at most 5% of an anchor beyond that, and well under an anchor of half.
            got = bytes_in(ports["grows"]) - before
            deltas = bytes_in(ports["whole"]) - whole_before
            print(f"grown from 1/8 to 1/2: {got} bytes; the whole worker's anchor {anchor_bytes}, its deltas 4-5 {deltas}")
            assert got <= (6 / 16 + 0.05) * anchor_bytes + 3 * deltas, (got, anchor_bytes, deltas)
            assert got < 0.5 * anchor_bytes, (got, anchor_bytes)
        saved = wait_for(lambda: sorted((tmp_path / "grows").glob("*.safetensors")), 30, "nothing saved")
        assert safetensors_names(saved[-1]) == {f"layers.{i:02d}.weight" for i in range(8)}
    with pytest.raises(ValueError, match="tensors"):
        deltacast.Worker("w", ["tcp://127.0.0.1:1"]).set_tensors([""])
