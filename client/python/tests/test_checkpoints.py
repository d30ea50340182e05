"""Checkpoint files are standard safetensors: the `safetensors` package reads what the
server's SaveCheckpoint wrote, with the values GetParameters returns, and the manifest's
SHA-256 and sizes match the files. Needs the `safetensors` package (.ci/run installs it
into its venv); skipped, saying so, where it is not importable."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import teserve
from teserve.v1 import service_pb2

try:
    from safetensors import safe_open
    from safetensors.numpy import load_file
except ImportError:  # pragma: no cover - depends on the environment
    pytest.skip("the safetensors package is not installed (pip install safetensors): "
                "the check that it reads teserve checkpoints is skipped", allow_module_level=True)


def test_safetensors_package_reads_checkpoint_files(start_server, tmp_path):
    server = start_server(f"--checkpoint_dir={tmp_path}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    y = rng.standard_normal((16, 8)).astype(np.float32)
    with teserve.connect(server.address) as client:
        session = client.create_session([teserve.LayerNorm(32), teserve.Linear(32, 8)],
                                        teserve.DelayedScaling(amax_history_len=4), teserve.AdamW(lr=0.01))
        session.forward_backward(x, target=y, loss="mse")
        session.step()
        session.forward_backward(x, target=y, loss="mse")  # gradients pending in the checkpoint
        saved = client._call("SaveCheckpoint", service_pb2.SaveCheckpointRequest(session_id=session.id, name="py-1"))
        assert saved.step == 1
        params = session.parameters()
        grads = session.gradients()

    ckpt = tmp_path / "py-1"
    loaded = load_file(str(ckpt / "parameters.safetensors"))
    assert list(loaded) and set(loaded) == set(params)
    for name, value in params.items():
        assert loaded[name].dtype == np.float32 and loaded[name].tobytes() == value.tobytes(), name
    loaded_grads = load_file(str(ckpt / "gradients.safetensors"))
    for name, value in grads.items():
        assert loaded_grads[name].tobytes() == value.tobytes(), name
    assert any(np.any(g != 0) for g in grads.values())

    moments = load_file(str(ckpt / "optimizer.safetensors"))
    assert set(moments) == {f"{n}.{b}" for n in params for b in ("exp_avg", "exp_avg_sq")}
    for name, value in params.items():
        assert moments[f"{name}.exp_avg"].shape == value.shape

    state = load_file(str(ckpt / "state.safetensors"))
    assert state["session.step"].dtype == np.int64 and state["session.step"].tolist() == [1]
    history = [k for k in state if k.endswith(".amax_history")]
    assert history and all(state[k].shape == (4,) for k in history)
    with safe_open(str(ckpt / "state.safetensors"), framework="np") as f:
        assert f.metadata() == {"format": "teserve-checkpoint", "version": "1", "group": "state", "step": "1"}

    manifest = json.loads((ckpt / "checkpoint.json").read_text())
    assert manifest["format"] == "teserve-checkpoint" and manifest["version"] == 1
    for entry in manifest["files"]:
        data = (ckpt / entry["name"]).read_bytes()
        assert int(entry["bytes"]) == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    model = json.loads((ckpt / "model.json").read_text())
    assert model["layers"][1]["linear"]["out_features"] == "8"


def test_bf16_session_resumes_from_its_checkpoint_with_its_params_dtype(start_server, tmp_path):
    """params_dtype is part of the saved spec: a session made from the checkpoint computes in
    BF16 again, from the same FP32 masters, and its outputs equal the original's bit for bit."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    server = start_server(f"--checkpoint_dir={tmp_path}")
    x = np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32)
    model = [teserve.LayerNorm(32, params_dtype="bfloat16"), teserve.Linear(32, 8, params_dtype="bfloat16")]
    with teserve.connect(server.address) as client:
        session = client.create_session(model, teserve.DelayedScaling(amax_history_len=4), teserve.AdamW(lr=0.01))
        for _ in range(2):
            session.forward_backward(x, target=np.zeros((16, 8), np.float32), loss="mse")
            session.step(zero_grad=True)
        client._call("SaveCheckpoint", service_pb2.SaveCheckpointRequest(session_id=session.id, name="bf16"))
        want = session.forward(x, no_grad=True).output
        resumed_id = client._call("CreateSession", service_pb2.CreateSessionRequest(from_checkpoint="bf16")).session_id
        resumed = teserve.Session(client, resumed_id, owned=True)
        assert [layer.params_dtype for layer in resumed.info.model.layers] == [
            layer.params_dtype for layer in session.info.model.layers]
        got = resumed.forward(x, no_grad=True).output
        assert got.dtype == ml_dtypes.bfloat16 and want.dtype == ml_dtypes.bfloat16
        assert got.tobytes() == want.tobytes()
