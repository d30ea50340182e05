"""teserve: Python client of the teserve server (Transformer-Engine-style layers and
quantization recipes behind gRPC).

    import numpy as np, teserve
    with teserve.connect("localhost:50051") as client:
        with client.create_session([teserve.Linear(32, 8)], teserve.DelayedScaling(),
                                   teserve.AdamW(lr=1e-3)) as session:
            fwd = session.forward(np.ones((4, 32), np.float32))
            fwd.backward(np.ones_like(fwd.output))
            session.step()

Layers, recipes and their arguments follow transformer_engine.pytorch; optimizers and
losses follow torch. Errors are ``teserve.TeserveError`` subclasses (``InvalidArgument``,
``NotFound``, ...) carrying the server's ``code`` and ``message``.
"""
from teserve._errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded,
                             FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange,
                             PermissionDenied, ResourceExhausted, TeserveError, Unauthenticated,
                             Unavailable, Unimplemented, Unknown)
from teserve._tensors import from_wire, to_wire
from teserve.client import (BackwardResult, Client, ForwardBackwardResult, ForwardResult, Future,
                            Session, StepResult, connect)
from teserve.layers import (DotProductAttention, GroupedLinear, LayerNorm, LayerNormLinear,
                            LayerNormMLP, Linear, MultiheadAttention, RMSNorm,
                            RotaryPositionEmbedding, TransformerLayer, model_spec)
from teserve.recipes import (SGD, AdamW, CrossEntropyLoss, DelayedScaling, Float8BlockScaling,
                             Float8CurrentScaling, Format, MSELoss, MXFP8BlockScaling,
                             NVFP4BlockScaling, Recipe)

__version__ = "0.1.0"

__all__ = [
    "connect", "Client", "Session", "Future", "ForwardResult", "BackwardResult",
    "ForwardBackwardResult", "StepResult",
    "Linear", "LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP", "GroupedLinear",
    "DotProductAttention", "MultiheadAttention", "TransformerLayer", "RotaryPositionEmbedding",
    "model_spec",
    "Format", "Recipe", "DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling",
    "Float8BlockScaling", "NVFP4BlockScaling",
    "SGD", "AdamW", "MSELoss", "CrossEntropyLoss",
    "TeserveError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
    "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
    "to_wire", "from_wire",
]
