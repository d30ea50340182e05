"""The PyTorch side of bench/run_bench.py: which C++ benchmarks run (BENCHES) and, for each
op they report, what torch runs for the same shape (TORCH_EQUIVALENTS: a builder
(rows, cols) -> (callable doing the op once, a note on what it runs)). Each builder
allocates its inputs (random, never zeros). torch is imported lazily, so the driver's
--help works without it.
"""

COPY_TBPS = 4.28  # device-to-device copy on the H200 host, bytes read + written (docs/gpu.md)

BENCHES = ["norm_bench", "cast_transpose_bench"]


# ---------------------------------------------------------------------------------------
# Torch equivalents. Each builder allocates its inputs (random, never zeros) and returns a
# callable doing the op once, plus a note on what it runs.

def _torch():
    import torch  # imported lazily so --help works without torch
    return torch


def _randn(rows, cols, dtype, mean=0.0, std=1.0, seed=0):
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(rows, cols, device="cuda", generator=g) * std + mean).to(dtype)


def _norm_inputs(rows, cols):
    """BF16 x, weight and bias (fixed seeds) for the torch side of the norm rows."""
    torch = _torch()
    x = _randn(rows, cols, torch.bfloat16, 0.5, 1.7, seed=1)
    w = _randn(1, cols, torch.bfloat16, 1.0, 0.3, seed=2).view(cols)
    b = _randn(1, cols, torch.bfloat16, 0.0, 0.3, seed=3).view(cols)
    return x, w, b


def _fp8_unfused(norm):
    """norm (layernorm / rmsnorm), then scale + cast to float8_e4m3fn, a transposed copy
    and the amax of the normalized values: the unfused path the fused kernel replaces."""
    def build(rows, cols):
        torch = _torch()
        F = torch.nn.functional
        x, w, b = _norm_inputs(rows, cols)
        scale = 64.0

        def run():
            if norm == "layernorm":
                y = F.layer_norm(x, (cols,), w, b, 1e-5)
            else:
                y = F.rms_norm(x, (cols,), w, 1e-5)
            amax = y.abs().amax()
            q = (y.float() * scale).to(torch.float8_e4m3fn)
            qt = q.t().contiguous()
            return q, qt, amax

        return run, (f"F.{'layer_norm' if norm == 'layernorm' else 'rms_norm'} -> abs().amax() -> "
                     "(y.float()*scale).to(float8_e4m3fn) -> .t().contiguous()")
    return build


def _fp8_rowwise_unfused(rows, cols):
    torch = _torch()
    F = torch.nn.functional
    x, w, b = _norm_inputs(rows, cols)

    def run():
        y = F.layer_norm(x, (cols,), w, b, 1e-5)
        return (y.float() * 64.0).to(torch.float8_e4m3fn), y.abs().amax()

    return run, "F.layer_norm -> abs().amax() -> (y.float()*scale).to(float8_e4m3fn)"


def _layernorm_bf16(rows, cols):
    torch = _torch()
    F = torch.nn.functional
    x, w, b = _norm_inputs(rows, cols)
    return (lambda: F.layer_norm(x, (cols,), w, b, 1e-5)), "F.layer_norm (BF16 in and out)"


def _norm_backward(norm):
    """Autograd backward of torch's norm: dx (BF16) and the weight (and bias) gradients."""
    def build(rows, cols):
        torch = _torch()
        F = torch.nn.functional
        x = _randn(rows, cols, torch.bfloat16, 0.5, 1.7, seed=1).requires_grad_()
        w = _randn(1, cols, torch.bfloat16, 1.0, 0.3, seed=2).view(cols).detach().requires_grad_()
        dy = _randn(rows, cols, torch.bfloat16, 0.0, 1.0, seed=4)
        if norm == "layernorm":
            b = _randn(1, cols, torch.bfloat16, 0.0, 0.3, seed=3).view(cols).detach().requires_grad_()
            y = F.layer_norm(x, (cols,), w, b, 1e-5)
            inputs = (x, w, b)
        else:
            y = F.rms_norm(x, (cols,), w, 1e-5)
            inputs = (x, w)
        return ((lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True)),
                f"torch.autograd.grad of F.{'layer_norm' if norm == 'layernorm' else 'rms_norm'} "
                "(BF16 x, weight)")
    return build


