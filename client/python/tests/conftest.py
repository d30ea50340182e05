"""Fixtures: a real teserve server (bazel-bin/server/teserve, --device=cpu) on a free
loopback port, and clients connected to it.

The binary is $TESERVE_BINARY when set, else bazel-bin/server/teserve of the repository
holding these tests (found by walking up to WORKSPACE), else `bazel info bazel-bin`.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

import teserve


def _repo_root() -> Optional[Path]:
    for parent in Path(__file__).resolve().parents:
        if (parent / "WORKSPACE").exists() and (parent / "server").is_dir():
            return parent
    return None


def find_server_binary() -> Path:
    env = os.environ.get("TESERVE_BINARY")
    if env:
        path = Path(env)
        if not os.access(path, os.X_OK):
            raise FileNotFoundError(f"TESERVE_BINARY={env}: expected an executable teserve binary")
        return path
    root = _repo_root()
    tried: List[str] = []
    if root is not None:
        candidate = root / "bazel-bin" / "server" / "teserve"
        tried.append(str(candidate))
        if os.access(candidate, os.X_OK):
            return candidate
        if shutil.which("bazel"):
            out = subprocess.run(["bazel", "info", "bazel-bin"], cwd=root, capture_output=True,
                                 text=True, timeout=120)
            if out.returncode == 0:
                candidate = Path(out.stdout.strip()) / "server" / "teserve"
                tried.append(str(candidate))
                if os.access(candidate, os.X_OK):
                    return candidate
    raise FileNotFoundError(
        "no teserve binary: set TESERVE_BINARY or run `bazel build --jobs=2 //server:teserve` "
        f"(tried {tried or 'no repository found above ' + __file__})")


class ServerProcess:
    """A teserve server started with --port=0; the ports are read from its log."""

    def __init__(self, *extra_flags: str, **connect_options: object) -> None:
        self.binary = find_server_binary()
        self.log: List[str] = []
        self.proc = subprocess.Popen(
            [str(self.binary), "--device=cpu", "--host=127.0.0.1", "--port=0", "--metrics_port=0",
             "--shutdown_grace_seconds=1", *extra_flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = self.metrics_port = 0
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line.rstrip())
                m = re.search(r"gRPC listening on [^ ]*:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                m = re.search(r"metrics on http://[^ ]*:(\d+)/metrics", line)
                if m:
                    self.metrics_port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60) or not self.port:
            self.stop()
            raise RuntimeError(f"{self.binary} did not start; its log:\n" + "\n".join(self.log))
        self.address = f"127.0.0.1:{self.port}"
        with teserve.connect(self.address, **connect_options) as client:  # type: ignore[arg-type]
            client.wait_until_serving(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess()
    yield proc
    proc.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[teserve.Client]:
    with teserve.connect(server.address) as c:
        yield c


@pytest.fixture
def start_server() -> Iterator:
    """Starts extra servers with given flags; stops them after the test."""
    started: List[ServerProcess] = []

    def start(*flags: str, **connect_options: object) -> ServerProcess:
        proc = ServerProcess(*flags, **connect_options)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
