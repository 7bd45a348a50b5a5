#!/usr/bin/env python3
"""Bytes a worker receives against the fraction of the model it serves, measured in one run.

A MoE-shaped BF16 model (--layers layers, each of --experts experts of three 1 MiB projections
and four 1 MiB attention projections and two small norms, plus an embedding) is published from
this process for --versions versions (an anchor, then deltas moving one ulp at about 1% of the
values, at random places) to:

- a worker of the whole model (`deltacast worker`) straight under the publisher: the baseline;
- a relay (`deltacast relay`) under the publisher, and under it one worker per subset:
  `--tensors` of one eighth of the experts (experts 0 and 1 of 16 by default, in every layer),
  and of the first half of the layers (one of two pipeline stages).

Bytes are each node's deltacast_bytes_in_total: for the anchor (version 1), and per delta (the
versions after it, averaged). Each subset's fraction f is its tensors' share of the image bytes;
the bound is f x the whole worker's bytes + 5% of them. Medians over --runs runs.

    PYTHONPATH=build/python python3 scripts/bench_subsets.py --layers 4 --experts 16 --versions 4 --runs 3
"""

import argparse
import fnmatch
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import deltacast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))
from share_reader import bytes_in  # noqa: E402  the measure the test asserts on
from bench_share import free_port, log  # noqa: E402

DELTACAST = os.environ.get("DELTACAST_BIN", str(ROOT / "build" / "tools" / "deltacast"))
MIB_ELEMENTS = 1 << 19  # BF16 elements in 1 MiB


def model(layers: int, experts: int) -> dict:
    g = torch.Generator().manual_seed(11)

    def t(elements):
        return torch.randn(elements, generator=g).to(torch.bfloat16)

    m = {"model.embed_tokens.weight": t(4 * MIB_ELEMENTS)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        m[p + "input_layernorm.weight"] = t(2048)
        m[p + "post_attention_layernorm.weight"] = t(2048)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            m[p + f"self_attn.{proj}.weight"] = t(MIB_ELEMENTS)
        for e in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                m[p + f"mlp.experts.{e}.{proj}.weight"] = t(MIB_ELEMENTS)
    return m


def step(tensors: dict, k: int) -> dict:
    """The next version: one ulp up or down at about 1% of the values, at random places (a regular
    stride would make positions nearly free to code, and the manifests all there is)."""
    g = torch.Generator().manual_seed(1000 + k)
    out = {}
    for name, t in tensors.items():
        t = t.clone()
        flat = t.view(torch.int16)
        at = torch.randint(0, flat.numel(), (max(1, flat.numel() // 100),), generator=g)
        flat[at] += (torch.randint(0, 2, at.shape, generator=g, dtype=torch.int16) * 2 - 1)
        out[name] = t
    return out


def fraction(tensors: dict, patterns: list) -> float:
    total = sum(t.numel() * 2 for t in tensors.values())
    part = sum(t.numel() * 2 for n, t in tensors.items() if any(fnmatch.fnmatchcase(n, p) for p in patterns))
    return part / total


def wait_ready(pub, version: int, workers: int, procs: list) -> None:
    deadline = time.time() + 600
    while True:
        try:
            pub.wait_ready(version, min_workers=workers, timeout=1)
            return
        except TimeoutError:
            pass
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{' '.join(p.args[:4])} exited ({p.returncode})")
        if time.time() > deadline:
            raise TimeoutError(f"version {version} not ready at {workers} workers in 600 s")


def one_run(args, subsets: dict) -> dict:
    procs = []
    ports = {name: free_port() for name in ["whole", "relay", *subsets]}
    out = {}
    try:
        with deltacast.Publisher("tcp://127.0.0.1:0") as pub:
            relay = f"tcp://127.0.0.1:{free_port()}"
            quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(subprocess.Popen([DELTACAST, "relay", "--id", "relay", "--listen", relay, "--parent", pub.listening,
                                           "--metrics", f"127.0.0.1:{ports['relay']}"], **quiet))
            procs.append(subprocess.Popen([DELTACAST, "worker", "--id", "whole", "--parent", pub.listening, "--scrub-rate", "0",
                                           "--metrics", f"127.0.0.1:{ports['whole']}"], **quiet))
            for name, patterns in subsets.items():
                flags = [a for p in patterns for a in ("--tensors", p)]
                procs.append(subprocess.Popen([DELTACAST, "worker", "--id", name, "--parent", relay, "--scrub-rate", "0", *flags,
                                               "--metrics", f"127.0.0.1:{ports[name]}"], **quiet))
            tensors = model(args.layers, args.experts)
            after_anchor = {}
            for v in range(1, args.versions + 1):
                if v > 1:
                    tensors = step(tensors, v)
                pub.publish(tensors)
                wait_ready(pub, v, 1 + len(subsets), procs)
                time.sleep(0.3)  # metrics are read from the nodes' own loops
                if v == 1:
                    after_anchor = {n: bytes_in(p) for n, p in ports.items()}
                log(f"  version {v} ready everywhere")
            for n, p in ports.items():
                total = bytes_in(p)
                out[n] = {"anchor": after_anchor[n], "delta": (total - after_anchor[n]) / max(1, args.versions - 1)}
            out["fractions"] = {n: fraction(tensors, pats) for n, pats in subsets.items()}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    eighth = max(1, args.experts // 8)
    subsets = {
        "experts-eighth": [f"model.layers.*.mlp.experts.{e}.*" for e in range(eighth)],
        "stage-half": [f"model.layers.{layer}.*" for layer in range(args.layers // 2)],
    }
    runs = []
    for r in range(args.runs):
        log(f"run {r + 1} of {args.runs}")
        runs.append(one_run(args, subsets))
    med = lambda name, kind: statistics.median(run[name][kind] for run in runs)  # noqa: E731
    mb = 1 << 20
    print(f"model: {args.layers} layers x {args.experts} experts, {args.versions} versions, median of {args.runs} runs")
    print(f"{'worker':<14}{'f (bytes)':>10}{'anchor MiB':>12}{'x whole':>9}{'delta MiB':>11}{'x whole':>9}{'bound f+5%':>12}")
    whole_a, whole_d = med("whole", "anchor"), med("whole", "delta")
    print(f"{'whole':<14}{1.0:>10.3f}{whole_a / mb:>12.1f}{1.0:>9.3f}{whole_d / mb:>11.2f}{1.0:>9.3f}{'':>12}")
    for name in subsets:
        f = runs[0]["fractions"][name]
        a, d = med(name, "anchor"), med(name, "delta")
        print(f"{name:<14}{f:>10.3f}{a / mb:>12.1f}{a / whole_a:>9.3f}{d / mb:>11.2f}{d / whole_d:>9.3f}{f + 0.05:>12.3f}")
    a, d = med("relay", "anchor"), med("relay", "delta")
    print(f"{'relay (union)':<14}{'':>10}{a / mb:>12.1f}{a / whole_a:>9.3f}{d / mb:>11.2f}{d / whole_d:>9.3f}")


if __name__ == "__main__":
    main()
