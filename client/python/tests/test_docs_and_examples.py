"""The generated RPC reference is current, and the examples run against the real server."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_rpc_reference_is_current():
    script = ROOT / "tools" / "gen_rpc_reference.py"
    if not script.exists():
        pytest.skip("not run from a teserve checkout")
    if not shutil.which("protoc"):
        pytest.skip("protoc not installed")
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_char_lm_example_learns(server, tmp_path):
    script = ROOT / "examples" / "char_lm.py"
    if not script.exists():
        pytest.skip("not run from a teserve checkout")
    r = subprocess.run([sys.executable, str(script), "--server", server.address, "--steps", "40", "--batch", "8",
                        "--seq-len", "32", "--layers", "1", "--eval-every", "20", "--sample-len", "40",
                        "--plot", ""],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"train loss ([\d.]+) -> ([\d.]+) \(uniform guess ([\d.]+)\)", r.stdout)
    assert m, r.stdout
    first, last, uniform = map(float, m.groups())
    assert first > last + 0.3, r.stdout   # it learns within 40 steps
    assert last < uniform
    sample = r.stdout.split("sample:\n", 1)[1]
    assert sample.startswith("The lamp ") and len(sample.rstrip("\n")) >= len("The lamp ") + 40
    # The example deletes its session.
    import teserve
    with teserve.connect(server.address) as client:
        assert all(not any(l.name.startswith("block") for l in s.layers) for s in client.list_sessions())


def test_fp8_health_scenarios_show_underflow_and_overflow(server):
    script = ROOT / "examples" / "fp8_health_scenarios.py"
    if not script.exists():
        pytest.skip("not run from a teserve checkout")
    r = subprocess.run([sys.executable, str(script), "--server", server.address, "--steps", "50",
                        "--spike-step", "30", "--interval", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    line = [l for l in r.stdout.splitlines() if l.startswith("step 50:")][0]
    stats = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
             for m in re.finditer(r"([\w-]+) scale ([\d.e+-]+) under ([\d.]+) over ([\d.]+)", line)}
    steady, spike, alternating, fixed = (stats[k] for k in ("steady", "spike", "alternating", "alternating-fixed"))
    assert steady[1] < 0.01 and steady[2] == 0
    assert spike[0] < steady[0] / 1000       # the outlier still holds the window max
    assert spike[1] > 0.1                    # most small values flush to zero
    assert alternating[2] > 0.3              # the large step saturates under history 1
    assert fixed[2] == 0                     # a 16-step "max" window holds the large amax
