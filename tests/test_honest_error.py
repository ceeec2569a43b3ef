"""The aggregation error of a round needs two honest rows (``phalanx.training.server.honest_error``): with one the
honest spread is 0, with none (a buffer of Byzantine updates alone) the honest mean is undefined. Counted as +∞ —
the ratio's own convention for x/0 — one such step made a whole run's mean error ∞ in its report (AFLGuard under a
small sign flip: ``| mean | 52.1 ± 5.0 | 52.1 | ∞ |``)."""

from __future__ import annotations

import math

import torch

from phalanx.analysis.epsilon import aggregation_error
from phalanx.experiments.report import summarize
from phalanx.training.server import honest_error


def test_fewer_than_two_honest_rows_have_no_error_and_two_have_the_ratio() -> None:
    agg = torch.tensor([1.0, 0.0])
    assert honest_error(agg, torch.zeros(0, 2)) is None
    assert honest_error(agg, torch.tensor([[0.0, 0.0]])) is None
    two = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    assert honest_error(agg, two) == aggregation_error(agg, two) == 0.0
    assert honest_error(torch.tensor([3.0, 0.0]), two) == 4.0  # ‖(3,0) − (1,0)‖² / 1
    zeros = torch.zeros(3, 2)  # rejected honest updates as zero rows: no spread
    assert honest_error(agg, zeros) is None and honest_error(torch.zeros(2), zeros) == 0.0
    nan = torch.tensor([float("nan"), 0.0])  # a non-finite output is still +inf, whatever the rows
    assert honest_error(nan, zeros) == honest_error(nan, two) == honest_error(nan, zeros[:1]) == math.inf


def test_the_mutant_convention_makes_a_runs_mean_infinite_and_none_does_not() -> None:
    """A run's summary averages the evaluated rounds' errors that exist: one round with a single honest row no longer
    turns the mean into ∞ (the mutant: the ratio's own +∞ for x/0, kept as the round's error)."""
    one_honest = torch.tensor([[0.0, 0.0]])
    agg = torch.tensor([1.0, 0.0])
    rows = [{"run": "r", "round": 0, "seed": 0, "test_accuracy": 0.5, "agg_error": 0.25, "byz_share": 0.0},
            {"run": "r", "round": 1, "seed": 0, "test_accuracy": 0.5, "agg_error": honest_error(agg, one_honest),
             "byz_share": 0.0}]
    (summary,) = summarize(rows, keys=("run",))
    assert summary["agg_error"] == 0.25
    rows[1]["agg_error"] = aggregation_error(agg, one_honest)  # the mutant
    (mutant,) = summarize(rows, keys=("run",))
    assert math.isinf(mutant["agg_error"])
