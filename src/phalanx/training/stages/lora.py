"""The truncation residual of LoRA adapters aggregated per layer update, a server stage that records it.

With ``model_params.aggregation = "update"`` (:class:`~phalanx.aggregators.lora.AdapterUpdates`, docs/lora.md) the
server's rule aggregates every adapted layer's update ΔW* and re-factorises BA + ΔW* to rank r by a truncated SVD
(the best rank-r approximation: Eckart & Young 1936; FlexLoRA, Bai et al., NeurIPS 2024, §3). That is exact only
when BA + ΔW* has rank ≤ r; otherwise the model moves by B′A′ − BA instead of ΔW*, off by the truncation residual

    ρ = max over layers ‖BA + ΔW* − B′A′‖_F / ‖BA + ΔW*‖_F.

This stage puts ρ of the round before each evaluation on the metric row (column ``lora_residual``), so the price of
re-factorising is read beside the accuracy. It changes nothing the round computes. Federated averaging brings it for
a model with adapters in mode ``update`` (:meth:`phalanx.training.algorithms.fedavg.FedAvg.stages`); a config does
not name it. Its state is the last residual (``stage.lora_residual.last``), so a resumed run's rows read as an
uninterrupted run's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators.lora import AdapterUpdates
from phalanx.errors import ConfigError
from phalanx.training.stages.base import Evaluation, Plan, ServerRound, ServerStage, Stage

COLUMNS = ("lora_residual",)
"""The metric column it fills."""


class LoraResidual(ServerStage):
    """Record the relative truncation residual ρ of ``rule`` (an :class:`AdapterUpdates`) after every aggregation."""

    name: ClassVar[str] = "lora_residual"
    reference: ClassVar[str] = ("Eckart & Young, Psychometrika 1936 (best rank-r approximation); FlexLoRA, Bai et "
                                "al., NeurIPS 2024, §3 (update-space aggregation re-factorised by SVD)")
    brought_by: ClassVar[str] = "algorithm = 'fedavg', for an hf: model with model_params.aggregation = 'update'"

    def __init__(self, rule: AdapterUpdates) -> None:
        self.rule = rule
        self.last: float | None = None

    @classmethod
    def configure(cls, section: Mapping[str, Any], plan: Plan) -> Stage:
        """Not set in a config: federated averaging brings it for a model whose adapters are aggregated per update."""
        raise ConfigError("stages.lora_residual", dict(section), "unset (fedavg brings it for an hf: model with "
                          "model_params.aggregation = 'update')")

    def check(self, plan: Plan) -> None:
        """The run's rule must be the one whose residual it reads (an ``AdapterUpdates``)."""
        if not isinstance(plan.rule, AdapterUpdates) or plan.rule is not self.rule:
            raise ConfigError(self.parameter("stages.lora_residual"), repr(plan.rule), "the run's own rule in "
                              "adapter aggregation 'update' (phalanx.training.adapters.rule_for)")

    def aggregated(self, agg: Tensor, r: ServerRound) -> Tensor:
        """Read the residual of the aggregation just made; the aggregate is left as it is."""
        self.last = float(self.rule.last_residual)
        return agg

    def column_names(self) -> tuple[str, ...]:
        return COLUMNS

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        """ρ of the last round (None before the first)."""
        return {COLUMNS[0]: self.last}

    def state_dict(self) -> dict[str, Tensor]:
        return {} if self.last is None else {"last": torch.tensor([self.last], dtype=torch.float64)}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """``last``: one float64 (``{}``: fresh); anything else is refused."""
        if not state:
            self.last = None
            return
        last = state.get("last")
        if set(state) != {"last"} or last is None or last.shape != (1,) or not bool(torch.isfinite(last).all()):
            raise ConfigError("stage.lora_residual", sorted(state), "{'last': one finite float64}")
        self.last = float(last[0])
