#!/usr/bin/env python3
"""A real fleet on the emulated WAN with one tree and with several (docs/BENCHMARKS.md,
"A multi-tree fleet on the emulated WAN").

Three regions joined pairwise by WAN links of RATE and DELAY one way (tests/wan/fleet.py,
RegionsFleet): us with the origin and a worker, eu and ap with a relay and WORKERS workers each.
`deltacast fleet-init --trees N` plans the fleet and writes every node's config; every node runs
from it in a namespace of its own, under kernel TCP. The origin publishes `deltacast gen`
checkpoints one after another, each once every worker holds the one before (--wait-workers).
The first version, an anchor of the whole model, crosses links sped up to ANCHOR_RATE; the
deltas cross them at RATE.

For each delta but the first (a worker's first delta after an anchor costs its whole image),
the figure is the time from publish to the slowest far worker's "ready" line.
One tree feeds eu and ap each over its own link from us: a delta of D bytes takes D / RATE. Two
trees send half of the chunks over us>eu and on over eu>ap, the other half over us>ap and on
over ap>eu, so each far region receives over two links: the bound is D / (2 RATE) plus the
delay. Rounds alternate between the tree counts, so both see the same machine.

Usage (root): python3 scripts/bench_wan_trees.py [--trees 1,2] [--rounds 3] [--rate-mbit 10]
              [--anchor-rate-mbit 400] [--delay-ms 30] [--size 512MB] [--lr 1e-6] [--versions 5]
              [--workers 2] [--stripes 1] [--cc bbr] [--json F]
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "wan"))
from fleet import RegionsFleet, make_versions  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def one_run(args, work: Path, versions, trees: str) -> dict:
    """Publishes every version to a fresh fleet; per delta, the slowest far worker's publish-to-ready seconds."""
    with RegionsFleet(args.deltacast, args.emulator, work, trees=trees, rate_mbit=args.rate_mbit,
                      delay_ms=args.delay_ms, workers=args.workers) as fleet:
        # The first version, an anchor, goes over fast links; the deltas over RATE.
        fleet.set_rate(args.anchor_rate_mbit)
        cc = ("--congestion-control", args.cc) if args.cc else ()
        fleet.start(versions, "--wait-workers", str(len(fleet.workers)), "--wait-timeout-ms", "600000",
                    "--interval-ms", "2000", "--linger-ms", "1000", *cc, node_args=("--stripes", str(args.stripes), "--stripes-start", str(args.stripes), *cc))
        if not fleet.ready(1, 300):
            raise RuntimeError(f"{trees} trees: not every worker reached version 1\n{fleet.tails()}")
        fleet.set_rate(args.rate_mbit)
        if not fleet.ready(2, 300):
            raise RuntimeError(f"{trees} trees: not every worker reached version 2\n{fleet.tails()}")
        wan = ("us>eu", "us>ap", "eu>ap", "ap>eu", "eu>us", "ap>us")
        before = sum(fleet.delivered(link) for link in wan)
        last = len(versions.checkpoints)
        if not fleet.ready(last, 120 + 4 * sum(versions.bytes.values()) * 8 / (args.rate_mbit * 1e6)):
            raise RuntimeError(f"{trees} trees: not every worker reached version {last}\n{fleet.tails()}")
        crossed = sum(fleet.delivered(link) for link in wan) - before
        fleet.procs["origin"].wait(timeout=60)
        failures = fleet.check_workers(versions)
        if failures:
            raise RuntimeError("\n".join(failures))
        far = [w for w in fleet.workers if not w.startswith("us.")]
        ms = {w: {v: t for v, _, t in fleet.logs[w].ready()} for w in far}
        deltas = range(3, last + 1)
        # Links that moved to a fallback parent: a far worker on another region's relay takes
        # every version over the WAN once more.
        moved = sum(1 for lg in fleet.logs.values() for line in lg.lines if " silent for " in line or "failover" in line)
        return {"trees": fleet.trees, "wan_bytes": crossed / sum(versions.bytes[v] for v in deltas), "moved": moved,
                "slowest_s": [max(ms[w][v] for w in far) / 1e3 for v in deltas],
                "median_s": [statistics.median(ms[w][v] for w in far) / 1e3 for v in deltas]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deltacast", default=str(ROOT / "build" / "tools" / "deltacast"))
    ap.add_argument("--emulator", default=str(ROOT / "build" / "tests" / "wan_emulator"))
    ap.add_argument("--trees", default="1,2", help="tree counts to compare, comma-separated (auto allowed); the first is the baseline")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate-mbit", type=float, default=10, help="each WAN link's rate while deltas cross")
    ap.add_argument("--anchor-rate-mbit", type=float, default=400, help="each WAN link's rate while the first version (an anchor) crosses")
    ap.add_argument("--delay-ms", type=float, default=30)
    ap.add_argument("--size", default="512MB")
    ap.add_argument("--lr", type=float, default=1e-6, help="about 1.9%% of the values change per step at 1e-6")
    ap.add_argument("--versions", type=int, default=5,
                    help="versions published: an anchor, then deltas; the first delta is not timed (a worker's first "
                         "delta after an anchor costs its whole image)")
    ap.add_argument("--stripes", type=int, default=1,
                    help="TCP connections per parent link (--stripes of relays and workers); the default window "
                         "exceeds these links' bandwidth-delay product, and more connections only fill the queue")
    ap.add_argument("--workers", type=int, default=2, help="workers in each far region")
    ap.add_argument("--cc", help="--congestion-control of the origin and every relay and worker (the connections they "
                                 "send versions down), e.g. bbr; default: the namespaces' (the kernel's default)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    if args.versions < 3 or args.rounds < 1 or args.workers < 1:
        ap.error("want at least 3 versions, 1 round and 1 worker")
    counts = args.trees.split(",")
    with tempfile.TemporaryDirectory(prefix="dcwan-trees-bench-") as tmp:
        work = Path(tmp)
        log(f"generating {args.versions} checkpoints of {args.size}, lr {args.lr:g}")
        versions = make_versions(args.deltacast, work, size=args.size, lr=args.lr, count=args.versions)
        runs = {c: [] for c in counts}
        for r in range(args.rounds):
            for c in counts:
                log(f"round {r + 1}/{args.rounds}: {c} tree(s)")
                runs[c].append(one_run(args, work, versions, c))
                run = runs[c][-1]
                log(f"  slowest far worker per delta: {', '.join(f'{s:.2f} s' for s in run['slowest_s'])}; "
                    f"WAN bytes {run['wan_bytes']:.2f}x the deltas'; {run['moved']} parent changes")
    delta = statistics.median(versions.bytes[v] for v in range(3, args.versions + 1))
    rate = args.rate_mbit * 1e6 / 8
    # A far worker's own bound: its region takes the delta over two WAN links (the maximum flow
    # from the origin), whatever the plan.
    bound = delta / (2 * rate) + args.delay_ms / 1e3
    print(f"three regions joined pairwise: {args.rate_mbit:g} Mbit/s, {args.delay_ms:g} ms one way; {args.workers} workers "
          f"under a relay in each far region; deltas of {delta / 1e6:.1f} MB ({args.size}, lr {args.lr:g}), "
          f"{args.versions - 2} timed per run, {args.rounds} runs per row, --stripes {args.stripes}"
          f"{', --congestion-control ' + args.cc if args.cc else ''}")
    print("| trees | slowest far worker, median over deltas and runs | median far worker | against the first row | "
          "a far worker's own bound (the delta over two links, plus the delay) | over the bound |")
    print("|---|---|---|---|---|---|")
    base = None
    out = {"args": vars(args), "delta_bytes": delta, "rows": []}
    for c in counts:
        trees = runs[c][0]["trees"]
        slowest = statistics.median(s for run in runs[c] for s in run["slowest_s"])
        median = statistics.median(s for run in runs[c] for s in run["median_s"])
        base = base or slowest
        b = bound
        print(f"| {c}{f' ({trees})' if c == 'auto' else ''} | {slowest:.2f} s | {median:.2f} s | "
              f"{base / slowest:.2f}x faster | {b:.2f} s | {slowest / b:.2f}x |")
        out["rows"].append({"trees": c, "planned": trees, "slowest_s": slowest, "median_s": median, "bound_s": b,
                            "runs": runs[c]})
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
