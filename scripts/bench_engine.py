#!/usr/bin/env python3
"""The engine adapter's cost per version: what one rank of a vLLM engine writes, and how long its
update takes, at tensor-parallel sizes 1, 2 and 4, against a whole reload of the same version
through the model's own load_weights, measured in the same run.

The engine is the tests' vLLM stand-in (python/tests/fakes: the GPU worker, its weight-transfer
state machine and a Llama built from vLLM's layers), on the CPU; the trainer is a
deltacast.Publisher in this process, each rank a deltacast worker over loopback. Every version
changes about --fraction of the values by one ulp. A version is timed once every rank's worker
has verified it: the update is what vLLM's worker runs (start, update_weights, finish), the
baseline ``model.load_weights`` of every tensor of that version.

    python3 scripts/bench_engine.py [--hidden 1024 --layers 8 --ffn 2816 --vocab 32000] [--versions 6]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "python" / "tests"
sys.path[:0] = [str(TESTS / "fakes"), str(TESTS)]

import torch  # noqa: E402

import deltacast  # noqa: E402
from engine_util import Rank  # noqa: E402
from fake_models import llama_checkpoint, make_llama, step  # noqa: E402
from vllm.model_executor.models.llama import LlamaConfig  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--versions", type=int, default=6, help="versions timed after the first (a whole load)")
    ap.add_argument("--fraction", type=float, default=0.02, help="values changed per version")
    ap.add_argument("--tp", default="1,2,4")
    a = ap.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    config = LlamaConfig(hidden_size=a.hidden, num_attention_heads=a.hidden // 64, num_key_value_heads=max(1, a.hidden // 256),
                         intermediate_size=a.ffn, vocab_size=a.vocab, num_hidden_layers=a.layers)

    def make(rank, tp):
        return make_llama(rank, tp, config)

    sd = llama_checkpoint(config, seed=1)
    params = sum(t.numel() for t in sd.values())
    print(f"model: {params / 1e6:.0f} M parameters ({len(sd)} tensors), {a.fraction:.0%} of the values changed per version; "
          f"{a.versions} versions timed per size", flush=True)
    rows = []
    for tp in [int(x) for x in a.tp.split(",")]:
        with deltacast.Publisher("tcp://127.0.0.1:0", chunk_bytes=4 << 20) as pub:
            ranks = [Rank(make, sd, [pub.listening], tp, r, worker_id=f"bench-tp{tp}") for r in range(tp)]
            try:
                update_s, reload_s, written, in_slice, held = [], [], [], [], []
                for version in range(1, a.versions + 2):
                    if version > 1:
                        step(sd, version, a.fraction)
                    request = pub.request(pub.publish(sd)).as_dict()
                    for r in ranks:
                        r.engine.worker.wait(version, timeout=600)
                    for r in ranks:
                        t0 = time.perf_counter()
                        r.update(request, timeout_s=600)
                        t1 = time.perf_counter()
                        if version == 1:
                            continue  # the whole first load, and the placement probe
                        v = r.engine.worker.version(version, pub.run, timeout=0)
                        t2 = time.perf_counter()
                        with torch.no_grad():
                            r.model.load_weights((n, t.clone()) for n, t in v.tensors())
                        t3 = time.perf_counter()
                        update_s.append(t1 - t0)
                        reload_s.append(t3 - t2)
                        written.append(r.stats["values_written"])
                        in_slice.append(r.stats["values_changed_in_slice"])
                        held.append(sum(p.numel() for p in r.model.parameters()))
                        assert r.stats["path"] == "in place", r.stats
                rows.append((tp, statistics.median(held), statistics.median(in_slice), statistics.median(written),
                             statistics.median(update_s), statistics.median(reload_s)))
                print(f"TP={tp}: done", flush=True)
            finally:
                for r in ranks:
                    r.close()
    print(f"\n{'TP':>3} {'params/rank':>12} {'changed in slice':>17} {'written':>10} {'written/changed':>16} "
          f"{'update ms':>10} {'whole reload ms':>16} {'reload/update':>14}")
    for tp, held, changed, wrote, up, whole in rows:
        print(f"{tp:>3} {held / 1e6:>11.1f}M {changed / 1e6:>16.3f}M {wrote / 1e6:>9.3f}M {wrote / changed:>16.3f} "
              f"{up * 1e3:>10.1f} {whole * 1e3:>16.1f} {whole / up:>13.1f}x")
    print("(medians over every rank and version; written: values the update wrote into the rank's parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
