"""The vLLM and SGLang adapters against stand-ins of their engines' contracts (tests/fakes), with a
model whose loader fuses q/k/v and gate/up and keeps one tensor-parallel rank's slice."""

import signal
import time

import pytest
import torch

import deltacast
import deltacast.sglang
import deltacast.vllm
from conftest import CORRUPTING_RELAY, DELTACAST, free_endpoint
from fake_models import FakeLlama, hf_state_dict, same_bits, step
from sglang.srt.model_executor.model_runner import ModelRunner, ServerArgs
from vllm.config import VllmConfig
from vllm.config.parallel import ParallelConfig
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer import base as vllm_base
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.plugins import load_general_plugins


def vllm_engine(parents, tp_size=1, tp_rank=0, **init):
    """An engine as vLLM's GPU worker makes it: plugins loaded, the factory, init_transfer_engine."""
    load_general_plugins()
    model = FakeLlama(tp_size, tp_rank)
    config = VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=tp_size, rank=tp_rank))
    engine = WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend="deltacast"), config, torch.device("cpu"), model)
    engine.init_transfer_engine(engine.parse_init_info({"parents": parents, "worker_id": f"vllm-tp{tp_rank}", **init}))
    return engine, model


def vllm_update(engine, version, timeout_s=30.0):
    """One update as vLLM runs it."""
    engine.start_weight_update()
    engine.update_weights({"version": version, "timeout_s": timeout_s})
    engine.finish_weight_update()


def test_the_vllm_plugin_registers_the_backend_from_its_entry_point():
    assert "deltacast" in load_general_plugins()
    load_general_plugins()  # every vLLM process loads plugins; twice is harmless
    engine, _ = vllm_engine([free_endpoint()])
    assert isinstance(engine, deltacast.vllm.DeltacastWeightTransferEngine)
    engine.shutdown()


def test_vllm_tensor_parallel_ranks_follow_every_version_bit_for_bit():
    sd = hf_state_dict()
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        engines = [vllm_engine([pub.listening], tp_size, rank) for tp_size, rank in ((1, 0), (2, 0), (2, 1))]
        try:
            for version in range(1, 5):
                if version > 1:
                    step(sd, version)
                vllm_base.CALLS.clear()
                assert deltacast.vllm.DeltacastWeightTransferEngine.trainer_send_weights(iter(sd.items()), {"publisher": pub}) == version
                for engine, model in engines:
                    vllm_update(engine, version)
                    assert same_bits(model, sd) == [], (version, model.tp_size, model.tp_rank)
                    stats = engine.updater.last_stats
                    assert stats["version"] == version
                    if version == 1:
                        assert stats["from"] is None and stats["patched_tensors"] == 0
                    else:
                        # Norms (and, unsliced, the other unfused layers) take just the changed values
                        # in place; fused and sliced ones go through load_weights.
                        assert stats["from"] == version - 1 and stats["patched_tensors"] > 0 and stats["loaded_tensors"] > 0
                        assert stats["patched_values"] < sum(t.numel() for t in sd.values()) / 10
                assert vllm_base.CALLS == ["update_weights", "synchronize"] * len(engines)
            tp1 = engines[0][0].updater.last_stats
            assert tp1["patched_tensors"] > engines[1][0].updater.last_stats["patched_tensors"]
        finally:
            for engine, _ in engines:
                engine.shutdown()


def test_sglang_custom_loader_applies_versions_in_every_tp_worker():
    sd = hf_state_dict(seed=3)
    loader = "deltacast.sglang.load_weights"
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        deltacast.sglang.configure([pub.listening], worker_id="sglang-worker", timeout_s=30)
        try:
            runners = [ModelRunner(FakeLlama(2, rank), ServerArgs(tp_size=2, custom_weight_loader=[loader]), rank) for rank in (0, 1)]
            for version in range(1, 4):
                if version > 1:
                    step(sd, 10 + version)
                assert pub.publish(sd) == version
                for runner in runners:  # SGLang's scheduler does this in each TP process
                    assert runner.update_weights_from_tensor(deltacast.sglang.request(version), load_format=loader) == (True, "Success")
                    assert same_bits(runner.model, sd) == []
            with pytest.raises(ValueError, match="deltacast.version"):
                runners[0].update_weights_from_tensor([("model.norm.weight", torch.zeros(3))], load_format=loader)
            with pytest.raises(ValueError):
                deltacast.sglang.request(0)
        finally:
            deltacast.sglang.shutdown()


