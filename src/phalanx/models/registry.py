"""Name → builder registry (:mod:`phalanx.plugins`), :func:`make`, :func:`names`, :func:`count_parameters` and the
seeded initialisation.

A builder is any function ``builder(input_shape, num_classes, **params) -> nn.Module``. The built-in models are
built on the ``meta`` device (no memory, no random draws) and then initialised by :func:`initialise` from exactly one
random generator: the one passed to :func:`make`, or torch's global default generator when none is passed. So
``torch.manual_seed(s); make(...)`` and ``make(..., generator=torch.Generator().manual_seed(s))`` give the same
weights. A user's builder (registered with ``@models.register("name")``, a ``module:attr`` spec or an entry point of
``phalanx.models``) runs on the CPU as written — it may read and draw tensors — with torch's global generator
seeded from ``generator`` for the call (and restored after it), so its own initialisation is kept and is
deterministic too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from phalanx import hub
from phalanx.errors import ConfigError
from phalanx.models.norm import FedNorm2d
from phalanx.plugins import Registry, check_params

__all__ = ["builder", "count_parameters", "initialise", "make", "names", "planned_parameters", "register"]

Builder = Callable[..., nn.Module]
B = TypeVar("B", bound=Builder)


def _accept(obj: Any, name: str) -> Builder:
    if not callable(obj):
        raise ConfigError("model", name, "a function builder(input_shape, num_classes, **params) -> nn.Module")
    return obj


_REGISTRY: Registry[Builder] = Registry("model", "phalanx.models", _accept)
_META_BUILT: set[str] = set()  # the built-ins: built on the meta device, then initialise()d


def register(name: str, *, meta: bool = False) -> Callable[[B], B]:
    """Decorator: make ``builder(input_shape, num_classes, **params) -> nn.Module`` known to :func:`make`.

    ``meta=True`` (Phalanx's own models): build on the meta device and initialise with :func:`initialise`.
    """

    def deco(builder: B) -> B:
        _REGISTRY.register(builder, name=name)
        if meta:
            _META_BUILT.add(name)
        return builder

    return deco


def builder(name: str) -> Builder:
    """The builder of ``name`` (registered, ``module:attr``, an entry point, or ``hf:NAME`` — a pre-trained Hugging
    Face model with LoRA adapters, :mod:`phalanx.models.hf`); a ConfigError if unknown."""
    if hub.is_hf(name):
        from phalanx.models import hf  # transformers and peft: only for an hf: model

        return functools.partial(hf.build, name)
    return _REGISTRY.get(name, "model")


def names() -> list[str]:
    """The model names :func:`make` accepts, sorted (installed plug-ins' entry points included; a ``module:attr``
    spec is accepted too)."""
    return _REGISTRY.names()


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
    name: ``"logreg"``, ``"mlp"``, ``"cnn"``, ``"resnet20"``, a registered name or a ``module:attr`` spec.
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
    build = builder(name)
    shape = _check_shape(input_shape)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ConfigError("num_classes", num_classes, "an integer >= 2")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ConfigError("generator", generator, "a torch.Generator or None")
    check_params(name, build, params, skip=("input_shape", "num_classes"))
    if name in _META_BUILT:
        with torch.device("meta"):
            model = build(shape, num_classes, **params)
        model = model.to_empty(device="cpu")
        initialise(model, generator)
        return model.train()
    if generator is None:
        model = build(shape, num_classes, **params)
    else:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build(shape, num_classes, **params)
    if not isinstance(model, nn.Module):
        got = type(model).__name__
        raise ConfigError("model", name, f"a builder that returns a torch.nn.Module (it returned a {got})")
    _check_functional(model, name)
    return model.train()


def _check_functional(model: nn.Module, name: str) -> None:
    """Refuse, in one line that names the fix, a model with torch's own BatchNorm (or InstanceNorm tracking running
    statistics): every worker's gradient is one vmapped functional call, which cannot update running statistics in
    place (torch's error, raised per run, said so three times in a grid's failure line without saying what to do)."""
    for where, module in model.named_modules():
        tracked = isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats
        if isinstance(module, nn.modules.batchnorm._BatchNorm) or tracked:
            raise ConfigError(
                "model", name, f"a model without torch's {type(module).__name__} (layer {where!r}): every "
                "worker's gradient is one vmapped, functional call, which cannot update running statistics",
                "use nn.GroupNorm or nn.LayerNorm; or, for BatchNorm itself, a built-in model with model_params "
                "norm = 'batch', 'hybrid' or 'fedbn' (statistics held by the server) and algorithm = 'fedavg' "
                "(docs/models.md)",
            )


def planned_parameters(name: str, input_shape: tuple[int, ...], num_classes: int, **params: Any) -> int | None:
    """How many parameters ``make(name, input_shape, num_classes, **params)`` would build, counted on the ``meta``
    device (shapes only: nothing is allocated, nothing drawn), so that a model too large for the machine is refused
    before it is built; None for a builder of one's own, which is built as it is (it may not build on ``meta``)."""
    build = builder(name)
    if name not in _META_BUILT:
        return None
    shape = _check_shape(input_shape)
    check_params(name, build, params, skip=("input_shape", "num_classes"))
    with torch.device("meta"):
        model = build(shape, num_classes, **params)
    return count_parameters(model, trainable_only=False)


def initialise(model: nn.Module, generator: torch.Generator | None = None) -> nn.Module:
    """(Re-)initialise every parameter of ``model`` in place, in module order, from one generator.

    * ``nn.Linear`` and ``nn.Conv2d`` (unless the module has ``init = "he"``): PyTorch's default — weights
      ``U(−b, b)`` with ``b = 1/√fan_in`` (``kaiming_uniform_(a=√5)``), biases ``U(−1/√fan_in, 1/√fan_in)``.
    * ``nn.Conv2d`` with ``init = "he"`` (ResNet-20): ``N(0, 2/fan_in)``, He et al. ICCV 2015, Eq. 10.
    * ``nn.GroupNorm``: weight 1, bias 0; :class:`~phalanx.models.norm.FedNorm2d`: its ``reset_parameters``.
    * ``nn.Embedding`` (``char-lstm``): PyTorch's default, ``N(0, 1)``.

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
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, generator=gen)  # PyTorch's default, N(0, 1)
            elif isinstance(module, FedNorm2d):
                module.reset_parameters()  # γ = 1, β = 0, d = 0; global statistics (0, 1)
            elif not isinstance(module, (nn.Sequential, nn.ModuleList, nn.Flatten, nn.ReLU, nn.MaxPool2d)) and any(
                True for _ in module.parameters(recurse=False)
            ):
                raise TypeError(f"initialise() does not know how to initialise {type(module).__name__}")
    return model


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of scalar parameters (only those with ``requires_grad`` unless ``trainable_only=False``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
