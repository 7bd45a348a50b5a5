#!/usr/bin/env python3
"""deltacast fleet-init writes, for every node, exactly the trees `deltacast plan` prints.

For a few fleets (the bundled four-region fleet, one with a relay-less region and one whose
hosts do not relay, the --relay shorthand) it runs `deltacast plan --list` on the description
and `deltacast fleet-init` on the same, both with the planner's own count of trees, then checks
every config against the printed trees: per tree, parents in the order [parent, fallback, last
resort] and their public keys; the keys each server allows, who listens, who signs and who trusts. Also: the errors for a serving node without an
endpoint and for an endpoint of a node the plan does not have.
Usage: fleet_init_test.py path/to/deltacast
"""
import json
import os
import re
import stat
import subprocess
import sys
import tempfile

DC = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = os.path.join(HERE, "..", "..", "sim", "scenarios")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def run(*args, ok=True):
    p = subprocess.run([DC, *args], capture_output=True, text=True, timeout=300)
    if ok and p.returncode != 0:
        raise SystemExit(f"deltacast {' '.join(args)} failed: {p.stderr}")
    return p


LINE = re.compile(r"^( *)(\S+) \((origin|relay|worker)(, relays)?\)(?:  fallback (\S+?)(?:, then (\S+))?)?$")


def printed_trees(fleet, tmp):
    """Per tree, node id -> {upstream: [parent, fallback, last resort], kind, forwards}, from
    `plan --list` (the planner's own count of trees, as fleet-init plans by default)."""
    out = run("plan", fleet, "--list", "-o", os.path.join(tmp, "plan")).stdout
    trees, stack = [], []
    for line in out.splitlines():
        if re.match(r"^tree \d+:$", line) or (not trees and LINE.match(line)):
            trees.append({})
            stack = []
        m = LINE.match(line)
        if not m:
            continue
        depth = len(m.group(1)) // 2
        del stack[depth:]
        node_id, kind = m.group(2), m.group(3)
        upstream = [stack[-1]] if stack else []
        upstream += [x for x in (m.group(5), m.group(6)) if x]
        trees[-1][node_id] = {"upstream": upstream, "kind": kind, "forwards": kind != "worker" or bool(m.group(4))}
        stack.append(node_id)
    return trees


def written_configs(out):
    configs, keys = {}, {}
    for root, _, files in os.walk(out):
        for f in files:
            path = os.path.join(root, f)
            rel = os.path.relpath(path, out)
            if f.endswith(".json") and rel != "fleet.json":
                cfg = json.load(open(path))
                check(rel == cfg["id"] + ".json", f"{rel} holds the config of {cfg['id']}")
                configs[cfg["id"]] = cfg
            elif f.endswith(".key") and f != "origin.sign.key":
                check(stat.S_IMODE(os.stat(path).st_mode) == 0o600, f"{rel} is readable by others")
                keys[rel[: -len(".key")]] = json.load(open(path))["public_key"]
    return configs, keys


