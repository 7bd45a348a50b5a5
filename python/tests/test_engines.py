"""Both engines driven as their users drive them, with ranks in separate processes (one
torch.distributed gloo group per engine): vLLM through ``LLM.collective_rpc``, its HTTP
weight-transfer routes and its trainer API; SGLang through ``Engine.update_weights_from_tensor``
and the HTTP route ``/update_weights_from_tensor`` of a server in a process of its own."""

import functools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

import deltacast
import deltacast.sglang
import deltacast.vllm
from conftest import free_port
from engine_util import eventually
from fake_models import differing, llama_checkpoint, make_llama, reference, step
from sglang.srt.entrypoints.engine import Engine
from vllm.distributed.weight_transfer.base import ModuleSource, VLLMWeightSyncClient
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
from vllm.entrypoints.llm import LLM
from vllm.entrypoints.serve.dev.rlhf import api_router
from vllm.plugins import load_general_plugins

TP = 2
LOADER = "deltacast.sglang.load_weights"


def fingerprint(worker_or_scheduler) -> dict:
    """A rank's parameters as bytes (run inside the engine's process)."""
    model = getattr(worker_or_scheduler, "model", None) or worker_or_scheduler.model_runner.model
    return {n: bytes(p.detach().contiguous().view(torch.uint8).numpy()) for n, p in model.named_parameters()}


def expected(checkpoint, rank) -> dict:
    return fingerprint_of(reference(make_llama, rank, TP, checkpoint))


def fingerprint_of(model) -> dict:
    return {n: bytes(p.detach().contiguous().view(torch.uint8).numpy()) for n, p in model.named_parameters()}


def vllm_held(worker) -> tuple:
    updater = worker.weight_transfer_engine.updater
    return (updater.run, updater.version) if updater else (None, None)


def break_loader_once(worker):
    """Inside a vLLM worker: rank 1's loader fails the next time (every changed tensor then goes
    through it), as a loader that runs out of memory would."""
    if worker.weight_transfer_engine.parallel_config.rank != 1:
        return
    updater = worker.weight_transfer_engine.updater
    loader = updater._load_weights
    updater.placement = deltacast.engine.Placement.none("the test's")
    updater.reload = None

    def failing(weights, calls=[]):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory")
        return loader(weights)

    updater._load_weights = failing


@pytest.fixture
def llm(request):
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
    engine = LLM(make_llama, llama_checkpoint(seed=80), tensor_parallel_size=TP, weight_transfer_config={"backend": "deltacast"})
    yield engine
    engine.shutdown()


def test_vllm_ranks_in_processes_apply_exactly_the_version_asked_for_while_the_trainer_publishes_faster(llm):
    sd = llama_checkpoint(seed=21)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        llm.init_weight_transfer_engine({"init_info": {"parents": [pub.listening], "worker_id": "llm"}})
        ckpt = {}
        # The trainer publishes a version every 20 ms, faster than the engine updates.
        stop = threading.Event()

        def train():
            while not stop.is_set() and pub.version < 40:
                step(sd, pub.version + 1)
                ckpt[pub.publish(sd)] = {n: t.clone() for n, t in sd.items()}
                time.sleep(0.02)

        step(sd, 0)
        ckpt[pub.publish(sd)] = {n: t.clone() for n, t in sd.items()}
        trainer = threading.Thread(target=train)
        trainer.start()
        try:
            asked = []
            for _ in range(4):
                time.sleep(0.15)
                request = pub.request(pub.version - 2 if pub.version > 3 else pub.version)  # sent late: newer ones exist
                asked.append(request.version)
                llm.start_weight_update()
                llm.update_weights({"update_info": {**request.as_dict(), "timeout_s": 30}})
                llm.finish_weight_update()
                held = llm.collective_rpc(vllm_held)
                assert held == [(pub.run, request.version)] * TP, (held, request)
                got = llm.collective_rpc(fingerprint)
                for rank in range(TP):
                    assert got[rank] == expected(ckpt[request.version], rank), (request.version, rank)
        finally:
            stop.set()
            trainer.join()
        assert asked == sorted(asked) and pub.version > asked[-1]

        # A version one rank cannot get (never published): every rank raises, every rank keeps its
        # version. (vLLM's engine core hands the trainer the message only, not the exception.)
        before = llm.collective_rpc(fingerprint)
        llm.start_weight_update()
        with pytest.raises(Exception, match=r"Call to update_weights method failed: .*rank 0 could not get it.*rank 1 could not get it"
                                            r".*The model keeps version (\d+)") as e:
            llm.update_weights({"update_info": {"version": pub.version + 5, "run": pub.run, "timeout_s": 1}})
        assert f"keeps version {asked[-1]} of run" in str(e.value)
        assert llm.collective_rpc(fingerprint) == before
        # One rank's loader fails after both got the version: the other puts its writes back.
        llm.collective_rpc(break_loader_once, args=())
        last = pub.version
        with pytest.raises(Exception, match="could not apply it: RuntimeError: CUDA out of memory"):
            llm.start_weight_update()
            llm.update_weights({"update_info": {"version": last, "run": pub.run, "timeout_s": 30}})
        assert llm.collective_rpc(vllm_held) == [(pub.run, asked[-1])] * TP
        assert llm.collective_rpc(fingerprint) == before
        # ... and the next update goes through on both.
        llm.start_weight_update()
        llm.update_weights({"update_info": {"version": last, "run": pub.run, "timeout_s": 30}})
        llm.finish_weight_update()
        got = llm.collective_rpc(fingerprint)
        assert all(got[rank] == expected(ckpt[last], rank) for rank in range(TP))


