"""Exact versions, identity and failures of the engine adapters (vLLM's stand-ins in this
process; tests/test_engines.py drives both engines across processes)."""

import signal
import time

import pytest
import torch

import deltacast
import deltacast.vllm
from conftest import CORRUPTING_RELAY, DELTACAST, free_endpoint
from deltacast.engine import UpdateError
from engine_util import Rank, eventually, params_of, unchanged
from fake_models import llama_checkpoint, make_llama, step


def publish_series(pub, sd, versions, seed=0):
    """Publishes `versions` steps of `sd`; returns a copy of the checkpoint of each version."""
    out = {}
    for _ in range(versions):
        step(sd, seed + pub.version + 1)
        out[pub.publish(sd)] = {n: t.clone() for n, t in sd.items()}
    return out


def test_a_rank_applies_exactly_the_version_asked_for_however_many_newer_ones_came():
    sd = llama_checkpoint(seed=11)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        r = Rank(make_llama, llama_checkpoint(seed=90), [pub.listening], 2, 1, worker_id="exact")
        try:
            ckpt = publish_series(pub, sd, 1)
            r.update(pub.request(1).as_dict())
            ckpt.update(publish_series(pub, sd, 6))  # 2..7 arrive while the model holds 1
            r.engine.worker.wait(7, timeout=20)
            r.update(pub.request(3).as_dict())  # read back from the worker's history
            assert r.stats["version"] == 3 and r.stats["from"] == 1 and r.stats["path"] == "in place"
            assert r.wrong(ckpt[3]) == []
            # The version the model holds keeps the history from going: 12 more versions later,
            # version 4 is still there (change_history is 4).
            ckpt.update(publish_series(pub, sd, 12))
            r.engine.worker.wait(19, timeout=20)
            r.update(pub.request(4).as_dict())
            assert r.wrong(ckpt[4]) == []
            # A plain {"version": N} means N of the run the worker follows.
            r.update({"version": 19})
            assert r.wrong(ckpt[19]) == [] and r.engine.updater.run == pub.run
            # Asked again for what it holds: nothing to do.
            before = params_of(r.model)
            r.update({"version": 19, "run": pub.run})
            assert unchanged(r.model, before)
        finally:
            r.close()


def test_an_older_version_or_one_of_a_run_the_worker_left_is_refused_saying_what_the_model_holds():
    sd = llama_checkpoint(seed=12)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        r = Rank(make_llama, llama_checkpoint(seed=91), [pub.listening], worker_id="older")
        try:
            ckpt = publish_series(pub, sd, 4)
            r.update(pub.request(3).as_dict())
            before = params_of(r.model)
            with pytest.raises(UpdateError, match=f"older than version 3 of run {pub.run}, which the model holds") as e:
                r.update(pub.request(2).as_dict())
            assert (e.value.model_version, e.value.model_run) == (3, pub.run)
            assert unchanged(r.model, before)
            with pytest.raises(UpdateError, match="moved to run"):
                r.update({"version": 4, "run": "1-0000000000000001"})  # an older run than the worker's
            with pytest.raises(ValueError, match="not a run id"):
                r.update({"version": 4, "run": "yesterday"})
            assert unchanged(r.model, before)
            r.update(pub.request(4).as_dict())  # the update state is usable afterwards
            assert r.wrong(ckpt[4]) == []
        finally:
            r.close()


def test_a_version_the_history_no_longer_reaches_is_refused_and_the_model_kept():
    sd = llama_checkpoint(seed=13)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        r = Rank(make_llama, llama_checkpoint(seed=92), [pub.listening], worker_id="gone", change_history=2,
                 change_history_bytes=64 << 10)  # about two versions of this model's changes
        try:
            publish_series(pub, sd, 1)
            r.update(pub.request(1).as_dict())
            before = params_of(r.model)
            publish_series(pub, sd, 8)
            r.engine.worker.wait(9, timeout=20)
            with pytest.raises(UpdateError, match="is gone: the worker holds version 9 and keeps versions back to") as e:
                r.update(pub.request(3).as_dict())
            assert e.value.model_version == 1 and unchanged(r.model, before)
        finally:
            r.close()


