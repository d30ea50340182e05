"""Quantization recipes named like transformer_engine.common.recipe, optimizers named like
torch.optim, and the built-in losses of ForwardBackward named like torch.nn."""
from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any, Optional, Tuple, Union

from teserve.layers import set_scalar
from teserve.v1 import model_pb2, service_pb2

__all__ = [
    "Format", "Recipe", "DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling",
    "Float8BlockScaling", "NVFP4BlockScaling", "recipe_spec",
    "Optimizer", "SGD", "AdamW", "optimizer_spec",
    "Loss", "MSELoss", "CrossEntropyLoss", "loss_spec",
]


class Format(enum.Enum):
    """TE's recipe.Format: the FP8 formats of forward (E4M3) and backward tensors."""

    HYBRID = model_pb2.HYBRID  # E4M3 forward, E5M2 backward
    E4M3 = model_pb2.E4M3
    E5M2 = model_pb2.E5M2      # rejected by the server: not a training format


def _format(value: Union[Format, str, None], where: str) -> int:
    if value is None:
        return model_pb2.FP8_FORMAT_UNSPECIFIED
    if isinstance(value, str):
        try:
            value = Format[value.upper()]
        except KeyError:
            raise ValueError(f"{where}: expected one of HYBRID, E4M3, E5M2, got {value!r}") from None
    if not isinstance(value, Format):
        raise TypeError(f"{where}: expected teserve.Format, got {value!r}")
    return value.value


class Recipe:
    """Base of the recipe classes; ``to_proto()`` gives the oneof member of RecipeSpec."""

    _oneof: str = ""

    def to_proto(self) -> Any:
        cls = type(self).__name__
        message = getattr(model_pb2, cls)()
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "fp8_format":
                message.fp8_format = _format(value, f"{cls}.fp8_format")
            else:
                set_scalar(message, f.name, value, cls)
        return message


@dataclass
class DelayedScaling(Recipe):
    """FP8 per-tensor scaling from an amax history (TE's DelayedScaling).

    scale = (fp8_max / amax) / 2**margin, amax over the last ``amax_history_len``
    steps (``amax_compute_algo`` "max") or the latest ("most_recent").
    """

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    reduce_amax: bool = True
    _oneof = "delayed"


@dataclass
class Float8CurrentScaling(Recipe):
    """FP8 per-tensor scaling from the amax of the tensor being quantized."""

    fp8_format: Format = Format.HYBRID
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    _oneof = "current"


@dataclass
class MXFP8BlockScaling(Recipe):
    """MXFP8: E8M0 scales per 32 elements, E4M3 data (HYBRID: E5M2 gradients)."""

    fp8_format: Format = Format.E4M3
    _oneof = "mxfp8"


@dataclass
class Float8BlockScaling(Recipe):
    """DeepSeek-V3-style FP8 blocks: 1x128 (1) or 128x128 (2) blocks, FP32 scales."""

    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    power_2_scale: bool = True
    amax_epsilon: float = 0.0
    _oneof = "block"


@dataclass
class NVFP4BlockScaling(Recipe):
    """NVFP4: E2M1 data, E4M3 scales per 16 elements and an FP32 per-tensor scale."""

    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    fp8_format: Format = Format.E4M3
    _oneof = "nvfp4"


def recipe_spec(recipe: Optional[Union[Recipe, model_pb2.RecipeSpec]], enabled: bool = True,
                calibrating: bool = False, fp8_health_stats: bool = False) -> model_pb2.RecipeSpec:
    """A RecipeSpec: ``recipe`` None means high precision (FP32) everywhere.

    ``enabled`` / ``calibrating`` are TE's fp8_autocast arguments; ``fp8_health_stats``
    measures underflow / overflow / MSE at every quantization.
    """
    if isinstance(recipe, model_pb2.RecipeSpec):
        return recipe
    spec = model_pb2.RecipeSpec()
    set_scalar(spec, "enabled", enabled, "recipe")
    set_scalar(spec, "calibrating", calibrating, "recipe")
    set_scalar(spec, "fp8_health_stats", fp8_health_stats, "recipe")
    if recipe is not None:
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe: expected a teserve recipe (teserve.DelayedScaling(), ...) or None, "
                            f"got {type(recipe).__name__}")
        getattr(spec, recipe._oneof).CopyFrom(recipe.to_proto())
    return spec