def start_sharing_worker(processes, tmp_path, pub) -> str:
    """A CLI worker "host" of `pub` that shares its versions (keeping 8 of change history); its socket."""
    sock = str(tmp_path / "host.sock")
    config = tmp_path / "host.json"
    config.write_text(json.dumps({"id": "host", "parents": [pub.listening], "share": sock, "change_history": 8}))
    processes.start(os.environ.get("DELTACAST_BIN", "deltacast"), "worker", "--config", config, stdout=subprocess.DEVNULL)
    return sock


def test_vllm_ranks_attached_to_their_hosts_one_worker_apply_exactly_the_version_asked_for(llm, processes, tmp_path):
    """One image per host: the CLI worker shares its versions, both ranks attach to it and apply
    an older version than the newest from its change history; the ledger sees one worker."""
    sd = llama_checkpoint(seed=23)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        sock = start_sharing_worker(processes, tmp_path, pub)
        ckpt = {}
        for k in range(6):
            step(sd, k)
            ckpt[pub.publish(sd)] = {n: t.clone() for n, t in sd.items()}
        pub.wait_ready(6, min_workers=1, timeout=60)
        llm.init_weight_transfer_engine({"init_info": {"attach": sock}})
        for version in (4, 6):
            request = pub.request(version)
            llm.start_weight_update()
            llm.update_weights({"update_info": {**request.as_dict(), "timeout_s": 30}})
            llm.finish_weight_update()
            assert llm.collective_rpc(vllm_held) == [(pub.run, version)] * TP
            got = llm.collective_rpc(fingerprint)
            for rank in range(TP):
                assert got[rank] == expected(ckpt[version], rank), (version, rank)
            assert eventually(lambda: (pub.ledger()["host"].get("model") or {}).get("version") == version), pub.ledger()
        assert list(pub.ledger()) == ["host"]


def post(url, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_vllm_http_weight_transfer_routes(llm):
    server = api_router.serve(llm, TP)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    sd = llama_checkpoint(seed=22)
    try:
        with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
            assert post(base + "/init_weight_transfer_engine", {"init_info": {"parents": [pub.listening], "worker_id": "http"}}) == \
                (200, {"message": "Weight transfer initialized"})
            for version in (1, 2):
                step(sd, 30 + version)
                request = deltacast.vllm.DeltacastWeightTransferEngine.trainer_send_weights(iter(sd.items()), {"publisher": pub})
                assert post(base + "/start_weight_update") == (200, {"message": "Weight update started"})
                assert post(base + "/update_weights", {"update_info": request}) == (200, {"message": "Weights updated"})
                assert post(base + "/finish_weight_update") == (200, {"message": "Weight update finished"})
                got = llm.collective_rpc(fingerprint)
                assert all(got[rank] == expected(sd, rank) for rank in range(TP))
            # What goes wrong comes back as vLLM's routes answer it.
            assert post(base + "/update_weights", {"no": 1})[0] == 400
            assert post(base + "/start_weight_update", {"include_draft": True})[1]["error"]["message"].endswith(
                "does not support draft model weight updates.")
            assert post(base + "/start_weight_update")[0] == 200
            status, body = post(base + "/update_weights", {"update_info": {"version": 1, "run": pub.run}})
            assert status == 500 and "older than version 2" in body["error"]["message"]
            assert post(base + "/start_weight_update")[0] == 200
            status, body = post(base + "/update_weights", {"update_info": {"version": 0}})
            assert status == 500 and "count from 1" in body["error"]["message"]  # a plain Exception by then
            # The trainer learns what each rank's model holds from the ledger.
            assert all(entry["model"]["version"] == 2 for entry in pub.ledger().values())
    finally:
        server.shutdown()


class SyncClient:
    """vLLM's VLLMWeightSyncClient (base.py at 02f250b: four methods taking plain dicts) over an LLM."""

    def __init__(self, llm):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self) -> None:
        self.llm.finish_weight_update()


