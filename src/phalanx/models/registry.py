"""Name → builder registry, :func:`make`, :func:`names`, :func:`count_parameters` and the seeded initialisation.

Every model is built on the ``meta`` device (no memory, no random draws) and then initialised by
:func:`initialise` from exactly one random generator: the one passed to :func:`make`, or torch's global default
generator when none is passed. So ``torch.manual_seed(s); make(...)`` and
``make(..., generator=torch.Generator().manual_seed(s))`` give the same weights, and nothing else in the process
moves the global generator during construction.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from phalanx.errors import ConfigError

__all__ = ["count_parameters", "initialise", "make", "names", "register"]

Builder = Callable[..., nn.Module]
B = TypeVar("B", bound=Builder)
_BUILDERS: dict[str, Builder] = {}


def register(name: str) -> Callable[[B], B]:
    """Decorator: make ``builder(input_shape, num_classes, **params) -> nn.Module`` known to :func:`make`."""

    def deco(builder: B) -> B:
        if name in _BUILDERS:
            raise RuntimeError(f"model name {name!r} registered twice")
        _BUILDERS[name] = builder
        return builder

    return deco


def names() -> list[str]:
    """The model names :func:`make` accepts, sorted."""
    return sorted(_BUILDERS)


def _check_shape(input_shape: Any) -> tuple[int, ...]:
    if not isinstance(input_shape, (tuple, list)) or not input_shape or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in input_shape
    ):
        raise ConfigError("input_shape", input_shape, "a non-empty tuple of positive ints, e.g. (1, 28, 28)")
    return tuple(input_shape)


def make(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    generator: torch.Generator | None = None,
    **params: Any,
) -> nn.Module:
    """Build a model by name (see :func:`names`), initialised deterministically.

    Parameters
    ----------
    name: ``"logreg"``, ``"mlp"``, ``"cnn"`` or ``"resnet20"``.
    input_shape: the shape of one input without the batch dimension, ``(C, H, W)`` for images (the convolutional
        models require three dimensions; the others flatten any shape).
    num_classes: number of outputs (logits), ≥ 2.
    generator: a CPU ``torch.Generator`` to draw the initial weights from; ``None`` uses torch's global default
        generator (seeded by ``torch.manual_seed``). Either way the same seed gives the same weights.
    params: the model's own parameters (``hidden=(128, 64)`` for ``mlp``, ``groups=4`` for ``resnet20``, ...).

    The model is on the CPU in float32, in training mode; every model is a pure function of its parameters and
    input (no BatchNorm, no buffers that change, no in-place activations, no data-dependent control flow), so
    ``torch.func.functional_call`` + ``torch.func.vmap(torch.func.grad(...))`` computes per-worker gradients.
    """
    if not isinstance(name, str) or name not in _BUILDERS:
        close = difflib.get_close_matches(str(name), names(), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else None
        raise ConfigError("model", name, "one of " + ", ".join(names()), hint)
    shape = _check_shape(input_shape)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ConfigError("num_classes", num_classes, "an integer >= 2")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ConfigError("generator", generator, "a torch.Generator or None")
    builder = _BUILDERS[name]
    accepted = [p for p in inspect.signature(builder).parameters if p not in ("input_shape", "num_classes")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(f"{name} parameter", unknown, f"parameters of {name}: {', '.join(accepted) or 'none'}")
    with torch.device("meta"):
        model = builder(shape, num_classes, **params)
    model = model.to_empty(device="cpu")
    initialise(model, generator)
    return model.train()


def initialise(model: nn.Module, generator: torch.Generator | None = None) -> nn.Module:
    """(Re-)initialise every parameter of ``model`` in place, in module order, from one generator.

    * ``nn.Linear`` and ``nn.Conv2d`` (unless the module has ``init = "he"``): PyTorch's default — weights
      ``U(−b, b)`` with ``b = 1/√fan_in`` (``kaiming_uniform_(a=√5)``), biases ``U(−1/√fan_in, 1/√fan_in)``.
    * ``nn.Conv2d`` with ``init = "he"`` (ResNet-20): ``N(0, 2/fan_in)``, He et al. ICCV 2015, Eq. 10.
    * ``nn.GroupNorm``: weight 1, bias 0.

    ``generator=None`` draws from torch's global default generator.
    """
    gen = generator if generator is not None else torch.default_generator
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                fan_in = nn.init._calculate_fan_in_and_fan_out(module.weight)[0]
                if getattr(module, "init", None) == "he":
                    nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu", generator=gen)
                else:
                    nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=gen)
                if module.bias is not None:
                    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                    nn.init.uniform_(module.bias, -bound, bound, generator=gen)
            elif isinstance(module, nn.GroupNorm) and module.affine:
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif not isinstance(module, (nn.Sequential, nn.ModuleList, nn.Flatten, nn.ReLU, nn.MaxPool2d)) and any(
                True for _ in module.parameters(recurse=False)
            ):
                raise TypeError(f"initialise() does not know how to initialise {type(module).__name__}")
    return model


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of scalar parameters (only those with ``requires_grad`` unless ``trainable_only=False``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
