#!/usr/bin/env python3
"""Character-level language model on teserve.

The token embedding and the output head live here, in numpy (with their own Adam); a
stack of TransformerLayers (causal self attention) and a final LayerNorm train on the
server under FP8 delayed scaling. Each step: embed -> Forward -> logits and cross entropy
in numpy -> Backward with d(hidden) -> Step on the server while the client's Adam updates
the embedding and head (a future keeps the two in flight together).

    bazel build --jobs=2 //server:teserve
    pip install ./client/python matplotlib          # matplotlib only for the plot
    python examples/char_lm.py --spawn              # starts bazel-bin/server/teserve --device=cpu
    python examples/char_lm.py --server localhost:50051 --steps 800

The text is examples/data/lighthouse.txt, a short story written for this example (no
third-party text). Prints a progress bar, a sample at the end, and writes a PNG of the
loss curves and of amax / scale of a few quantized tensors when matplotlib is installed.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

try:
    import teserve
except ImportError:  # running from a checkout without `pip install ./client/python`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client" / "python"))
    import teserve

HERE = Path(__file__).resolve().parent
# Quantized tensors whose amax / scale the plot follows: (layer suffix, tensor).
TRACKED = [("block1.self_attention.layernorm_qkv", "input"),
           ("block1.layernorm_mlp.fc1", "weight"),
           ("block1.layernorm_mlp.fc2", "grad_output")]


class Adam:
    """Adam for the client-side numpy parameters."""

    def __init__(self, params: Dict[str, np.ndarray], lr: float, betas=(0.9, 0.99), eps=1e-8) -> None:
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, grads: Dict[str, np.ndarray]) -> None:
        self.t += 1
        b1, b2 = self.betas
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            m_hat = self.m[k] / (1 - b1 ** self.t)
            v_hat = self.v[k] / (1 - b2 ** self.t)
            self.params[k] -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


def positions(seq_len: int, hidden: int) -> np.ndarray:
    """Sinusoidal position table [S, 1, H]."""
    pos = np.arange(seq_len)[:, None]
    i = np.arange(hidden)[None, :]
    angle = pos / np.power(10000.0, 2 * (i // 2) / hidden)
    table = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    return table[:, None, :].astype(np.float32)


class CharLM:
    """Client half of the model: embedding, positions, output head, loss."""

    def __init__(self, vocab: int, hidden: int, max_len: int, rng: np.random.Generator) -> None:
        self.params = {
            "embedding": (rng.standard_normal((vocab, hidden)) * 0.5).astype(np.float32),
            "head.weight": (rng.standard_normal((vocab, hidden)) * 0.02).astype(np.float32),
            "head.bias": np.zeros(vocab, np.float32),
        }
        self.pos = positions(max_len, hidden)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """tokens [S, B] -> hidden states [S, B, H] (sbhd)."""
        return self.params["embedding"][tokens] + self.pos[: tokens.shape[0]]

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        return hidden @ self.params["head.weight"].T + self.params["head.bias"]

    def loss_and_grads(self, hidden: np.ndarray, targets: np.ndarray) -> Tuple[float, np.ndarray, Dict[str, np.ndarray]]:
        """Mean cross entropy; d(hidden) for the server and the head's gradients."""
        logits = self.logits(hidden)
        logits -= logits.max(-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(-1, keepdims=True)
        flat_t = targets.reshape(-1)
        flat_p = probs.reshape(-1, probs.shape[-1])
        n = flat_t.size
        loss = float(-np.log(flat_p[np.arange(n), flat_t] + 1e-12).mean())
        dlogits = flat_p.copy()
        dlogits[np.arange(n), flat_t] -= 1
        dlogits /= n
        flat_h = hidden.reshape(n, -1)
        grads = {"head.weight": dlogits.T @ flat_h, "head.bias": dlogits.sum(0)}
        dhidden = (dlogits @ self.params["head.weight"]).reshape(hidden.shape).astype(np.float32)
        return loss, dhidden, grads

    def embedding_grad(self, tokens: np.ndarray, dinput: np.ndarray) -> np.ndarray:
        grad = np.zeros_like(self.params["embedding"])
        np.add.at(grad, tokens.reshape(-1), dinput.reshape(-1, dinput.shape[-1]))
        return grad


def batch(data: np.ndarray, seq_len: int, size: int, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    starts = rng.integers(0, len(data) - seq_len - 1, size=size)
    x = np.stack([data[s:s + seq_len] for s in starts], axis=1)        # [S, B]
    y = np.stack([data[s + 1:s + seq_len + 1] for s in starts], axis=1)
    return x, y


def progress(step: int, total: int, loss: float, val: Optional[float], started: float) -> None:
    width = 30
    done = int(width * step / total)
    rate = step / max(time.time() - started, 1e-9)
    val_text = f" val {val:.3f}" if val is not None else ""
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {step}/{total} loss {loss:.3f}{val_text} "
                     f"{rate:.1f} steps/s")
    sys.stderr.flush()


def spawn_server() -> Tuple[subprocess.Popen, str]:
    binary = os.environ.get("TESERVE_BINARY") or str(HERE.parent / "bazel-bin" / "server" / "teserve")
    if not os.access(binary, os.X_OK):
        sys.exit(f"char_lm: --spawn needs {binary} (bazel build --jobs=2 //server:teserve) or TESERVE_BINARY")
    proc = subprocess.Popen([binary, "--device=cpu", "--host=127.0.0.1", "--port=0", "--metrics_port=0"],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"gRPC listening on [^ ]*:(\d+)", line)
        if m:
            return proc, f"127.0.0.1:{m.group(1)}"
    sys.exit("char_lm: the spawned server exited before listening")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="localhost:50051", help="teserve address (default %(default)s)")
    p.add_argument("--spawn", action="store_true", help="start bazel-bin/server/teserve --device=cpu for the run")
    p.add_argument("--text", default=str(HERE / "data" / "lighthouse.txt"))
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--amax-history-len", type=int, default=16)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--sample-len", type=int, default=400)
    p.add_argument("--prompt", default="The lamp ")
    p.add_argument("--plot", default="char_lm.png", help="PNG path ('' = none)")
    args = p.parse_args()

    text = Path(args.text).read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = np.array([index[c] for c in text], dtype=np.int64)
    split = int(len(data) * 0.9)
    train, val = data[:split], data[split:]
    rng = np.random.default_rng(args.seed)
    print(f"text {Path(args.text).name}: {len(text)} characters, vocabulary {len(chars)}; "
          f"{args.layers} TransformerLayers hidden {args.hidden} on the server, FP8 delayed scaling")

    server_proc = None
    address = args.server
    if args.spawn:
        server_proc, address = spawn_server()
    client = teserve.connect(address)
    client.wait_until_serving(timeout=30)
    model = [teserve.TransformerLayer(args.hidden, args.ffn, args.heads, hidden_dropout=0.0,
                                      attention_dropout=0.0, self_attn_mask_type="causal",
                                      name=f"block{i + 1}") for i in range(args.layers)]
    model.append(teserve.LayerNorm(args.hidden, name="final_norm"))
    recipe = teserve.DelayedScaling(margin=0, amax_history_len=args.amax_history_len)
    lm = CharLM(len(chars), args.hidden, args.seq_len, rng)
    adam = Adam(lm.params, args.lr)

    history: Dict[str, List] = {"step": [], "loss": [], "val_step": [], "val": [], "q_step": []}
    tracked: Dict[Tuple[str, str], Dict[str, List[float]]] = {t: {"amax": [], "scale": []} for t in TRACKED}

    def validate(session: teserve.Session) -> float:
        # Several no_grad forwards in flight at once (futures), then the losses.
        vrng = np.random.default_rng(1234)
        batches = [batch(val, args.seq_len, args.batch, vrng) for _ in range(4)]
        futures = [session.forward_async(lm.embed(x), no_grad=True) for x, _ in batches]
        return float(np.mean([lm.loss_and_grads(f.result().output, y)[0] for f, (_, y) in zip(futures, batches)]))

    started = time.time()
    try:
        with client.create_session(model, recipe, teserve.AdamW(lr=args.lr, weight_decay=0.0),
                                   seed=args.seed, max_grad_norm=1.0) as session:
            print(f"session {session.id} on {session.info.device}")
            val_loss = None
            for step in range(1, args.steps + 1):
                x, y = batch(train, args.seq_len, args.batch, rng)
                fwd = session.forward(lm.embed(x))
                loss, dhidden, grads = lm.loss_and_grads(fwd.output, y)
                dinput = fwd.backward(dhidden).grad_input
                server_step = session.step_async(zero_grad=True)   # runs while numpy works
                grads["embedding"] = lm.embedding_grad(x, dinput)
                norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
                if norm > 1.0:
                    grads = {k: g / norm for k, g in grads.items()}
                adam.step(grads)
                server_step.result()
                history["step"].append(step)
                history["loss"].append(loss)
                if step % 10 == 0 or step == 1:
                    state = {(t.layer, t.tensor): t for t in session.quant_state().tensors}
                    history["q_step"].append(step)
                    for key in TRACKED:
                        tracked[key]["amax"].append(state[key].amax if key in state else float("nan"))
                        tracked[key]["scale"].append(state[key].scale if key in state else float("nan"))
                if step % args.eval_every == 0 or step == args.steps:
                    val_loss = validate(session)
                    history["val_step"].append(step)
                    history["val"].append(val_loss)
                progress(step, args.steps, float(np.mean(history["loss"][-20:])), val_loss, started)
            sys.stderr.write("\n")
            elapsed = time.time() - started
            first = float(np.mean(history["loss"][:10]))
            last = float(np.mean(history["loss"][-20:]))
            print(f"train loss {first:.3f} -> {last:.3f} (uniform guess {math.log(len(chars)):.3f}); "
                  f"validation {history['val'][-1]:.3f}; {args.steps} steps in {elapsed:.0f} s")
            print("sample:")
            print(sample(session, lm, chars, index, args.prompt, args.sample_len, args.seq_len, rng))
    finally:
        client.close()
        if server_proc is not None:
            server_proc.send_signal(signal.SIGTERM)
            server_proc.wait()
    if args.plot:
        plot(args.plot, history, tracked)
    return 0


