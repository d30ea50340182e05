"""numpy / torch arrays <-> wire Tensors (raw little-endian row-major bytes + dtype + shape).

bfloat16 and FP8 arrays need ml_dtypes (``pip install ml_dtypes``) on the numpy side;
torch tensors of every dtype below are accepted when torch is installed.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from teserve.v1 import tensor_pb2

try:  # optional: numpy dtypes for bfloat16 / FP8
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None  # type: ignore[assignment]

__all__ = ["to_wire", "from_wire", "is_torch_tensor", "to_numpy"]

DType = tensor_pb2.DType

# numpy dtype name -> wire dtype. ml_dtypes names its types 'bfloat16', 'float8_e4m3fn', ...
_WIRE_OF_NAME = {
    "float32": DType.FLOAT32,
    "float16": DType.FLOAT16,
    "bfloat16": DType.BFLOAT16,
    "float8_e4m3fn": DType.FLOAT8_E4M3,
    "float8_e5m2": DType.FLOAT8_E5M2,
    "float8_e8m0fnu": DType.FLOAT8_E8M0,
    "int32": DType.INT32,
    "int64": DType.INT64,
    "bool": DType.BOOL,
}


def _numpy_dtype_of_wire(dtype: int) -> Optional[np.dtype]:
    plain: Dict[int, np.dtype] = {
        DType.FLOAT32: np.dtype("<f4"),
        DType.FLOAT16: np.dtype("<f2"),
        DType.INT32: np.dtype("<i4"),
        DType.INT64: np.dtype("<i8"),
        DType.BOOL: np.dtype("?"),
    }
    if dtype in plain:
        return plain[dtype]
    if _ml_dtypes is None:
        return None
    extended = {
        DType.BFLOAT16: "bfloat16",
        DType.FLOAT8_E4M3: "float8_e4m3fn",
        DType.FLOAT8_E5M2: "float8_e5m2",
        DType.FLOAT8_E8M0: "float8_e8m0fnu",
    }
    name = extended.get(dtype)
    if name is None or not hasattr(_ml_dtypes, name):
        return None
    return np.dtype(getattr(_ml_dtypes, name))


def is_torch_tensor(value: Any) -> bool:
    """True for a torch.Tensor (checked without importing torch)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def to_numpy(value: Any, field: str = "tensor") -> np.ndarray:
    """A C-contiguous numpy array holding ``value`` (numpy array, torch tensor, list, scalar).

    torch bfloat16 tensors become ml_dtypes.bfloat16 arrays when ml_dtypes is installed,
    else float32 (exact: every bfloat16 is a float32).
    """
    if is_torch_tensor(value):
        t = value.detach().cpu().contiguous()
        name = str(t.dtype).replace("torch.", "")
        if name == "bfloat16":
            if _ml_dtypes is not None:
                return t.view(_torch().int16).numpy().view(_ml_dtypes.bfloat16)
            return t.float().numpy()
        if name in ("float8_e4m3fn", "float8_e5m2"):
            if _ml_dtypes is None:
                raise TypeError(f"{field}: a torch {name} tensor needs ml_dtypes (pip install ml_dtypes)")
            return t.view(_torch().uint8).numpy().view(getattr(_ml_dtypes, name))
        return t.numpy()
    return _contiguous(np.asarray(value))


def _contiguous(array: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array into shape (1,).
    return array if array.flags.c_contiguous else array.copy(order="C")


def _torch():
    import torch  # only reached with a torch tensor in hand

    return torch


def to_wire(value: Any, field: str = "tensor", dtype: Optional[str] = None) -> tensor_pb2.Tensor:
    """Encodes ``value`` as a wire Tensor.

    Args:
        value: numpy array, torch tensor, nested list or scalar.
        field: the name used in error messages (``"inputs[0]"``).
        dtype: cast to this numpy dtype name first (``"float32"``, ``"int64"``, ...).
            Without it, float64 is narrowed to float32 (the server computes in FP32) and
            other dtypes travel as they are.
    Raises:
        TypeError: a dtype the wire format has no code for (it names the field).
    """
    array = to_numpy(value, field)
    if dtype is not None and array.dtype.name != dtype:
        if dtype == "bfloat16":
            if _ml_dtypes is None:
                raise TypeError(f"{field}: bfloat16 needs ml_dtypes (pip install ml_dtypes)")
            array = array.astype(_ml_dtypes.bfloat16)
        else:
            array = array.astype(dtype)
    elif array.dtype == np.float64:
        array = array.astype(np.float32)
    name = array.dtype.name
    wire_dtype = _WIRE_OF_NAME.get(name)
    if wire_dtype is None:
        raise TypeError(
            f"{field}: expected dtype one of {', '.join(sorted(_WIRE_OF_NAME))}, got {name}")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    array = _contiguous(array)
    return tensor_pb2.Tensor(dtype=wire_dtype, shape=list(array.shape), data=array.tobytes())


def from_wire(tensor: tensor_pb2.Tensor, field: str = "tensor") -> np.ndarray:
    """Decodes a wire Tensor into a new (writable) numpy array.

    BFLOAT16 becomes ml_dtypes.bfloat16 when ml_dtypes is installed, else float32 (an exact
    widening). FP8 / E8M0 need ml_dtypes; FLOAT4_E2M1 is returned packed as uint8 (two
    elements a byte, element 2i in the low nibble).
    """
    shape = tuple(int(d) for d in tensor.shape)
    np_dtype = _numpy_dtype_of_wire(tensor.dtype)
    if np_dtype is None:
        if tensor.dtype == DType.BFLOAT16:
            bits = np.frombuffer(tensor.data, dtype="<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(shape)
        if tensor.dtype == DType.FLOAT4_E2M1:
            return np.frombuffer(tensor.data, dtype=np.uint8).copy()
        name = DType.Name(tensor.dtype) if tensor.dtype in DType.values() else str(tensor.dtype)
        raise TypeError(f"{field}: dtype {name} needs ml_dtypes (pip install ml_dtypes)")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    expected = count * np_dtype.itemsize
    if len(tensor.data) != expected:
        raise ValueError(
            f"{field}.data: expected {expected} bytes (shape {list(shape)} x {np_dtype.name}), "
            f"got {len(tensor.data)}")
    return np.frombuffer(tensor.data, dtype=np_dtype).reshape(shape).copy()
