"""The Python worker against a real publisher process on loopback."""

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import deltacast

from conftest import DELTACAST, free_port


def read_safetensors(path: Path) -> dict[str, tuple[str, bytes]]:
    """name -> (dtype, bytes), read independently of deltacast."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = (info["dtype"], body[begin:end])
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("ckpt")
    subprocess.run([DELTACAST, "gen", "-q", "-o", str(d), "--hidden", "64", "--layers", "2", "--vocab", "512", "--ffn", "192",
                    "--steps", "3", "--fp32-norms"], check=True)
    return sorted(d.glob("step-*.safetensors"))


def start_publisher(checkpoints, interval_ms: int):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    p = subprocess.Popen([DELTACAST, "publish", "--listen", endpoint, "--interval-ms", str(interval_ms), "--linger-ms", "30000",
                          "--log-level", "warn", *map(str, checkpoints)])
    return endpoint, p


@pytest.fixture
def publisher(checkpoints):
    endpoint, p = start_publisher(checkpoints, 300)
    yield endpoint
    p.terminate()
    p.wait(timeout=30)


@pytest.fixture
def slow_publisher(checkpoints):
    """Publishes a version a second: a worker that joined at once gets every delta."""
    endpoint, p = start_publisher(checkpoints, 1000)
    yield endpoint
    p.terminate()
    p.wait(timeout=30)


def as_int(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits, for bit-exact comparison (NaN payloads, -0)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def test_a_worker_exposes_every_tensor_bit_for_bit(publisher, checkpoints):
    with deltacast.Worker("py-worker", [publisher]) as w:
        v = w.wait(len(checkpoints), timeout=60)
        assert v.number == len(checkpoints)
        assert v.base_number == len(checkpoints) - 1
        assert 0 < v.ready_us <= time.monotonic_ns() // 1000  # the same clock as Python's monotonic
        expected = read_safetensors(checkpoints[-1])
        got = dict(v.numpy_tensors())
        assert set(got) == set(expected)
        for name, (dtype, raw) in expected.items():
            assert got[name].tobytes() == raw, name
        tensors = dict(v.tensors())
        bf16 = [n for n, (dt, _) in expected.items() if dt == "BF16"]
        assert bf16
        for name in bf16:
            assert tensors[name].dtype == torch.bfloat16
            assert tensors[name].view(torch.int16).numpy().tobytes() == expected[name][1]


def test_a_worker_of_a_multi_tree_fleet_takes_one_link_per_tree(publisher, checkpoints):
    # Both trees from the origin: chunk i comes down link i mod 2, and the version is whole.
    with deltacast.Worker("py-trees", trees=[[publisher], [publisher]]) as w:
        v = w.wait(len(checkpoints), timeout=60)
        expected = read_safetensors(checkpoints[-1])
        assert {n: t.tobytes() for n, t in v.numpy_tensors()} == {n: raw for n, (_, raw) in expected.items()}
    with pytest.raises(deltacast.Error, match="trees: 2 to 8"):
        deltacast.Worker("w", trees=[[publisher]])
    with pytest.raises(deltacast.Error, match="not both"):
        deltacast.Worker("w", [publisher], trees=[[publisher], [publisher]])
    with pytest.raises(deltacast.Error, match="parents: at most 16"):
        deltacast.Worker("w", [publisher] * 17)
    with pytest.raises(deltacast.Error, match="same shape"):
        deltacast.Worker("w", trees=[[publisher], [publisher]], tree_parent_keys=[["k"]])


def test_a_worker_runs_from_the_config_fleet_init_wrote(processes, checkpoints, tmp_path):
    # Two trees over an origin and two relays, CURVE on every link, versions signed: the worker
    # takes its parents per tree, its keys and the trust key from its config file alone.
    ports = [free_port() for _ in range(3)]
    subprocess.run([DELTACAST, "fleet-init", "-o", str(tmp_path), "--origin", f"tcp://127.0.0.1:{ports[0]}",
                    "--relay", f"eu=tcp://127.0.0.1:{ports[1]}", "--relay", f"ap=tcp://127.0.0.1:{ports[2]}",
                    "--workers-per-relay", "1", "--trees", "2"], check=True, capture_output=True)
    config = json.loads((tmp_path / "eu.w0.json").read_text())
    assert len(config["trees"]) == 2 and config["tree_parent_keys"] and config["trust_keys"]
    processes.start(DELTACAST, "publish", "--config", tmp_path / "origin.json", "--interval-ms", "300", "--linger-ms", "30000",
                    "--log-level", "warn", *checkpoints)
    for relay in ("eu.relay-0", "ap.relay-0"):
        processes.start(DELTACAST, "relay", "--config", tmp_path / f"{relay}.json", "--log-level", "warn")
    with deltacast.Worker.from_config(tmp_path / "eu.w0.json") as w:
        v = w.wait(len(checkpoints), timeout=60)
        expected = read_safetensors(checkpoints[-1])
        assert {n: t.tobytes() for n, t in v.numpy_tensors()} == {n: raw for n, (_, raw) in expected.items()}
    # Without the parents' keys the CURVE handshake cannot start: the config does not check.
    del config["tree_parent_keys"]
    (tmp_path / "broken.json").write_text(json.dumps(config))
    with pytest.raises(deltacast.Error, match="tree_parent_keys"):
        deltacast.Worker.from_config(tmp_path / "broken.json")
    (tmp_path / "unknown.json").write_text(json.dumps({**config, "parnets": []}))
    with pytest.raises(deltacast.Error, match='unknown field "parnets"'):
        deltacast.Worker.from_config(tmp_path / "unknown.json")


def test_views_are_zero_copy_and_outlive_the_worker(publisher, checkpoints):
    w = deltacast.Worker("py-worker", [publisher])
    v = w.wait(1, timeout=60)
    image = np.frombuffer(v._native, dtype=np.uint8)
    lo, hi = image.ctypes.data, image.ctypes.data + image.nbytes
    name, t = next(iter(v.tensors()))
    assert lo <= t.data_ptr() < hi
    first = t.clone()
    w.close()
    del v, image
    assert (t == first).all()  # the version's memory is still there


def test_a_wait_times_out_and_bad_arguments_raise(publisher):
    with deltacast.Worker("py-worker", [publisher]) as w:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            w.wait(10_000, timeout=0.5)
        assert time.monotonic() - start < 5
    with pytest.raises(deltacast.Error):
        deltacast.Worker("", [publisher])
    with pytest.raises(deltacast.Error, match="closed"):
        w.current()


def test_verify_names_the_tensors_that_differ(publisher, checkpoints):
    with deltacast.Worker("py-worker", [publisher]) as w:
        v = w.wait(len(checkpoints), timeout=60)
        model = {name: t.clone() for name, t in v.tensors()}  # a copy, as a model would hold
        assert v.verify(model) == []
        assert v.verify({n: a.copy() for n, a in v.numpy_tensors()}) == []
        names = sorted(model)
        flipped, reshaped = names[0], names[1]
        model[flipped].view(-1).view(torch.int16 if model[flipped].element_size() == 2 else torch.uint8)[0] ^= 1
        model[reshaped] = model[reshaped].reshape(-1)
        model["no-such-tensor"] = torch.zeros(1)
        assert sorted(v.verify(model)) == sorted([flipped, reshaped, "no-such-tensor"])


def test_tensors_by_name_from_any_iterable(publisher, checkpoints):
    with deltacast.Worker("py-worker", [publisher]) as w:
        v = w.wait(1, timeout=60)
        wanted = v.names()[:3]
        assert [n for n, _ in v.tensors(n for n in wanted)] == wanted  # a generator is read once
        assert [n for n, _ in v.numpy_tensors(iter(wanted))] == wanted
        with pytest.raises(KeyError):
            next(v.tensors(["no-such-tensor"]))


def test_patches_turn_every_older_version_into_the_newest(slow_publisher, checkpoints):
    with deltacast.Worker("py-worker", [slow_publisher], change_history=8) as w:
        first = w.wait(1, timeout=60)
        v = w.wait(len(checkpoints), timeout=60)
        reach = v._native.changes_since
        assert reach <= first.number < v.number  # it got every delta since it joined
        newest = {n: torch.frombuffer(bytearray(raw), dtype=torch.uint8) for n, (_, raw) in read_safetensors(checkpoints[-1]).items()}
        changed_any = False
        for since in range(reach, v.number):
            # A model at version `since`, as an engine would hold it (its own writable copy).
            model = {name: t.clone() for name, t in _load(checkpoints[since - 1])}
            count = 0
            for name, idx, values in v.patches(since=since):
                assert idx.dtype == torch.int64 and values.dtype == model[name].dtype
                model[name].view(-1).index_copy_(0, idx, values)
                count += idx.numel()
            changed_any |= count > 0
            for name, t in model.items():
                assert torch.equal(as_int(t).reshape(-1).view(torch.uint8), newest[name]), (since, name)
            shapes = {name: t.shape for name, t in v.tensors()}
            assert v.verify({name: t.reshape(shapes[name]) for name, t in model.items()}) == []
        assert changed_any
        with pytest.raises(deltacast.Error, match="load tensors"):
            v.patches(since=reach - 1)  # beyond what the worker kept (or 0: came whole)
        with pytest.raises(ValueError):
            v.patches(since=v.number + 1)
        assert all(idx.numel() == 0 for _, idx, _ in v.patches(since=v.number))


def test_a_worker_without_change_history_has_no_patches(publisher, checkpoints):
    with deltacast.Worker("py-worker", [publisher], change_history=0) as w:
        v = w.wait(len(checkpoints), timeout=60)
        with pytest.raises(deltacast.Error, match="load tensors"):
            v.patches()


def _load(path: Path):
    """(name, torch tensor) of a safetensors file, read independently of deltacast."""
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "I64": torch.int64, "I32": torch.int32,
              "U8": torch.uint8, "I8": torch.int8, "BOOL": torch.bool, "F64": torch.float64, "I16": torch.int16}
    for name, (dtype, raw) in read_safetensors(path).items():
        yield name, torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtypes[dtype])


def test_ctrl_c_interrupts_a_wait(tmp_path):
    """A wait with no time limit ends with KeyboardInterrupt soon after SIGINT (the GIL is released
    while waiting, and the wait wakes every 100 ms to let Python see the signal)."""
    script = tmp_path / "wait.py"
    script.write_text(
        "import sys, time, deltacast\n"
        "w = deltacast.Worker('waiter', ['tcp://127.0.0.1:%d'])\n"
        "pub = deltacast.Publisher('tcp://127.0.0.1:0')\n"
        "pub.publish({'x': __import__('torch').zeros(3)})\n"
        "for wait in (lambda: w.wait(), lambda: pub.wait_ready(1, min_workers=5)):\n"
        "    print('waiting', flush=True)\n"
        "    start = time.monotonic()\n"
        "    try:\n"
        "        wait()\n"
        "    except KeyboardInterrupt:\n"
        "        print(f'interrupted after {time.monotonic() - start:.2f} s', flush=True)\n"
        "w.close(); pub.close()\n" % free_port())
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    lines = []
    for _ in range(2):
        line = p.stdout.readline()
        assert line.startswith("waiting"), line
        time.sleep(0.5)
        sent = time.monotonic()
        p.send_signal(2)  # SIGINT, as Ctrl-C
        line = p.stdout.readline()
        assert line.startswith("interrupted"), line
        assert time.monotonic() - sent < 2.0
        lines.append(line)
    assert p.wait(timeout=30) == 0


def test_views_made_in_cpp_match_the_python_ones_for_every_dtype():
    # Both makers of tensors(): deltacast._torch_views (built whenever libtorch-dev is there, as the
    # test setup installs it) and the Python fallback. Odd sizes put later tensors off their alignment.
    assert deltacast._views_in_cpp(), "deltacast._torch_views was not built or not loaded"
    g = torch.Generator().manual_seed(3)
    named = [("flags", torch.tensor([True, False, True])), ("u8", torch.randint(0, 255, (5,), dtype=torch.uint8, generator=g)),
             ("bf16", torch.randn(3, 7, generator=g).to(torch.bfloat16)), ("i8", torch.tensor([-1, 2, -3], dtype=torch.int8)),
             ("f64", torch.randn(2, 3, generator=g, dtype=torch.float64)), ("scalar", torch.tensor(2.5)),
             ("empty", torch.zeros(0, 4, dtype=torch.float16)), ("u16", np.arange(7, dtype=np.uint16) * 9000),
             ("u32", np.arange(3, dtype=np.uint32) << 30), ("u64", np.array([1 << 63, 5], dtype=np.uint64)),
             ("i16", torch.tensor([[-7, 7]], dtype=torch.int16)), ("i32", torch.tensor([-(1 << 31)], dtype=torch.int32)),
             ("i64", torch.tensor([[1], [-1]], dtype=torch.int64)), ("f16", torch.randn(4, generator=g).half()),
             ("f32", torch.randn(2, 2, 2, generator=g))]
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("w", [pub.listening]) as w:
        pub.publish(named)
        v = w.wait(1, timeout=30)
        cpp, py = list(v.tensors()), list(v._python_tensors())
        assert [n for n, _ in cpp] == [n for n, _ in py] == [n for n, _ in named]
        for (name, a), (_, b), (_, src) in zip(cpp, py, named):
            assert (a.dtype, a.shape, a.stride(), a.data_ptr()) == (b.dtype, b.shape, b.stride(), b.data_ptr()), name
            assert a.is_contiguous() and a.device.type == "cpu" and not a.requires_grad, name
            src = torch.from_numpy(src.view(f"int{src.itemsize * 8}")) if isinstance(src, np.ndarray) else src
            assert as_int(a).numpy().tobytes() == as_int(src).numpy().tobytes(), name
        picked = list(v.tensors(["f32", "u8", "f32"]))
        assert [n for n, _ in picked] == ["f32", "u8", "f32"] and picked[0][1].data_ptr() == dict(cpp)["f32"].data_ptr()
        with pytest.raises(KeyError, match="nope"):
            v.tensors(["u8", "nope"])
