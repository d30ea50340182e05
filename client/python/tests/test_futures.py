"""Futures: pipelined requests give the same results as blocking calls."""
from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

import teserve


def test_forward_futures_match_blocking_forwards(client):
    rng = np.random.default_rng(0)
    with client.create_session([teserve.LayerNormMLP(16, 32)], teserve.Float8CurrentScaling()) as session:
        batches = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(8)]
        futures = [session.forward_async(x, no_grad=True) for x in batches]
        assert all(isinstance(f, concurrent.futures.Future) for f in futures)
        done, not_done = concurrent.futures.wait(futures, timeout=60)
        assert not not_done
        for x, f in zip(batches, futures):
            np.testing.assert_array_equal(f.result().output, session.forward(x, no_grad=True).output)


def test_pipelined_forwards_then_backwards_accumulate(client):
    rng = np.random.default_rng(1)
    with client.create_session([teserve.Linear(6, 3)], None, teserve.SGD(lr=0.1)) as session:
        w = session.parameters()["layers.0.weight"]
        xs = [rng.standard_normal((2, 6)).astype(np.float32) for _ in range(4)]
        gs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(4)]
        forwards = [session.forward_async(x) for x in xs]
        handles = [f.result() for f in forwards]
        assert len({h.handle for h in handles}) == 4
        assert session.info.live_handles == 4
        backwards = [session.backward_async(h, g) for h, g in zip(handles, gs)]
        for g, b in zip(gs, backwards):
            np.testing.assert_allclose(b.result().grad_input, g @ w, rtol=1e-5, atol=1e-6)
        expected = sum(g.T @ x for x, g in zip(xs, gs))
        np.testing.assert_allclose(session.gradients()["layers.0.weight"], expected, rtol=1e-5, atol=1e-5)
        step = session.step_async(zero_grad=True).result(timeout=30)
        assert step.step == 1
        np.testing.assert_allclose(session.parameters()["layers.0.weight"], w - 0.1 * expected, rtol=1e-5, atol=1e-5)


def test_forward_backward_futures_and_errors(client):
    rng = np.random.default_rng(2)
    with client.create_session([teserve.Linear(4, 5)]) as session:
        x = rng.standard_normal((3, 4)).astype(np.float32)
        labels = np.array([0, 4, 2])
        ok = session.forward_backward_async(x, target=labels)
        bad = session.forward_backward_async(np.zeros((3, 7), np.float32), target=labels)
        assert ok.result(timeout=30).num_tokens == 3
        with pytest.raises(teserve.InvalidArgument) as err:
            bad.result(timeout=30)
        assert "inputs[0]" in err.value.message
        assert isinstance(bad.exception(), teserve.InvalidArgument)
        session.zero_grad()
        blocking = session.forward_backward(x, target=labels)
        assert ok.result().loss == pytest.approx(blocking.loss, rel=1e-6)


def test_callbacks_run_with_the_converted_result(client):
    with client.create_session([teserve.Linear(4, 2)]) as session:
        seen = []
        f = session.forward_async(np.ones((1, 4), np.float32), no_grad=True)
        f.add_done_callback(lambda fut: seen.append(fut.result().output.shape))
        f.result(timeout=30)
        concurrent.futures.wait([f])
        assert seen == [(1, 2)]


def test_cancelled_future_raises_cancelled(client):
    with client.create_session([teserve.LayerNormMLP(256, 1024)]) as session:
        x = np.ones((512, 256), np.float32)
        futures = [session.forward_async(x, no_grad=True) for _ in range(8)]
        last = futures[-1]
        if last.cancel():  # still in flight: the RPC is cancelled
            with pytest.raises(teserve.Cancelled):
                last.result(timeout=60)
        else:  # it finished first: its result stands
            assert last.result().output.shape == (512, 256)
        for f in futures[:-1]:
            f.result(timeout=60)
