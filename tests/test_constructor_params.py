"""``params()`` is derived from the constructor (scikit-learn's ``get_params`` convention,
:func:`phalanx.plugins.constructor_params`), not hand-written: every registered rule, pre-aggregator and attack reports
every constructor argument, and a rule rebuilt for another f (``with_f``, what a server does when m workers are
missing) keeps every other argument."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phalanx import attacks
from phalanx.aggregators import registry
from phalanx.aggregators.base import Aggregator
from phalanx.plugins import constructor_params

OWN = {"backdoor", "dba", "edgecase", "neurotoxin", "replacement", "phrase-backdoor", "intermittent"}
"""Attacks that override ``params()``: the backdoors leave an unset ``stop_round`` out; ``intermittent`` reports the
wrapped attack's parameters (kept as ``base_params``); ``phrase-backdoor`` its trigger (kept as ``phrase``)."""


@pytest.mark.parametrize("name", registry.names())
def test_every_component_reports_its_constructor(name: str) -> None:
    component = registry.get_class(name)(f=1)
    assert component.params() == constructor_params(component)
    assert "f" in component.params()


@pytest.mark.parametrize("name", registry.names("rule"))
def test_with_f_keeps_every_other_argument(name: str) -> None:
    rule = registry.get_class(name)(f=1)
    again = rule.with_f(2)
    assert type(again) is type(rule) and again.params() == {**rule.params(), "f": 2}


@pytest.mark.parametrize("name", sorted(set(attacks.names()) - OWN))
def test_every_attack_without_its_own_params_reports_its_constructor(name: str) -> None:
    attack = attacks.make(name)
    assert attack.params() == constructor_params(attack)


class _Hidden(Aggregator):
    """The mutant: a rule that keeps its argument under another name and does not say so."""

    name = "hidden"
    reference = "a test"
    requirement = "n > 2f"

    def __init__(self, f: int = 0, k: int = 3) -> None:
        super().__init__(f)
        self._k = k

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: Any) -> tuple[torch.Tensor, None]:
        return x.mean(0), None


def test_an_argument_kept_under_another_name_is_refused_not_dropped() -> None:
    rule = _Hidden(f=1, k=5)
    with pytest.raises(TypeError, match=r"_Hidden.params\(\): constructor parameter 'k' is not kept as self.k"):
        rule.params()
    with pytest.raises(TypeError):  # with_f would otherwise rebuild it with k = 3 silently
        rule.with_f(0)
