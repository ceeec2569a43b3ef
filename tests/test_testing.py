"""phalanx.testing: every built-in rule and attack passes the published checks, and broken ones are caught."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from phalanx import aggregators, attacks
from phalanx.attacks.base import AttackContext
from phalanx.testing import check_aggregator, check_attack


@pytest.mark.parametrize("name", aggregators.names("rule"))
def test_every_registered_rule_passes_what_it_declares(name: str) -> None:
    check_aggregator(name, trials=12)  # its tags, at their check_params; its min_workers; context_for's context


@pytest.mark.parametrize("pre", aggregators.names("pre"))
def test_every_pre_aggregator_in_front_of_a_robust_rule_passes(pre: str) -> None:
    # the chain claims what both elements claim; a stochastic element draws from the one stream context_for passes
    check_aggregator(f"{pre}>cwmed", trials=8)


def test_a_claim_against_the_tags_is_checked_and_caught() -> None:
    with pytest.raises(AssertionError, match="order of the rows"):  # bucketing declares permutation=False
        check_aggregator("bucketing>cwmed", trials=4, permutation=True)


class _Mean:
    """A user's rule without a base class: the mean, with knobs to break it."""

    def __init__(self, f: int = 0, fault: str = "") -> None:
        self.f, self.fault = f, fault

    def __call__(self, x: Tensor) -> Tensor:
        if self.fault == "modifies":
            x[0] = 0.0
        if self.fault == "shape":
            return x.mean(0, keepdim=True)
        if self.fault == "order":
            return 0.9 * x[0] + 0.1 * x[1:].mean(0) if x.shape[0] > 1 else x[0]
        if self.fault == "dtype":
            return x.double().mean(0)
        return x.mean(0)


@pytest.mark.parametrize(("fault", "claims", "match"), [
    ("modifies", {"robust": False}, "modified"),
    ("shape", {"robust": False}, "output shape"),
    ("order", {"robust": False}, "order of the rows"),
    ("dtype", {"robust": False}, "float32 input"),
    ("", {}, "garbage"),  # the plain mean does not survive garbage rows: claiming robustness is caught
])
def test_broken_rules_are_caught(fault: str, claims: dict[str, Any], match: str) -> None:
    with pytest.raises(AssertionError, match=match):
        check_aggregator(lambda f: _Mean(f, fault), min_n=lambda f: 2 * f + 2, **claims)
    if fault == "":
        check_aggregator(lambda f: _Mean(f), min_n=lambda f: 2 * f + 2, robust=False)


@pytest.mark.parametrize("name", attacks.names("vector"))
def test_every_built_in_attack_passes(name: str) -> None:
    check_attack(attacks.make(name))


class _Broken:
    def __init__(self, fault: str) -> None:
        self.fault = fault

    def __call__(self, ctx: AttackContext) -> Tensor:
        b, d = ctx.n_byzantine, ctx.dim
        if self.fault == "global":
            return torch.randn(b, d, dtype=ctx.honest.dtype)
        if self.fault == "modifies":
            ctx.honest.mul_(2.0)
        return -ctx.honest[:1].expand(b, d).clone()


@pytest.mark.parametrize(("fault", "match"), [("global", "generator"), ("modifies", "modified")])
def test_broken_attacks_are_caught(fault: str, match: str) -> None:
    cls = attacks.registry.user_attack(_Broken, "broken")
    with pytest.raises(AssertionError, match=match):
        check_attack(cls(fault=fault))
    check_attack(cls(fault=""))
