"""Layer specs named and shaped like transformer_engine.pytorch's modules.

Each class takes TE's argument names with TE's defaults and builds one
``teserve.v1.LayerSpec``; a list of them is the model of a session::

    model = [teserve.TransformerLayer(64, 256, 4, hidden_dropout=0.0),
             teserve.LayerNorm(64), teserve.Linear(64, 96)]

Differences from TE, all from running remotely: ``init_method`` /
``output_layer_init_method`` (callables) become ``init_std`` / ``output_layer_init_std``
(the standard deviation of the normal init, server default 0.023, TE's); there is no
``device``, tensor / sequence parallelism or userbuffers argument; ``params_dtype``
takes ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (or the numpy / torch
dtype) and keeps FP32 master weights on the server;
MultiheadAttention and TransformerLayer build their rotary table from ``rotary``
instead of taking ``rotary_pos_emb`` at forward time. ``name`` sets the layer's name
(parameters are ``"<name>.<param>"``; default ``"layers.<index>"``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

from google.protobuf.descriptor import FieldDescriptor

from teserve.v1 import model_pb2, tensor_pb2

_PARAMS_DTYPES = {"float32": tensor_pb2.FLOAT32, "bfloat16": tensor_pb2.BFLOAT16, "float16": tensor_pb2.FLOAT16}


def _params_dtype(value: Any, where: str) -> int:
    """TE's params_dtype as the wire enum: a name, a numpy dtype or a torch dtype."""
    if isinstance(value, str):
        name = value
    else:
        try:  # numpy dtypes and scalar types (np.float16, ml_dtypes.bfloat16)
            import numpy as np
            name = np.dtype(value).name
        except TypeError:  # torch.bfloat16 and friends print as "torch.<name>"
            name = str(value).replace("torch.", "")
    if name not in _PARAMS_DTYPES:
        raise ValueError(f"{where}: expected one of float32, bfloat16, float16, got {value!r}")
    return _PARAMS_DTYPES[name]

__all__ = [
    "LayerSpecBase", "Linear", "LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP",
    "GroupedLinear", "DotProductAttention", "MultiheadAttention", "TransformerLayer",
    "RotaryPositionEmbedding", "model_spec",
]

WindowSize = Optional[Tuple[int, int]]

_INT_TYPES = (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64,
              FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64)
