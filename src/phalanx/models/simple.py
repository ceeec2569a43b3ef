"""Small models: multinomial logistic regression, a ReLU MLP and a LeNet-style CNN."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from phalanx.errors import ConfigError
from phalanx.models.norm import NORMS, make_norm
from phalanx.models.registry import register

__all__ = ["LeNetLike", "logreg", "mlp"]


def _positive_ints(name: str, value: Any, allow_empty: bool = False) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    ok = isinstance(value, (tuple, list)) and (allow_empty or len(value) > 0) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value
    )
    if not ok:
        raise ConfigError(name, value, "a tuple of positive ints" + (" (may be empty)" if allow_empty else ""))
    return tuple(value)


@register("logreg", meta=True)
def logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression: ``softmax(W·vec(x) + b)`` (the softmax is in the loss).

    ``Flatten → Linear(∏ input_shape, num_classes)``; a convex problem, the setting of most Byzantine-robustness
    theory.
    """
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


@register("mlp", meta=True)
def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int] = (64,)) -> nn.Module:
    """Fully connected ReLU network: ``Flatten → [Linear → ReLU] per hidden size → Linear``.

    ``hidden``: the hidden widths, default ``(64,)`` (64·65 + 65·10 = 4,810 parameters on 8×8 digits); ByzFL's
    ``fc_mnist`` on 28×28 images is ``hidden=(100,)``. ``hidden=()`` gives logistic regression.
    """
    widths = (math.prod(input_shape), *_positive_ints("hidden", hidden, allow_empty=True))
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], num_classes))
    return nn.Sequential(*layers)


class LeNetLike(nn.Module):
    """A LeNet-style CNN (LeCun et al. 1998) for any image size: conv stages, then two fully connected layers.

    Each stage is ``Conv2d(k×k, padding k//2) → norm → ReLU → MaxPool2d(2)``; then ``Flatten → Linear(·, hidden) →
    ReLU → Linear(hidden, num_classes)``. ``norm``: ``"none"`` (the default), ``"group"`` (GroupNorm, ``groups``
    groups), ``"batch"`` (BatchNorm) or ``"hybrid"`` (Hybrid BN) — these two with server-held statistics — or
    ``"fedbn"`` (FedBN: client-local BatchNorm) (:class:`~phalanx.models.norm.FedNorm2d`, federated rounds). With
    the defaults (channels 16, 32; 5×5 kernels; hidden 128): 8×8 → 2×2×32, 28×28 → 7×7×32, 32×32 → 8×8×32
    features before the classifier. The flattened size is computed by running a dummy input through the stages (on
    the ``meta`` device: no memory, no arithmetic).
    """

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, channels: Sequence[int] = (16, 32),
        kernel_size: int = 5, hidden: int = 128, norm: str = "none", groups: int = 2,
    ) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError("input_shape", input_shape, "(C, H, W) for the cnn model")
        chans = _positive_ints("channels", channels)
        if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
            raise ConfigError("kernel_size", kernel_size, "an odd integer >= 1")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ConfigError("hidden", hidden, "a positive int (the width of the hidden fully connected layer)")
        smallest = 2 ** len(chans)
        if min(input_shape[1:]) < smallest:
            raise ConfigError(
                "input_shape", input_shape, f"images of at least {smallest}×{smallest} for {len(chans)} pooling stages",
            )
        if norm not in NORMS:
            raise ConfigError("norm", norm, " | ".join(repr(n) for n in NORMS))
        if norm == "group" and any(c % groups for c in chans):
            raise ConfigError("groups", groups, f"a divisor of every stage's channels {list(chans)}")
        stages: list[nn.Module] = []
        c_in = input_shape[0]
        for c_out in chans:
            conv = nn.Conv2d(c_in, c_out, kernel_size, padding=kernel_size // 2)
            layers = [conv] if norm == "none" else [conv, make_norm(norm, c_out, groups)]
            stages += [*layers, nn.ReLU(), nn.MaxPool2d(2)]
            c_in = c_out
        self.features = nn.Sequential(*stages)
        with torch.no_grad():
            flat = self.features(torch.zeros((1, *input_shape), device="meta")).numel()
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


@register("cnn", meta=True)
def cnn(
    input_shape: tuple[int, ...], num_classes: int, channels: Sequence[int] = (16, 32), kernel_size: int = 5,
    hidden: int = 128, norm: str = "none", groups: int = 2,
) -> nn.Module:
    """A LeNet-style CNN (``norm``: none, group, batch, hybrid or fedbn after each convolution), see
    :class:`LeNetLike`."""
    return LeNetLike(input_shape, num_classes, channels=channels, kernel_size=kernel_size, hidden=hidden, norm=norm,
                     groups=groups)
