"""numpy <-> wire round trips, with and without the server."""
from __future__ import annotations

import numpy as np
import pytest

import teserve
from teserve import _tensors
from teserve.v1 import tensor_pb2


@pytest.mark.parametrize("dtype,wire", [
    (np.float32, tensor_pb2.FLOAT32), (np.float16, tensor_pb2.FLOAT16), (np.int32, tensor_pb2.INT32),
    (np.int64, tensor_pb2.INT64), (np.bool_, tensor_pb2.BOOL)])
def test_plain_dtypes_round_trip(dtype, wire):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 4, 5)) * 10).astype(dtype)
    t = teserve.to_wire(a)
    assert t.dtype == wire
    assert list(t.shape) == [3, 4, 5]
    assert len(t.data) == a.nbytes
    b = teserve.from_wire(t)
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(a, b)
    b[0, 0, 0] = 1  # decoded arrays are writable copies


def test_float64_narrows_and_views_are_made_contiguous():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2]
    t = teserve.to_wire(a)
    assert t.dtype == tensor_pb2.FLOAT32
    np.testing.assert_array_equal(teserve.from_wire(t), a.astype(np.float32))
    big_endian = np.arange(4, dtype=">f4")
    np.testing.assert_array_equal(teserve.from_wire(teserve.to_wire(big_endian)), big_endian)


def test_scalars_lists_and_unsupported_dtypes():
    assert list(teserve.to_wire(3.0).shape) == []
    np.testing.assert_array_equal(teserve.from_wire(teserve.to_wire([[1, 2], [3, 4]])), [[1, 2], [3, 4]])
    with pytest.raises(TypeError, match=r"inputs\[0\]: expected dtype one of .* got complex64"):
        teserve.to_wire(np.zeros(2, np.complex64), "inputs[0]")


def test_wrong_byte_count_names_the_field():
    t = tensor_pb2.Tensor(dtype=tensor_pb2.FLOAT32, shape=[2, 2], data=b"\0" * 12)
    with pytest.raises(ValueError, match=r"outputs\[0\].data: expected 16 bytes .* got 12"):
        teserve.from_wire(t, "outputs[0]")


def test_bfloat16_without_ml_dtypes_widens_exactly(monkeypatch):
    values = np.array([1.0, -2.5, 3.140625, 1e-3], np.float32)
    bits = (values.view(np.uint32) >> 16).astype("<u2")  # exact bf16 values above
    t = tensor_pb2.Tensor(dtype=tensor_pb2.BFLOAT16, shape=[4], data=bits.tobytes())
    monkeypatch.setattr(_tensors, "_ml_dtypes", None)
    out = teserve.from_wire(t)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, (bits.astype(np.uint32) << 16).view(np.float32))


def test_bfloat16_with_ml_dtypes_round_trips_through_the_server(client):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    x32 = rng.standard_normal((4, 8)).astype(np.float32)
    x16 = x32.astype(ml_dtypes.bfloat16)
    t = teserve.to_wire(x16)
    assert t.dtype == tensor_pb2.BFLOAT16 and len(t.data) == 2 * x16.size
    back = teserve.from_wire(t)
    assert back.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(back.astype(np.float32), x16.astype(np.float32))
    with client.create_session([teserve.Linear(8, 3)]) as session:
        out_bf16 = session.forward(x16, no_grad=True).output
        out_exact = session.forward(x16.astype(np.float32), no_grad=True).output
        assert out_bf16.dtype == np.float32
        np.testing.assert_array_equal(out_bf16, out_exact)
        # Parameters written as bfloat16 read back as the same values in float32.
        w = rng.standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
        session.load_parameters({"layers.0.weight": w})
        np.testing.assert_array_equal(session.parameters()["layers.0.weight"], w.astype(np.float32))


def test_float16_inputs_are_widened_by_the_server(client):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 8)).astype(np.float16)
    with client.create_session([teserve.LayerNorm(8)]) as session:
        np.testing.assert_array_equal(session.forward(x, no_grad=True).output,
                                      session.forward(x.astype(np.float32), no_grad=True).output)


def test_side_inputs_travel_as_their_te_dtypes():
    from teserve.client import Session
    named = {n.name: n.tensor for n in Session._encode_side(
        {"cu_seqlens_q": [0, 3, 5], "m_splits": [2, 3], "attention_mask": [[0, 1]], "encoder_output": np.ones(2)})}
    assert named["cu_seqlens_q"].dtype == tensor_pb2.INT32
    assert named["m_splits"].dtype == tensor_pb2.INT64
    assert named["attention_mask"].dtype == tensor_pb2.BOOL
    assert named["encoder_output"].dtype == tensor_pb2.FLOAT32


def test_torch_tensors_in_and_out(client):
    torch = pytest.importorskip("torch")
    with client.create_session([teserve.Linear(8, 3)]) as session:
        x = torch.randn(4, 8)
        fwd = session.forward(x)
        assert isinstance(fwd.output, torch.Tensor)
        expected = session.forward(x.numpy(), no_grad=True).output
        np.testing.assert_array_equal(fwd.output.numpy(), expected)
        bwd = fwd.backward(torch.ones(4, 3))
        assert isinstance(bwd.grad_input, torch.Tensor) and tuple(bwd.grad_input.shape) == (4, 8)
        out_bf16 = session.forward(x.to(torch.bfloat16), no_grad=True).output
        np.testing.assert_array_equal(out_bf16.numpy(),
                                      session.forward(x.to(torch.bfloat16).float(), no_grad=True).output.numpy())
