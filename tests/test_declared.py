"""Declared, not listed: what used to be a name list somewhere else (the memory estimate's pairwise rules, the gossip
attacks that run on real processes, an attack's boost) is an attribute of the class, so a new rule or attack — a
user's included — is one file: it declares what it is."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from phalanx import aggregators, attacks
from phalanx.aggregators.base import Aggregator
from phalanx.analysis.epsilon import memory_needed
from phalanx.decentralized import gossip_attacks
from phalanx.decentralized.gossip_attacks import Dissensus, GossipAttack, GossipView
from phalanx.errors import ConfigError
from phalanx.training.gossip_node import check_attack

DISTANCE_BASED = {"krum", "multikrum", "bulyan", "mda", "signguard", "dnc", "clippedclustering"}


@pytest.mark.parametrize("name", aggregators.names("rule"))
def test_every_rule_declares_its_pairwise_matrices(name: str) -> None:
    rule = aggregators.make(name, f=0 if name == "mean" else 1)
    k = rule.pairwise_matrices
    assert isinstance(k, int) and k >= 0
    assert (k > 0) == (name in DISTANCE_BASED), name


def test_a_chain_takes_the_largest_declaration_of_its_parts() -> None:
    n, d = 50, 1000
    plain = memory_needed(aggregators.make("cwtm", f=2), n, d)
    assert memory_needed(aggregators.make("nnm>cwtm", f=2), n, d) == plain + 8 * 5 * n * n
    assert memory_needed(aggregators.make("clippedclustering", f=2), n, d) == plain + 8 * 10 * n * n


class PairwiseMean(Aggregator):
    """A user's rule that builds one (n, n) matrix and says so."""

    name: ClassVar[str] = "pairwise-mean"
    reference: ClassVar[str] = "a test"
    pairwise_matrices = 1

    def _run(self, x: torch.Tensor, want_contributions: bool, **context: Any) -> tuple[torch.Tensor, None]:
        _ = torch.cdist(x, x)
        return x.mean(0), None


def test_a_users_rule_is_counted_by_its_own_declaration() -> None:
    assert memory_needed(PairwiseMean(f=0), 10, 5) - memory_needed(aggregators.make("mean", f=0), 10, 5) == 8 * 100


class LocalShift(GossipAttack):
    """A user's decentralized attack that needs only the target's neighbourhood, and declares it."""

    name: ClassVar[str] = "local-shift"
    reference: ClassVar[str] = "a test"
    neighbourhood_only = True

    def messages(self, view: GossipView) -> torch.Tensor:
        return torch.zeros(1)


def test_gossip_attacks_on_real_processes_are_the_ones_that_declare_it() -> None:
    assert Dissensus.neighbourhood_only and not gossip_attacks.make("spectral").neighbourhood_only
    check_attack(LocalShift())  # declared: accepted
    check_attack(gossip_attacks.make("dissensus"))
    with pytest.raises(ConfigError, match="spectral"):
        check_attack(gossip_attacks.make("spectral"))


def test_boost_is_declared_on_every_attack() -> None:
    for name in attacks.names():
        attack = attacks.make(name)
        assert attack.boost == 1.0 or name == "backdoor", name
    assert attacks.make("backdoor", boost=5.0).boost == 5.0