class Optimizer:
    """Base of SGD / AdamW."""


@dataclass
class SGD(Optimizer):
    """torch.optim.SGD's arguments (weight_decay is L2 added to the gradient)."""

    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def to_proto(self) -> model_pb2.OptimizerSpec:
        spec = model_pb2.OptimizerSpec()
        spec.sgd.SetInParent()
        for f in fields(self):
            set_scalar(spec.sgd, f.name, getattr(self, f.name), "SGD")
        return spec


@dataclass
class AdamW(Optimizer):
    """torch.optim.AdamW's arguments (decoupled weight decay)."""

    lr: float = 1e-3
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01

    def to_proto(self) -> model_pb2.OptimizerSpec:
        spec = model_pb2.OptimizerSpec()
        spec.adamw.SetInParent()
        set_scalar(spec.adamw, "lr", self.lr, "AdamW")
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise TypeError(f"AdamW.betas: expected a (beta1, beta2) pair, got {self.betas!r}")
        set_scalar(spec.adamw, "beta1", self.betas[0], "AdamW.betas")
        set_scalar(spec.adamw, "beta2", self.betas[1], "AdamW.betas")
        set_scalar(spec.adamw, "eps", self.eps, "AdamW")
        set_scalar(spec.adamw, "weight_decay", self.weight_decay, "AdamW")
        return spec


def optimizer_spec(optimizer: Optional[Union[Optimizer, model_pb2.OptimizerSpec]],
                   max_grad_norm: float = 0.0) -> model_pb2.OptimizerSpec:
    """An OptimizerSpec; None means SGD with the default lr. ``max_grad_norm`` 0 = no clipping."""
    if isinstance(optimizer, model_pb2.OptimizerSpec):
        spec = model_pb2.OptimizerSpec()
        spec.CopyFrom(optimizer)
    elif optimizer is None:
        spec = SGD().to_proto()
    elif isinstance(optimizer, (SGD, AdamW)):
        spec = optimizer.to_proto()
    else:
        raise TypeError(f"optimizer: expected teserve.SGD or teserve.AdamW, got {type(optimizer).__name__}")
    if max_grad_norm:
        set_scalar(spec, "max_grad_norm", max_grad_norm, "optimizer")
    return spec


class Loss:
    """Base of the built-in losses of ForwardBackward."""


@dataclass
class MSELoss(Loss):
    """Mean squared error over all elements; the target has the output's shape."""

    def to_proto(self) -> service_pb2.LossSpec:
        spec = service_pb2.LossSpec()
        spec.mse.SetInParent()
        return spec


@dataclass
class CrossEntropyLoss(Loss):
    """Cross entropy of the logits [..., V] against integer labels [...]."""

    ignore_index: int = -100
    label_smoothing: float = 0.0

    def to_proto(self) -> service_pb2.LossSpec:
        spec = service_pb2.LossSpec()
        spec.cross_entropy.SetInParent()
        set_scalar(spec.cross_entropy, "ignore_index", self.ignore_index, "CrossEntropyLoss")
        set_scalar(spec.cross_entropy, "label_smoothing", self.label_smoothing, "CrossEntropyLoss")
        return spec


def loss_spec(loss: Union[str, Loss]) -> service_pb2.LossSpec:
    """``"mse"``, ``"cross_entropy"`` or a loss object -> LossSpec."""
    if isinstance(loss, str):
        named = {"mse": MSELoss, "cross_entropy": CrossEntropyLoss}
        if loss not in named:
            raise ValueError(f"loss: expected 'mse', 'cross_entropy' or a teserve loss object, got {loss!r}")
        loss = named[loss]()
    if not isinstance(loss, (MSELoss, CrossEntropyLoss)):
        raise TypeError(f"loss: expected teserve.MSELoss or teserve.CrossEntropyLoss, got {type(loss).__name__}")
    return loss.to_proto()
