"""Writes placed by the engine's own loader: every rank of a vLLM engine (the stand-ins in
fakes/vllm, written from vLLM's files) ends each version bit for bit where the engine's own whole
load of that checkpoint puts it, writing only the changed values of its slice."""

import pytest
import torch

import deltacast
import deltacast.vllm
from deltacast.engine import Placement
from engine_util import Rank, params_of, unchanged
from fake_models import gpt2_checkpoint, llama_checkpoint, make_gpt2, make_llama, make_repacked_llama, make_scaled_norm_llama, step

LAYOUTS = [(1, 0), (2, 0), (2, 1), (4, 0), (4, 3)]


@pytest.mark.parametrize("make, checkpoint", [(make_gpt2, gpt2_checkpoint), (make_llama, llama_checkpoint)], ids=["gpt2", "llama"])
def test_every_rank_writes_only_the_changed_values_of_its_slice_where_the_loader_puts_them(make, checkpoint):
    # GPT-2: Conv1D weights the loader transposes (attn.c_proj is square: its shape says nothing),
    # a fused c_attn split into q/k/v. Llama: q/k/v and gate/up fused. Both: a vocabulary of 250
    # padded to 256 and split over 1, 2 and 4 ranks.
    sd = checkpoint()
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        ranks = [Rank(make, checkpoint(seed=99), [pub.listening], tp, r, worker_id=f"{make.__name__}-tp{tp}") for tp, r in LAYOUTS]
        try:
            for version in range(1, 5):
                if version > 1:
                    step(sd, version)
                request = deltacast.vllm.DeltacastWeightTransferEngine.trainer_send_weights(iter(sd.items()), {"publisher": pub})
                assert request == {"version": version, "run": pub.run}
                for r in ranks:
                    r.update(request)
                    assert r.wrong(sd) == [], (version, r.tp_size, r.rank)
                    stats = r.stats
                    assert stats["version"] == version
                    assert r.engine.updater.placement.exact, r.engine.updater.placement.reason
                    if version == 1:
                        assert stats["path"] == "reload" and stats["from"] is None
                        continue
                    assert stats["path"] == "in place" and stats["from"] == version - 1 and stats["tensors_loaded"] == 0
                    assert 0 < stats["values_changed_in_slice"] <= stats["values_changed"]
                    assert stats["values_written"] <= 1.2 * stats["values_changed_in_slice"]
                    if r.tp_size > 1:
                        assert stats["values_changed_in_slice"] < stats["values_changed"]
        finally:
            for r in ranks:
                r.close()


def test_the_map_follows_the_loader_not_names_and_shapes():
    # GPT-2's attn.c_proj is [64, 64] in the checkpoint and in the model; the loader transposes it.
    # The map says element (i, j) of the checkpoint lands at (j, i).
    model = make_gpt2()
    sd = gpt2_checkpoint()
    placement = Placement.derive(model, model.load_weights, [(n, tuple(t.shape), t.dtype) for n, t in sd.items()])
    assert placement.exact, placement.reason
    name = "h.0.attn.c_proj.weight"
    idx = torch.tensor([1, 64 + 5])  # (0, 1) and (1, 5)
    writes, landed = placement.writes(name, idx, torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    assert landed == 2
    (owner, dst, values), = writes
    assert placement.param_names[owner] == "transformer.h.0.attn.c_proj.weight"
    assert dst.tolist() == [1 * 64 + 0, 5 * 64 + 1]
    # A checkpoint tensor no value of which lands on a rank has no writes there.
    llama = make_llama(0, 1)
    unknown = Placement.derive(llama, llama.load_weights, [("nothing.weight", (4,), torch.bfloat16)])
    assert not unknown.loadable and "KeyError" in unknown.reason  # the loader has no such tensor


def test_padded_vocabulary_rows_are_never_written():
    model = make_llama(3, 4)  # rows 192..255 of 256: 58 of the 250 real ones, then 6 of padding
    sd = llama_checkpoint()
    placement = Placement.derive(model, model.load_weights, [(n, tuple(t.shape), t.dtype) for n, t in sd.items()])
    assert placement.exact
    hidden = sd["model.embed_tokens.weight"].shape[1]
    every = torch.arange(sd["model.embed_tokens.weight"].numel())
    writes, landed = placement.writes("model.embed_tokens.weight", every, torch.zeros(every.numel(), dtype=torch.bfloat16))
    assert landed == 58 * hidden
    (owner, dst, _), = writes
    assert int(dst.max()) < 58 * hidden  # the padded rows stay as the loader left them (zeros)


def test_a_loader_that_post_processes_goes_through_vllms_layerwise_reload():
    # Its linear layers are repacked after loading (a quantization kernel's layout): the loader
    # copies values, so the probe sees a map, but the check of the map against the first whole load
    # finds the repacked parameters. Every version after goes through vLLM's own layerwise reload.
    sd = llama_checkpoint(seed=4)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        r = Rank(make_repacked_llama, llama_checkpoint(seed=98), [pub.listening], 2, 1, worker_id="repacked")
        try:
            for version in range(1, 4):
                if version > 1:
                    step(sd, 40 + version)
                r.update(deltacast.vllm.DeltacastWeightTransferEngine.trainer_send_weights(iter(sd.items()), {"publisher": pub}))
                assert r.wrong(sd) == [], version
                placement = r.engine.updater.placement
                assert not placement.exact and "post-processes" in placement.reason
                assert r.stats["path"] == "reload"
        finally:
            r.close()


@pytest.mark.parametrize("reload_mode", ["layerwise", "direct"])
def test_a_loader_that_transforms_values_is_never_guessed(reload_mode):
    # The loader scales norm weights as it loads them: the two probes disagree, no map. With
    # vLLM's reload_mode "direct" the changed tensors go through the loader alone (no
    # post-processing, as vLLM's direct mode), with "layerwise" through the layerwise reload.
    sd = llama_checkpoint(seed=5)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        r = Rank(make_scaled_norm_llama, llama_checkpoint(seed=97), [pub.listening], reload_mode=reload_mode, worker_id="scaled")
        try:
            for version in range(1, 4):
                if version > 1:
                    step(sd, 50 + version)
                r.update(deltacast.vllm.DeltacastWeightTransferEngine.trainer_send_weights(iter(sd.items()), {"publisher": pub}))
                assert r.wrong(sd) == [], version
                assert "transforms them" in r.engine.updater.placement.reason
                if version > 1:
                    assert r.stats["path"] == ("reload" if reload_mode == "layerwise" else "loader")
                    if reload_mode == "direct":
                        assert r.stats["tensors_loaded"] == len(sd)  # every tensor changed a little
        finally:
            r.close()


def test_a_draft_update_is_refused_and_neither_model_is_touched():
    sd = llama_checkpoint(seed=6)
    with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
        r = Rank(make_llama, llama_checkpoint(seed=96), [pub.listening], draft=make_llama, worker_id="draft")
        try:
            assert deltacast.vllm.DeltacastWeightTransferEngine.supports_draft_weight_update is False
            pub.publish(sd)
            target, draft = params_of(r.model), params_of(r.worker.draft_model)
            with pytest.raises(RuntimeError, match="does not support draft model weight updates"):
                r.worker.start_weight_update(include_draft=True)
            assert unchanged(r.model, target) and unchanged(r.worker.draft_model, draft)
            r.update(pub.request().as_dict())  # the target's own update still works
            assert r.wrong(sd) == []
        finally:
            r.close()
