"""The rule for a round with m missing workers is configured for f − m, written once
(:mod:`phalanx.aggregators.missing`) and taken by both the Phalanx server and the Flower strategy."""

from __future__ import annotations

import inspect

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators.missing import MissingTooMany, RulesForMissing
from phalanx.training import server


def test_m_missing_give_the_rule_for_f_minus_m_built_once() -> None:
    rules = RulesForMissing(aggregators.make("cwtm", 3))
    for m in range(4):
        rule = rules.for_missing(m, received=10 - m)
        assert rule.f == 3 - m and rule.params() == {"f": 3 - m}
        assert rules.for_missing(m, received=10 - m) is rule  # kept, not rebuilt


def test_a_rule_for_missing_that_keeps_f_is_the_mutant() -> None:
    """A server that aggregated with the configured rule whatever went missing would trim f of n − m vectors; the
    check above (``rule.f == f − m``) is what catches it."""
    rule = aggregators.make("cwtm", 3)
    mutant = RulesForMissing(rule, build=lambda _f: rule)
    assert mutant.for_missing(2, received=8).f != 3 - 2


def test_more_missing_than_f_and_too_few_vectors_are_refused_in_the_rules_terms() -> None:
    rules = RulesForMissing(aggregators.make("krum", 2), name="krum")
    with pytest.raises(MissingTooMany) as err:
        rules.for_missing(3, received=4)
    assert err.value.detail == ""
    with pytest.raises(MissingTooMany, match=r"aggregator 'krum' with f=1 needs 5 vectors, got 4"):
        rules.for_missing(1, received=4)


def test_a_callable_without_with_f_keeps_its_own_rule() -> None:
    def median(x: torch.Tensor) -> torch.Tensor:
        return x.median(0).values

    rules = RulesForMissing(median)
    assert rules.for_f(0) is median and rules.for_missing(0, received=1) is median


def test_the_server_and_the_flower_strategy_share_it() -> None:
    assert "RulesForMissing" in inspect.getsource(server.Server.__init__)
    strategy = pytest.importorskip("phalanx.flower.strategy")
    assert "RulesForMissing" in inspect.getsource(strategy.PhalanxFedAvg.__init__)
    assert "_rules" not in inspect.getsource(strategy.PhalanxFedAvg)  # no second cache