def _cast_transpose(dtype_name):
    def build(rows, cols):
        torch = _torch()
        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        x = _randn(rows, cols, dtype, 0.0, 2.0, seed=5)

        def run():
            amax = x.abs().amax()
            q = (x.float() * 64.0).to(torch.float8_e4m3fn)
            return q, q.t().contiguous(), amax

        return run, "x.abs().amax(); (x.float()*scale).to(float8_e4m3fn); .t().contiguous()"
    return build


def _cast_transpose_dbias(rows, cols):
    """The unfused path the fused dbias replaces: amax, scale + cast, transposed copy and
    the FP32 column sums x.sum(0) (TE's cast_transpose_dbias of a Linear's dy)."""
    torch = _torch()
    x = _randn(rows, cols, torch.bfloat16, 0.0, 2.0, seed=5)

    def run():
        amax = x.abs().amax()
        q = (x.float() * 64.0).to(torch.float8_e4m3fn)
        return q, q.t().contiguous(), amax, x.sum(0, dtype=torch.float32)

    return run, ("x.abs().amax(); (x.float()*scale).to(float8_e4m3fn); .t().contiguous(); "
                 "x.sum(0, dtype=float32)")


def _copy(rows, cols):
    torch = _torch()
    x = _randn(rows, cols, torch.bfloat16, seed=6)
    y = torch.empty_like(x)
    return (lambda: y.copy_(x)), "y.copy_(x)"


TORCH_EQUIVALENTS = {
    "layernorm_fwd_fp8": _fp8_unfused("layernorm"),
    "rmsnorm_fwd_fp8": _fp8_unfused("rmsnorm"),
    "layernorm_fwd_fp8_rowwise": _fp8_rowwise_unfused,
    "layernorm_fwd_bf16": _layernorm_bf16,
    "layernorm_bwd": _norm_backward("layernorm"),
    "rmsnorm_bwd": _norm_backward("rmsnorm"),
    "cast_transpose_bf16": _cast_transpose("bf16"),
    "cast_transpose_fp32": _cast_transpose("fp32"),
    "cast_transpose_dbias_bf16": _cast_transpose_dbias,
    "copy_d2d": _copy,
}


# --- Block-scaled recipes (block_quantize_bench) -----------------------------------------
# PyTorch has no fused MXFP8 / FP8 block-scaling quantizer: these compose one from eager
# ops (view into blocks, abs().amax(), log2/ceil or division for the scale, exp2,
# multiply, .to(float8_e4m3fn), .t().contiguous() for the columnwise copy), which is what
# a user without a fused kernel would run. NVFP4 has no torch equivalent (no E2M1 cast).
BENCHES.append("block_quantize_bench")


def _mxfp8_scaled_blocks(torch, blocks, dim):
    """E8M0 exponent e = ceil(log2(amax / 448)) over `dim` and the E4M3 codes of blocks * 2^-e."""
    amax = blocks.abs().amax(dim=dim, keepdim=True)
    e = torch.ceil(torch.log2(amax / 448.0)).clamp_(-127.0, 127.0)
    codes = (blocks * torch.exp2(-e)).to(torch.float8_e4m3fn)
    return codes, (e + 127.0).to(torch.uint8), amax