def sample(session: teserve.Session, lm: CharLM, chars: List[str], index: Dict[str, int], prompt: str,
           length: int, seq_len: int, rng: np.random.Generator, temperature: float = 0.7) -> str:
    tokens = [index[c] for c in prompt if c in index]
    for _ in range(length):
        context = np.array(tokens[-seq_len:], dtype=np.int64)[:, None]   # [S, 1]
        hidden = session.forward(lm.embed(context), no_grad=True).output[-1, 0]
        logits = lm.logits(hidden) / temperature
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        tokens.append(int(rng.choice(len(chars), p=probs)))
    return "".join(chars[t] for t in tokens)


def plot(path: str, history: Dict[str, List], tracked: Dict[Tuple[str, str], Dict[str, List[float]]]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    ax.plot(history["step"], history["loss"], lw=0.6, alpha=0.5, label="train (per step)")
    window = 20
    smooth = np.convolve(history["loss"], np.ones(window) / window, mode="valid")
    ax.plot(history["step"][window - 1:], smooth, lw=1.5, label=f"train ({window}-step mean)")
    ax.plot(history["val_step"], history["val"], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross entropy (nats / char)")
    ax.set_title("char-level LM on teserve (FP8 delayed scaling)")
    ax.legend()
    for ax, key, label in ((axes[1], "amax", "amax"), (axes[2], "scale", "scale = 448 / max(amax history)")):
        for (layer, tensor), series in tracked.items():
            ax.plot(history["q_step"], series[key], label=f"{layer.replace('self_attention.', '')} {tensor}")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
