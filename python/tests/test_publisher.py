"""The Python publisher and the plain encode and decode functions."""

import os
import subprocess
import time

import numpy as np
import pytest
import torch

import deltacast

# BF16 bit patterns a value-based comparison would get wrong: NaN payloads, -0, infinities and
# subnormals.
SPECIAL_BF16 = [0x7FC1, 0xFFA0, 0x7F81, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x007F, 0x3F80]


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def state_dict(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    special = torch.tensor(SPECIAL_BF16 * 3, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return {
        "embed.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16),
        "special": special.clone(),
        "norm.weight": torch.randn(64, generator=g),
        "steps": torch.arange(5, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "half": torch.randn(7, 3, generator=g).to(torch.float16),
    }


def train_step(sd: dict, step: int) -> None:
    """Changes about 2% of the BF16 values by a few ulps, some special values, and an F32 tensor."""
    g = torch.Generator().manual_seed(100 + step)
    w = sd["embed.weight"].view(-1)
    idx = torch.randint(0, w.numel(), (w.numel() // 50,), generator=g)
    w.view(torch.int16)[idx] += 1
    s = sd["special"].view(torch.int16)
    s[step % s.numel()] ^= 0x0001  # a NaN payload bit, or a subnormal's last bit
    sd["norm.weight"][step % 64] += 0.5
    sd["steps"] += 1


def test_published_versions_reach_a_worker_bit_for_bit_with_their_patches():
    sd = state_dict()
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("w", [pub.listening]) as w:
        held = None  # the worker's own copy, kept current with patches
        for step in range(1, 5):
            if step > 1:
                train_step(sd, step)
            number = pub.publish(sd)
            assert number == step == pub.version
            v = w.wait(number, timeout=30)
            assert v.number == number
            got = dict(v.tensors())
            for name, t in sd.items():
                assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
                assert bits(got[name]) == bits(t), (step, name)
            if held is None:
                held = {name: t.clone() for name, t in got.items()}
            else:
                assert v.base_number == step - 1
                for name, idx, values in v.patches():
                    held[name].view(-1).index_copy_(0, idx, values)
            assert v.verify(held) == []
            delivery = pub.wait_ready(number, timeout=30)
            assert delivery.workers_ready == delivery.workers_wanted == 1
        entry = pub.ledger()["w"]
        assert entry["version"] == 4 and entry["run"] == pub.run and not entry["left"]


def test_numpy_arrays_publish_too():
    arrays = {"u16": np.arange(1000, dtype=np.uint16), "f32": np.linspace(-1, 1, 33, dtype=np.float32).reshape(3, 11)}
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("w", [pub.listening]) as w:
        pub.publish(arrays)
        got = dict(w.wait(1, timeout=30).numpy_tensors())
        for name, a in arrays.items():
            assert got[name].dtype == a.dtype and got[name].shape == a.shape
            assert got[name].tobytes() == a.tobytes()


def test_the_trainer_may_change_its_tensors_once_publish_returns():
    sd = state_dict()
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("w", [pub.listening]) as w:
        pub.publish(sd)
        published = bits(sd["embed.weight"])
        sd["embed.weight"].fill_(7)  # the next optimizer step, in place
        assert bits(dict(w.wait(1, timeout=30).tensors())["embed.weight"]) == published
        pub.publish(sd)  # a delta against what version 1 really was
        assert bits(dict(w.wait(2, timeout=30).tensors())["embed.weight"]) == bits(sd["embed.weight"])


def test_a_changed_layout_goes_out_whole():
    sd = state_dict()
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("w", [pub.listening]) as w:
        pub.publish(sd)
        w.wait(1, timeout=30)
        sd["extra"] = torch.ones(4)
        pub.publish(sd)
        v = w.wait(2, timeout=30)
        assert v.base_number == 0  # an anchor
        assert bits(dict(v.tensors())["extra"]) == bits(sd["extra"])
        with pytest.raises(deltacast.Error, match="load tensors"):
            v.patches()


def test_codec_auto_picks_fewer_bytes_over_a_slow_wan_and_v1_for_busy_workers():
    for wan_rate, cores, expect in (("1Mbit", 1000, "v2"), ("1Tbit", 1, "v1")):
        sd = state_dict()
        with deltacast.Publisher("tcp://127.0.0.1:0", codec="auto", wan_rate=wan_rate, worker_cores=cores) as pub, \
                deltacast.Worker("w", [pub.listening]) as w:
            pub.publish(sd)
            assert pub.last_codec is None  # an anchor
            for step in (2, 3):
                train_step(sd, step)
                pub.publish(sd)
                d = pub.last_codec
                assert d["codec"] == expect, (wan_rate, d)
                assert d["v2_tried"] == (expect == "v2")
                assert d["v3_tried"] == (expect == "v2")  # v3 is tried before v2, and v2 only when v3 is WAN-bound too
                if d["v3_tried"]:
                    assert d["v3_wan_s"] > d["v3_worker_s"]
                if expect == "v2":
                    assert d["v2_wan_s"] < d["v1_wan_s"] and max(d["v2_wan_s"], d["v2_worker_s"]) < d["v1_wan_s"]
                else:
                    assert d["v1_worker_s"] >= d["v1_wan_s"]
                got = dict(w.wait(step, timeout=30).tensors())
                assert all(bits(got[name]) == bits(t) for name, t in sd.items())


def test_publisher_errors_are_clear():
    with pytest.raises(deltacast.Error, match="listen"):
        deltacast.Publisher("")
    with pytest.raises(deltacast.Error, match="codec"):
        deltacast.Publisher("tcp://127.0.0.1:0", codec="v4")
    with pytest.raises(deltacast.Error, match="wan_rate"):
        deltacast.Publisher("tcp://127.0.0.1:0", codec="auto", wan_rate="fast")
    with pytest.raises(ValueError, match="say different things"):
        deltacast.Publisher("tcp://127.0.0.1:0", codec="auto", v2=True)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        with pytest.raises(TypeError, match="not a torch tensor"):
            pub.publish({"x": [1, 2, 3]})
        with pytest.raises(TypeError, match="no safetensors equivalent"):
            pub.publish({"x": torch.zeros(2, dtype=torch.complex64)})
        with pytest.raises(deltacast.Error, match="given twice"):
            pub.publish([("x", torch.zeros(2)), ("x", torch.zeros(2))])
        assert pub.version == 0  # nothing counted
        with pytest.raises(deltacast.Error, match="not published"):
            pub.wait_ready(1, timeout=1)
        pub.publish({"x": torch.zeros(2)})
        with pytest.raises(TimeoutError, match="0 of 3 workers"):
            pub.wait_ready(1, min_workers=3, timeout=0.3)
    with pytest.raises(deltacast.Error, match="closed"):
        pub.publish({"x": torch.zeros(2)})


def test_encode_and_decode_round_trip_bit_for_bit():
    base = state_dict()
    new = {name: t.clone() for name, t in base.items()}
    train_step(new, 1)
    anchor = deltacast.encode_anchor(base)
    delta = deltacast.encode_delta(base, new)
    assert len(delta) < len(anchor) / 5
    for codec_v2 in (False, True):
        decoded = deltacast.decode_delta(base, deltacast.encode_delta(base, new, v2=codec_v2))
        assert {name: bits(t) for name, t in decoded.items()} == {name: bits(t) for name, t in new.items()}
    whole = deltacast.decode_delta(None, anchor)
    assert {name: bits(t) for name, t in whole.items()} == {name: bits(t) for name, t in base.items()}
    numpy_base = {name: t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t for name, t in base.items()}
    assert deltacast.decode_delta(None, deltacast.encode_anchor({"a": numpy_base["embed.weight"]}))["a"].dtype == torch.int16


def test_decode_refuses_a_wrong_base_and_damaged_bytes():
    base = state_dict()
    new = {name: t.clone() for name, t in base.items()}
    train_step(new, 1)
    delta = deltacast.encode_delta(base, new)
    wrong = {name: t.clone() for name, t in base.items()}
    wrong["embed.weight"].view(torch.int16)[5] += 3
    with pytest.raises(deltacast.Error, match="base"):
        deltacast.decode_delta(wrong, delta)
    with pytest.raises(deltacast.Error, match="delta"):
        deltacast.decode_delta(None, delta)
    with pytest.raises(deltacast.Error, match="differ"):
        deltacast.decode_delta({"other": torch.zeros(3)}, delta)
    damaged = bytearray(delta)
    damaged[-10] ^= 0x40
    with pytest.raises(deltacast.Error, match="hash|corrupt"):
        deltacast.decode_delta(base, bytes(damaged))
    with pytest.raises(deltacast.Error):
        deltacast.decode_delta(base, delta[: len(delta) // 2])
    with pytest.raises(deltacast.Error):
        deltacast.decode_delta(base, b"not a deltacast file at all, not even close")
    with pytest.raises(deltacast.Error, match="differ"):
        deltacast.encode_delta(base, {"other": torch.zeros(3)})


def test_tensors_after_odd_sized_ones_are_views_too():
    named = [("flags", torch.tensor([True, False, True])), ("w", torch.arange(6, dtype=torch.int16).view(torch.bfloat16).reshape(2, 3)),
             ("x", torch.arange(5, dtype=torch.float32))]
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("w", [pub.listening]) as w:
        pub.publish(named)
        got = dict(w.wait(1, timeout=30).tensors())
        for name, t in named:  # "w" starts at byte 3, "x" at byte 15: not aligned to their element size
            assert got[name].dtype == t.dtype and got[name].shape == t.shape
            assert bits(got[name]) == bits(t), name


def test_publish_from_several_threads_numbers_every_version_once():
    import threading

    sd = state_dict()
    numbers = []
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        def publish_some():
            for _ in range(5):
                numbers.append(pub.publish(sd))

        threads = [threading.Thread(target=publish_some) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(numbers) == list(range(1, 16)) and pub.version == 15


def test_zero_timeouts_see_what_is_there_and_close_ends_waits_in_other_threads():
    import threading

    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        w = deltacast.Worker("w", [pub.listening])
        pub.publish({"x": torch.zeros(3)})
        assert w.wait(1, timeout=30).number == 1
        assert w.wait(1, timeout=0).number == 1  # already there: no TimeoutError
        assert pub.wait_ready(1, timeout=30).workers_ready == 1
        assert pub.wait_ready(1, timeout=0).workers_ready == 1
        errors = []

        def wait_forever():
            try:
                w.wait(99)
            except deltacast.Error as e:
                errors.append(str(e))

        t = threading.Thread(target=wait_forever)
        t.start()
        time.sleep(0.3)
        w.close()  # another thread is inside wait(): it must end with an error, not crash
        t.join(timeout=10)
        assert not t.is_alive() and errors and "closed" in errors[0]


def test_on_version_follows_an_in_place_worker_and_survives_a_failing_callback():
    sd = state_dict()
    seen, calls = [], []
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub, deltacast.Worker("w", [pub.listening], in_place=True) as w:
        def failing(v):
            calls.append(v.number)
            raise RuntimeError("a callback bug")

        w.on_version(failing)
        w.on_version(lambda v: seen.append(v.number))
        for step in range(1, 4):
            if step > 1:
                train_step(sd, step)
            pub.publish(sd)
            deadline = time.monotonic() + 30
            while (not seen or seen[-1] < step) and time.monotonic() < deadline:
                time.sleep(0.05)
        assert seen and seen[-1] == 3  # the watcher held no version, so the in-place worker moved on
        assert calls and calls[-1] == 3


def test_a_new_run_is_loaded_whole_even_with_the_same_version_number(tmp_path):
    # A ModelUpdater on its own, as a rollout process of one's own uses it: the request names the
    # run, so version 1 of the restarted trainer's run is waited for, not taken from the old run.
    from deltacast.engine import ModelUpdater

    from fake_models import llama_checkpoint, make_llama, same_as_whole_load

    endpoint = f"tcp://127.0.0.1:{__import__('conftest').free_port()}"
    model = make_llama()
    first, second = llama_checkpoint(seed=1), llama_checkpoint(seed=2)
    with deltacast.Worker("w", [endpoint]) as w:
        updater = ModelUpdater(model)
        with deltacast.Publisher(endpoint) as pub:
            pub.publish(first)
            updater.update(w, pub.request(), timeout=30)
            assert same_as_whole_load(model, make_llama, 0, 1, first) == []
        with deltacast.Publisher(endpoint) as pub:  # the trainer restarted: a new run, counting from 1
            pub.publish(second)
            updater.update(w, pub.request(), timeout=30)
            assert updater.run == pub.run and updater.last_stats["path"] == "whole"
            assert same_as_whole_load(model, make_llama, 0, 1, second) == []


def test_a_worker_striped_to_its_parent_gets_every_version_bit_for_bit():
    g = torch.Generator().manual_seed(5)
    named = {f"layer.{i}": torch.randn(512, 512, generator=g).to(torch.bfloat16) for i in range(6)}
    with deltacast.Publisher("tcp://127.0.0.1:0", chunk_bytes=64 << 10) as pub, \
            deltacast.Worker("w", [pub.listening], stripes=4, settings={"stripes_start": 4}) as w:
        for version in (1, 2, 3):
            for t in named.values():
                t.view(-1).view(torch.int16)[:: 7 * version] += 1
            assert pub.publish(named) == version
            got = dict(w.wait(version, timeout=30).tensors())
            for name, t in named.items():
                assert bits(got[name]) == bits(t), (version, name)
    with pytest.raises(deltacast.Error, match="stripes"):
        deltacast.Worker("w", ["tcp://127.0.0.1:9"], stripes=0)


def test_trainer_shards_publishing_rows_merge_into_whole_tensors(processes):
    """Two trainer shards as FSDP or a tensor-parallel export hold the model: each a range of rows
    of the matrices, one a small tensor whole. Neither holds the model; an origin merging them
    serves whole tensors, bit for bit, and a shard whose rows move publishes an anchor."""
    from conftest import DELTACAST, free_endpoint

    origin = free_endpoint()
    log = open(os.devnull, "wb")
    processes.start(DELTACAST, "publish", "--listen", origin, "--expect-shards", "2", stdout=log, stderr=log)
    sd = state_dict()
    whole = {"embed.weight": sd["embed.weight"], "norm.weight": sd["norm.weight"], "proj": torch.randn(50, 16).to(torch.bfloat16)}

    def slices(swapped):
        """Shard 0 holds the first half of the matrices' rows and the norm, shard 1 the rest; swapped,
        the other half each (the same shapes, other rows)."""
        e, p = whole["embed.weight"], whole["proj"]
        halves = [(e[:150], 0, p[:25], 0), (e[150:], 150, p[25:50], 25)]
        (e0, s0, p0, q0), (e1, s1, p1, q1) = halves[::-1] if swapped else halves
        return ({"embed.weight": deltacast.Rows(e0, s0, 300), "norm.weight": whole["norm.weight"], "proj": deltacast.Rows(p0, q0, 50)},
                {"embed.weight": deltacast.Rows(e1, s1, 300), "proj": deltacast.Rows(p1, q1, 50)})

    with deltacast.Publisher(origin=origin, shard=(0, 2)) as s0, deltacast.Publisher(origin=origin, shard=(1, 2)) as s1, \
            deltacast.Worker("w", [origin]) as w:
        for step in range(1, 5):
            if step > 1:
                train_step(sd, step)
                whole["proj"].view(torch.int16)[step] += 1
            a, b = slices(swapped=step >= 4)  # version 4: the shards' rows move
            assert s0.publish(a) == step and s1.publish(b) == step
            v = w.wait(step, timeout=30)
            got = dict(v.tensors())
            assert list(got) == list(whole)  # whole tensors, in the order shard 0 first names them
            for name, t in whole.items():
                assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
                assert bits(got[name]) == bits(t), (step, name)
            assert v.base_number == (step - 1 if 1 < step < 4 else 0), step  # rows moved: an anchor


def test_four_trainer_shards_one_killed_and_restarted_merge_bit_for_bit(processes):
    """Four trainer shards, each its own process, publish dim-0 ranges and whole tensors to an origin
    (a Python Publisher with expect_shards=4). Shard 2 is killed with SIGKILL mid-run and started
    again at the step after the newest merged version, as a trainer resumes from its checkpoint:
    the fleet goes on, and every version the worker exposes is the whole model, bit for bit."""
    import signal
    import sys

    import shard_trainer

    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "shard_trainer.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), here) if p))
    last = 10  # room for the others to run ahead (at most two unmerged versions) before the restart
    seen = {}
    with deltacast.Publisher("tcp://127.0.0.1:0", expect_shards=4) as origin, deltacast.Worker("w", [origin.listening]) as w:
        w.on_version(lambda v: seen.setdefault(v.number, dict(v.tensors())))

        def start(shard, first, step_s):
            return processes.start(sys.executable, script, origin.listening, shard, first, last, "--step-s", step_s, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        for shard in (0, 1, 3):
            start(shard, 1, 0.3)
        doomed = start(2, 1, 0.3)
        w.wait(3, timeout=60)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        time.sleep(1.0)  # the others publish on; their slices wait at the origin
        resume = origin.version + 1
        assert resume <= last - 2, "the shards ran out of steps before the restart: make the test's steps longer"
        start(2, resume, 0.3)
        v = w.wait(last, timeout=90)
        assert v.number == last
    assert last in seen and resume - 1 in seen
    for number, got in seen.items():
        want = shard_trainer.model_at(number)
        assert list(got) == shard_trainer.merged_names(), number
        for name, t in want.items():
            assert got[name].shape == t.shape and bits(got[name]) == bits(t), (number, name)


def test_signed_trainer_shards_merge_only_with_their_own_keys(tmp_path):
    """Each shard signs its slices with its own key; the origin, given the shards' keys in order
    (settings "shard_keys"), merges only slices signed by their shard's key, and signs the merged
    versions with its own key, which the worker trusts. A shard signing with another key adds
    nothing."""
    from conftest import DELTACAST

    def keygen(name):
        out = subprocess.run([DELTACAST, "keygen", "--sign", "-o", str(tmp_path / name)], check=True, capture_output=True, text=True)
        return str(tmp_path / name), out.stdout.strip().split()[-1]

    (origin_key, origin_public), (k0, p0), (k1, p1), (stranger, _) = (keygen(n) for n in ("origin", "s0", "s1", "stranger"))
    whole = {"a": torch.arange(64, dtype=torch.int16).view(torch.bfloat16).reshape(8, 8), "b": torch.ones(5, dtype=torch.bfloat16)}
    with deltacast.Publisher("tcp://127.0.0.1:0", expect_shards=2, sign_key=origin_key, settings={"shard_keys": [p0, p1]}) as origin, \
            deltacast.Worker("w", [origin.listening], trust_keys=[origin_public]) as w:
        with deltacast.Publisher(origin=origin.listening, shard=(0, 2), sign_key=k0) as s0, \
                deltacast.Publisher(origin=origin.listening, shard=(1, 2), sign_key=stranger) as s1:
            s0.publish({"a": deltacast.Rows(whole["a"][:4], 0, 8), "b": whole["b"]}, version=1)
            s1.publish({"a": deltacast.Rows(whole["a"][4:], 4, 8)}, version=1)
            time.sleep(2)
            assert origin.version == 0  # shard 1's slice is not signed by shard 1's key
        with deltacast.Publisher(origin=origin.listening, shard=(0, 2), sign_key=k0) as s0, \
                deltacast.Publisher(origin=origin.listening, shard=(1, 2), sign_key=k1) as s1:
            s0.publish({"a": deltacast.Rows(whole["a"][:4], 0, 8), "b": whole["b"]}, version=2)
            s1.publish({"a": deltacast.Rows(whole["a"][4:], 4, 8)}, version=2)
            got = dict(w.wait(2, timeout=30).tensors())
    assert bits(got["a"]) == bits(whole["a"]) and bits(got["b"]) == bits(whole["b"])


def test_trainer_shard_arguments_are_checked():
    with pytest.raises(deltacast.Error, match="one parent, the origin"):
        deltacast.Publisher(shard=(0, 2))
    with pytest.raises(deltacast.Error, match="the origin has no parent"):
        deltacast.Publisher(origin="tcp://127.0.0.1:1")
    with pytest.raises(deltacast.Error, match="I < N"):
        deltacast.Publisher(origin="tcp://127.0.0.1:1", shard=(2, 2))
    with pytest.raises(ValueError, match="shard=.i, n."):
        deltacast.Publisher(origin="tcp://127.0.0.1:1", shard=2)
    with pytest.raises(deltacast.Error, match="no endpoint to listen on"):
        deltacast.Publisher("tcp://127.0.0.1:0", origin="tcp://127.0.0.1:1", shard=(0, 2))
    with pytest.raises(deltacast.Error, match="different processes"):
        deltacast.Publisher(origin="tcp://127.0.0.1:1", shard=(0, 2), expect_shards=2)
    with pytest.raises(deltacast.Error, match="shard_keys: one per shard"):
        deltacast.Publisher("tcp://127.0.0.1:0", expect_shards=2, settings={"shard_keys": ["00" * 32]})
    # Rows past the whole tensor are refused before anything is sent.
    with deltacast.Publisher(origin="tcp://127.0.0.1:1", shard=(0, 2)) as s:
        with pytest.raises(deltacast.Error, match="past the whole tensor"):
            s.publish({"w": deltacast.Rows(torch.zeros(4, 2), 3, 6)})