# ---- failure semantics -------------------------------------------------------------------------


def params_of(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def unchanged(model, before) -> bool:
    return all(torch.equal(p.detach().view(torch.int16), before[name].view(torch.int16)) for name, p in model.named_parameters())


def start_relay(processes, parent, relay_id="relay"):
    endpoint = free_endpoint()
    p = processes.start(DELTACAST, "relay", "--id", relay_id, "--listen", endpoint, "--parent", parent, "--log-level", "warn")
    return endpoint, p


def test_a_dead_relay_leaves_the_model_at_its_version_and_a_fallback_parent_finishes(processes):
    sd = hf_state_dict(seed=5)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        relay, relay_proc = start_relay(processes, pub.listening)
        only_relay, model_a = vllm_engine([relay])
        with_fallback, model_b = vllm_engine([relay, pub.listening], worker_id="vllm-fallback")
        try:
            pub.publish(sd)
            for engine in (only_relay, with_fallback):
                vllm_update(engine, 1)
            # The relay freezes with version 2 on its way through it, then dies.
            relay_proc.send_signal(signal.SIGSTOP)
            step(sd, 6)
            pub.publish(sd)
            time.sleep(0.3)
            relay_proc.kill()
            relay_proc.wait()
            before, loads = params_of(model_a), model_a.load_calls
            start = time.monotonic()
            with pytest.raises(deltacast.vllm.UpdateError, match="unchanged at version 1") as e:
                vllm_update(only_relay, 2, timeout_s=2.0)
            assert e.value.model_version == 1
            assert time.monotonic() - start < 15
            assert unchanged(model_a, before) and model_a.load_calls == loads
            vllm_update(with_fallback, 2)
            assert same_bits(model_b, sd) == []
        finally:
            only_relay.shutdown()
            with_fallback.shutdown()


def test_corrupt_chunks_are_fetched_again_and_never_applied(processes, tmp_path):
    sd = hf_state_dict(seed=7)
    with deltacast.Publisher("tcp://127.0.0.1:0", chunk_bytes=16 << 10) as pub:
        relay = free_endpoint()
        log = tmp_path / "corrupting_relay.log"
        with open(log, "w") as f:
            processes.start(CORRUPTING_RELAY, "corrupting-relay", relay, pub.listening, 5, stderr=f)
        engine, model = vllm_engine([relay])
        try:
            for version in range(1, 4):
                if version > 1:
                    step(sd, 20 + version)
                pub.publish(sd)
                vllm_update(engine, version)
                assert same_bits(model, sd) == []
            assert "corrupted chunk" in log.read_text()
        finally:
            engine.shutdown()


def test_an_unreachable_parent_times_out_without_touching_the_model():
    engine, model = vllm_engine([free_endpoint()])
    try:
        before = params_of(model)
        with pytest.raises(deltacast.vllm.UpdateError, match="did not verify"):
            vllm_update(engine, 1, timeout_s=1.0)
        assert unchanged(model, before) and model.load_calls == 0
    finally:
        engine.shutdown()


def test_a_worker_whose_saved_version_was_damaged_never_exposes_it(tmp_path):
    sd = hf_state_dict(seed=9)
    state = tmp_path / "state"
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        engine, _ = vllm_engine([pub.listening], state_dir=str(state))
        pub.publish(sd)
        vllm_update(engine, 1)
        engine.shutdown()
        saved = sorted(state.glob("*.safetensors"))
        assert saved
        data = bytearray(saved[-1].read_bytes())
        data[-100] ^= 0x01  # a flipped bit in the saved image: a wrong base for the next delta
        saved[-1].write_bytes(bytes(data))
        step(sd, 10)
        pub.publish(sd)
        engine, model = vllm_engine([pub.listening], state_dir=str(state))
        try:
            vllm_update(engine, 2)
            assert same_bits(model, sd) == []
        finally:
            engine.shutdown()


def test_bad_arguments_raise_before_anything_starts():
    engine, model = vllm_engine([free_endpoint()])
    try:
        with pytest.raises(ValueError, match="parent"):
            engine.parse_init_info({"parents": []})
        with pytest.raises(ValueError, match="Invalid init_info"):
            engine.parse_init_info({"no_such_option": 1})
        with pytest.raises(ValueError, match="count from 1"):
            engine.update_weights({"version": 0})
        with pytest.raises(ValueError, match="Invalid update_info"):
            engine.update_weights({"step": 3})
        assert model.load_calls == 0
    finally:
        engine.shutdown()
