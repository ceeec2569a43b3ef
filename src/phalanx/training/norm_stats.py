"""The server's normalisation statistics: measured by the sampled clients on the broadcast model, pooled robustly,
blended into the global statistics.

For a model with :class:`~phalanx.models.norm.FedNorm2d` layers (BatchNorm or Hybrid BN), round t of federated
training follows the statistics protocol of Hybrid Batch Normalisation (Chen et al., ICML 2025, arXiv 2505.21877,
§3 and the authors' code): before local training, every sampled client runs the *received* model θ_t in training
mode on one batch of its data (``stats_batch`` samples) and reports, per layer and channel, the batch mean μ_k and
second moment m_k = σ²_k + μ_k²; local training then uses the global statistics as they are (frozen for the
round). The server pools them and blends the pool into the global statistics with momentum ρ:

    μ_pool = T_f(μ_1 … μ_C),   σ²_pool = max(T_f(m_1 … m_C) − μ_pool², 0),
    μ_g ← (1 − ρ) μ_g + ρ μ_pool,   σ²_g ← (1 − ρ) σ²_g + ρ σ²_pool,

where T_f is the coordinate-wise trimmed mean that drops the f largest and f smallest values (the plain mean
when f = 0). With the mean, σ²_pool = (1/C) Σ (σ²_k + (μ_k − μ_pool)²): the pooled variance *with* the spread of
the clients' means, as in the authors' code (equal weights instead of their batch-count weights, and 1/C instead of
1/(N − 1)). Statistics are an attack surface as much as updates are — a Byzantine client can report any mean or a
huge variance — so they are pooled with a rule robust to f outliers per coordinate whatever the update rule is;
Byzantine clients of a vector attack send the attack's output computed on the honest clients' statistics.

Differences from the authors' code, on purpose: the clients report the raw batch statistics of the layer's input
(theirs report the already-mixed hybrid statistics), from a random batch drawn from the run's ``batches`` stream
(theirs: always the first 64 samples), and the mixing factor d is aggregated like every other parameter (theirs:
averaged at the server, but each client keeps its own d between participations). Evaluation uses the global
statistics; the authors evaluate with a fresh momentum-1 pool of the round's clients instead.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call

from phalanx.models.norm import FedNorm2d, fed_norms, recording


class NormStats:
    """The :class:`FedNorm2d` layers of a model with server-held statistics (``batch`` / ``hybrid`` mode; FedBN's
    client-local layers are :mod:`phalanx.training.algorithms.fedbn`'s) and their global statistics as one vector
    ``(μ_g ‖ σ²_g)``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layers: list[FedNorm2d] = fed_norms(model)
        self.channels = sum(layer.global_mean.numel() for layer in self.layers)

    @classmethod
    def of(cls, model: nn.Module) -> NormStats | None:
        """The model's statistics, or None when it has no :class:`FedNorm2d` layer."""
        return cls(model) if fed_norms(model) else None

    def vector(self) -> Tensor:
        """The global statistics ``(2·channels,)``: every layer's means, then every layer's variances (a copy)."""
        means = [layer.global_mean.reshape(-1) for layer in self.layers]
        variances = [layer.global_var.reshape(-1) for layer in self.layers]
        return torch.cat(means + variances).clone()

    @torch.no_grad()
    def load(self, vector: Tensor) -> None:
        """Set the global statistics from :meth:`vector`'s layout (in place: the model's buffers)."""
        if vector.shape != (2 * self.channels,):
            raise ValueError(f"statistics must be ({2 * self.channels},), got {tuple(vector.shape)}")
        means, variances = vector[: self.channels], vector[self.channels :]
        off = 0
        for layer in self.layers:
            c = layer.global_mean.numel()
            layer.global_mean.copy_(means[off : off + c])
            layer.global_var.copy_(variances[off : off + c])
            off += c

    @torch.no_grad()
    def measure(self, params: dict[str, Tensor], buffers: dict[str, Tensor], xb: Tensor) -> Tensor:
        """Each client's ``(μ ‖ m)`` rows ``(W, 2·channels)`` of the model with ``params`` on its batch ``xb[i]``
        (training mode: the batch's statistics, layer by layer as the forward pass normalises them)."""
        rows = []
        was = self.model.training
        self.model.train()
        try:
            with recording(self.model) as layers:
                for i in range(xb.shape[0]):
                    functional_call(self.model, (params, buffers), (xb[i],))
                    recorded = [layer.recorded for layer in layers]
                    assert all(r is not None for r in recorded)
                    mean = torch.cat([r[0] for r in recorded if r is not None])
                    var = torch.cat([r[1] for r in recorded if r is not None])
                    rows.append(torch.cat([mean, var + mean.square()]))
        finally:
            self.model.train(was)
        return torch.stack(rows)

    def pool(self, rows: Tensor, f: int) -> Tensor:
        """The pooled statistics ``(μ_pool ‖ σ²_pool)`` of the clients' ``(μ ‖ m)`` rows: the coordinate-wise
        trimmed mean T_f (f dropped on each side while at least one row is left; non-finite values count as the
        largest), variance max(T_f(m) − μ², 0)."""
        m = rows.shape[0]
        trim = max(0, min(f, (m - 1) // 2))
        clean = torch.nan_to_num(rows, nan=torch.finfo(rows.dtype).max)
        kept = clean.sort(dim=0).values[trim : m - trim] if trim else clean
        pooled = kept.mean(dim=0)
        mean, second = pooled[: self.channels], pooled[self.channels :]
        var = (second - mean.square()).clamp_min(0.0)
        return torch.cat([mean, var])

    def blend(self, pooled: Tensor, momentum: float) -> None:
        """μ_g ← (1 − ρ) μ_g + ρ μ_pool and σ²_g likewise, when the pool is finite (a non-finite pool — more
        outliers than f — is not taken)."""
        if not bool(torch.isfinite(pooled).all()):
            return
        self.load(torch.lerp(self.vector(), pooled.to(self.vector().dtype), momentum))
