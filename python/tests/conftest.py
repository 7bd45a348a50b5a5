"""Shared by the Python package's tests: the fake engines on the path, the binaries, free ports."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fakes"))
sys.path.insert(0, str(Path(__file__).parent))

DELTACAST = os.environ.get("DELTACAST_BIN", "deltacast")
CORRUPTING_RELAY = os.environ.get("DELTACAST_CORRUPTING_RELAY", str(Path(DELTACAST).resolve().parent.parent / "tests" / "corrupting_relay"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


class Processes:
    """Child processes of one test, stopped at its end."""

    def __init__(self):
        self.procs = []

    def start(self, *args, **kwargs) -> subprocess.Popen:
        p = subprocess.Popen([str(a) for a in args], **kwargs)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def processes():
    ps = Processes()
    yield ps
    ps.stop_all()