def compare(name, trees, out):
    configs, keys = written_configs(out)
    nodes = trees[0]
    if not check(set(configs) == set(nodes), f"{name}: configs for {sorted(set(configs) ^ set(nodes))[:5]} differ from the plan"):
        return
    sign = json.load(open(os.path.join(out, "origin.sign.key")))["public_key"]
    by_endpoint = {c["listen"]: i for i, c in configs.items() if "listen" in c}
    check(len(by_endpoint) == sum(1 for c in configs.values() if "listen" in c), f"{name}: two nodes listen on one endpoint")
    clients = {i: set() for i in nodes}
    for tree in trees:
        for node_id, node in tree.items():
            for p in node["upstream"]:
                clients[p].add(keys[node_id])
    for node_id, node in nodes.items():
        cfg = configs[node_id]
        # One tree: "parents" and "parent_keys"; several: "trees" and "tree_parent_keys", a list per tree.
        if len(trees) == 1:
            per_tree, per_tree_keys = [cfg.get("parents", [])], [cfg.get("parent_keys", [])]
        else:
            per_tree, per_tree_keys = cfg.get("trees", []), cfg.get("tree_parent_keys", [])
            check("parents" not in cfg, f"{name}: {node_id} has both parents and trees")
        for t, tree in enumerate(trees):
            upstream = tree[node_id]["upstream"]
            written = per_tree[t] if t < len(per_tree) else []  # the origin has none
            parents = [by_endpoint.get(ep, "?" + ep) for ep in written]
            check(parents == upstream, f"{name}: {node_id} has parents {parents} in tree {t}, the plan {upstream}")
            written_keys = per_tree_keys[t] if t < len(per_tree_keys) else []
            check(written_keys == [keys[p] for p in upstream], f"{name}: {node_id}: parent keys differ in tree {t}")
        forwards = any(tree[node_id]["forwards"] for tree in trees)
        check(set(cfg.get("allow_keys", [])) == clients[node_id], f"{name}: {node_id}: allowed keys differ from its clients'")
        check(("listen" in cfg) == forwards, f"{name}: {node_id} listens: {'listen' in cfg}, forwards in the plan: {forwards}")
        check(cfg.get("relay", False) == (node["kind"] == "worker" and forwards), f"{name}: {node_id}: relay flag")
        if node["kind"] == "origin":
            check("sign_key" in cfg and "trust_keys" not in cfg, f"{name}: the origin does not sign")
        else:
            check(cfg.get("trust_keys") == [sign], f"{name}: {node_id} does not trust exactly the origin's key")
        check(os.path.isabs(cfg["keys"]), f"{name}: {node_id}: key path is not absolute")
    print(f"  {name}: {len(nodes)} nodes, {len(trees)} tree(s); configs match the printed trees")


def case_fleet(tmp, name, fleet, *extra):
    out = os.path.join(tmp, name)
    run("fleet-init", "-o", out, "--fleet", fleet, *extra)
    compare(name, printed_trees(os.path.join(out, "fleet.json"), tmp), out)


def mixed_fleet(tmp):
    """A relay-less region and one whose hosts do not relay; endpoints for the serving nodes."""
    fleet = {
        "origin": {"region": "us", "uplink": "100Gbit"},
        "fanout_max": 4,
        "defaults": {"lan": {"latency_ms": 0.1, "bandwidth": "25Gbit"},
                     "worker_nic": {"uplink": "25Gbit", "downlink": "25Gbit"},
                     "relay_nic": {"uplink": "100Gbit", "downlink": "100Gbit"}},
        "regions": [{"name": "us", "workers": 9, "relays": 2},
                    {"name": "eu", "workers": 11, "relays": 0},
                    {"name": "ap", "workers": 6, "relays": 1, "worker_relays": False}],
        "wan": [{"between": ["us", "eu"], "latency_ms": 40, "bandwidth": "10Gbit"},
                {"between": ["eu", "ap"], "latency_ms": 90, "bandwidth": "5Gbit"}],
    }
    path = os.path.join(tmp, "mixed.json")
    json.dump(fleet, open(path, "w"))
    trees = printed_trees(path, tmp)
    serving = sorted(i for i in trees[0] if any(t[i]["forwards"] for t in trees))
    endpoints = {i: f"tcp://10.0.{k // 200}.{k % 200 + 1}:7100" for k, i in enumerate(serving)}
    ep_path = os.path.join(tmp, "endpoints.json")
    json.dump(endpoints, open(ep_path, "w"))
    case_fleet(tmp, "mixed", path, "--endpoints", ep_path)

    # A serving node without an endpoint, and an endpoint of a node that is not in the plan.
    missing = dict(endpoints)
    gone = serving[-1]
    del missing[gone]
    json.dump(missing, open(ep_path, "w"))
    p = run("fleet-init", "-o", os.path.join(tmp, "bad1"), "--fleet", path, "--endpoints", ep_path, ok=False)
    check(p.returncode != 0 and f"no endpoint for {gone}" in p.stderr, f"a missing endpoint is not refused: {p.stderr!r}")
    json.dump(dict(endpoints, **{"us/w99": "tcp://10.9.9.9:7100"}), open(ep_path, "w"))
    p = run("fleet-init", "-o", os.path.join(tmp, "bad2"), "--fleet", path, "--endpoints", ep_path, ok=False)
    check(p.returncode != 0 and "us/w99" in p.stderr, f"an endpoint of an unknown node is not refused: {p.stderr!r}")
    check(not os.path.exists(os.path.join(tmp, "bad1")) and not os.path.exists(os.path.join(tmp, "bad2")),
          "a refused fleet-init wrote files")


