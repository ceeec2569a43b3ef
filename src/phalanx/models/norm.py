"""Batch normalisation for federated training: BatchNorm and Hybrid Batch Normalisation with server-held statistics,
and FedBN's client-local BatchNorm.

PyTorch's ``nn.BatchNorm2d`` updates its running statistics in place during the forward pass: shared state that
``torch.func.vmap`` over clients cannot carry, and that in federated learning is the server's to set, not each
client's. :class:`FedNorm2d` is a pure function of its parameters, its input and two buffers — the *global*
statistics μ_g, σ²_g that the server holds and every client receives with the model:

* training, ``mode = "batch"`` (BatchNorm, Ioffe & Szegedy, ICML 2015, Alg. 1): normalise with the batch's
  statistics μ_b = mean(x), σ²_b = mean((x − μ_b)²) over (N, H, W) per channel;
* training, ``mode = "hybrid"`` (Hybrid Batch Normalisation, Chen, Xu, Wu & Kittler, ICML 2025, arXiv
  2505.21877, §3): mix them with the global statistics per channel,
  μ = a·μ_b + (1 − a)·μ_g,  σ² = a·σ²_b + (1 − a)·σ²_g,  a = sigmoid(d),
  with the mixing factor d a trained parameter initialised 0 (a = ½) — the sign convention of the authors' code
  (a weighs the batch; their figure writes the same mix with α = −d);
* training, ``mode = "fedbn"`` (FedBN, Li, Jiang, Zhang, Kamp & Dou, ICLR 2021, arXiv 2102.07623): BatchNorm
  again, but the layer is the *client's own*: its γ, β and its two buffers, which then hold the client's running
  statistics, never leave the client (:mod:`phalanx.training.algorithms.fedbn` keeps a copy per client);
* evaluation (``model.eval()``), every mode: μ = μ_g, σ² = σ²_g (for ``"fedbn"``: the client's running statistics).

Then y = γ (x − μ)/√(σ² + ε) + β. How the server sets μ_g, σ²_g from the clients' statistics of the broadcast
model is the round algorithm's part (:mod:`phalanx.training.norm_stats`). While recording (:func:`recording`),
each layer keeps its batch's statistics of the current forward pass, which is how a client measures them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch
from torch import Tensor, nn

from phalanx.errors import ConfigError

NormMode = Literal["batch", "hybrid", "fedbn"]
MODES: tuple[NormMode, ...] = ("batch", "hybrid", "fedbn")
SERVER_MODES: tuple[NormMode, ...] = ("batch", "hybrid")
"""The modes whose statistics the server holds (:mod:`phalanx.training.norm_stats`); ``"fedbn"`` layers are the
clients' own (:mod:`phalanx.training.algorithms.fedbn`)."""
NORMS = ("none", "group", "batch", "hybrid", "fedbn")
"""What a built-in model with a ``norm`` parameter accepts: no normalisation, GroupNorm, :class:`FedNorm2d` in
``batch``, ``hybrid`` or ``fedbn`` mode."""


class FedNorm2d(nn.Module):
    """Per-channel normalisation of ``(N, C, H, W)`` features with server-held statistics (see the module's
    docstring). ``eps`` as BatchNorm's, 1e-5."""

    global_mean: Tensor
    global_var: Tensor

    def __init__(self, channels: int, mode: NormMode = "batch", eps: float = 1e-5) -> None:
        super().__init__()
        if mode not in MODES:
            raise ConfigError("norm", mode, " | ".join(repr(m) for m in MODES))
        self.mode = mode
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(channels))
        self.bias = nn.Parameter(torch.empty(channels))
        self.mix = nn.Parameter(torch.empty(channels)) if mode == "hybrid" else None
        self.register_buffer("global_mean", torch.empty(channels))
        self.register_buffer("global_var", torch.empty(channels))
        self.recorded: tuple[Tensor, Tensor] | None = None
        self.recorded_count = 0
        """How many values per channel the recorded batch statistics are over (N·H·W of that forward pass)."""
        self.record = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """γ = 1, β = 0, d = 0 (a = ½), μ_g = 0, σ²_g = 1."""
        with torch.no_grad():
            self.weight.fill_(1.0)
            self.bias.fill_(0.0)
            if self.mix is not None:
                self.mix.fill_(0.0)
            self.global_mean.fill_(0.0)
            self.global_var.fill_(1.0)

    def forward(self, x: Tensor) -> Tensor:
        shape = (1, -1, 1, 1)
        if self.training:
            mean = x.mean(dim=(0, 2, 3))
            var = (x - mean.view(shape)).square().mean(dim=(0, 2, 3))
            if self.record:
                self.recorded = (mean.detach(), var.detach())
                self.recorded_count = x.numel() // max(1, x.shape[1])
            if self.mix is not None:
                a = torch.sigmoid(self.mix)
                mean = a * mean + (1 - a) * self.global_mean
                var = a * var + (1 - a) * self.global_var
        else:
            mean, var = self.global_mean, self.global_var
        scale = self.weight * torch.rsqrt(var + self.eps)
        return x * scale.view(shape) + (self.bias - mean * scale).view(shape)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, mode={self.mode!r}, eps={self.eps:g}"


def make_norm(norm: str, channels: int, groups: int = 2) -> nn.Module:
    """A normalisation layer by name (:data:`NORMS`): identity, ``GroupNorm(groups, channels)`` or
    :class:`FedNorm2d`."""
    if norm == "none":
        return nn.Identity()
    if norm == "group":
        return nn.GroupNorm(groups, channels)
    if norm in MODES:
        return FedNorm2d(channels, norm)
    raise ConfigError("norm", norm, " | ".join(repr(n) for n in NORMS))


def fed_norms(model: nn.Module, modes: tuple[NormMode, ...] = SERVER_MODES) -> list[FedNorm2d]:
    """The model's :class:`FedNorm2d` layers of the given modes (default: those with server-held statistics), in
    module order."""
    return [m for m in model.modules() if isinstance(m, FedNorm2d) and m.mode in modes]


@contextmanager
def recording(model: nn.Module, modes: tuple[NormMode, ...] = SERVER_MODES) -> Iterator[list[FedNorm2d]]:
    """While open, every :class:`FedNorm2d` of ``model`` of the given modes keeps its batch statistics of the last
    training-mode forward pass in ``recorded`` (μ_b, σ²_b) and their count per channel in ``recorded_count``; they
    are cleared when it closes (under ``torch.func`` transforms they are values of the transform)."""
    layers = fed_norms(model, modes)
    for layer in layers:
        layer.record, layer.recorded = True, None
    try:
        yield layers
    finally:
        for layer in layers:
            layer.record, layer.recorded = False, None


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in evaluation mode inside the block (normalisation layers use their held statistics), in the mode it
    was in after it."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)
