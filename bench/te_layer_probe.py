"""Transformer Engine's te.Linear, te.LayerNormLinear and te.LayerNormMLP, forward +
backward, timed as linear_bench times ours (<op>_pipelined: steps back to back).

BF16 parameters, FP8 delayed scaling (HYBRID, history 16, max; --recipe current: FP8
current scaling, HYBRID; --recipe none: no FP8 autocast, BF16 GEMMs), LayerNorm, bias, gelu;
tokens x features as linear_bench's --shapes (16384 x 8192 by default), the MLP's ffn
width --ffn (4 x features by default, as linear_bench's LAYER_BENCH_FFN). Each layer is
timed --rounds times (median of 30 steps each) so that the spread between rounds shows.
Needs Transformer Engine (the GPU host's tekit environment). Prints JSON lines.
"""
import argparse
import json

import torch

from te_linear_probe import timed  # same folder: median of CUDA-event-timed steps


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--features", type=int, default=8192)
    p.add_argument("--ffn", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layers", default="Linear,LayerNormLinear,LayerNormMLP")
    p.add_argument("--recipe", choices=["delayed", "current", "none"], default="delayed")
    a = p.parse_args()
    import transformer_engine
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe

    ffn = a.ffn or 4 * a.features
    print(json.dumps({"probe": "env", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "te": getattr(transformer_engine, "__version__", "?")}), flush=True)
    if a.recipe == "current":
        rec = te_recipe.Float8CurrentScaling(fp8_format=te_recipe.Format.HYBRID)
    else:
        rec = te_recipe.DelayedScaling(fp8_format=te_recipe.Format.HYBRID, amax_history_len=16,
                                       amax_compute_algo="max")
    make = {
        "Linear": lambda: te.Linear(a.features, a.features, params_dtype=torch.bfloat16, device="cuda"),
        "LayerNormLinear": lambda: te.LayerNormLinear(a.features, a.features, params_dtype=torch.bfloat16,
                                                      device="cuda"),
        "LayerNormMLP": lambda: te.LayerNormMLP(a.features, ffn, params_dtype=torch.bfloat16, device="cuda"),
    }
    for name in a.layers.split(","):
        torch.manual_seed(0)
        layer = make[name]()
        x = torch.randn(a.tokens, a.features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(a.tokens, a.features, device="cuda", dtype=torch.bfloat16) * 1e-3

        def step():
            layer.zero_grad(set_to_none=True)
            x.grad = None
            with te.autocast(enabled=a.recipe != "none", recipe=rec):
                y = layer(x)
            y.backward(dy)

        for r in range(a.rounds):
            print(json.dumps({"probe": "te." + name + " fwd_bwd", "recipe": a.recipe, "round": r, "tokens": a.tokens,
                              "features": a.features, "ffn": ffn if name == "LayerNormMLP" else None,
                              "ms": round(timed(step), 4)}), flush=True)
        del layer, x, dy
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
