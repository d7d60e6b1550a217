"""What every pruned layer of `sparsec.nn` shares: its activations (the language's
one-argument functions as torch's) and the check of its input."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..base.errors import DTypeError, InputError, ShapeError

#: the language's one-argument functions (sparsec/frontend/functions.py) as torch's
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "abs": torch.abs,
    "sqrt": torch.sqrt,
    "exp": torch.exp,
    "log": torch.log,
    "sin": torch.sin,
    "cos": torch.cos,
}


def check_activation(name: str | None) -> None:
    """Refuse an activation that is not one of `ACTIVATIONS` (None: no activation)."""
    if name is not None and name not in ACTIVATIONS:
        raise InputError(
            f"unknown activation {name!r}; use one of {', '.join(ACTIVATIONS)} or None"
        )


def activate(y: torch.Tensor, name: str | None) -> torch.Tensor:
    """``y`` through the activation ``name`` (itself for None)."""
    return y if name is None else ACTIVATIONS[name](y)


def check_input(layer: str, x: torch.Tensor, in_features: int, dtype: torch.dtype) -> None:
    """Refuse an input whose last dimension is not ``in_features`` or whose dtype is not
    the layer's values' ``dtype``."""
    if x.shape[-1] != in_features:
        raise ShapeError(
            f"{layer} expects inputs of shape (..., {in_features}), got {tuple(x.shape)}"
        )
    if x.dtype != dtype:
        raise DTypeError(
            f"{layer} holds {dtype} values; the input is {x.dtype} "
            "(cast one of them, e.g. layer.to(x.dtype))"
        )
