#!/usr/bin/env python3
"""Runs teserve's C++ CUDA benchmarks and PyTorch equivalents on the same shapes.

On the GPU host (docs/gpu.md), from the repository root, after `source <bundle>/env.sh`:

    python3 bench/run_bench.py --bin-dir .devbundle_b/bin --json $OUT/bench.json

Each C++ benchmark (BENCHES) prints JSON results {op, shape, dtype, median_us, bytes,
...}; for every op with an entry in TORCH_EQUIVALENTS the same work is timed in torch
(CUDA events, warm-up, median), and one table is printed:

    op | shape | ours (us) | torch (us) | speedup | TB/s | % of copy

speedup = torch time / our time; TB/s = the op's minimal bytes (inputs read once, outputs
written once) over our time; % of copy = that over the 4.28 TB/s device copy measured on
the H200 host (docs/gpu.md); the copy measured in this run is printed too.

To add a benchmark: put its binary name in BENCHES and, for each op it reports, a torch
builder in TORCH_EQUIVALENTS (a function (rows, cols) -> (callable, note)), both in
bench/torch_equivalents.py.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

# The benchmarks, their torch equivalents and the copy bandwidth they are compared with
# (bench/torch_equivalents.py, beside this file).
from torch_equivalents import BENCHES, COPY_TBPS, TORCH_EQUIVALENTS, _torch  # noqa: E402


def time_torch(fn, warmup, iters):
    torch = _torch()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------


def run_cpp(bin_dir, name, args, timeout_s):
    path = os.path.join(bin_dir, name)
    if not os.path.exists(path):
        print(f"skipping {name}: {path} not found", file=sys.stderr)
        return None
    try:
        proc = subprocess.run([path] + args, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"{name} did not finish in {timeout_s} s (--timeout); its rows are missing", file=sys.stderr)
        return None
    if proc.returncode != 0:
        print(f"{name} failed ({proc.returncode}):\n{proc.stderr}", file=sys.stderr)
        return None
    return json.loads(proc.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=".devbundle_g1/bin", help="folder holding the C++ bench binaries")
    parser.add_argument("--shapes", default="16384x8192", help="comma-separated RxC list")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--benches", default=",".join(BENCHES), help="comma-separated subset of BENCHES")
    parser.add_argument("--no-torch", action="store_true", help="only our kernels")
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one C++ bench binary may run")
    args = parser.parse_args()

    cpp_args = [f"--shapes={args.shapes}", f"--iters={args.iters}", f"--warmup={args.warmup}"]
    rows = []
    device = None
    failed = []
    for bench in args.benches.split(","):
        out = run_cpp(args.bin_dir, bench, cpp_args, args.timeout)
        if out is None:
            failed.append(bench)
            continue
        device = out.get("device", device)
        for r in out["results"]:
            r["bench"] = bench
            rows.append(r)

    if not args.no_torch:
        torch = _torch()
        for r in rows:
            builder = TORCH_EQUIVALENTS.get(r["op"])
            if builder is None:
                continue
            n, h = r["shape"]
            try:
                fn, note = builder(n, h)
                r["torch_us"] = time_torch(fn, args.warmup, args.iters)
                r["torch_note"] = note
                del fn
            except Exception as e:  # report and keep going: one missing op must not hide the rest
                r["torch_error"] = f"{type(e).__name__}: {e}"
            torch.cuda.empty_cache()
        torch_version = torch.__version__
    else:
        torch_version = None

    copy = next((r for r in rows if r["op"] == "copy_d2d"), None)
    header = ("op", "shape", "ours (us)", "torch (us)", "speedup", "TB/s", "% of copy", "TFLOP/s")
    table = []
    for r in rows:
        shape = "x".join(str(d) for d in r["shape"])
        torch_us = r.get("torch_us")
        speedup = f"{torch_us / r['median_us']:.2f}x" if torch_us else "-"
        table.append((r["op"], shape, f"{r['median_us']:.1f}", f"{torch_us:.1f}" if torch_us else "-",
                      speedup, f"{r['tbps']:.2f}", f"{100.0 * r['tbps'] / COPY_TBPS:.0f}%",
                      f"{r['tflops']:.0f}" if r.get("flops") else "-"))
    widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(header)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(t, widths)) + " |" for t in table]
    print()
    print(f"device: {device}; torch {torch_version}; % of copy against {COPY_TBPS} TB/s"
          + (f"; copy measured here {copy['tbps']:.2f} TB/s" if copy else ""))
    for r in rows:
        if "torch_error" in r:
            print(f"  torch {r['op']}: {r['torch_error']}")
    print("\n".join(lines))
    for r in rows:
        print(f"  {r['op']}: ours = {r.get('config', '')}; torch = {r.get('torch_note', '-')}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch_version, "copy_reference_tbps": COPY_TBPS,
                       "results": rows, "table": lines, "failed_benches": failed}, f, indent=1)
    if failed:
        print(f"failed, timed out or missing: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
