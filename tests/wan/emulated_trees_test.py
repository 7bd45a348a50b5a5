#!/usr/bin/env python3
"""A multi-tree fleet over the emulated WAN under kernel TCP (tests/wan; root).

Three regions joined pairwise by 40 Mbit/s links, 30 ms one way (tests/wan/fleet.py,
RegionsFleet), configured by `deltacast fleet-init --trees N` with CURVE and signed versions, for
N = 2 and 3. The relay in eu is SIGKILLed while version 3 crosses the WAN; its children in
every tree fail over. Every worker must expose every version with the publisher's checksum, and
nothing else; the links between eu and ap must carry versions (the trees route through them),
and each remote region must receive about one version's bytes per version, not one per tree.

Usage: emulated_trees_test.py DELTACAST WAN_EMULATOR
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import RegionsFleet, make_versions, verdict  # noqa: E402

VERSIONS = 4
TIMING = {"parent_timeout_ms": 5000}


def run(dc: str, emulator: str, work: Path, versions, trees: int) -> list[str]:
    failures = []
    # A parent timeout of 5 s, not 2 s: on a loaded host (sanitizer builds, tests side by side)
    # the emulator or a node can be starved of CPU for seconds, and a worker that fails over to a
    # parent across the WAN fetches its version again over it: the bytes checked below.
    with RegionsFleet(dc, emulator, work, trees=trees, rate_mbit=40, delay_ms=30, workers=2, timing=TIMING) as fleet:
        if fleet.trees != trees:
            failures.append(f"fleet-init wrote configs for {fleet.trees} trees, not {trees}")
        fleet.start(versions, "--wait-workers", str(len(fleet.workers)), "--wait-timeout-ms", "120000",
                    "--interval-ms", "500", "--linger-ms", "1000")
        links = ("us>eu", "us>ap", "eu>ap", "ap>eu")
        crossed = []  # bytes each link delivered for version 1 (the anchor), then version 2 (a delta)
        for v in (1, 2):
            start = {link: fleet.delivered(link) for link in links}
            if not fleet.ready(v, 120):
                failures.append(f"{trees} trees: version {v} did not reach every worker")
            crossed.append({link: fleet.delivered(link) - start[link] for link in links})
            print(f"{trees} trees, version {v} ({versions.bytes[v] / 1e6:.1f} MB): "
                  + ", ".join(f"{l} {b / 1e6:.1f} MB" for l, b in crossed[-1].items()), flush=True)
        # Each region received each version once. The anchor came down tree 0 whole; the delta's
        # chunks came down every tree, so the links between eu and ap carried a share of it.
        for v, got in zip((1, 2), crossed):
            for region in ("eu", "ap"):
                into = sum(b for l, b in got.items() if l.endswith(f">{region}"))
                if into > 1.3 * versions.bytes[v]:
                    failures.append(f"{trees} trees: {region} received {into} bytes for version {v} of {versions.bytes[v]}: chunks came twice")
        for link in ("eu>ap", "ap>eu"):
            if crossed[1][link] < 0.5 / trees * versions.bytes[2]:
                failures.append(f"{trees} trees: {link} carried {crossed[1][link]} bytes of version 2: the trees do not cross it")
        # Version 3 is on its way once a quarter megabyte of it crossed us>eu; then eu's relay dies.
        if not fleet.wait_delivered("us>eu", 1 << 18, 60):
            failures.append(f"{trees} trees: version 3 did not start over us>eu")
        fleet.procs["eu.relay-0"].kill()
        if not fleet.ready(VERSIONS, 180):
            failures.append(f"{trees} trees: version {VERSIONS} did not reach every worker after eu's relay was killed")
        if fleet.procs["origin"].wait(timeout=120) != 0:
            failures.append(f"{trees} trees: publish exited {fleet.procs['origin'].returncode}")
        failures += [f"{trees} trees: {f}" for f in fleet.check_workers(versions)]
        stats = fleet.net.stats()["links"]
        print(f"{trees} trees, in all: " + ", ".join(f"{l} {stats[l]['delivered_bytes'] / 1e6:.1f} MB" for l in links))
        if failures:
            print(fleet.tails())
    return failures


def main() -> int:
    dc, emulator = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory(prefix="dcwan-trees-") as tmp:
        work = Path(tmp)
        versions = make_versions(dc, work, size="24MB", lr=1e-3, count=VERSIONS)
        for trees in (2, 3):
            failures += run(dc, emulator, work, versions, trees)
    return verdict("emulated WAN multi-tree fleet", failures)


if __name__ == "__main__":
    sys.exit(main())
