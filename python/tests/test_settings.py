"""One settings path: every field a node config file holds reaches the node from every front end
(a config file through the command line, the C ABI's settings_json, Python's Worker and
Publisher), and comes back the same from the one loader. A field added to the config schema
without a sample here fails the first test; a front end that drops a field fails the others."""

import json
import os
import subprocess

import pytest

import deltacast
from deltacast import _native

DC = os.environ.get("DELTACAST_BIN", "deltacast")
C_WORKER = os.environ.get("DELTACAST_C_WORKER")
PARENT = "tcp://127.0.0.1:9"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    subprocess.run([DC, "keygen", "-o", str(d / "node.key")], check=True, capture_output=True)
    out = subprocess.run([DC, "keygen", "--sign", "-o", str(d / "sign.key")], check=True, capture_output=True, text=True).stdout
    curve = json.loads((d / "node.key").read_text())
    return dict(node=str(d / "node.key"), sign=str(d / "sign.key"), sign_public=out.strip().split()[-1],
                curve_public=curve["public_key"])


def samples(keys):
    """Per field: settings that set it to a value other than its default (with what it needs)."""
    other = "tcp://127.0.0.1:10"
    return {
        "id": {"id": "sample-node"},
        "listen": {"listen": "tcp://127.0.0.1:7301"},
        "parents": {"parents": [PARENT, other]},
        "trees": {"trees": [[PARENT], [other]]},
        "cache_size": {"cache_size": "3GB"},
        "queue_size": {"queue_size": "32MB"},
        "keys": {"keys": keys["node"], "parent_keys": [keys["curve_public"]]},
        "parent_keys": {"keys": keys["node"], "parent_keys": [keys["curve_public"]]},
        "tree_parent_keys": {"keys": keys["node"], "trees": [[PARENT], [other]],
                             "tree_parent_keys": [[keys["curve_public"]], [keys["curve_public"]]]},
        "allow_keys": {"keys": keys["node"], "parent_keys": [keys["curve_public"]], "allow_keys": [keys["curve_public"]]},
        "metrics": {"metrics": "127.0.0.1:9401"},
        "limits": {"limits": {"image_bytes_max": 2 << 30, "needs_per_s_max": 77, "connections_max": 99, "stripe_part_bytes": 65536}},
        "timing": {"timing": {"heartbeat_ms": 100, "parent_timeout_ms": 900, "child_timeout_ms": 5000, "need_after_ms": 300,
                              "parent_return_ms": 0}},
        "sign_key": {"sign_key": keys["sign"]},
        "trust_keys": {"trust_keys": [keys["sign_public"]]},
        "shard_keys": {"shard_keys": [keys["sign_public"]], "expect_shards": 1},
        "shard": {"shard": "1/4", "parents": [PARENT]},
        "expect_shards": {"expect_shards": 3},
        "log_level": {"log_level": "warn"},
        "stripes": {"stripes": 3},
        "stripes_start": {"stripes": 3, "stripes_start": 2},
        "congestion_control": {"congestion_control": "cubic"},
        "relay": {"relay": True},
        "in_place": {"in_place": True},
        "share": {"share": "/tmp/deltacast-settings-sample.sock"},
        "tensors": {"tensors": ["model.layers.1[0-5].*", "lm_head.weight"]},
        "scrub_rate": {"scrub_rate": "64MB"},
        "change_history": {"change_history": 7},
        "change_history_bytes": {"change_history_bytes": 1 << 20},
    }


# Fields only a publisher takes: a worker (or relay) given one refuses it.
PUBLISHER_ONLY = {"shard", "expect_shards"}
# And the reverse: a publisher given one refuses it.
WORKER_ONLY = {"share", "tensors"}


class Refused(Exception):
    """A front end outside this process refused the settings (its message)."""


def test_every_config_field_has_a_sample_here(keys):
    assert set(samples(keys)) == set(_native.setting_names())


def with_node(settings):
    """A worker's id and parent, unless the settings name them: the front ends' named arguments
    are left unset, so that these come through `settings` too."""
    base = {"id": "w"} if "id" not in settings else {}
    if "parents" not in settings and "trees" not in settings:
        base["parents"] = [PARENT]
    return dict(base, **settings)


