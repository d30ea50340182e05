#!/usr/bin/env python3
"""Three small sessions that show what healthy and unhealthy FP8 delayed scaling look
like in teserve's metrics (docs/fp8_health.md has the pictures this produced).

  steady       Linear(512, 512), Gaussian inputs of a fixed size, DelayedScaling with
               amax_history_len=16: amax and scale flat, overflow 0, underflow ~0.
  spike        the same, but one step's input holds a single outlier of --spike: the
               window max jumps, the scale drops by the same factor, and for
               amax_history_len (64) steps most small values flush to zero (underflow),
               until the outlier leaves the history window.
  alternating  inputs alternate between std 1 and std --ratio every step under
               amax_history_len=1: every large step is quantized with the small step's
               scale, so a large share of it saturates (overflow).
  alternating-fixed   the same inputs with amax_history_len=16 ("max"): no overflow.

Parameters barely move (SGD, lr 1e-4, gradient clipping): only the quantizers matter.
Run it against a server whose metrics Prometheus scrapes, with --fp8_stats_interval=1
so every step is measured:

    teserve --device=cpu --fp8_stats_interval=1 &
    python examples/fp8_health_scenarios.py --server localhost:50051 --steps 300
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

try:
    import teserve
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client" / "python"))
    import teserve


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="localhost:50051")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--spike-step", type=int, default=100)
    p.add_argument("--spike", type=float, default=1e5)
    p.add_argument("--ratio", type=float, default=16.0)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between steps (Prometheus sees each)")
    p.add_argument("--keep", action="store_true", help="leave the sessions alive at the end")
    args = p.parse_args()

    client = teserve.connect(args.server)
    client.wait_until_serving()
    opt = teserve.SGD(lr=1e-4)
    specs = {
        "steady": teserve.DelayedScaling(amax_history_len=16),
        "spike": teserve.DelayedScaling(amax_history_len=64),
        "alternating": teserve.DelayedScaling(amax_history_len=1),
        "alternating-fixed": teserve.DelayedScaling(amax_history_len=16),
    }
    sessions = {name: client.create_session([teserve.Linear(512, 512, name=name.replace("-", "_"))],
                                            recipe, opt, max_grad_norm=1.0, seed=1)
                for name, recipe in specs.items()}
    for name, s in sessions.items():
        print(f"{name:18s} session {s.id}")
    rng = np.random.default_rng(0)
    try:
        for step in range(1, args.steps + 1):
            x = rng.standard_normal((64, 512)).astype(np.float32)
            target = np.zeros((64, 512), np.float32)
            inputs = {"steady": x, "spike": x.copy(), "alternating": x * (args.ratio if step % 2 == 0 else 1.0)}
            inputs["alternating-fixed"] = inputs["alternating"]
            if step == args.spike_step:
                inputs["spike"][0, 0] = args.spike
            futures = [sessions[n].forward_backward_async(inputs[n], target=target, loss="mse") for n in sessions]
            for f in futures:
                f.result()
            for f in [s.step_async(zero_grad=True) for s in sessions.values()]:
                f.result()
            if step % 25 == 0:
                parts = []
                for name, s in sessions.items():
                    inp = [t for t in s.quant_state().tensors if t.tensor == "input"][0]
                    parts.append(f"{name} scale {inp.scale:.3g} under {inp.health.underflow_ratio:.3f} "
                                 f"over {inp.health.overflow_ratio:.3f}")
                print(f"step {step}: " + "; ".join(parts), flush=True)
            time.sleep(args.interval)
    finally:
        if not args.keep:
            for s in sessions.values():
                s.close()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