def test_vllm_trainer_api_of_02f250b_publishes_and_asks_for_exactly_that_version(llm):
    load_general_plugins()
    trainer_model = torch.nn.Module()
    sd = llama_checkpoint(seed=23)
    for name, t in sd.items():  # a trainer's module whose parameters carry the checkpoint's names
        parent = trainer_model
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        parent.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    init = deltacast.vllm.DeltacastTrainerInitInfo(rank=0, worker_init={"worker_id": "trainer-api"})
    client = SyncClient(llm)
    assert isinstance(client, VLLMWeightSyncClient)
    engine = WeightTransferTrainerFactory.trainer_init("deltacast", None, init, client=client, source=ModuleSource(trainer_model))
    try:
        for version in (1, 2, 3):
            if version > 1:
                step(sd, 60 + version)  # the trainer's parameters change in place
            engine.send_weights()
            assert engine.last_request.version == version
            got = llm.collective_rpc(fingerprint)
            assert all(got[rank] == expected(sd, rank) for rank in range(TP))
    finally:
        engine.shutdown()


def test_vllm_trainer_api_with_a_backend_classvar_in_its_own_process():
    # The newer API (TrainerInitInfo carries `backend`; trainer_init(init_info, *, client, source)):
    # its own stand-in tree, python/tests/fakes_newer, in a process where `vllm` is that tree.
    tests = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests / "fakes_newer"), str(tests), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(tests / "newer_trainer_api.py")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "versions 1 2 3 applied exactly" in done.stdout


# ---- SGLang ---------------------------------------------------------------------------------


def sglang_held(scheduler) -> tuple:
    updater = deltacast.sglang._updaters.get(scheduler.model_runner.model)
    return (updater.run, updater.version) if updater else (None, None)


def test_sglang_engine_ranks_apply_exactly_the_version_asked_for_and_never_raise_into_sglang():
    sd = llama_checkpoint(seed=24)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        env = {"DELTACAST_PARENTS": pub.listening, "DELTACAST_WORKER_ID": "sglang-engine", "DELTACAST_TIMEOUT_S": "30"}
        with Engine(make_model=make_llama, checkpoint=llama_checkpoint(seed=81), env=env, tp_size=TP,
                    custom_weight_loader=[LOADER]) as engine:
            ckpt = {}
            for _ in range(5):
                step(sd, pub.version + 70)
                ckpt[pub.publish(sd)] = {n: t.clone() for n, t in sd.items()}
            for version in (2, 5):  # 2 after 3..5 arrived: read back
                assert engine.update_weights_from_tensor(deltacast.sglang.request(pub.request(version)), load_format=LOADER) == \
                    (True, "Success")
                assert engine.tokenizer_manager.call(sglang_held) == [(pub.run, version)] * TP
                got = engine.tokenizer_manager.call(fingerprint)
                assert all(got[rank] == expected(ckpt[version], rank) for rank in range(TP))
            assert pub.wait_ready(5, min_workers=TP, timeout=30).workers_ready == TP
            # A version it cannot have (of a run it left): SGLang gets no exception (it would kill
            # the server and this process), the model keeps version 5, the trainer learns it from
            # the ledger.
            before = engine.tokenizer_manager.call(fingerprint)
            step(sd, 99)
            assert engine.update_weights_from_tensor(deltacast.sglang.request({"version": 6, "run": "1-0000000000000001"}),
                                                     load_format=LOADER) == (True, "Success")
            assert engine.tokenizer_manager.call(fingerprint) == before
            assert engine.tokenizer_manager.call(sglang_held) == [(pub.run, 5)] * TP
            assert engine.update_weights_from_tensor([("model.norm.weight", torch.zeros(3))], load_format=LOADER) == (True, "Success")
            assert eventually(lambda: "expects only" in pub.ledger()["sglang-engine-r0"]["last_error"])
            assert all(pub.ledger()[f"sglang-engine-r{rank}"]["model"]["version"] == 5 for rank in range(TP))
            # The next request is served as if nothing happened.
            pub.publish(sd)
            assert engine.update_weights_from_tensor(deltacast.sglang.request(pub.request()), load_format=LOADER) == (True, "Success")
            got = engine.tokenizer_manager.call(fingerprint)
            assert all(got[rank] == expected(sd, rank) for rank in range(TP))