def _mxfp8_quantize(dtype_name, columnwise):
    def build(rows, cols):
        torch = _torch()
        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        x = _randn(rows, cols, dtype, 0.0, 2.0, seed=7)

        def run():
            xf = x.float()
            q, s, amax = _mxfp8_scaled_blocks(torch, xf.view(rows, cols // 32, 32), -1)
            out = [q.view(rows, cols), s.view(rows, cols // 32), amax.amax()]
            if columnwise:
                qc, sc, _ = _mxfp8_scaled_blocks(torch, xf.view(rows // 32, 32, cols), 1)
                out += [qc.view(rows, cols).t().contiguous(), sc.view(rows // 32, cols).t().contiguous()]
            return out

        return run, ("composed MXFP8 (no fused torch op): 1x32" + (" and 32x1" if columnwise else "")
                     + " blocks, abs().amax -> ceil(log2(amax/448)) -> x*exp2(-e) -> float8_e4m3fn"
                     + (", columnwise .t().contiguous()" if columnwise else ""))
    return build


def _block_scaled(torch, blocks, dim):
    """Power-of-two FP32 scale 448/amax (1 for zero blocks) over `dim`, codes and scale_inv."""
    amax = blocks.abs().amax(dim=dim, keepdim=True)
    scale = torch.where(amax > 0, 448.0 / amax, torch.ones_like(amax))
    scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (blocks * scale).to(torch.float8_e4m3fn), scale.reciprocal(), amax


def _block_quantize(two_d):
    def build(rows, cols):
        torch = _torch()
        x = _randn(rows, cols, torch.bfloat16, 0.0, 2.0, seed=8)

        def run():
            xf = x.float()
            if two_d:
                q, s, amax = _block_scaled(torch, xf.view(rows // 128, 128, cols // 128, 128), (1, 3))
                q = q.view(rows, cols)
                return q, s, q.t().contiguous(), amax.amax()
            q, s, amax = _block_scaled(torch, xf.view(rows, cols // 128, 128), -1)
            qc, sc, _ = _block_scaled(torch, xf.view(rows // 128, 128, cols), 1)
            return (q.view(rows, cols), s, qc.view(rows, cols).t().contiguous(),
                    sc.view(rows // 128, cols).t().contiguous(), amax.amax())

        return run, ("composed FP8 block scaling (no fused torch op): "
                     + ("128x128" if two_d else "1x128 and 128x1")
                     + " blocks, abs().amax -> exp2(floor(log2(448/amax))) -> float8_e4m3fn,"
                     + " columnwise .t().contiguous()")
    return build


def _mxfp8_dequantize(rows, cols):
    torch = _torch()
    x = _randn(rows, cols, torch.bfloat16, 0.0, 2.0, seed=9).float()
    q, s, _ = _mxfp8_scaled_blocks(torch, x.view(rows, cols // 32, 32), -1)

    def run():
        return (q.float() * torch.exp2(s.float() - 127.0)).view(rows, cols)

    return run, "q.float() * exp2(e8m0 - 127) per 1x32 block (FP32 out)"


TORCH_EQUIVALENTS.update({
    "mxfp8_quantize_rowwise_columnwise_bf16": _mxfp8_quantize("bf16", True),
    "mxfp8_quantize_rowwise_columnwise_fp32": _mxfp8_quantize("fp32", True),
    "mxfp8_quantize_rowwise_columnwise_bf16_integer_codec": _mxfp8_quantize("bf16", True),
    "mxfp8_quantize_rowwise_bf16": _mxfp8_quantize("bf16", False),
    "block1d_quantize_rowwise_columnwise_bf16": _block_quantize(False),
    "block2d_quantize_rowwise_columnwise_bf16": _block_quantize(True),
    "mxfp8_dequantize_rowwise_fp32": _mxfp8_dequantize,
})


def _with_column_sum(build_quantize, dtype_name):
    """The composed quantizer followed by dbias = x.float().sum(0) (a second read of x)."""
    def build(rows, cols):
        torch = _torch()
        run_quantize, config = build_quantize(rows, cols)
        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        x = _randn(rows, cols, dtype, 0.0, 2.0, seed=10)

        def run():
            return run_quantize(), x.float().sum(0)

        return run, config + "; then dbias = x.float().sum(0)"
    return build


TORCH_EQUIVALENTS.update({
    "mxfp8_quantize_rowwise_columnwise_bf16_generic": _mxfp8_quantize("bf16", True),
    "mxfp8_quantize_rowwise_columnwise_fp32_generic": _mxfp8_quantize("fp32", True),
    "mxfp8_quantize_dbias_bf16": _with_column_sum(_mxfp8_quantize("bf16", True), "bf16"),
    "block1d_quantize_dbias_bf16": _with_column_sum(_block_quantize(False), "bf16"),
})


def _layernorm_mxfp8_unfused(rows, cols):
    """F.layer_norm, then the composed MXFP8 quantization (1x32 and 32x1 blocks) of its
    FP32 output: the unfused path of norm_bench's layernorm_fwd_mxfp8."""
    torch = _torch()
    F = torch.nn.functional
    x, w, b = _norm_inputs(rows, cols)

    def run():
        y = F.layer_norm(x.float(), (cols,), w.float(), b.float(), 1e-5)
        q, s, amax = _mxfp8_scaled_blocks(torch, y.view(rows, cols // 32, 32), -1)
        qc, sc, _ = _mxfp8_scaled_blocks(torch, y.view(rows // 32, 32, cols), 1)
        return (q.view(rows, cols), s.view(rows, cols // 32), amax.amax(),
                qc.view(rows, cols).t().contiguous(), sc.view(rows // 32, cols).t().contiguous())

    return run, ("F.layer_norm (FP32 y) -> composed MXFP8 1x32 and 32x1 blocks (abs().amax -> "
                 "ceil(log2(amax/448)) -> y*exp2(-e) -> float8_e4m3fn, columnwise .t().contiguous())")


TORCH_EQUIVALENTS["layernorm_fwd_mxfp8"] = _layernorm_mxfp8_unfused


# --- Multi-tensor optimizers (optimizer_bench) -------------------------------------------
# The bench reports shape [layers, hidden] of its 1B-parameter model (FFN 4 x hidden, 12
# tensors per layer); the same FP32 tensor list is built here for torch's fused optimizers.
BENCHES.append("optimizer_bench")


def _model_params(layers, hidden):
    torch = _torch()
    ffn = 4 * hidden
    sizes = []
    for _ in range(layers):
        sizes += [(hidden,), (hidden,), (3 * hidden, hidden), (3 * hidden,), (hidden, hidden), (hidden,),
                  (hidden,), (hidden,), (ffn, hidden), (ffn,), (hidden, ffn), (hidden,)]
    params = []
    for i, shape in enumerate(sizes):
        g = torch.Generator(device="cuda").manual_seed(i)
        p = torch.nn.Parameter(torch.randn(shape, device="cuda", generator=g) * 0.05)
        p.grad = torch.randn(shape, device="cuda", generator=g) * 1e-3
        params.append(p)
    return params


def _torch_adamw(bf16_copy):
    def build(layers, hidden):
        torch = _torch()
        params = _model_params(layers, hidden)
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)
        opt.step()  # allocates exp_avg / exp_avg_sq before timing
        if not bf16_copy:
            return opt.step, "torch.optim.AdamW(fused=True).step() over the same FP32 tensor list"
        copies = [p.detach().to(torch.bfloat16) for p in params]
        masters = [p.detach() for p in params]

        def run():
            opt.step()
            torch._foreach_copy_(copies, masters)
        return run, "torch.optim.AdamW(fused=True).step() then torch._foreach_copy_ into BF16 copies"
    return build


def _torch_sgd_momentum(layers, hidden):
    torch = _torch()
    params = _model_params(layers, hidden)
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9, fused=True)
    opt.step()  # allocates the momentum buffers before timing
    return opt.step, "torch.optim.SGD(momentum=0.9, fused=True).step() over the same FP32 tensor list"


TORCH_EQUIVALENTS.update({
    "adamw_fp32": _torch_adamw(False),
    "adamw_bf16_copy": _torch_adamw(True),
    "sgd_momentum": _torch_sgd_momentum,
})


# --- Activations (activation_bench) ----------------------------------------------------
# The bench's shape RxK is the output [R, K]; x is [R, K] or [R, 2K] for gated kinds (TE's
# convention: the activation goes on the first half, the second half is the linear gate).
# The torch equivalents run the activation in FP32 on the BF16 input, then amax, scale +
# cast to float8_e4m3fn and a transposed copy: the unfused path the fused kernel replaces.
BENCHES.append("activation_bench")


def _act_fn(torch, kind):
    F = torch.nn.functional

    def gated(f, clamp=False):
        def run(x):
            a, b = x.chunk(2, dim=-1)
            if clamp:
                a = a.clamp(max=7.0)
                b = b.clamp(-7.0, 7.0) + 1.0
            return f(a) * b
        return run

    gelu = lambda t: F.gelu(t, approximate="tanh")
    qgelu = lambda t: t * torch.sigmoid(1.702 * t)
    srelu = lambda t: F.relu(t).square()
    return {
        "gelu": gelu, "geglu": gated(gelu),
        "qgelu": qgelu, "qgeglu": gated(qgelu),
        "relu": F.relu, "reglu": gated(F.relu),
        "srelu": srelu, "sreglu": gated(srelu),
        "silu": F.silu, "swiglu": gated(F.silu),
        "clamped_swiglu": gated(qgelu, clamp=True),
    }[kind]


_ACT_GATED = {"geglu", "qgeglu", "reglu", "sreglu", "swiglu", "clamped_swiglu"}


def _act_fwd_fp8(kind, dtype_name="bf16", columnwise=True):
    def build(rows, cols):
        torch = _torch()
        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        width = 2 * cols if kind in _ACT_GATED else cols
        x = _randn(rows, width, dtype, 0.0, 2.0, seed=10)
        f = _act_fn(torch, kind)

        def run():
            y = f(x.float())
            amax = y.abs().amax()
            q = (y * 64.0).to(torch.float8_e4m3fn)
            return (q, q.t().contiguous(), amax) if columnwise else (q, amax)

        return run, (f"{kind} in FP32 on {dtype_name} x, abs().amax(), (y*scale).to(float8_e4m3fn)"
                     + ("; .t().contiguous()" if columnwise else ""))
    return build


def _act_fwd_bf16(rows, cols):
    torch = _torch()
    x = _randn(rows, cols, torch.bfloat16, 0.0, 2.0, seed=11)
    return (lambda: torch.nn.functional.gelu(x, approximate="tanh")), "F.gelu(x, approximate='tanh') on BF16"


def _act_bwd(kind, dbias):
    def build(rows, cols):
        torch = _torch()
        F = torch.nn.functional
        dy = _randn(rows, cols, torch.bfloat16, 0.0, 1.0, seed=12)
        if kind == "gelu":
            x = _randn(rows, cols, torch.bfloat16, 0.0, 2.0, seed=13)

            def grad():
                return torch.ops.aten.gelu_backward(dy.float(), x.float(), approximate="tanh")
        else:  # swiglu
            x = _randn(rows, 2 * cols, torch.bfloat16, 0.0, 2.0, seed=13)

            def grad():
                a, b = x.float().chunk(2, dim=-1)
                g = dy.float()
                return torch.cat([torch.ops.aten.silu_backward(g * b, a), g * F.silu(a)], dim=-1)

        def run():
            dx = grad()
            out = dx.to(torch.bfloat16)
            return (out, dx.sum(0)) if dbias else out

        return run, (f"{kind} backward in FP32 (aten.{'gelu' if kind == 'gelu' else 'silu'}_backward), dx to BF16"
                     + (", dbias = dx.sum(0)" if dbias else ""))
    return build


TORCH_EQUIVALENTS.update({f"{k}_fwd_fp8": _act_fwd_fp8(k) for k in
                          ["gelu", "geglu", "qgelu", "qgeglu", "relu", "reglu", "srelu", "sreglu", "silu",
                           "swiglu", "clamped_swiglu"]})
TORCH_EQUIVALENTS.update({
    "gelu_fwd_fp8_fp32": _act_fwd_fp8("gelu", "fp32"),
    "gelu_fwd_fp8_codec": _act_fwd_fp8("gelu"),
    "gelu_fwd_fp8_rowwise": _act_fwd_fp8("gelu", columnwise=False),
    "gelu_fwd_bf16": _act_fwd_bf16,
    "gelu_fwd_fp8_tiled64": _act_fwd_fp8("gelu"),
    "relu_fwd_fp8_tiled64": _act_fwd_fp8("relu"),
    "swiglu_fwd_fp8_tiled64": _act_fwd_fp8("swiglu"),
    "gelu_bwd_dbias": _act_bwd("gelu", True),
    "gelu_bwd": _act_bwd("gelu", False),
    "swiglu_bwd_dbias": _act_bwd("swiglu", True),
    "swiglu_bwd": _act_bwd("swiglu", False),
})


# --- GEMM (gemm_bench): rows x cols means m = rows, n = k = cols -------------------------

BENCHES.append("gemm_bench")


def _torch_matmul_bf16(rows, cols):
    torch = _torch()
    a = _randn(rows, cols, torch.bfloat16, seed=1)
    b = _randn(cols, cols, torch.bfloat16, seed=2)
    return (lambda: torch.matmul(a, b.t())), "torch.matmul(a, b.t()) BF16 -> BF16"


def _torch_scaled_mm(fast):
    def build(rows, cols):
        torch = _torch()
        a = _randn(rows, cols, torch.float32, seed=1).to(torch.float8_e4m3fn)
        b = _randn(cols, cols, torch.float32, seed=2).to(torch.float8_e4m3fn)
        sa = torch.tensor(0.5, device="cuda")
        sb = torch.tensor(0.25, device="cuda")
        return (lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                         use_fast_accum=fast)), \
            f"torch._scaled_mm E4M3 x E4M3 -> BF16, use_fast_accum={fast}"
    return build


def _torch_scaled_mm_block(rows, cols):
    """torch._scaled_mm with DeepSeek-style FP32 block scales (PyTorch >= 2.9 routes these to
    cuBLASLt's VEC128_32F / BLK128x128_32F modes on sm_90): A 1x128 blocks, scale_a
    [M, K/128] with M contiguous; B 128x128 tiles, scale_b^T [N/128, K/128] row-major.
    Older PyTorch rejects the scale shapes; the row then reports torch_error and our
    TFLOP/s stands alone."""
    torch = _torch()
    kb = -(-cols // 128)
    nb = -(-cols // 128)
    a = _randn(rows, cols, torch.float32, seed=1).to(torch.float8_e4m3fn)
    b = _randn(cols, cols, torch.float32, seed=2).to(torch.float8_e4m3fn)
    sa = torch.ones(kb, rows, device="cuda", dtype=torch.float32).t()   # [M, K/128], stride (1, M)
    kb_padded = -(-kb // 4) * 4
    sb = torch.ones(nb, kb_padded, device="cuda", dtype=torch.float32)[:, :kb].t()  # [K/128, N/128]
    return (lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)), \
        "torch._scaled_mm E4M3 x E4M3 -> BF16, 1x128 x 128x128 FP32 block scales"


def _torch_linear_fwd_bwd(rows, cols):
    torch = _torch()
    layer = torch.nn.Linear(cols, cols, bias=True, device="cuda", dtype=torch.bfloat16)
    x = _randn(rows, cols, torch.bfloat16, seed=1).requires_grad_(True)
    dy = _randn(rows, cols, torch.bfloat16, std=1e-3, seed=2)

    def run():
        y = layer(x)
        y.backward(dy)
    return run, "torch.nn.Linear BF16 forward + backward (dx, dW, db)"


BENCHES.append("linear_bench")


_SDPA_BATCH, _SDPA_HEADS = 4, 32  # attention_bench's B and H


def _sdpa_tensors(seq, head_dim):
    """BF16 q, k, v, dout [B, H, S, D]."""
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (_SDPA_BATCH, _SDPA_HEADS, seq, head_dim)
    return [torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4)]


def _sdpa_fwd_bwd(q, k, v, dout, **sdpa_args):
    """A step of SDPA forward + backward (dq, dk, dv) on these tensors."""
    import torch.nn.functional as F
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)

    def run():
        out = F.scaled_dot_product_attention(q, k, v, **sdpa_args)
        q.grad = k.grad = v.grad = None
        out.backward(dout)
    return run


def _torch_sdpa(backward):
    def build(seq, head_dim):
        import torch.nn.functional as F
        q, k, v, dout = _sdpa_tensors(seq, head_dim)
        if not backward:
            return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), \
                "F.scaled_dot_product_attention BF16 causal forward"
        return _sdpa_fwd_bwd(q, k, v, dout, is_causal=True), \
            "F.scaled_dot_product_attention BF16 causal forward + backward (dq, dk, dv)"
    return build


def _torch_sdpa_padded(seq, head_dim):
    """What a PyTorch user runs for a right-padded causal batch: one boolean mask (causal and
    the keys past each sequence's length), which sends SDPA to its memory-efficient kernel."""
    torch = _torch()
    q, k, v, dout = _sdpa_tensors(seq, head_dim)
    batch = _SDPA_BATCH
    lengths = torch.tensor([seq * (batch - b) // batch for b in range(batch)], device="cuda")
    pos = torch.arange(seq, device="cuda")
    causal = pos[None, :] <= pos[:, None]                                   # [S_q, S_kv]
    keys = pos[None, :] < lengths[:, None]                                  # [B, S_kv]
    mask = (causal[None, :, :] & keys[:, None, :])[:, None, :, :]           # [B, 1, S_q, S_kv]
    return _sdpa_fwd_bwd(q, k, v, dout, attn_mask=mask), \
        "F.scaled_dot_product_attention BF16, causal + key-padding boolean attn_mask, forward + backward"


def _torch_sdpa_alibi(seq, head_dim):
    """What a PyTorch user runs for causal ALiBi: the bias (-slope_h * (i - j), the default
    slopes of 32 heads, 2^(-8h/32)) and the causal -inf as one BF16 float attn_mask."""
    torch = _torch()
    q, k, v, dout = _sdpa_tensors(seq, head_dim)
    heads = _SDPA_HEADS
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device="cuda")
    pos = torch.arange(seq, device="cuda")
    distance = (pos[None, :] - pos[:, None]).float()                       # j - i
    bias = slopes[:, None, None] * distance[None, :, :]                    # [H, S_q, S_kv]
    bias = bias.masked_fill(distance[None, :, :] > 0, float("-inf"))
    mask = bias[None, :, :, :].to(torch.bfloat16)                          # [1, H, S_q, S_kv]
    return _sdpa_fwd_bwd(q, k, v, dout, attn_mask=mask), \
        "F.scaled_dot_product_attention BF16, ALiBi + causal as a float attn_mask, forward + backward"


BENCHES.append("attention_bench")

TORCH_EQUIVALENTS.update({
    "attention_bf16_causal_fwd": _torch_sdpa(False),
    "attention_bf16_causal_fwd_bwd": _torch_sdpa(True),
    "attention_bf16_causal_fwd_bwd_nondeterministic": _torch_sdpa(True),
    "attention_bf16_padding_causal_fwd_bwd": _torch_sdpa_padded,
    "attention_bf16_causal_alibi_fwd_bwd": _torch_sdpa_alibi,
    "linear_fp32_fwd_bwd": _torch_linear_fwd_bwd,
    "linear_fp8_delayed_fwd_bwd": _torch_linear_fwd_bwd,
    "linear_bf16_fwd_bwd": _torch_linear_fwd_bwd,
    "linear_fp8_delayed_bf16_fwd_bwd": _torch_linear_fwd_bwd,
    "linear_fp8_delayed_bf16_fwd_bwd_pipelined": _torch_linear_fwd_bwd,
    "linear_mxfp8_bf16_fwd_bwd": _torch_linear_fwd_bwd,
    "linear_mxfp8_bf16_fwd_bwd_pipelined": _torch_linear_fwd_bwd,
    "linear_nvfp4_bf16_fwd_bwd": _torch_linear_fwd_bwd,
    "linear_nvfp4_bf16_fwd_bwd_pipelined": _torch_linear_fwd_bwd,
    "gemm_bf16": _torch_matmul_bf16,
    "gemm_fp8_fast": _torch_scaled_mm(True),
    "gemm_fp8_split": _torch_scaled_mm(False),
    "gemm_fp8_block": _torch_scaled_mm_block,
    "gemm_fp8_block_qscales": _torch_scaled_mm_block,
})
