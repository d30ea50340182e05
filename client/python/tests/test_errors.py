"""Server and client errors surface as teserve exceptions with code and message."""
from __future__ import annotations

import socket

import grpc
import numpy as np
import pytest

import teserve


def test_bad_shape_is_invalid_argument_naming_the_field(client):
    with client.create_session([teserve.Linear(32, 8)]) as session:
        with pytest.raises(teserve.InvalidArgument) as err:
            session.forward(np.zeros((4, 16), np.float32))
        e = err.value
        assert isinstance(e, teserve.TeserveError)
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.method == "Forward"
        assert "inputs[0].shape" in e.message and "expected" in e.message and "[4, 16]" in e.message
        assert e.message in str(e)


def test_bad_spec_is_invalid_argument(client):
    with pytest.raises(teserve.InvalidArgument) as err:
        client.create_session([teserve.TransformerLayer(30, 64, 4)])  # 30 heads do not divide
    assert "layers[0]" in err.value.message or "hidden_size" in err.value.message
    with pytest.raises(teserve.InvalidArgument) as err:
        client.create_session([teserve.LayerNormMLP(8, 16, activation="gelux")])
    assert "activation" in err.value.message and "gelux" in err.value.message
    with pytest.raises(teserve.InvalidArgument) as err:
        client.create_session([teserve.Linear(8, 8)], teserve.DelayedScaling(fp8_format=teserve.Format.E5M2))
    assert "fp8_format" in err.value.message


def test_unknown_side_input_name_is_rejected_by_name(client):
    with client.create_session([teserve.Linear(4, 4)]) as session:
        with pytest.raises(teserve.InvalidArgument) as err:
            session.forward(np.zeros((2, 4), np.float32), attention_maks=np.zeros((1,), bool))
        assert "attention_maks" in err.value.message and "attention_mask" in err.value.message


def test_unknown_session_and_used_handle_are_not_found(client):
    with pytest.raises(teserve.NotFound) as err:
        client.session("0" * 32)
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    with client.create_session([teserve.Linear(4, 4)]) as session:
        fwd = session.forward(np.ones((2, 4), np.float32))
        fwd.backward(np.ones((2, 4), np.float32))
        with pytest.raises(teserve.NotFound) as err:
            fwd.backward(np.ones((2, 4), np.float32))
        assert str(fwd.handle) in err.value.message
        with pytest.raises(teserve.NotFound):
            session.parameters(["layers.0.nope"])


def test_backward_gradient_shape_mismatch(client):
    with client.create_session([teserve.Linear(4, 3)]) as session:
        fwd = session.forward(np.ones((2, 4), np.float32))
        with pytest.raises(teserve.InvalidArgument) as err:
            fwd.backward(np.ones((2, 4), np.float32))
        assert "grad_outputs[0]" in err.value.message
        # A failed backward leaves the handle usable.
        assert fwd.backward(np.ones((2, 3), np.float32)).grad_input.shape == (2, 4)


def test_set_parameters_is_all_or_nothing(client):
    with client.create_session([teserve.Linear(4, 3)]) as session:
        before = session.parameters()
        with pytest.raises(teserve.InvalidArgument) as err:
            session.load_parameters({"layers.0.bias": np.ones(3, np.float32),
                                     "layers.0.weight": np.ones((4, 4), np.float32)})
        assert "layers.0.weight" in err.value.message
        after = session.parameters()
        np.testing.assert_array_equal(after["layers.0.bias"], before["layers.0.bias"])


def test_max_sessions_is_resource_exhausted(start_server):
    small = start_server("--max_sessions=2")
    with teserve.connect(small.address) as client:
        a = client.create_session([teserve.Linear(2, 2)])
        b = client.create_session([teserve.Linear(2, 2)])
        with pytest.raises(teserve.ResourceExhausted) as err:
            client.create_session([teserve.Linear(2, 2)])
        assert "max_sessions" in err.value.message or "2" in err.value.message
        a.delete()
        client.create_session([teserve.Linear(2, 2)]).delete()
        b.delete()


def test_server_down_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    with teserve.connect(f"127.0.0.1:{port}", timeout=5) as client:
        with pytest.raises(teserve.Unavailable) as err:
            client.server_info()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(teserve.Unavailable):
            client.wait_until_serving(timeout=0.5)


def test_client_side_type_errors_name_the_field():
    with pytest.raises(TypeError, match=r"TransformerLayer.hidden_size: expected int, got str"):
        teserve.TransformerLayer("64", 256, 4).to_proto()
    with pytest.raises(TypeError, match=r"window_size: expected a \(left, right\) pair"):
        teserve.MultiheadAttention(8, 2, window_size=5).to_proto()
    with pytest.raises(ValueError, match=r"activation_params: expected keys"):
        teserve.LayerNormMLP(8, 16, activation="clamped_swiglu", activation_params={"beta": 1}).to_proto()
    with pytest.raises(ValueError, match=r"loss: expected 'mse', 'cross_entropy'"):
        teserve.recipes.loss_spec("l1")
    with pytest.raises(TypeError, match=r"recipe: expected a teserve recipe"):
        teserve.recipes.recipe_spec("delayed")


def test_cross_entropy_needs_integer_labels(client):
    with client.create_session([teserve.Linear(4, 3)]) as session:
        with pytest.raises(TypeError, match="integer class labels"):
            session.forward_backward(np.ones((2, 4)), target=np.array([0.5, 1.0]))
        with pytest.raises(teserve.InvalidArgument) as err:
            session.forward_backward(np.ones((2, 4)), target=np.array([0, 7]))
        assert "target" in err.value.message


def test_token_is_sent_as_metadata(server):
    # teserve checks no token; the call must still succeed with one attached.
    with teserve.connect(server.address, token="secret") as client:
        assert client.health() == "SERVING"
        assert client.server_info().device == "cpu"
