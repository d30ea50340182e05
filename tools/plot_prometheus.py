#!/usr/bin/env python3
"""Plots teserve series from a running Prometheus (its HTTP query_range API) into the
PNGs of docs/fp8_health.md. Used by tools/fp8_health_pictures.sh; needs matplotlib.

    python3 tools/plot_prometheus.py --prometheus http://127.0.0.1:9090 --start T0 --end T1 --out docs/images
"""
import argparse
import json
import os
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SCENARIOS = ["steady", "spike", "alternating", "alternating_fixed"]


def query(base, expr, start, end, step):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return [(s["metric"], [(float(t) - start, float(v)) for t, v in s["values"]]) for s in body["data"]["result"]]


def panel(ax, base, expr, start, end, step, label_of, title, log=False):
    series = query(base, expr, start, end, step)
    for metric, values in sorted(series, key=lambda s: label_of(s[0])):
        ax.plot([t for t, _ in values], [v for _, v in values], label=label_of(metric), lw=1.2)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("seconds into the run")
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7)
    return series


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--prometheus", required=True)
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--scenarios-end", type=float, required=True)
    p.add_argument("--end", type=float, required=True)
    p.add_argument("--out", default="docs/images")
    p.add_argument("--no-char-lm", action="store_true", help="only the scenario picture")
    a = p.parse_args()
    base, start, step = a.prometheus.rstrip("/"), a.start, 1
    end = a.scenarios_end
    scen = '|'.join(SCENARIOS)

    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    by_layer = lambda m: m.get("layer", "?")  # noqa: E731
    panel(axes[0][0], base, f'teserve_fp8_amax_window_max{{tensor="input",layer=~"{scen}"}}', start, end, step,
          by_layer, 'teserve_fp8_amax_window_max{tensor="input"}', log=True)
    panel(axes[0][1], base, f'teserve_fp8_scale{{tensor="input",layer=~"{scen}"}}', start, end, step,
          by_layer, 'teserve_fp8_scale{tensor="input"}', log=True)
    panel(axes[1][0], base, f'teserve_fp8_underflow_ratio{{tensor="input",layer=~"{scen}"}}', start, end, step,
          by_layer, 'teserve_fp8_underflow_ratio{tensor="input"}\n(alert FP8UnderflowHigh: > 0.1 for 15m)')
    axes[1][0].axhline(0.1, color="red", ls="--", lw=0.8)
    panel(axes[1][1], base, f'max_over_time(teserve_fp8_overflow_ratio{{tensor="input",layer=~"{scen}"}}[5s])',
          start, end, step, by_layer,
          'max_over_time(teserve_fp8_overflow_ratio{tensor="input"}[5s])\n(alert FP8OverflowHigh: > 0.01 for 5m)')
    axes[1][1].axhline(0.01, color="red", ls="--", lw=0.8)
    fig.suptitle("FP8 delayed scaling scenarios (examples/fp8_health_scenarios.py), scraped by Prometheus every 1 s")
    fig.tight_layout()
    path = os.path.join(a.out, "fp8_scenarios.png")
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")

    if a.no_char_lm:
        return
    end, step = a.end, 2
    fig, axes = plt.subplots(2, 2, figsize=(14, 8.5))
    by_tensor = lambda m: f'{m.get("layer", "?").replace("self_attention.", "")} {m.get("tensor", "?")}'  # noqa: E731
    panel(axes[0][0], base, 'teserve_fp8_amax{layer=~"block1.*",tensor!="grad_output"}', start, end, step,
          by_tensor, "teserve_fp8_amax, block1 forward tensors", log=True)
    panel(axes[0][1], base, 'teserve_fp8_amax{layer=~"block1.*",tensor="grad_output"}', start, end, step,
          by_tensor, "teserve_fp8_amax, block1 grad_output", log=True)
    by_kind = lambda m: m.get("tensor", "?")  # noqa: E731
    panel(axes[1][0], base, 'max by (tensor) (teserve_fp8_underflow_ratio{layer=~"block.*"})', start, end, step,
          by_kind, "max by (tensor) (teserve_fp8_underflow_ratio), both blocks", log=True)
    panel(axes[1][1], base, 'max by (tensor) (teserve_fp8_overflow_ratio{layer=~"block.*"})', start, end, step,
          by_kind, "max by (tensor) (teserve_fp8_overflow_ratio), both blocks (zeros not drawn)", log=True)
    fig.suptitle("char-level LM (examples/char_lm.py) under DelayedScaling(amax_history_len=16), from Prometheus")
    fig.tight_layout()
    path = os.path.join(a.out, "fp8_char_lm.png")
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
