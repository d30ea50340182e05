"""Which GEMM kernels te.Linear runs, and how long each takes, next to torch._scaled_mm.

Companion of linear_bench's breakdown (LINEAR_BENCH_BREAKDOWN=1): te.Linear 16384 tokens,
8192 -> 8192, params BF16, FP8 delayed scaling (HYBRID, history 16, max), forward +
backward under torch.profiler, every CUDA kernel aggregated by name (count, mean us).
Then torch._scaled_mm on the same m, n, k with operands of different value ranges, to
show whether the FP8 GEMM's speed depends on the data (codes spread over the whole
E4M3 range, as delayed scaling makes them, against randn cast directly).

Needs Transformer Engine (the GPU host's tekit environment). Prints JSON lines.
"""
import argparse
import collections
import json
import statistics

import torch


def timed(fn, warmup=10, iters=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, stop in events:
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def te_kernels(tokens, features, iters):
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe

    rec = te_recipe.DelayedScaling(fp8_format=te_recipe.Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    torch.manual_seed(0)
    lin = te.Linear(features, features, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16)

    def step():
        lin.zero_grad(set_to_none=True)
        x.grad = None
        with te.autocast(enabled=True, recipe=rec):
            y = lin(x)
        y.backward(dy)

    print(json.dumps({"probe": "te.Linear fwd_bwd", "ms": round(timed(step), 4)}), flush=True)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    totals = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name][0] += 1
            totals[event.name][1] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    for name, (count, us) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(json.dumps({"probe": "te.Linear kernel", "name": name[:300], "per_step": count / iters,
                          "mean_us": round(us / count, 1)}), flush=True)
    timeline(step)


def timeline(step):
    """One step's device timeline (as linear_bench's TESERVE_BENCH_TRACE prints ours):
    each kernel / memcpy / memset with its offset from the first, the idle gap before it
    and its duration, then device busy against the step's device span."""
    import os
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    if not gpu:
        return
    first, last_end, busy = gpu[0]["ts"], None, 0.0
    for e in gpu:
        gap = 0.0 if last_end is None else e["ts"] - last_end
        busy += e["dur"]
        print("trace te.Linear | +%9.1f us | gap %7.1f | %8.1f us | %.150s" % (e["ts"] - first, gap, e["dur"], e["name"]))
        last_end = e["ts"] + e["dur"] if last_end is None else max(last_end, e["ts"] + e["dur"])
    span = last_end - first
    print("trace te.Linear | summary: device span %.1f us, busy %.1f us (%.1f%%), %d launches"
          % (span, busy, 100.0 * busy / span, len(gpu)), flush=True)


def scaled_mm_data(m, n, k):
    g = torch.Generator(device="cuda").manual_seed(0)
    one = torch.ones((), device="cuda")
    flops = 2 * m * n * k

    def operands(kind, rows, cols, dtype):
        r = torch.randn(rows, cols, device="cuda", generator=g)
        if kind == "randn":
            return r.to(dtype)
        if kind == "full_range":  # what delayed scaling does: amax maps to the format's max
            top = 448.0 if dtype == torch.float8_e4m3fn else 57344.0
            return (r * (top / r.abs().max())).to(dtype)
        if kind == "zeros":
            return torch.zeros(rows, cols, device="cuda").to(dtype)
        raise ValueError(kind)

    for kind in ("randn", "full_range", "zeros"):
        for a_dtype, label in ((torch.float8_e4m3fn, "e4m3"), (torch.float8_e5m2, "e5m2")):
            a = operands(kind, m, k, a_dtype)
            b = operands(kind, n, k, torch.float8_e4m3fn)
            for fast in (True, False):
                try:
                    ms = timed(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                        use_fast_accum=fast))
                    print(json.dumps({"probe": "_scaled_mm", "data": kind, "a": label, "fast_accum": fast,
                                      "m": m, "n": n, "k": k, "ms": round(ms, 4),
                                      "tflops": round(flops / ms / 1e9, 1)}), flush=True)
                except Exception as e:  # noqa: BLE001 (a combination torch does not take)
                    print(json.dumps({"probe": "_scaled_mm", "data": kind, "a": label, "error": repr(e)[:200]}))
            del a, b


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--features", type=int, default=8192)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--skip-te", action="store_true")
    a = p.parse_args()
    print(json.dumps({"probe": "env", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    if not a.skip_te:
        te_kernels(a.tokens, a.features, a.iters)
    scaled_mm_data(a.tokens, a.features, a.features)


if __name__ == "__main__":
    main()