def systemd_configs(tmp):
    """--systemd: the configs name their key files where the units read them, and the commands
    printed install each node's files there and enable its unit."""
    out = os.path.join(tmp, "systemd")
    printed = run("fleet-init", "-o", out, "--origin", "tcp://10.0.0.1:7100", "--relay", "eu=tcp://10.0.1.1:7101",
                  "--workers-per-relay", "2", "--systemd").stdout
    configs, _ = written_configs(out)
    for node, cfg in configs.items():
        check(cfg["keys"] == f"/etc/deltacast/{node}.key", f"systemd: {node}'s keys at {cfg['keys']}")
        check(os.path.exists(os.path.join(out, f"{node}.key")), f"systemd: {node}.key not written to the out dir")
    check(configs["origin"].get("sign_key") == "/etc/deltacast/origin.sign.key", "systemd: the origin's sign key path")
    for node, unit in (("eu.relay-0", "deltacast-relay@eu.relay-0"), ("eu.w0", "deltacast-worker@eu.w0"), ("eu.w1", "deltacast-worker@eu.w1")):
        check(re.search(rf"install .*{re.escape(node)}\.json {re.escape(node)}\.key /etc/deltacast/\) && systemctl enable --now {re.escape(unit)}$",
                        printed, re.M) is not None, f"systemd: no install and enable line for {node}")


def timing_configs(tmp):
    """--timing goes into every node's config as its "timing"; a timing a node would refuse is
    refused before anything is written."""
    out = os.path.join(tmp, "timing")
    timing = {"parent_timeout_ms": 5000, "heartbeat_ms": 500}
    run("fleet-init", "-o", out, "--origin", "tcp://10.0.0.1:7100", "--relay", "eu=tcp://10.0.1.1:7101",
        "--workers-per-relay", "2", "--timing", json.dumps(timing))
    configs, _ = written_configs(out)
    check(len(configs) == 4, f"timing: {len(configs)} configs, not 4")
    for node, cfg in configs.items():
        check(cfg.get("timing") == timing, f"timing: {node}'s config has timing {cfg.get('timing')}")
    p = run("fleet-init", "-o", os.path.join(tmp, "bad-timing"), "--origin", "tcp://10.0.0.1:7100", "--relay", "eu=tcp://10.0.1.1:7101",
            "--timing", '{"parent_timeout_ms": 100}', ok=False)
    check(p.returncode != 0 and "must be at least twice heartbeat_ms" in p.stderr, f"a timing nodes would refuse is not refused: {p.stderr!r}")
    check(not os.path.exists(os.path.join(tmp, "bad-timing")), "a refused --timing wrote files")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        case_fleet(tmp, "four-regions", os.path.join(SCENARIOS, "four-regions.json"), "--local-ports", "20000")
        mixed_fleet(tmp)
        out = os.path.join(tmp, "shorthand")
        run("fleet-init", "-o", out, "--origin", "tcp://127.0.0.1:7100", "--relay", "a=tcp://127.0.0.1:7101",
            "--relay", "b=tcp://127.0.0.1:7102", "--workers-per-relay", "3")
        compare("shorthand", printed_trees(os.path.join(out, "fleet.json"), tmp), out)
        systemd_configs(tmp)
        timing_configs(tmp)
    for f in failures[:20]:
        print("FAIL:", f)
    print(f"fleet-init: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
