"""Divergence: a run whose model becomes non-finite stops there, with a status that says so.

Training on with a NaN or infinite model only produces garbage (every later round is NaN too) and, worse, a run that
"finishes" and is reported like any other. :class:`StopOnDivergence` checks θ after every round — the honest nodes'
models, in decentralized rounds — and raises :class:`Diverged` at the first round that leaves a non-finite
coordinate. The metric rows then end with that round's row, marked ``"diverged": true``, whose accuracies are 0 (a
non-finite model predicts nothing) and whose loss is ``None``; the run directory records it (``DIVERGED``, see
:mod:`phalanx.experiments.runstate`), a grid counts it as ended (the same configuration would diverge again) and the
report shows it. The check is one reduction over θ per round.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from phalanx.errors import PhalanxError
from phalanx.training.loop import Callback, Evaluate, Loop, RoundInfo


class Diverged(PhalanxError, ArithmeticError):
    """The model became non-finite after round ``round`` (``bad`` of its ``size`` coordinates are NaN or ±inf);
    ``rows``: the run's metric rows, the last one the diverged model's."""

    def __init__(self, round: int, bad: int, size: int, rows: list[dict[str, Any]]) -> None:
        self.round = round
        self.bad = bad
        self.size = size
        self.rows = rows
        super().__init__(
            f"the run diverged: after round {round} the model has {bad} non-finite coordinates (of {size}); it is "
            "stopped there and not resumed (a smaller lr, weight_decay or a robust aggregator may help)"
        )


def honest_model(loop: Loop) -> torch.Tensor:
    """What must stay finite: θ, or the honest nodes' rows of a decentralized run's stacked models."""
    theta = loop.state.theta
    return theta[: loop.experiment.honest] if theta.dim() == 2 else theta


class StopOnDivergence(Callback):
    """Raise :class:`Diverged` after the first round that leaves the model non-finite (before the run directory
    would checkpoint it)."""

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        model = honest_model(loop)
        finite = torch.isfinite(model)
        if bool(finite.all()):
            return
        row = loop.rows[-1] if loop.rows and loop.rows[-1]["round"] == loop.state.round else None
        if row is None:
            row = Evaluate.row(loop, info.result)
            loop.rows.append(row)
        for key, value in list(row.items()):
            if key.endswith("accuracy") and isinstance(value, float):  # worst node / client, whole test set, …
                row[key] = 0.0
            elif isinstance(value, float) and not math.isfinite(value):  # no NaN or Infinity (not JSON)
                row[key] = None
        row.update({"test_accuracy": 0.0, "test_loss": None, "diverged": True})
        bad = int((~finite).sum())
        raise Diverged(loop.state.round, bad, model.numel(), list(loop.rows))
