"""ResNet-20 for CIFAR (He et al., CVPR 2016, §4.2) with GroupNorm in place of BatchNorm.

He et al.'s CIFAR network: a 3×3 convolution with 16 filters, then three stages of ``n`` basic blocks on feature
maps of 32×32, 16×16, 8×8 with 16, 32, 64 filters (the first convolution of stages 2 and 3 has stride 2), global
average pooling and a fully connected layer: ``6n + 2`` weighted layers, ``n = 3`` for ResNet-20. A basic block is
``conv3×3 → norm → ReLU → conv3×3 → norm``, plus the shortcut, then ReLU. The shortcut is the identity; where the
block halves the resolution and doubles the width it is "option A" of the paper (the input subsampled with stride 2
and padded with zero channels), which adds no parameter: 269,722 parameters for 10 classes.

Normalisation: BatchNorm's running statistics are shared state that differs between workers and breaks
``torch.func.vmap`` over workers. As in the experiments of Yang, Shi & Li (ICML 2025), who cite Wu & He
(ECCV 2018), and of Hsieh et al. (ICML 2020), every BatchNorm is replaced by ``nn.GroupNorm(groups, channels)``:
statistics per sample over groups of channels, with a learned per-channel scale and shift. Yang et al. do not
state the number of groups (and we could not check Hsieh et al.'s value here); ``groups=2`` is our default (8, 16,
32 channels per group in the three stages). Any divisor of 16 works: ``groups=1`` is layer norm, ``groups=16``
instance norm in the first stage.
"""

from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from phalanx.errors import ConfigError
from phalanx.models.norm import make_norm
from phalanx.models.registry import register

__all__ = ["BasicBlock", "ResNet20"]


class _HeConv2d(nn.Conv2d):
    """A 3×3 convolution without bias, initialised N(0, 2/fan_in) by :func:`~phalanx.models.registry.initialise`."""

    init: ClassVar[str] = "he"

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """``relu(norm(conv(relu(norm(conv(x))))) + shortcut(x))`` with an option-A (parameter-free) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int, norm: str = "group") -> None:
        super().__init__()
        self.conv1 = _HeConv2d(c_in, c_out, stride)
        self.norm1 = make_norm(norm, c_out, groups)
        self.conv2 = _HeConv2d(c_out, c_out)
        self.norm2 = make_norm(norm, c_out, groups)
        self.stride = stride
        self.extra_channels = c_out - c_in

    def shortcut(self, x: Tensor) -> Tensor:
        if self.stride != 1:
            x = x[..., :: self.stride, :: self.stride]
        if self.extra_channels:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))  # zero channels appended (option A)
        return x

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """ResNet-20 (He et al. 2016, §4.2, n = 3) with GroupNorm (``norm="group"``), or BatchNorm / Hybrid BN with
    server-held statistics (``norm="batch"`` / ``"hybrid"``), or FedBN's client-local BatchNorm (``norm="fedbn"``)
    (:class:`~phalanx.models.norm.FedNorm2d`, federated rounds); see the module docstring."""

    widths = (16, 32, 64)
    blocks_per_stage = 3

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, groups: int = 2, norm: str = "group") -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError("input_shape", input_shape, "(C, H, W) for resnet20")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or 16 % groups:
            raise ConfigError("groups", groups, "a divisor of 16: 1, 2, 4, 8 or 16")
        if norm not in ("group", "batch", "hybrid", "fedbn"):
            raise ConfigError("norm", norm, "'group' | 'batch' | 'hybrid' | 'fedbn'")
        self.conv = _HeConv2d(input_shape[0], self.widths[0])
        self.norm = make_norm(norm, self.widths[0], groups)
        blocks: list[nn.Module] = []
        c_in = self.widths[0]
        for stage, c_out in enumerate(self.widths):
            for b in range(self.blocks_per_stage):
                blocks.append(BasicBlock(c_in, c_out, 2 if stage > 0 and b == 0 else 1, groups, norm))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(self.widths[-1], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.blocks(F.relu(self.norm(self.conv(x))))
        return self.fc(out.mean(dim=(-2, -1)))  # global average pooling


@register("resnet20", meta=True)
def resnet20(input_shape: tuple[int, ...], num_classes: int, groups: int = 2, norm: str = "group") -> nn.Module:
    """ResNet-20 with GroupNorm (``groups`` groups per normalisation layer), or ``norm="batch"`` / ``"hybrid"`` /
    ``"fedbn"``, see :class:`ResNet20`."""
    return ResNet20(input_shape, num_classes, groups=groups, norm=norm)
