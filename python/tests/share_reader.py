"""One engine rank of a host: attaches to the worker sharing PATH and reads versions 1..LAST,
printing one JSON line per version: its number, a BLAKE2b digest of each tensor's bytes, and the
memory the shared images take in this process (Pss and Rss of the memfd mappings, from smaps).
Its helpers measure the same of other processes, for python/tests/test_share.py and
scripts/bench_share.py.

Usage: share_reader.py PATH LAST [--slow]
With --slow it prints {"reading": 1} and then reads version 1's tensors slowly, for a test to
kill it mid-read.
"""
import hashlib
import json
import sys
import time
import urllib.request

import deltacast
import torch


def image_mappings(pid="self") -> list[tuple[str, int, int]]:
    """(inode, Pss, Rss), in bytes, of each mapping of a shared deltacast image in process `pid`."""
    out, inode, rss = [], None, 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inode = head[4] if line.rstrip().endswith("/memfd:deltacast-image (deleted)") else None
            elif inode is not None and head[0] == "Rss:":
                rss = int(head[1]) * 1024
            elif inode is not None and head[0] == "Pss:":  # after Rss
                out.append((inode, int(head[1]) * 1024, rss))
    return out


def image_memory(pid="self") -> dict:
    """Pss and Rss, in bytes, of a process's mappings of shared deltacast images."""
    maps = image_mappings(pid)
    return {"pss": sum(m[1] for m in maps), "rss": sum(m[2] for m in maps)}


def pss_total(pid) -> int:
    """A process's whole PSS, in bytes."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no Pss for process {pid}")


def next_version(tensors: dict, k: int) -> dict:
    """The version after `tensors` (torch BF16): one ulp up at about 1% of the values, from k on."""
    out = {}
    for name, t in tensors.items():
        t = t.clone()
        t.view(torch.int16)[k::97] += 1
        out[name] = t
    return out


def bytes_in(metrics_port: int) -> int:
    """A node's deltacast_bytes_in_total, from its metrics."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return int(float(next(line.split()[-1] for line in body.splitlines() if line.startswith("deltacast_bytes_in_total"))))


def digests(version) -> dict:
    return {name: hashlib.blake2b(memoryview(array), digest_size=16).hexdigest() for name, array in version.numpy_tensors()}


def main(path: str, last: int, slow: bool) -> None:
    reader = deltacast.attach(path, timeout=60)
    for number in range(1, last + 1):
        v = reader.wait(number, timeout=120)
        if slow:
            print(json.dumps({"reading": v.number}), flush=True)
            for _, array in v.numpy_tensors():
                hashlib.blake2b(memoryview(array)).digest()
                time.sleep(0.5)
        print(json.dumps({"version": v.number, "digests": digests(v), "memory": image_memory()}), flush=True)
        del v
    reader.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), "--slow" in sys.argv[3:])
