"""The pooling of BatchNorm / Hybrid BN statistics, a server stage: after the step of every federated round, the
statistics the round's clients measured on the broadcast model (``Received.stats``) are pooled robustly and blended
into the model's global statistics (Hybrid Batch Normalisation's protocol, Chen et al., ICML 2025, arXiv 2505.21877,
§3 — the formulas and the differences from the authors' code are :mod:`phalanx.training.norm_stats`'s):

    μ_pool, σ²_pool = pool_{T_f}(rows),   (μ_g, σ²_g) ← (1 − ρ)(μ_g, σ²_g) + ρ (μ_pool, σ²_pool)

with T_f the coordinate-wise trimmed mean at the f the round's rule has (f − m when m clients are missing). The
round algorithm that measures the statistics brings the stage (federated averaging, for a model that has them); its
state is the global statistics, kept in checkpoints under ``norm_stats`` (the key they had before this stage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.norm_stats import NormStats
from phalanx.training.stages.base import Plan, ServerRound, ServerStage, Stage
from phalanx.validate import check_real


class PoolStats(ServerStage):
    """Pool the round's measured statistics with a trimmed mean at f and blend them in with momentum ``momentum``
    (ρ, 0 < ρ ≤ 1) — into ``norm``, the model's layers."""

    name: ClassVar[str] = "norm_stats"
    reference: ClassVar[str] = ("Chen et al., 'Hybrid batch normalisation', ICML 2025, arXiv 2505.21877, §3; the "
                                "trimmed mean of Yin et al., ICML 2018")
    parameters: ClassVar[Mapping[str, str]] = {
        "momentum": "0 < ρ ≤ 1: the weight of the round's pooled statistics in the global ones (fedavg's "
                    "stats_momentum)",
    }
    brought_by: ClassVar[str] = "algorithm = 'fedavg', for a model with BatchNorm / Hybrid BN layers"
    state_prefix: ClassVar[str | None] = "norm_"
    """Its state, ``stats``, is the checkpoint's ``norm_stats``."""

    def __init__(self, norm: NormStats, momentum: float = 0.1) -> None:
        self.norm = norm
        self.momentum = check_real("stats_momentum", momentum, low=0.0, high=1.0, low_open=True)

    @classmethod
    def configure(cls, section: Mapping[str, Any], plan: Plan) -> Stage:
        """Not set in a config: the round algorithm that measures the statistics brings it."""
        raise ConfigError("stages.norm_stats", dict(section), "unset (the round algorithm brings it for a model with "
                          "BatchNorm / Hybrid BN layers: fedavg, whose stats_momentum is its momentum)")

    def params(self) -> dict[str, float]:
        return {"momentum": self.momentum}

    def stepped(self, theta: Tensor, r: ServerRound) -> Tensor:
        """Pool and blend the round's statistics (a round that measured none changes nothing)."""
        got = r.received
        if got.stats is not None and got.stats.shape[0]:
            pooled = self.norm.pool(got.stats, max(0, r.f - len(got.missing)))
            self.norm.blend(pooled, self.momentum)
        return theta

    def state_dict(self) -> dict[str, Tensor]:
        return {"stats": self.norm.vector()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """The global statistics of a checkpoint (``{}``: the model's own, as they are)."""
        unknown = set(state) - {"stats"}
        width = 2 * self.norm.channels
        stats = state.get("stats")
        if unknown or (stats is not None and tuple(stats.shape) != (width,)):
            shapes = {k: tuple(v.shape) for k, v in state.items()}
            raise ConfigError("norm_stats", shapes, f"a ({width},) vector of the model's global statistics")
        if stats is not None:
            self.norm.load(stats)