def test_a_restarted_trainer_is_never_raced(processes):
    # The trainer restarts on the same endpoint: its new run counts from 1 again. A request for
    # version 1 of the new run sent right away waits for it, instead of returning the old run's.
    endpoint = free_endpoint()
    sd = llama_checkpoint(seed=14)
    pub = deltacast.Publisher(endpoint)
    r = Rank(make_llama, llama_checkpoint(seed=93), [endpoint], worker_id="restart")
    try:
        old = publish_series(pub, sd, 3)
        old_run = pub.run
        r.update(pub.request(3).as_dict())
        assert r.wrong(old[3]) == []
        pub.close()
        pub = deltacast.Publisher(endpoint)  # the restarted trainer
        new_sd = llama_checkpoint(seed=15)
        request = {"version": 1, "run": pub.run}
        import threading

        late = threading.Timer(1.5, lambda: pub.publish(new_sd))  # published after the request went out
        late.start()
        r.update(request)
        late.join()
        assert r.engine.updater.run == pub.run and r.engine.updater.version == 1
        assert r.wrong(new_sd) == []
        # The old run's versions are refused from now on.
        with pytest.raises(UpdateError, match="moved to run"):
            r.update({"version": 3, "run": old_run})
    finally:
        r.close()
        pub.close()


def test_default_ids_differ_between_instances_on_a_host_and_hold_across_restarts(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        a = Rank(make_llama, llama_checkpoint(), [pub.listening], 2, 0, gpu=0)
        b = Rank(make_llama, llama_checkpoint(), [pub.listening], 2, 0, gpu=2)  # another instance, GPUs 6 and 7
        try:
            ids = {a.engine.worker_id(), b.engine.worker_id()}
            assert len(ids) == 2 and all(i.endswith(("-vllm-gpu4", "-vllm-gpu6")) for i in ids)
            a_id = a.engine.worker_id()
        finally:
            a.close()
            b.close()
        again = Rank(make_llama, llama_checkpoint(), None, 2, 0, gpu=0)  # a restarted instance, same GPUs
        assert again.engine.worker_id() == a_id
        # A given id is extended per rank.
        assert again.engine.worker_id("rollout") == "rollout-dp0-r0"


def test_a_second_live_worker_claiming_an_id_is_refused_and_shows_in_the_ledger():
    sd = llama_checkpoint(seed=16)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        pub.publish(sd)
        first = Rank(make_llama, llama_checkpoint(), [pub.listening], worker_id="dup")
        second = Rank(make_llama, llama_checkpoint(), [pub.listening], worker_id="dup")
        try:
            first.update(pub.request().as_dict())
            before = params_of(second.model)
            with pytest.raises(UpdateError, match="held by another live process"):
                second.update(pub.request().as_dict(), timeout_s=10)
            assert unchanged(second.model, before)
            assert eventually(lambda: (pub.ledger()["dup-dp0-r0"]["model"] or {}).get("version") == 1)  # the first one's
            entry = pub.ledger()["dup-dp0-r0"]
            assert entry["duplicates"] >= 1 and "held by another live process" in entry["last_error"]
        finally:
            first.close()
            second.close()


def test_init_twice_replaces_the_worker_and_a_state_dir_has_one_live_user(tmp_path):
    sd = llama_checkpoint(seed=17)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        pub.publish(sd)
        r = Rank(make_llama, llama_checkpoint(), [pub.listening], worker_id="twice", state_dir=str(tmp_path))
        try:
            first = r.engine.worker
            r.worker.init_weight_transfer_engine({"parents": [pub.listening], "worker_id": "twice", "state_dir": str(tmp_path)})
            assert r.engine.worker is not first
            with pytest.raises(deltacast.Error, match="closed"):
                first.current()
            r.update(pub.request().as_dict())
            assert r.wrong(sd) == []
            # Another engine pointed at the same state dir under the same id is refused at init.
            with pytest.raises(deltacast.Error, match="in use by another live worker"):
                Rank(make_llama, llama_checkpoint(), [pub.listening], worker_id="twice", state_dir=str(tmp_path))
        finally:
            r.close()


def test_wait_ready_names_a_worker_whose_model_could_not_apply_a_version():
    sd = llama_checkpoint(seed=18)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        good = Rank(make_llama, llama_checkpoint(), [pub.listening], worker_id="good")
        bad = Rank(make_llama, llama_checkpoint(), [pub.listening], worker_id="bad")
        try:
            pub.publish(sd)
            v1 = {n: t.clone() for n, t in sd.items()}
            good.update(pub.request().as_dict())
            bad.update(pub.request().as_dict())
            assert pub.wait_ready(1, min_workers=2, timeout=20).workers_ready == 2
            step(sd, 1)
            pub.publish(sd)
            good.update(pub.request().as_dict())
            calls = []

            def out_of_memory_once(weights):
                calls.append(1)
                if len(calls) == 1:
                    next(iter(weights))  # part of the way in
                    raise RuntimeError("CUDA out of memory")
                return bad.model.load_weights(weights)

            # The engine's own loader fails once on this rank (every changed tensor goes through
            # it); putting the version it held back goes through it again and works.
            bad.engine.updater._load_weights = out_of_memory_once
            bad.engine.updater.placement = deltacast.engine.Placement.none("the test's")
            bad.engine.updater.reload = None
            with pytest.raises(UpdateError, match="CUDA out of memory"):
                bad.update(pub.request().as_dict())
            with pytest.raises(deltacast.Error, match=r"version 2 could not be applied by bad-dp0-r0 \(.*could not apply it"):
                pub.wait_ready(2, min_workers=2, timeout=20)
            ledger = pub.ledger()
            assert ledger["bad-dp0-r0"]["model"]["version"] == 1 and ledger["bad-dp0-r0"]["model"]["failed_version"] == 2
            assert bad.engine.updater.version == 1 and bad.wrong(v1) == []  # put back
            assert ledger["good-dp0-r0"]["model"]["version"] == 2
        finally:
            good.close()
            bad.close()


# ---- failures on the way --------------------------------------------------------------------


def start_relay(processes, parent, relay_id="relay"):
    endpoint = free_endpoint()
    p = processes.start(DELTACAST, "relay", "--id", relay_id, "--listen", endpoint, "--parent", parent, "--log-level", "warn")
    return endpoint, p


def test_a_dead_relay_leaves_the_model_at_its_version_and_a_fallback_parent_finishes(processes):
    sd = llama_checkpoint(seed=5)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        relay, relay_proc = start_relay(processes, pub.listening)
        only_relay = Rank(make_llama, llama_checkpoint(), [relay], worker_id="only-relay")
        with_fallback = Rank(make_llama, llama_checkpoint(), [relay, pub.listening], worker_id="fallback")
        try:
            pub.publish(sd)
            for r in (only_relay, with_fallback):
                r.update(pub.request().as_dict())
            relay_proc.send_signal(signal.SIGSTOP)  # it freezes with version 2 on its way through it, then dies
            step(sd, 6)
            pub.publish(sd)
            time.sleep(0.3)
            relay_proc.kill()
            relay_proc.wait()
            before = params_of(only_relay.model)
            start = time.monotonic()
            with pytest.raises(UpdateError, match="did not verify within 2.0 s") as e:
                only_relay.update(pub.request().as_dict(), timeout_s=2.0)
            assert e.value.model_version == 1 and "keeps version 1" in str(e.value)
            assert time.monotonic() - start < 15
            assert unchanged(only_relay.model, before)
            with_fallback.update(pub.request().as_dict())
            assert with_fallback.wrong(sd) == []
        finally:
            only_relay.close()
            with_fallback.close()


def test_corrupt_chunks_are_fetched_again_and_never_applied(processes, tmp_path):
    sd = llama_checkpoint(seed=7)
    with deltacast.Publisher("tcp://127.0.0.1:0", chunk_bytes=16 << 10) as pub:
        relay = free_endpoint()
        log = tmp_path / "corrupting_relay.log"
        with open(log, "w") as f:
            processes.start(CORRUPTING_RELAY, "corrupting-relay", relay, pub.listening, 5, stderr=f)
        r = Rank(make_llama, llama_checkpoint(), [relay], worker_id="corrupt")
        try:
            for version in range(1, 4):
                if version > 1:
                    step(sd, 20 + version)
                pub.publish(sd)
                r.update(pub.request().as_dict())
                assert r.wrong(sd) == []
            assert "corrupted chunk" in log.read_text()
        finally:
            r.close()


def test_an_unreachable_parent_times_out_without_touching_the_model():
    r = Rank(make_llama, llama_checkpoint(), [free_endpoint()], worker_id="unreachable")
    try:
        before = params_of(r.model)
        with pytest.raises(UpdateError, match="did not verify"):
            r.update({"version": 1}, timeout_s=1.0)
        assert unchanged(r.model, before)
        assert r.engine.updater.version is None
    finally:
        r.close()


def test_a_worker_whose_saved_version_was_damaged_never_exposes_it(tmp_path):
    sd = llama_checkpoint(seed=9)
    state = tmp_path / "state"
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        r = Rank(make_llama, llama_checkpoint(), [pub.listening], worker_id="saved", state_dir=str(state))
        pub.publish(sd)
        r.update(pub.request().as_dict())
        r.close()
        saved = sorted(state.glob("*/*.safetensors"))
        assert saved
        data = bytearray(saved[-1].read_bytes())
        data[-100] ^= 0x01  # a flipped bit in the saved image: a wrong base for the next delta
        saved[-1].write_bytes(bytes(data))
        step(sd, 10)
        pub.publish(sd)
        r = Rank(make_llama, llama_checkpoint(), [pub.listening], worker_id="saved", state_dir=str(state))
        try:
            r.update(pub.request().as_dict())
            assert r.wrong(sd) == []
        finally:
            r.close()


def test_bad_arguments_raise_before_anything_starts():
    r = Rank(make_llama, llama_checkpoint(), [free_endpoint()], worker_id="args")
    try:
        engine = r.engine
        before = params_of(r.model)
        with pytest.raises(ValueError, match="parent"):
            engine.parse_init_info({"parents": []})
        with pytest.raises(ValueError, match="Invalid init_info"):
            engine.parse_init_info({"no_such_option": 1})
        with pytest.raises(ValueError, match="count from 1"):
            engine.update_weights({"version": 0})
        with pytest.raises(ValueError, match="Invalid update_info"):
            engine.update_weights({"step": 3})
        with pytest.raises(ValueError, match="a run is a string"):
            engine.update_weights({"version": 1, "run": 7})
        assert unchanged(r.model, before)
    finally:
        r.close()


def test_a_model_whose_loader_cannot_take_the_checkpoint_is_refused_untouched():
    # SGLang's speculative decoding hands the draft model the same request as the target (its
    # EAGLE worker updates the draft runner, then the target's). A draft model's loader cannot
    # take the target's checkpoint: nothing is written into it, and the target is updated.
    import deltacast.sglang
    from fake_models import make_gpt2

    sd = llama_checkpoint(seed=19)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        deltacast.sglang.configure([pub.listening], worker_id="draft-and-target", timeout_s=20)
        try:
            pub.publish(sd)
            draft, target = make_gpt2(), make_llama()
            draft_before, target_before = params_of(draft), params_of(target)
            deltacast.sglang.load_weights(draft, deltacast.sglang.request(pub.request()))  # never raises
            assert unchanged(draft, draft_before)
            deltacast.sglang.load_weights(target, deltacast.sglang.request(pub.request()))
            assert not unchanged(target, target_before)
            from fake_models import same_as_whole_load

            assert same_as_whole_load(target, make_llama, 0, 1, sd) == []
            assert eventually(lambda: "cannot load this checkpoint into this model" in pub.ledger()["draft-and-target-r0"]["last_error"])
            assert eventually(lambda: pub.ledger()["draft-and-target-r0"]["model"]["version"] == 1)  # the target's
        finally:
            deltacast.sglang.shutdown()
