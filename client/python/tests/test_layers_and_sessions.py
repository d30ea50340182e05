"""Layer specs, recipes and sessions against the real server."""
from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

import teserve
from teserve.v1 import model_pb2

ALL_LAYERS = [
    (teserve.Linear(8, 6), "Linear", ["weight", "bias"]),
    (teserve.LayerNorm(8), "LayerNorm", ["weight", "bias"]),
    (teserve.RMSNorm(8), "RMSNorm", ["weight"]),
    (teserve.LayerNormLinear(8, 6), "LayerNormLinear", ["layer_norm_weight", "layer_norm_bias", "weight", "bias"]),
    (teserve.LayerNormMLP(8, 16), "LayerNormMLP",
     ["layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]),
    (teserve.GroupedLinear(2, 8, 6), "GroupedLinear", ["weight0", "weight1", "bias0", "bias1"]),
    (teserve.DotProductAttention(2, 4), "DotProductAttention", []),
    (teserve.MultiheadAttention(8, 2), "MultiheadAttention", None),
    (teserve.TransformerLayer(8, 16, 2), "TransformerLayer", None),
]


@pytest.mark.parametrize("layer,kind,params", ALL_LAYERS, ids=[k for _, k, _ in ALL_LAYERS])
def test_every_layer_creates_a_session(client, layer, kind, params):
    with client.create_session([layer]) as session:
        info = session.info
        assert info.layers[0].kind == kind
        assert info.layers[0].name == "layers.0"
        names = list(info.layers[0].parameters)
        if params is not None:
            assert sorted(names) == sorted(f"layers.0.{p}" for p in params)
        # The parameters the server reports are the ones GetParameters returns.
        assert sorted(session.parameters()) == sorted(names)
        assert info.num_parameters == sum(v.size for v in session.parameters().values())


def test_layer_names_and_te_defaults_reach_the_server(client):
    layer = teserve.TransformerLayer(16, 32, 4, name="block", self_attn_mask_type="no_mask")
    with client.create_session([layer]) as session:
        echoed = session.info.model.layers[0]
        assert echoed.name == "block"
        spec = echoed.transformer_layer
        # TE's defaults, sent explicitly by the client.
        assert spec.hidden_dropout == pytest.approx(0.1)
        assert spec.attention_dropout == pytest.approx(0.1)
        assert spec.layernorm_epsilon == pytest.approx(1e-5)
        assert spec.activation == "gelu"
        assert spec.attn_input_format == "sbhd"
        assert spec.self_attn_mask_type == "no_mask"
        assert session.info.layers[0].parameters[0].startswith("block.")


def test_defaults_follow_transformer_engine():
    sig = inspect.signature(teserve.TransformerLayer)
    assert sig.parameters["hidden_dropout"].default == 0.1
    assert sig.parameters["self_attn_mask_type"].default == "causal"
    assert sig.parameters["enc_dec_attn_mask_type"].default == "no_mask"
    assert sig.parameters["layer_type"].default == "encoder"
    assert sig.parameters["normalization"].default == "LayerNorm"
    assert list(sig.parameters)[:3] == ["hidden_size", "ffn_hidden_size", "num_attention_heads"]
    assert inspect.signature(teserve.MultiheadAttention).parameters["attention_dropout"].default == 0.1
    assert inspect.signature(teserve.DotProductAttention).parameters["attention_dropout"].default == 0.0
    assert inspect.signature(teserve.DotProductAttention).parameters["qkv_format"].default == "sbhd"
    assert inspect.signature(teserve.LayerNormMLP).parameters["activation"].default == "gelu"
    d = teserve.DelayedScaling()
    assert (d.margin, d.amax_history_len, d.amax_compute_algo, d.fp8_format) == (0, 1024, "max", teserve.Format.HYBRID)
    assert teserve.MXFP8BlockScaling().fp8_format == teserve.Format.E4M3
    b = teserve.Float8BlockScaling()
    assert (b.x_block_scaling_dim, b.w_block_scaling_dim, b.grad_block_scaling_dim) == (1, 2, 1)


def test_every_layer_spec_field_exists_in_the_proto():
    # A renamed or misspelt argument would otherwise only fail when it is set.
    specials = {"kv_channels"}
    for cls, message in [(teserve.Linear, model_pb2.LinearSpec), (teserve.LayerNorm, model_pb2.LayerNormSpec),
                         (teserve.RMSNorm, model_pb2.RMSNormSpec), (teserve.GroupedLinear, model_pb2.GroupedLinearSpec),
                         (teserve.LayerNormLinear, model_pb2.LayerNormLinearSpec),
                         (teserve.LayerNormMLP, model_pb2.LayerNormMLPSpec),
                         (teserve.DotProductAttention, model_pb2.DotProductAttentionSpec),
                         (teserve.MultiheadAttention, model_pb2.MultiheadAttentionSpec),
                         (teserve.TransformerLayer, model_pb2.TransformerLayerSpec)]:
        proto_fields = set(message.DESCRIPTOR.fields_by_name)
        for f in dataclasses.fields(cls):
            if f.name in ("name", "params_dtype") or f.name in specials:
                continue
            assert f.name in proto_fields, f"{cls.__name__}.{f.name} is not a field of {message.__name__}"


@pytest.mark.parametrize("recipe,name", [
    (None, "none"),
    (teserve.DelayedScaling(), "delayed"),
    (teserve.Float8CurrentScaling(), "current"),
    (teserve.MXFP8BlockScaling(), "mxfp8"),
    (teserve.Float8BlockScaling(), "block"),
    (teserve.NVFP4BlockScaling(), "nvfp4"),
])
def test_every_recipe_trains(client, recipe, name):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    with client.create_session([teserve.Linear(64, 64)], recipe, teserve.SGD(lr=0.1)) as session:
        assert session.info.recipe_name == name
        first = session.forward_backward(x, target=x, loss="mse").loss
        for _ in range(5):
            session.step(zero_grad=True)
            last = session.forward_backward(x, target=x, loss="mse").loss
        assert last < first
        tensors = session.quant_state().tensors
        if recipe is None:
            assert len(tensors) == 0
        else:
            assert {t.recipe for t in tensors} == {name}
            assert {"input", "weight", "grad_output"} <= {t.tensor for t in tensors}


def linear_session(client, rng, in_f=5, out_f=3, **kw):
    session = client.create_session([teserve.Linear(in_f, out_f)], None, teserve.SGD(lr=0.5), **kw)
    w = rng.standard_normal((out_f, in_f)).astype(np.float32)
    b = rng.standard_normal(out_f).astype(np.float32)
    session.load_parameters({"layers.0.weight": w, "layers.0.bias": b})
    return session, w, b


def test_linear_forward_backward_step_match_numpy(client):
    rng = np.random.default_rng(1)
    session, w, b = linear_session(client, rng)
    with session:
        x = rng.standard_normal((4, 5)).astype(np.float32)
        fwd = session.forward(x)
        np.testing.assert_allclose(fwd.output, x @ w.T + b, rtol=1e-5, atol=1e-6)
        assert fwd.output.dtype == np.float32 and fwd.handle != 0
        g = rng.standard_normal((4, 3)).astype(np.float32)
        bwd = fwd.backward(g)
        np.testing.assert_allclose(bwd.grad_input, g @ w, rtol=1e-5, atol=1e-6)
        grads = session.gradients()
        np.testing.assert_allclose(grads["layers.0.weight"], g.T @ x, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grads["layers.0.bias"], g.sum(0), rtol=1e-5, atol=1e-6)
        result = session.step()
        assert result.step == 1 and not result.skipped
        expected_norm = np.sqrt((grads["layers.0.weight"] ** 2).sum() + (grads["layers.0.bias"] ** 2).sum())
        assert result.grad_norm == pytest.approx(expected_norm, rel=1e-5)
        params = session.parameters()
        np.testing.assert_allclose(params["layers.0.weight"], w - 0.5 * (g.T @ x), rtol=1e-5, atol=1e-6)
        assert session.info.step == 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", np.float16])
def test_params_dtype_outputs_16_bit_activations_and_keeps_fp32_masters(client, dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2)
    model = [teserve.LayerNorm(16, params_dtype=dtype), teserve.Linear(16, 8, params_dtype=dtype)]
    with client.create_session(model, teserve.DelayedScaling(), teserve.SGD(lr=0.1)) as session:
        wire = {"bfloat16": "BFLOAT16"}.get(dtype if isinstance(dtype, str) else "", "FLOAT16")
        assert [model_pb2.LayerSpec.DESCRIPTOR.fields_by_name["params_dtype"].enum_type.values_by_number[
            layer.params_dtype].name for layer in session.info.model.layers] == [wire, wire]
        x = rng.standard_normal((32, 16)).astype(np.float32)
        w = session.parameters()["layers.1.weight"]
        fwd = session.forward(x)
        want_dtype = ml_dtypes.bfloat16 if wire == "BFLOAT16" else np.float16
        assert fwd.output.dtype == want_dtype
        # The layers compute from FP32 masters rounded to 16 bits: close to the FP32 math.
        ln = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(fwd.output.astype(np.float32), ln @ w.T, rtol=0.1, atol=0.05)
        bwd = fwd.backward(np.ones((32, 8), np.float32))
        assert bwd.grad_input.dtype == np.float32  # the input's dtype
        session.zero_grad()
        first = session.forward_backward(x, target=np.zeros((32, 8), np.float32), loss="mse").loss
        for _ in range(5):
            session.step(zero_grad=True)
            last = session.forward_backward(x, target=np.zeros((32, 8), np.float32), loss="mse").loss
        assert last < first
        assert all(v.dtype == np.float32 for v in session.parameters().values())


def test_params_dtype_rejects_other_dtypes():
    with pytest.raises(ValueError, match=r"Linear.params_dtype: expected one of float32, bfloat16, float16"):
        teserve.Linear(4, 4, params_dtype="float8").to_proto()


def test_no_grad_forward_keeps_no_handle(client):
    rng = np.random.default_rng(2)
    session, w, b = linear_session(client, rng)
    with session:
        fwd = session.forward(np.ones((2, 5), np.float32), no_grad=True)
        assert fwd.handle == 0
        assert session.info.live_handles == 0
        session.forward(np.ones((2, 5), np.float32))
        assert session.info.live_handles == 1


def test_forward_backward_cross_entropy_matches_numpy(client):
    rng = np.random.default_rng(3)
    session, w, b = linear_session(client, rng, in_f=6, out_f=4)
    with session:
        x = rng.standard_normal((8, 6)).astype(np.float32)
        labels = rng.integers(0, 4, size=8)
        labels[2] = -100
        r = session.forward_backward(x, target=labels, return_outputs=True, return_input_grad=True)
        logits = x @ w.T + b
        np.testing.assert_allclose(r.output, logits, rtol=1e-5, atol=1e-6)
        keep = labels != -100
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        expected = -logp[keep, labels[keep]].mean()
        assert r.loss == pytest.approx(expected, rel=1e-5)
        assert r.num_tokens == keep.sum()
        p = np.exp(logp)
        onehot = np.zeros_like(p)
        onehot[np.arange(8)[keep], labels[keep]] = 1
        dlogits = (p - onehot) * keep[:, None] / keep.sum()
        np.testing.assert_allclose(r.grad_input, dlogits @ w, rtol=1e-4, atol=1e-6)


def test_forward_backward_label_smoothing_and_mse(client):
    rng = np.random.default_rng(4)
    session, w, b = linear_session(client, rng, in_f=6, out_f=4)
    with session:
        x = rng.standard_normal((5, 6)).astype(np.float32)
        logits = x @ w.T + b
        labels = rng.integers(0, 4, size=5)
        r = session.forward_backward(x, target=labels, loss=teserve.CrossEntropyLoss(label_smoothing=0.2))
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        smoothed = np.full_like(logp, 0.2 / 4)
        smoothed[np.arange(5), labels] += 0.8
        assert r.loss == pytest.approx(-(smoothed * logp).sum(-1).mean(), rel=1e-5)
        target = rng.standard_normal((5, 4))  # float64: sent as float32
        r = session.forward_backward(x, target=target, loss="mse", return_input_grad=True)
        diff = logits - target.astype(np.float32)
        assert r.loss == pytest.approx((diff ** 2).mean(), rel=1e-5)
        np.testing.assert_allclose(r.grad_input, (2 * diff / diff.size) @ w, rtol=1e-4, atol=1e-6)


def test_delayed_scaling_state_follows_te_formula(client):
    rng = np.random.default_rng(5)
    for margin in (0, 2):
        recipe = teserve.DelayedScaling(margin=margin, amax_history_len=16)
        with client.create_session([teserve.Linear(32, 32)], recipe) as session:
            x = (3 * rng.standard_normal((16, 32))).astype(np.float32)
            session.forward(x, no_grad=True)
            state = session.quant_state()
            (inp,) = [t for t in state.tensors if t.tensor == "input"]
            assert len(inp.amax_history) == 16
            assert inp.amax == pytest.approx(np.abs(x).max(), rel=1e-6)
            assert inp.amax_history[-1] == pytest.approx(np.abs(x).max(), rel=1e-6)
            # E4M3 (HYBRID forward) max 448: scale = 448 / amax / 2**margin.
            assert inp.scale == pytest.approx(448.0 / np.abs(x).max() / 2 ** margin, rel=1e-6)
            assert inp.scale_inv == pytest.approx(1 / inp.scale, rel=1e-6)
            assert inp.format == teserve.v1.tensor_pb2.FLOAT8_E4M3


def test_grouped_linear_m_splits_side_input(client):
    rng = np.random.default_rng(6)
    with client.create_session([teserve.GroupedLinear(2, 4, 3)]) as session:
        params = session.parameters()
        x = rng.standard_normal((5, 4)).astype(np.float32)
        out = session.forward(x, m_splits=[2, 3], no_grad=True).output
        expected = np.concatenate([
            x[:2] @ params["layers.0.weight0"].T + params["layers.0.bias0"],
            x[2:] @ params["layers.0.weight1"].T + params["layers.0.bias1"]])
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
        with pytest.raises(teserve.InvalidArgument) as err:
            session.forward(x, m_splits=[2, 2], no_grad=True)
        assert "m_splits" in err.value.message


def test_cross_attention_returns_encoder_output_grad(client):
    rng = np.random.default_rng(7)
    layer = teserve.TransformerLayer(8, 16, 2, layer_type="decoder", hidden_dropout=0.0, attention_dropout=0.0)
    with client.create_session([layer]) as session:
        x = rng.standard_normal((3, 2, 8)).astype(np.float32)
        enc = rng.standard_normal((5, 2, 8)).astype(np.float32)
        fwd = session.forward(x, encoder_output=enc)
        bwd = fwd.backward(np.ones_like(fwd.output))
        assert bwd.grad_input.shape == x.shape
        assert set(bwd.side_grads) == {"encoder_output"}
        assert bwd.side_grads["encoder_output"].shape == enc.shape
        assert np.abs(bwd.side_grads["encoder_output"]).sum() > 0
        # The encoder output changes the result.
        other = session.forward(x, encoder_output=enc + 1, no_grad=True).output
        assert not np.allclose(other, fwd.output)


def test_attention_mask_side_input_masks_keys(client):
    rng = np.random.default_rng(8)
    layer = teserve.DotProductAttention(1, 4, attn_mask_type="padding", qkv_format="bshd")
    with client.create_session([layer]) as session:
        q, k, v = (rng.standard_normal((1, 3, 1, 4)).astype(np.float32) for _ in range(3))
        mask = np.zeros((1, 1, 1, 3), bool)
        mask[..., 2] = True  # the last key is padding
        out = session.forward(q, k, v, attention_mask=mask, no_grad=True).output
        k2, v2 = k.copy(), v.copy()
        k2[:, 2], v2[:, 2] = 100.0, -100.0  # changing a masked key changes nothing
        out2 = session.forward(q, k2, v2, attention_mask=mask, no_grad=True).output
        np.testing.assert_allclose(out, out2, rtol=1e-6)
        scores = np.einsum("bshd,bthd->bhst", q, k)[..., :2] / 2.0
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        expected = np.einsum("bhst,bthd->bshd", probs, v[:, :2]).reshape(1, 3, 4)
        expected[:, 2] = 0  # a padding mask also pads the query: its row is zero (TE's padding)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_context_manager_deletes_session(client):
    with client.create_session([teserve.Linear(4, 4)]) as session:
        sid = session.id
        assert sid in [s.session_id for s in client.list_sessions()]
    assert sid not in [s.session_id for s in client.list_sessions()]
    with pytest.raises(teserve.NotFound):
        session.info


def test_close_deletes_owned_sessions_only(client):
    owned = client.create_session([teserve.Linear(4, 4)])
    attached = client.session(owned.id)
    attached.close()  # not owned: the session lives on
    assert owned.info.session_id == owned.id
    owned.close()
    with pytest.raises(teserve.NotFound):
        client.session(owned.id)
    owned.close()  # twice is fine


def test_parameters_by_name_and_load_round_trip(client):
    rng = np.random.default_rng(9)
    with client.create_session([teserve.LayerNormMLP(8, 16)], seed=3) as session:
        before = session.parameters()
        assert set(session.parameters(["layers.0.fc1_weight"])) == {"layers.0.fc1_weight"}
        new = {k: rng.standard_normal(v.shape) for k, v in before.items()}  # float64 in
        session.load_parameters(new)
        after = session.parameters()
        for k in new:
            assert after[k].dtype == np.float32
            np.testing.assert_array_equal(after[k], new[k].astype(np.float32))
        # state_dict / load_state_dict are the torch-style aliases.
        session.load_state_dict(before)
        for k, v in session.state_dict().items():
            np.testing.assert_array_equal(v, before[k])


def test_same_seed_same_parameters(client):
    specs = [teserve.Linear(8, 8)]
    with client.create_session(specs, seed=11) as a, client.create_session(specs, seed=11) as b, \
            client.create_session(specs, seed=12) as c:
        pa, pb, pc = a.parameters(), b.parameters(), c.parameters()
        np.testing.assert_array_equal(pa["layers.0.weight"], pb["layers.0.weight"])
        assert not np.array_equal(pa["layers.0.weight"], pc["layers.0.weight"])
        # init_std is TE's 0.023 by default
        assert pa["layers.0.weight"].std() == pytest.approx(0.023, rel=0.3)


def test_adamw_and_clipping_reach_the_server(client):
    with client.create_session([teserve.Linear(4, 4)], None, teserve.AdamW(lr=0.01, betas=(0.8, 0.9)),
                               max_grad_norm=1.5) as session:
        opt = session.info.optimizer
        assert opt.adamw.lr == pytest.approx(0.01)
        assert (opt.adamw.beta1, opt.adamw.beta2) == (pytest.approx(0.8), pytest.approx(0.9))
        assert opt.max_grad_norm == pytest.approx(1.5)


def test_server_info(client):
    info = client.server_info()
    assert info.version
    assert info.device == "cpu"
    assert {r.recipe for r in info.recipes} == {"delayed", "current", "mxfp8", "block", "nvfp4"}
    assert info.max_sessions > 0
    with client.create_session([teserve.Linear(4, 4)]) as session:
        assert session.server_info() == info
