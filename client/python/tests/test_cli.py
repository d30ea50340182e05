"""python -m teserve."""
from __future__ import annotations

import socket
import subprocess
import sys

import teserve


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "teserve", *args], capture_output=True, text=True, timeout=60)


def test_health_serving_exits_0(server):
    r = run("health", "--server", server.address)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "SERVING"


def test_health_of_a_closed_port_exits_1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run("health", "--server", f"127.0.0.1:{port}", "--timeout", "2")
    assert r.returncode == 1
    assert "UNAVAILABLE" in r.stderr


def test_bad_usage_exits_2():
    assert run().returncode == 2
    assert run("health", "--no-such-flag").returncode == 2


def test_server_info_lists_recipes(server):
    r = run("server-info", "--server", server.address)
    assert r.returncode == 0, r.stderr
    for recipe in ("delayed", "current", "mxfp8", "block", "nvfp4"):
        assert recipe in r.stdout
    info = teserve.connect(server.address).server_info()
    assert info.version in r.stdout
    # The limits travel too (the fixture's server runs with the defaults).
    assert info.max_tokens_per_request == 65536 and "max_tokens_per_request 65536" in r.stdout
    assert info.max_attention_scores == 1 << 27
    assert info.max_live_handles == 1024
