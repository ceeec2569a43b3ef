"""Each round algorithm's config section is read from its constructor (``phalanx list algorithms`` prints it): every
parameter, with the key that sets it — and the key it names does set it (a config with that key builds the
algorithm with that value). A user's algorithm has its section by existing."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from typer.testing import CliRunner

from phalanx import cli
from phalanx.experiments import from_config, make_config
from phalanx.experiments.schema import RunConfig
from phalanx.experiments.sections import algorithm_section
from phalanx.training.algorithms import base
from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.algorithms.gossip import Gossip

SMALL = {"dataset": "digits", "model": "logreg", "workers": 8, "byzantine": 0, "f": 0, "aggregator": "mean",
         "attack": "none", "rounds": 1, "eval_every": 1, "seed": 0}


@dataclasses.dataclass(frozen=True)
class Tempered(DSGD):
    """DSGD with one parameter of its own (``temper``), for the test: a section by existing."""

    temper: float = 0.25
    name = "sections-test"


def _keys_are_true(name: str, params: dict[str, Any]) -> None:
    """Each of ``params`` (parameter → a value that is not its default), set by the first key the section names for
    it, reaches the built algorithm."""
    section = {p.name: p for p in algorithm_section(name)}
    table: dict[str, Any] = {**SMALL, "algorithm": name}
    for param, value in params.items():
        key = section[param].keys[0]
        assert key in RunConfig.model_fields or key.startswith("algorithm_params."), (param, key)
        if key.startswith("algorithm_params."):
            table.setdefault("algorithm_params", {})[key.split(".", 1)[1]] = value
        else:
            table[key] = value
    algo = from_config(make_config(table)).algorithm
    for param, value in params.items():
        assert getattr(algo, param) == value, param


@pytest.mark.parametrize("name", base.names())
def test_a_section_is_the_constructors_parameters(name: str) -> None:
    from phalanx.training.algorithms import builtin

    cls = builtin.algorithm_class(name)
    declared = [f.name for f in dataclasses.fields(cls) if f.init]
    assert [p.name for p in algorithm_section(name)] == declared
    for p in algorithm_section(name):
        assert all(k in RunConfig.model_fields or k.startswith("algorithm_params.") or k == "set by the run"
                   for k in p.keys), p


@pytest.mark.parametrize(("name", "params"), [
    ("fedavg", {"local_steps": 3, "clients_per_round": 4, "prox_mu": 0.01}),
    ("dsgd", {"batch_size": 8, "momentum": 0.5}),
    ("gossip", {"weights": "uniform_neighbour", "batch_size": 8}),
    ("scaffold", {"clients_per_round": 4, "local_steps": 2, "lr": 0.02}),
    ("fedbuff", {"buffer_size": 3}),
])
def test_the_key_a_section_names_sets_the_parameter(name: str, params: dict[str, Any]) -> None:
    _keys_are_true(name, params)


def test_a_users_algorithm_has_its_section_by_existing() -> None:
    base.register(Tempered)
    section = {p.name: p for p in algorithm_section("sections-test")}
    assert section["temper"].text() == "temper: float = 0.25 (algorithm_params.temper)"
    _keys_are_true("sections-test", {"temper": 0.5, "batch_size": 8})
    out = CliRunner().invoke(cli.app, ["list", "algorithms", "--format", "csv"]).output
    assert "temper: float = 0.25 (algorithm_params.temper)" in out
    assert "clients_per_round: int | None = None (algorithm_params.clients_per_round, clients_per_round)" in out


def test_the_section_check_rejects_an_undeclared_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant that forgets gossip's declaration (``weights`` is set by ``gossip_weights``): the section then
    names no config key for it, and the check that the key sets the parameter fails."""
    monkeypatch.setattr(Gossip, "section_keys", {})
    with pytest.raises(AssertionError):
        _keys_are_true("gossip", {"weights": "uniform_neighbour"})


def _attack_keys_are_true(name: str, params: dict[str, Any]) -> None:
    """Each of ``params``, set by the key the attack's section names for it, reaches the built attack."""
    from phalanx.experiments import sections

    section = {p.name: p for p in sections.attack_section(name)}
    table: dict[str, Any] = {**SMALL, "attack": name, "byzantine": 2, "f": 2, "aggregator": "cwtm"}
    for param, value in params.items():
        key = section[param].keys[0]
        if key.startswith("attack_params."):
            table.setdefault("attack_params", {})[key.split(".", 1)[1]] = value
        else:
            table[key] = value
    attack = from_config(make_config(table)).attack
    for param, value in params.items():
        assert getattr(attack, param) == value, param


@pytest.mark.parametrize(("name", "params"), [
    ("alie", {"z": 1.5}), ("signflip", {"scale": 2.0}), ("gaussian", {"sigma": 3.0, "mu": 0.5}),
    ("minmax", {"perturbation": "sign", "gamma_init": 5.0}), ("backdoor", {"target": 3, "poison_fraction": 0.25}),
])
def test_the_key_an_attack_section_names_sets_the_parameter(name: str, params: dict[str, Any]) -> None:
    _attack_keys_are_true(name, params)


def test_every_attack_has_its_section_in_the_listing() -> None:
    from phalanx import attacks
    from phalanx.experiments.sections import attack_section

    out = CliRunner().invoke(cli.app, ["list", "attacks", "--format", "csv"]).output
    assert "z: float | None = None (attack_params.z)" in out
    for name in attacks.names():
        for p in attack_section(name):
            assert p.keys == (f"attack_params.{p.name}",) and p.text() in out, (name, p)


def test_the_attack_section_check_rejects_a_section_naming_the_wrong_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant section that names a parameter by a flat key (``z`` instead of ``attack_params.z``): the config
    refuses that key, so the check fails."""
    from phalanx.errors import ConfigError
    from phalanx.experiments import sections

    real = sections.attack_section
    monkeypatch.setattr(sections, "attack_section",
                        lambda name: [dataclasses.replace(p, keys=(p.name,)) for p in real(name)])
    with pytest.raises(ConfigError, match="unknown key"):
        _attack_keys_are_true("alie", {"z": 1.5})