def test_sglang_ranks_attached_to_their_hosts_one_worker_apply_exactly_the_version_asked_for(processes, tmp_path):
    sd = llama_checkpoint(seed=25)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        sock = start_sharing_worker(processes, tmp_path, pub)
        env = {"DELTACAST_ATTACH": sock, "DELTACAST_TIMEOUT_S": "30"}
        with Engine(make_model=make_llama, checkpoint=llama_checkpoint(seed=82), env=env, tp_size=TP,
                    custom_weight_loader=[LOADER]) as engine:
            ckpt = {}
            for _ in range(5):
                step(sd, pub.version + 70)
                ckpt[pub.publish(sd)] = {n: t.clone() for n, t in sd.items()}
            for version in (2, 5):  # 2 after 3..5 arrived: read back from the host worker's history
                assert engine.update_weights_from_tensor(deltacast.sglang.request(pub.request(version)), load_format=LOADER) == \
                    (True, "Success")
                assert engine.tokenizer_manager.call(sglang_held) == [(pub.run, version)] * TP
                got = engine.tokenizer_manager.call(fingerprint)
                assert all(got[rank] == expected(ckpt[version], rank) for rank in range(TP))
            assert eventually(lambda: (pub.ledger()["host"].get("model") or {}).get("version") == 5), pub.ledger()
            assert list(pub.ledger()) == ["host"]


def start_server(processes, tmp_path, loader, env):
    port = free_port()
    log = open(tmp_path / f"server-{port}.log", "w")
    tests = Path(__file__).parent
    server_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests / "fakes"), str(tests), os.environ.get("PYTHONPATH", "")]), **env)
    proc = processes.start(sys.executable, "-m", "sglang.launch_server", "--tp-size", TP, "--port", port, "--custom-weight-loader", loader,
                           "--model", "llama", "--seed", 82, env=server_env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return f"http://127.0.0.1:{port}", proc
        except OSError:
            assert proc.poll() is None, (tmp_path / f"server-{port}.log").read_text()
            time.sleep(0.2)
    raise AssertionError("the SGLang server did not start")


def test_sglang_http_server_in_its_own_process_takes_a_remote_trainers_request_and_stays_up(processes, tmp_path):
    sd = llama_checkpoint(seed=25)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        env = {"DELTACAST_PARENTS": pub.listening, "DELTACAST_WORKER_ID": "sglang-http", "DELTACAST_TIMEOUT_S": "3"}
        url, server = start_server(processes, tmp_path, LOADER, env)
        pub.publish(sd)
        # What a trainer in another process builds: base64 of a by-value pickle, one per rank.
        body = {"serialized_named_tensors": deltacast.sglang.serialized_request(pub.request(), TP), "load_format": LOADER}
        assert post(url + "/update_weights_from_tensor", body) == (200, {"success": True, "message": "Success"})
        assert pub.wait_ready(1, min_workers=TP, timeout=30).workers_ready == TP
        # A version that never comes: the loader gives up after DELTACAST_TIMEOUT_S, says so to the
        # ledger, and the server stays up.
        body["serialized_named_tensors"] = deltacast.sglang.serialized_request(deltacast.Request(2, pub.run), TP)
        assert post(url + "/update_weights_from_tensor", body)[0] == 200
        assert server.poll() is None
        with pytest.raises(deltacast.Error, match=r"version 2 could not be applied by sglang-http-r\d \(.*did not verify"):
            step(sd, 1)
            pub.publish(sd)  # published only now, after the ranks gave up
            pub.wait_ready(2, min_workers=TP, timeout=30)
        body["serialized_named_tensors"] = deltacast.sglang.serialized_request(pub.request(2), TP)
        assert post(url + "/update_weights_from_tensor", body) == (200, {"success": True, "message": "Success"})
        # The ranks' reports of this attempt travel up after the response: until they arrive, the
        # ledger still holds the failed attempt's (a loaded CI machine saw it once).
        deadline = time.monotonic() + 30
        while True:
            try:
                assert pub.wait_ready(2, min_workers=TP, timeout=30).workers_ready == TP
                break
            except deltacast.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def test_sglang_takes_the_server_down_when_a_loader_raises_which_is_why_deltacasts_never_does(processes, tmp_path):
    # The stand-in is faithful to SGLang here: a custom loader that raises kills the server.
    url, server = start_server(processes, tmp_path, "fake_models.raising_loader", {})
    body = {"serialized_named_tensors": deltacast.sglang.serialized_request({"version": 1}, TP), "load_format": "fake_models.raising_loader"}
    try:
        post(url + "/update_weights_from_tensor", body)
    except OSError:
        pass  # the connection dies with the server
    assert server.wait(timeout=60) != 0
