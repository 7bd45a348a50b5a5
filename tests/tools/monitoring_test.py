#!/usr/bin/env python3
"""The Grafana dashboard and the Prometheus alert rules (packaging/monitoring) against the
metrics real nodes serve.

An origin (deltacast publish) and a worker, each with --metrics, on loopback: once the worker
holds a version and has reported it, both are scraped. Every metric the dashboard's queries and
the alert rules name must be one the nodes serve (the worker's staleness, the origin's ledger).
The dashboard must be a Grafana dashboard whose every panel has a query. With promtool
(Debian's prometheus package), `promtool check rules` and `promtool test rules` on the rules'
own tests (each alert fires on the series that should fire it, and only then).
Usage: monitoring_test.py path/to/deltacast
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

DC = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
MONITORING = os.path.join(HERE, "..", "..", "packaging", "monitoring")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def served_metrics(tmp):
    """Metric families (# TYPE) an origin and a worker serve once the worker reported a version."""
    subprocess.run([DC, "gen", "-q", "-o", os.path.join(tmp, "ckpt"), "--hidden", "64", "--layers", "2", "--vocab", "512",
                    "--ffn", "192", "--steps", "2"], check=True, capture_output=True)
    ckpts = sorted(os.path.join(tmp, "ckpt", f) for f in os.listdir(os.path.join(tmp, "ckpt")))
    endpoint, m_origin, m_worker = f"tcp://127.0.0.1:{free_port()}", free_port(), free_port()
    procs = [subprocess.Popen([DC, "publish", "--listen", endpoint, "--metrics", f"127.0.0.1:{m_origin}", "--interval-ms", "300",
                               "--linger-ms", "60000", "--log-level", "warn", *ckpts]),
             subprocess.Popen([DC, "worker", "--id", "w0", "--parent", endpoint, "--metrics", f"127.0.0.1:{m_worker}",
                               "--log-level", "warn"])]
    try:
        deadline, families = time.monotonic() + 60, set()
        while time.monotonic() < deadline:
            try:
                text = scrape(m_origin) + scrape(m_worker)
            except OSError:
                time.sleep(0.2)
                continue
            families = set(re.findall(r"^# TYPE (\S+)", text, re.M))
            if re.search(r'^deltacast_worker_version\{[^}]*worker="w0"[^}]*\} 3$', text, re.M):
                return families
            time.sleep(0.2)
        check(False, "the worker did not report version 3 to the origin's ledger within 60 s")
        return families
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)


def named_metrics(text):
    return set(re.findall(r"\bdeltacast_[a-z_]+\b", text))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        served = served_metrics(tmp)
    check({"deltacast_staleness_versions", "deltacast_worker_version"} <= served, f"the nodes serve {sorted(served)}")

    with open(os.path.join(MONITORING, "deltacast-dashboard.json")) as f:
        dashboard = json.load(f)
    check(dashboard.get("uid") and dashboard.get("title") and dashboard.get("panels"), "the dashboard lacks uid, title or panels")
    queries = []
    for panel in dashboard["panels"]:
        exprs = [t.get("expr", "") for t in panel.get("targets", [])]
        check(exprs and all(exprs), f"panel {panel.get('title')!r} has no query")
        check("gridPos" in panel and "datasource" in panel, f"panel {panel.get('title')!r} lacks gridPos or datasource")
        queries += exprs
    for name in sorted(named_metrics(" ".join(queries)) - served):
        check(False, f"the dashboard queries {name}, which no node serves")
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for want in ("versions behind", "publish to ready", "bytes", "retransmits", "failovers", "cache"):
        check(want in titles, f"no dashboard panel on {want}")

    rules_path = os.path.join(MONITORING, "deltacast-alerts.yml")
    with open(rules_path) as f:
        rules = f.read()
    for name in sorted(named_metrics(rules) - served):
        check(False, f"the alert rules name {name}, which no node serves")
    for alert in ("DeltacastWorkerBehind", "DeltacastNoNewVersion"):
        check(f"alert: {alert}" in rules, f"no alert {alert}")
    promtool = shutil.which("promtool")
    if promtool:
        for args in (["check", "rules", "deltacast-alerts.yml"], ["test", "rules", "deltacast-alerts.test.yml"]):
            p = subprocess.run([promtool, *args], cwd=MONITORING, capture_output=True, text=True)
            check(p.returncode == 0, f"promtool {' '.join(args)}: {p.stdout}{p.stderr}")
        print("promtool: rules check, and their tests pass")
    else:
        print("promtool: not installed here (Debian's prometheus package has it)")
    for f in failures:
        print("FAIL:", f)
    print(f"monitoring: {len(served)} metric families served, {len(dashboard['panels'])} panels, {rules.count('alert:')} alerts; "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
