"""The committed generated modules match proto/ (tools/gen_py_stubs.sh --check)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_generated_modules_are_current():
    script = ROOT / "tools" / "gen_py_stubs.sh"
    if not script.exists():
        pytest.skip("not run from a teserve checkout")
    if not (shutil.which("protoc") and shutil.which("grpc_python_plugin")):
        pytest.skip("protoc / grpc_python_plugin not installed")
    r = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_generated_modules_describe_every_rpc():
    from teserve.v1 import service_pb2, service_pb2_grpc

    methods = {m.name for m in service_pb2.DESCRIPTOR.services_by_name["Trainer"].methods}
    stub_methods = {name for name in vars(service_pb2_grpc.TrainerServicer) if not name.startswith("_")}
    assert methods == stub_methods
    from teserve.client import Session
    # Every per-session RPC has a Session method.
    wrapped = {"Forward": "forward", "Backward": "backward", "Step": "step", "ForwardBackward": "forward_backward",
               "ZeroGrad": "zero_grad", "GetParameters": "parameters", "SetParameters": "load_parameters",
               "GetQuantizationState": "quant_state", "GetSession": "info", "DeleteSession": "delete"}
    for rpc, method in wrapped.items():
        assert rpc in methods and hasattr(Session, method)
