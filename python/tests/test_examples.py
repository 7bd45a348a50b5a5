"""The examples as a user runs them: the training loop as the origin, a relay, and two rollout
processes under it, each keeping its own copy of the model with patches."""

import subprocess
import sys
from pathlib import Path

import torch

from conftest import DELTACAST, free_endpoint

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 6


def test_training_loop_to_two_rollout_processes_through_a_relay(processes, tmp_path):
    origin, relay = free_endpoint(), free_endpoint()
    trainer = processes.start(sys.executable, EXAMPLES / "train_publish.py", "--listen", origin, "--steps", STEPS,
                              "--wait-workers", 2, "--special-values", "--dump-dir", tmp_path / "trainer",
                              stdout=subprocess.PIPE, text=True)
    processes.start(DELTACAST, "relay", "--id", "relay", "--listen", relay, "--parent", origin, "--log-level", "warn")
    rollouts = [processes.start(sys.executable, EXAMPLES / "rollout.py", "--id", f"rollout-{i}", "--parent", relay,
                                "--until", STEPS + 1, "--dump-dir", tmp_path / "rollout", stdout=subprocess.PIPE, text=True)
                for i in range(2)]
    outputs = [r.communicate(timeout=240)[0] for r in rollouts]
    assert [r.returncode for r in rollouts] == [0, 0], outputs
    trainer_out = trainer.communicate(timeout=60)[0]
    assert trainer.returncode == 0, trainer_out
    for out in outputs:
        assert "values patched" in out and out.count("verified") >= 2, out
    for version in range(1, STEPS + 2):
        published = torch.load(tmp_path / "trainer" / f"v{version}.pt")
        assert "special_values" in published
        special = published["special_values"].view(torch.int16)
        assert torch.isnan(published["special_values"].float()).any() and (special == -32768).any()  # NaNs and -0 travel
        for i in range(2):
            held = torch.load(tmp_path / "rollout" / f"rollout-{i}-v{version}.pt")
            assert set(held) == set(published)
            for name, t in published.items():
                assert torch.equal(held[name].view(torch.int16), t.view(torch.int16)), (version, i, name)


def test_sharded_trainers_publish_from_their_shards_bit_for_bit():
    """examples/train_shards.py in both layouts: FSDP2's dim-0 ranges over 3 ranks (uneven ranges),
    Megatron's tensor-parallel split over 4; every merged version checked against the ranks' parts."""
    for layout, ranks in (("fsdp", 3), ("megatron", 4)):
        out = subprocess.run([sys.executable, EXAMPLES / "train_shards.py", "--listen", free_endpoint(), "--layout", layout,
                              "--ranks", str(ranks), "--steps", "3", "--check"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        for version in range(1, 5):
            assert f"merged version {version} from {ranks} shards" in out.stdout, out.stdout
            assert f"version {version}: every tensor whole, bit for bit the ranks' parts" in out.stdout, out.stdout
        assert "step 3: loss" in out.stdout


def test_the_adamw_series_is_real_training_read_by_the_codec_commands(tmp_path):
    """scripts/adamw_series.py: checkpoints every bench command reads, each a step of AdamW."""
    script = EXAMPLES.parent / "scripts" / "adamw_series.py"
    out = subprocess.run([sys.executable, script, "-o", tmp_path, "--size", "tiny", "--steps", "2", "--warmup", "3", "--threads", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    files = sorted(tmp_path.glob("step-*.safetensors"))
    assert [f.name for f in files] == [f"step-{i:06d}.safetensors" for i in range(3)]
    inspect = subprocess.run([DELTACAST, "inspect", "--entropy", files[1], files[2], "--prev", files[0]],
                             capture_output=True, text=True, timeout=120)
    assert inspect.returncode == 0, inspect.stdout + inspect.stderr
    # Every value comes from a trained weight: some change each step, most do not.
    changed = float(inspect.stdout.split(" changed (")[1].split("%")[0])
    assert 0.1 < changed < 50, inspect.stdout
    assert "given exponent and previous step" in inspect.stdout