def as_publisher(settings):
    """The sample as a publisher takes it: the origin has no parents and listens (its own CURVE keys
    and the children it allows come as named arguments, a key file through `settings` still does);
    a trainer shard keeps its one parent, the origin."""
    if "shard" in settings:
        return dict(settings)
    out = {k: v for k, v in settings.items() if k not in ("parents", "trees", "parent_keys", "tree_parent_keys")}
    return dict(out, listen=out.get("listen", "tcp://127.0.0.1:7302")) if out else {}


def through_cli(command, settings, tmp_path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps(settings))
    out = subprocess.run([DC, command, "--config", str(path), "--print-settings"], capture_output=True, text=True)
    if out.returncode != 0:
        raise Refused(out.stderr)
    return json.loads(out.stdout)


def settings_through_cli(settings, tmp_path):
    return through_cli("worker", with_node(settings), tmp_path)


def settings_through_cli_publisher(settings, tmp_path):
    return through_cli("publish", settings, tmp_path)


def settings_through_c(settings, tmp_path):
    if not C_WORKER:
        pytest.fail("DELTACAST_C_WORKER (the c_worker_test program) is not set: ctest sets it")
    out = subprocess.run([C_WORKER, "--settings", "", "", json.dumps(with_node(settings))], capture_output=True, text=True)
    if out.returncode != 0:
        raise Refused(out.stdout + out.stderr)
    return json.loads(out.stdout)


def settings_through_python_worker(settings, tmp_path):
    # The named arguments say nothing: whatever `settings` holds must come through.
    return deltacast.Worker.settings("", None, change_history=None, settings=with_node(settings))


def settings_through_python_publisher(settings, tmp_path):
    return deltacast.Publisher.settings(settings=settings)


FRONT_ENDS = {"cli": settings_through_cli, "c": settings_through_c, "python-worker": settings_through_python_worker,
              "cli-publisher": settings_through_cli_publisher, "python-publisher": settings_through_python_publisher}


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_every_config_field_reaches_the_node_from_every_front_end(front_end, keys, tmp_path):
    publisher = front_end.endswith("publisher")
    for field, settings in samples(keys).items():
        if publisher:
            settings = as_publisher(settings)
            if not settings:
                continue  # parents, trees: not a publisher's
            if WORKER_ONLY & set(settings):
                with pytest.raises((Refused, deltacast.Error), match="only a worker"):
                    FRONT_ENDS[front_end](settings, tmp_path)
                continue
        elif PUBLISHER_ONLY & set(settings):
            with pytest.raises((Refused, deltacast.Error), match="for publishers"):
                FRONT_ENDS[front_end](settings, tmp_path)
            continue
        got = FRONT_ENDS[front_end](settings, tmp_path)
        for name, value in settings.items():
            assert got.get(name) == value, (front_end, field, name, got)


def test_a_front_end_refuses_what_the_loader_refuses(tmp_path):
    bad = {"limits": {"needs_per_s_max": 0}}
    with pytest.raises(deltacast.Error, match="needs_per_s_max"):
        deltacast.Worker.settings("w", [PARENT], settings=bad)
    with pytest.raises(deltacast.Error, match="unknown field"):
        deltacast.Worker.settings("w", [PARENT], settings={"heartbeat": 5})
    with pytest.raises(deltacast.Error, match="stripes_start"):
        deltacast.Worker.settings("w", [PARENT], settings={"stripes": 2, "stripes_start": 3})
    with pytest.raises(deltacast.Error, match="twice heartbeat_ms"):
        deltacast.Publisher.settings("tcp://127.0.0.1:7303", settings={"timing": {"heartbeat_ms": 1000, "parent_timeout_ms": 1500}})
    if C_WORKER:
        out = subprocess.run([C_WORKER, "--settings", "w", PARENT, json.dumps(bad)], capture_output=True, text=True)
        assert out.returncode == 1 and "needs_per_s_max" in out.stdout, out.stdout
