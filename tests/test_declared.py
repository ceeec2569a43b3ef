"""Declared, not listed: what used to be a name list somewhere else (the memory estimate's pairwise rules, the gossip
attacks that run on real processes, an attack's boost, the property tests' table of each rule's symmetries) is an
attribute of the class, so a new rule or attack — a user's included — is one file: it declares what it is."""

from __future__ import annotations

import copy
import pickle
from typing import Any, ClassVar

import pytest
import torch

from phalanx import aggregators, attacks
from phalanx.aggregators.base import Aggregator, RuleTags
from phalanx.analysis.epsilon import memory_needed
from phalanx.decentralized import gossip_attacks
from phalanx.decentralized.gossip_attacks import Dissensus, GossipAttack, GossipView
from phalanx.errors import ConfigError
from phalanx.training.algorithms.gossip_node import check_attack

DISTANCE_BASED = {"krum", "multikrum", "bulyan", "mda", "signguard", "dnc", "clippedclustering", "foolsgold", "flame",
                  "caf", "smea", "fldetector"}


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


class Jitter:
    """A user's attack that draws from the attack stream, and says so."""

    stochastic = True

    def __call__(self, ctx: Any) -> torch.Tensor:
        return torch.randn(ctx.n_byzantine, ctx.dim, generator=ctx.generator, dtype=torch.float64)


def test_a_users_attack_declares_its_randomness() -> None:
    """tests/test_attacks_base.py checks every attack's declarations both ways (another seed changes the vectors
    exactly when it declares ``stochastic``; non-finite vectors exactly when it declares ``finite = False``)."""
    from phalanx.attacks.registry import user_attack

    cls = user_attack(Jitter, "jitter")
    assert cls.stochastic and cls.finite
    plain = user_attack(lambda: (lambda ctx: ctx.honest[:0]), "plain")  # nothing declared: deterministic, finite
    assert not plain.stochastic and plain.finite


def test_boost_is_declared_on_every_attack() -> None:
    for name in attacks.names():
        attack = attacks.make(name)
        assert attack.boost == 1.0 or name == "replacement", name  # model replacement boosts by default
    assert attacks.make("backdoor", boost=5.0).boost == 5.0


@pytest.mark.parametrize("name", aggregators.names())
def test_every_component_declares_tags_its_constructor_takes(name: str) -> None:
    tags = aggregators.get_tags(name)
    assert isinstance(tags, RuleTags) and tags is aggregators.get_class(name).tags
    component = aggregators.get_class(name)(f=1, **tags.check_params)  # a misspelt check parameter fails here
    assert aggregators.get_tags(component) is tags
    assert component.describe()["tags"] == {**tags.claims(), "tol": tags.tol}


def test_a_chain_claims_what_all_its_elements_claim() -> None:
    chain = aggregators.make("bucketing>clip>geomed", f=1)
    assert chain.tags == aggregators.get_tags("bucketing>clip>geomed")
    assert chain.tags.claims() == {"permutation": False, "translation": False, "scale": False, "identical": False,
                                   "robust": True}
    assert chain.tags.tol == aggregators.get_tags("geomed").tol and not chain.tags.check_params
    assert not aggregators.make("clip>mean", f=1).tags.robust
    assert aggregators.make("nnm>cwtm", f=1).tags == RuleTags()
    again = pickle.loads(pickle.dumps(aggregators.make("bucketing>geomed", f=1)))  # a chain holds its own tags
    assert again.tags == aggregators.get_tags("bucketing>geomed")
    assert copy.deepcopy(aggregators.get_tags("geomed")) == aggregators.get_tags("geomed")


class OrderedMean:
    """A user's rule without a base class that declares what it lacks."""

    tags = RuleTags(permutation=False, robust=False)

    def __init__(self, f: int = 0) -> None:
        self.f = f

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return 0.9 * x[0] + 0.1 * x.mean(0)


class Plain:
    """A user's rule that declares nothing."""

    def __init__(self, f: int = 0) -> None:
        self.f = f

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(0)


def test_a_users_rule_carries_its_own_tags_and_is_checked_by_them() -> None:
    from phalanx.aggregators.registry import user_rule
    from phalanx.testing import check_aggregator

    cls = user_rule(OrderedMean, "ordered-mean")
    assert cls.tags is OrderedMean.tags and aggregators.get_tags(cls(f=0)) is OrderedMean.tags
    check_aggregator(lambda f: cls(f=f), trials=8)  # what it declares holds
    with pytest.raises(AssertionError, match="order of the rows"):
        check_aggregator(lambda f: cls(f=f), trials=8, permutation=True)
    assert user_rule(Plain, "plain").tags == RuleTags()  # nothing declared: the full contract


def test_tags_of_the_wrong_kind_are_refused_in_one_line() -> None:
    class Tagged(OrderedMean):
        tags = "permutation=False"  # type: ignore[assignment]

    with pytest.raises(ConfigError, match="RuleTags"):
        aggregators.get_tags(Tagged)
    for bad, parameter in [({"permutation": 1}, "RuleTags.permutation"), ({"tol": 0.0}, "RuleTags.tol"),
                           ({"check_params": [("tol", 1)]}, "RuleTags.check_params")]:
        with pytest.raises(ConfigError) as info:
            RuleTags(**bad)
        assert info.value.parameter == parameter
    with pytest.raises(TypeError):
        RuleTags(check_params={"tau": 1.0}).check_params["tau"] = 2.0  # type: ignore[index]


def test_the_config_reads_which_keys_roles_and_devices_belong_to_which_algorithm_from_the_algorithms() -> None:
    """FEDERATED_KEYS, DECENTRALIZED_KEYS, ROLE_NAMES, DEVICE_ALGORITHMS and the columns a run's rows carry were lists
    in the config and the builder; each built-in algorithm now declares its own and the config derives them."""
    from phalanx.experiments import config
    from phalanx.experiments.validrun import config_columns
    from phalanx.training.algorithms import builtin
    from phalanx.training.algorithms.base import BUILT_IN

    assert tuple(builtin.BUILT_IN) == BUILT_IN
    assert config.ROLE_NAMES == {"server_lr": ("dsgd",), "client_lr": ("fedavg",), "node_lr": ("gossip", "anytime")}
    assert config.DEVICE_ALGORITHMS == ("dsgd", "fedavg") and config.DECENTRALIZED == ("gossip", "anytime")
    assert builtin.readers("clients_per_round") == ("fedavg",) and builtin.readers("graph") == ("gossip", "anytime")
    assert set(config.ALGORITHM_KEYS) <= set(config.RunConfig.model_fields)  # every declared key is a config key
    fed = config_columns(config.make_config({"algorithm": "fedavg", "clients_per_round": 4}))
    assert {"algorithm", "clients_per_round", "local_steps", "local_epochs", "server_lr"} <= set(fed)
    with pytest.raises(ConfigError, match=r"clients_per_round=4 .*read by algorithm = 'fedavg' only"):
        config.make_config({"algorithm": "dsgd", "clients_per_round": 4})
    with pytest.raises(ConfigError, match=r"graph='torus' .*read by algorithm = 'gossip' or 'anytime' only"):
        config.make_config({"graph": "torus"})
