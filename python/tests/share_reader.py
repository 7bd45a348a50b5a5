"""One engine rank of a host: attaches to the worker sharing PATH and reads versions 1..LAST,
printing one JSON line per version: its number, a BLAKE2b digest of each tensor's bytes, and the
memory the shared images take in this process (Pss and Rss of the memfd mappings, from smaps).

Usage: share_reader.py PATH LAST [--slow]
With --slow it prints {"reading": 1} and then reads version 1's tensors slowly, for a test to
kill it mid-read.
"""
import hashlib
import json
import sys
import time

import deltacast


def image_memory() -> dict:
    """Pss and Rss, in bytes, of this process's mappings of shared deltacast images."""
    pss = rss = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inside = line.rstrip().endswith("/memfd:deltacast-image (deleted)")
            elif inside and head[0] == "Pss:":
                pss += int(head[1]) * 1024
            elif inside and head[0] == "Rss:":
                rss += int(head[1]) * 1024
    return {"pss": pss, "rss": rss}


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
