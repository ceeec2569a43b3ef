"""A stage's metric columns overwrite none of the row's: not the loop's own (``round``, ``test_accuracy`` …), not the
config's, not another stage's (an attacker's review: a stage declaring ``test_accuracy`` gave 1.0 on every row, one
declaring nothing but filling ``dp_epsilon`` replaced the DP stage's ε on every row, both accepted)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from phalanx import aggregators, attacks, data, models
from phalanx.errors import ConfigError
from phalanx.training import Experiment, Loop, loop, metric_rows
from phalanx.training.stages.base import Evaluation, ServerStage
from phalanx.training.stages.privacy import ClientDP


class Liar(ServerStage):
    """A stage whose ``columns`` fills ``cols`` and declares ``declared`` (by default the same names)."""

    name: ClassVar[str] = "liar_test"

    def __init__(self, cols: dict[str, Any], declared: tuple[str, ...] | None = None) -> None:
        self.cols = cols
        self.declared = tuple(cols) if declared is None else declared

    def column_names(self) -> tuple[str, ...]:
        return self.declared

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        return dict(self.cols)


def _experiment(**kw: Any) -> Experiment:
    ds = data.load("digits")
    model = models.make("logreg", ds.input_shape, ds.num_classes, generator=torch.Generator().manual_seed(0))
    base: dict[str, Any] = {"model": model, "dataset": ds, "rule": aggregators.make("cwtm", f=1), "workers": 5,
                            "byzantine": 1, "attack": attacks.make("alie"), "rounds": 2, "eval_every": 1, "lr": 0.1,
                            "columns": {"dataset": "digits", "seed": 0}}
    return Experiment(**{**base, **kw})


def _first_row(exp: Experiment) -> dict[str, Any]:
    run = Loop(exp, callbacks=[loop.Evaluate()])
    run.open()
    return run.rows[0]


@pytest.mark.parametrize("column", [*metric_rows.CORE, "seed"])
def test_a_stage_declaring_a_column_of_the_loop_or_the_config_is_refused_when_the_run_is_built(column: str) -> None:
    owner = "the config" if column == "seed" else "the metric row"
    with pytest.raises(ConfigError, match=rf"stages='Liar\(\)' is invalid: .*\({column} is also {owner}'s\)"):
        _experiment(stages=[Liar({column: 1.0})])


def test_the_loop_fills_exactly_its_core_columns() -> None:
    """:data:`metric_rows.CORE` is the loop's list: a run with a durability attack, sampled clients and no stage
    has every one of them, and the config's, and nothing else of the loop's."""
    from phalanx.training.algorithms.fedavg import FedAvg

    exp = _experiment(algorithm=FedAvg(clients_per_round=3), attack=attacks.make("backdoor", stop_round=1))
    run = Loop(exp, callbacks=[loop.Evaluate()])
    run.open()
    run.step()
    row = run.rows[-1]
    assert set(row) == {*metric_rows.CORE, "dataset", "seed", "attack_success"}


@pytest.mark.parametrize("first", [True, False])
def test_a_stage_filling_another_stages_column_it_did_not_declare_fails_at_the_first_row(first: bool) -> None:
    """Before or after the DP stage, the stage that fills ``dp_epsilon`` without declaring it is named."""
    sneaky = Liar({"dp_epsilon": 0.001}, declared=())
    dp = ClientDP(clip=1.0, noise=1.0)
    exp = _experiment(stages=[sneaky, dp] if first else [dp, sneaky])
    with pytest.raises(ValueError, match=r"^stage 'liar_test' fills metric column 'dp_epsilon', which stage 'dp' "):
        _first_row(exp)


def test_a_stage_filling_a_column_it_did_not_declare_fails_at_the_first_row() -> None:
    with pytest.raises(ValueError, match=r"stage 'liar_test' fills metric column 'surprise', which its column_names\(\)"
                                         r" does not declare"):
        _first_row(_experiment(stages=[Liar({"surprise": 1.0}, declared=())]))


def test_a_stage_filling_the_loops_or_the_configs_column_undeclared_fails_at_the_first_row() -> None:
    """Undeclared, a core or config column is not refused when the run is built; the first row names it."""
    for column, owner in (("test_accuracy", "the loop"), ("round", "the loop"), ("seed", "the config")):
        with pytest.raises(ValueError, match=rf"stage 'liar_test' fills metric column '{column}', which {owner} "):
            _first_row(_experiment(stages=[Liar({column: 7}, declared=())]))


def test_a_stage_declaring_the_attacks_own_column_fails_at_the_first_row() -> None:
    """The attack's columns are known only when it measures: a stage that declares one is named at round 0."""
    with pytest.raises(ValueError, match=r"stage 'liar_test' fills metric column 'attack_success', which the "
                                         r"algorithm, the attack or an earlier stage fills"):
        _first_row(_experiment(attack=attacks.make("backdoor"), stages=[Liar({"attack_success": 1.0})]))


def test_a_stage_may_fill_undeclared_columns_under_its_own_name_and_a_declared_subset() -> None:
    """CRFL's ``crfl_attack_success`` depends on the run's attack: a stage's undeclared ``<name>_…`` column is kept,
    as is a row where it fills only some of its declared ones."""
    stage = Liar({"liar_test_extra": 2.0}, declared=("liar_test_a", "liar_test_b"))
    row = _first_row(_experiment(stages=[stage]))
    assert row["liar_test_extra"] == 2.0 and row["test_accuracy"] < 1.0 and row["round"] == 0