_FLOAT_TYPES = (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or type(value).__name__ in (
        "int32", "int64", "uint32", "uint64")


def set_scalar(message: Any, name: str, value: Any, where: str) -> None:
    """Sets a scalar proto field after checking the Python type (errors name the field)."""
    if value is None:
        return
    fd = message.DESCRIPTOR.fields_by_name[name]
    kind = fd.cpp_type
    if kind in _INT_TYPES:
        if not _is_int(value):
            raise TypeError(f"{where}.{name}: expected int, got {type(value).__name__} {value!r}")
        value = int(value)
    elif kind in _FLOAT_TYPES:
        if not (_is_int(value) or isinstance(value, float) or type(value).__name__.startswith("float")):
            raise TypeError(f"{where}.{name}: expected float, got {type(value).__name__} {value!r}")
        value = float(value)
    elif kind == FieldDescriptor.CPPTYPE_BOOL:
        if not isinstance(value, bool) and type(value).__name__ != "bool_":
            raise TypeError(f"{where}.{name}: expected bool, got {type(value).__name__} {value!r}")
        value = bool(value)
    elif kind == FieldDescriptor.CPPTYPE_STRING:
        if not isinstance(value, str):
            raise TypeError(f"{where}.{name}: expected str, got {type(value).__name__} {value!r}")
    elif kind == FieldDescriptor.CPPTYPE_ENUM:
        value = int(value)
    setattr(message, name, value)


def _window(target: model_pb2.AttentionWindowSize, value: Sequence[int], where: str) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(_is_int(v) for v in value):
        raise TypeError(f"{where}: expected a (left, right) pair of ints (-1 = unbounded), got {value!r}")
    target.left, target.right = int(value[0]), int(value[1])


def _activation_params(target: model_pb2.ActivationParams, value: Mapping[str, float], where: str) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(f"{where}: expected a dict with 'limit' and/or 'alpha', got {value!r}")
    unknown = sorted(set(value) - {"limit", "alpha"})
    if unknown:
        raise ValueError(f"{where}: expected keys 'limit' and/or 'alpha', got {unknown}")
    for key, v in value.items():
        set_scalar(target, key, v, where)


@dataclass
class RotaryPositionEmbedding:
    """TE's RotaryPositionEmbedding for MultiheadAttention / TransformerLayer.

    The dimension is the layer's kv_channels; the server builds the frequency table.
    """

    rotary_percent: float = 1.0
    seq_len_interpolation_factor: Optional[float] = None
    pretrained_max_position_embeddings: Optional[int] = None
    rotary_base: float = 10000.0

    def to_proto(self, where: str = "rotary") -> model_pb2.RotarySpec:
        spec = model_pb2.RotarySpec()
        for f in dataclasses.fields(self):
            set_scalar(spec, f.name, getattr(self, f.name), where)
        return spec


class LayerSpecBase:
    """Common behaviour of the layer specs: ``to_proto()`` -> ``teserve.v1.LayerSpec``."""

    _oneof: str = ""           # LayerSpec's oneof field
    _special: Tuple[str, ...] = ()  # fields converted by _convert_special

    name: Optional[str]
    params_dtype: Any

    def to_proto(self) -> model_pb2.LayerSpec:
        layer = model_pb2.LayerSpec()
        cls = type(self).__name__
        if self.name is not None:
            set_scalar(layer, "name", self.name, cls)
        if self.params_dtype is not None:
            layer.params_dtype = _params_dtype(self.params_dtype, f"{cls}.params_dtype")
        spec = getattr(layer, self._oneof)
        spec.SetInParent()
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name in ("name", "params_dtype") or value is None:
                continue
            if f.name in self._special:
                self._convert_special(spec, f.name, value, f"{cls}.{f.name}")
            else:
                set_scalar(spec, f.name, value, cls)
        return layer

    def _convert_special(self, spec: Any, name: str, value: Any, where: str) -> None:
        if name in ("window_size", "enc_dec_window_size"):
            _window(getattr(spec, name), value, where)
        elif name == "activation_params":
            _activation_params(spec.activation_params, value, where)
        elif name == "rotary":
            if not isinstance(value, RotaryPositionEmbedding):
                raise TypeError(f"{where}: expected teserve.RotaryPositionEmbedding, got {value!r}")
            spec.rotary.CopyFrom(value.to_proto(where))
        elif name == "qk_norm_type":
            set_scalar(spec, name, value, where.rsplit(".", 1)[0])
        else:  # pragma: no cover - every special field is handled above
            raise AssertionError(name)


@dataclass
class Linear(LayerSpecBase):
    """TE's Linear: y = x W^T + b. Parameters ``weight`` [out, in], ``bias`` [out]."""

    in_features: int
    out_features: int
    bias: bool = True
    return_bias: bool = False
    init_std: Optional[float] = None
    params_dtype: Any = None
    name: Optional[str] = None
    _oneof = "linear"


@dataclass
class LayerNorm(LayerSpecBase):
    """TE's LayerNorm over the last dimension. Parameters ``weight``, ``bias``."""

    hidden_size: int
    eps: float = 1e-5
    zero_centered_gamma: bool = False
    params_dtype: Any = None
    name: Optional[str] = None
    _oneof = "layer_norm"


@dataclass
class RMSNorm(LayerSpecBase):
    """TE's RMSNorm over the last dimension. Parameter ``weight``."""

    hidden_size: int
    eps: float = 1e-5
    zero_centered_gamma: bool = False
    params_dtype: Any = None
    name: Optional[str] = None
    _oneof = "rms_norm"


@dataclass
class GroupedLinear(LayerSpecBase):
    """TE's GroupedLinear: ``num_gemms`` Linears over consecutive row groups.

    The group sizes arrive per call as the side input ``m_splits``. Parameters
    ``weight<i>``, ``bias<i>``.
    """

    num_gemms: int
    in_features: int
    out_features: int
    bias: bool = True
    return_bias: bool = False
    init_std: Optional[float] = None
    params_dtype: Any = None
    name: Optional[str] = None
    _oneof = "grouped_linear"


@dataclass
class LayerNormLinear(LayerSpecBase):
    """TE's LayerNormLinear: LayerNorm or RMSNorm, then a Linear.

    ``parameters_split``: TE's dict (name -> rows) or list of names (equal blocks).
    Outputs: y, then the bias if ``return_bias``, then the normalized input if
    ``return_layernorm_output``.
    """

    in_features: int
    out_features: int
    eps: float = 1e-5
    bias: bool = True
    normalization: str = "LayerNorm"
    return_bias: bool = False
    return_layernorm_output: bool = False
    parameters_split: Optional[Union[Mapping[str, int], Sequence[str]]] = None
    zero_centered_gamma: bool = False
    init_std: Optional[float] = None
    params_dtype: Any = None
    name: Optional[str] = None
    _oneof = "layer_norm_linear"
    _special = ("parameters_split",)

    def _convert_special(self, spec: Any, name: str, value: Any, where: str) -> None:
        if isinstance(value, Mapping):
            items = list(value.items())
        elif isinstance(value, (list, tuple)):
            items = [(n, 0) for n in value]
        else:
            raise TypeError(f"{where}: expected a dict name -> size or a list of names, got {value!r}")
        for i, (split_name, size) in enumerate(items):
            entry = spec.parameters_split.add()
            set_scalar(entry, "name", split_name, f"{where}[{i}]")
            set_scalar(entry, "size", size, f"{where}[{i}]")


@dataclass
class LayerNormMLP(LayerSpecBase):
    """TE's LayerNormMLP: norm, fc1, activation, fc2.

    ``activation``: gelu (default), geglu, qgelu, qgeglu, relu, reglu, srelu, sreglu, silu,
    swiglu, clamped_swiglu (``activation_params={"limit": 7.0, "alpha": 1.702}``).
    ``checkpoint`` recomputes norm and fc1 in the backward.
    """

    hidden_size: int
    ffn_hidden_size: int
    eps: float = 1e-5
    bias: bool = True
    normalization: str = "LayerNorm"
    activation: str = "gelu"
    activation_params: Optional[Mapping[str, float]] = None
    return_layernorm_output: bool = False
    return_bias: bool = False
    zero_centered_gamma: bool = False
    checkpoint: bool = False
    init_std: Optional[float] = None
    params_dtype: Any = None
    name: Optional[str] = None
    _oneof = "layer_norm_mlp"
    _special = ("activation_params",)


@dataclass
class DotProductAttention(LayerSpecBase):
    """TE's DotProductAttention; reads three inputs (query, key, value).

    ``kv_channels`` is an int or a (k, v) pair of head sizes. Masks, cu_seqlens, bias
    and ALiBi slopes arrive as forward keyword arguments (side inputs).
    """

    num_attention_heads: int
    kv_channels: Union[int, Tuple[int, int]]
    num_gqa_groups: Optional[int] = None
    attention_dropout: float = 0.0
    qkv_format: str = "sbhd"
    attn_mask_type: str = "causal"
    window_size: WindowSize = None
    softmax_scale: Optional[float] = None
    softmax_type: str = "vanilla"
    core_attention_bias_type: str = "no_bias"
    return_max_logit: bool = False
    checkpoint_core_attention: bool = False
    params_dtype: Any = None
    name: Optional[str] = None
    _oneof = "dot_product_attention"
    _special = ("kv_channels", "window_size")

    def _convert_special(self, spec: Any, name: str, value: Any, where: str) -> None:
        if name == "kv_channels":
            if isinstance(value, (tuple, list)):
                if len(value) != 2:
                    raise TypeError(f"{where}: expected an int or a (k, v) pair, got {value!r}")
                set_scalar(spec, "kv_channels", value[0], where.rsplit(".", 1)[0])
                set_scalar(spec, "kv_channels_v", value[1], where.rsplit(".", 1)[0])
            else:
                set_scalar(spec, "kv_channels", value, where.rsplit(".", 1)[0])
        else:
            super()._convert_special(spec, name, value, where)


@dataclass
class MultiheadAttention(LayerSpecBase):
    """TE's MultiheadAttention: QKV projection (optionally after ``input_layernorm``),
    qk_norm, rotary embedding, DotProductAttention, output projection ``proj``.

    Cross attention (``attention_type="cross"``) reads the forward keyword
    ``encoder_output``.
    """

    hidden_size: int
    num_attention_heads: int
    kv_channels: Optional[int] = None
    attention_dropout: float = 0.1
    layernorm_epsilon: float = 1e-5
    attn_mask_type: str = "causal"
    window_size: WindowSize = None
    num_gqa_groups: Optional[int] = None
    return_layernorm_output: bool = False
    input_layernorm: bool = False
    attention_type: str = "self"
    zero_centered_gamma: bool = False
    qkv_weight_interleaved: bool = True
    bias: bool = True
    normalization: str = "LayerNorm"
    qkv_format: str = "sbhd"
    qk_norm_type: Optional[str] = None
    qk_norm_eps: float = 1e-6
    qk_norm_before_rope: bool = False
    softmax_type: str = "vanilla"
    fuse_qkv_params: bool = False
    return_bias: bool = False
    rotary: Optional[RotaryPositionEmbedding] = None
    rotary_pos_interleaved: bool = False
    checkpoint_core_attention: bool = False
    init_std: Optional[float] = None
    output_layer_init_std: Optional[float] = None
    params_dtype: Any = None
    name: Optional[str] = None
    _oneof = "multihead_attention"
    _special = ("window_size", "rotary", "qk_norm_type")


@dataclass
class TransformerLayer(LayerSpecBase):
    """TE's TransformerLayer: self attention, (decoder) cross attention over the forward
    keyword ``encoder_output``, and a LayerNormMLP with residual bias-dropout-adds.

    Input and output are in ``attn_input_format`` layout ([S, B, H] for "sbhd").
    """

    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_gqa_groups: Optional[int] = None
    layernorm_epsilon: float = 1e-5
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    kv_channels: Optional[int] = None
    self_attn_mask_type: str = "causal"
    window_size: WindowSize = None
    enc_dec_attn_mask_type: str = "no_mask"
    enc_dec_window_size: WindowSize = None
    apply_residual_connection_post_layernorm: bool = False
    output_layernorm: bool = False
    parallel_attention_mlp: bool = False
    layer_type: str = "encoder"
    drop_path_rate: float = 0.0
    fuse_qkv_params: bool = False
    zero_centered_gamma: bool = False
    qkv_weight_interleaved: bool = True
    bias: bool = True
    activation: str = "gelu"
    activation_params: Optional[Mapping[str, float]] = None
    normalization: str = "LayerNorm"
    attn_input_format: str = "sbhd"
    qk_norm_type: Optional[str] = None
    qk_norm_eps: float = 1e-6
    qk_norm_before_rope: bool = False
    softmax_type: str = "vanilla"
    rotary: Optional[RotaryPositionEmbedding] = None
    rotary_pos_interleaved: bool = False
    checkpoint_core_attention: bool = False
    init_std: Optional[float] = None
    output_layer_init_std: Optional[float] = None
    params_dtype: Any = None
    name: Optional[str] = None
    _oneof = "transformer_layer"
    _special = ("window_size", "enc_dec_window_size", "activation_params", "rotary", "qk_norm_type")


LayerLike = Union[LayerSpecBase, model_pb2.LayerSpec]


def model_spec(layers: Union[Sequence[LayerLike], model_pb2.ModelSpec], seed: int = 0) -> model_pb2.ModelSpec:
    """A ``teserve.v1.ModelSpec`` from layer specs (or LayerSpec protos) and a seed."""
    if isinstance(layers, model_pb2.ModelSpec):
        spec = model_pb2.ModelSpec()
        spec.CopyFrom(layers)
        if seed:
            spec.seed = seed
        return spec
    if isinstance(layers, LayerSpecBase):
        layers = [layers]
    spec = model_pb2.ModelSpec()
    set_scalar(spec, "seed", seed, "model")
    for i, layer in enumerate(layers):
        if isinstance(layer, LayerSpecBase):
            spec.layers.append(layer.to_proto())
        elif isinstance(layer, model_pb2.LayerSpec):
            spec.layers.append(layer)
        else:
            raise TypeError(f"model[{i}]: expected a teserve layer (teserve.Linear, ...) or a "
                            f"teserve.v1.LayerSpec, got {type(layer).__name__}")
    return spec
