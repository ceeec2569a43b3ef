"""The torch-free catalogue (:mod:`phalanx.catalogue`) says what the registries hold.

``phalanx list datasets | models | aggregators`` and the study groups' ``--help`` read the catalogue instead of
importing the registries (issue 37: torch is most of a command's start-up; ``tests/test_startup.py``). A listing
read from a declaration can go stale, so each declaration is checked here against the registry it stands for: every
built-in name (both ways), each entry's ``module:attr`` target (it is the class the registry hands out), a rule's
kind, requirement and reference and its ε and κ at every (n, f) with n ≤ 24, f < n/2 — the values its class's
``describe(n)`` gives — and a study's help text. Each check is a function returning the mismatches, and each has
mutants (a κ that ignores f, a stale reference, a requirement of another default, a target naming another class, a
missing or an extra name, an edited help text) that it must report. The listings themselves are compared as printed,
in every format, from the catalogue and from the registries' classes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from typer.testing import CliRunner

from phalanx import aggregators, catalogue, cli, data, models, studies
from phalanx.cli import listing
from phalanx.decentralized import robust_gossip
from phalanx.plugins import import_spec

GRID = [(n, f) for n in range(1, 25) for f in range((n + 1) // 2)] + [
    (n, f) for n in (49, 100, 1001, 10**6) for f in (0, 1, n // 4, (n - 1) // 2)]
"""Every (n, f) ``phalanx list aggregators`` accepts (f < n/2) up to n = 24, and the ends of the range at four larger
n (a formula copied with a slip that shows only at large n — an n² where the class has n — fails there)."""


def _own(registered: Mapping[str, Any]) -> set[str]:
    """The names registered by Phalanx's own modules (a test's in-process registrations left out)."""
    return {name for name, obj in registered.items() if getattr(obj, "__module__", "").startswith("phalanx.")}


def name_mismatches(declared: tuple[str, ...], registered: Mapping[str, Any]) -> list[str]:
    """Names declared but not registered, and built-ins registered but not declared."""
    return ([f"{n}: declared, not registered" for n in sorted(set(declared) - set(registered))]
            + [f"{n}: registered, not declared" for n in sorted(_own(registered) - set(declared))])


def rule_mismatches(declared: Mapping[str, Any]) -> list[str]:
    """Every difference between the declared rules and the aggregator registry's classes: names, targets, kind,
    requirement and reference (at f = 1 and every f of the grid), ε and κ over the grid."""
    registered = aggregators.registry._REGISTRY.registered()
    out = name_mismatches(tuple(declared), registered)
    for name, entry in declared.items():
        if name not in registered:
            continue
        cls = registered[name]
        if import_spec(entry.target, "target") is not cls:
            out.append(f"{name}: target {entry.target} is not {cls.__module__}:{cls.__qualname__}")
        for n, f in GRID:
            info = cls(f=f).describe(n)
            got = (entry.kind, entry.requirement, entry.reference, entry.epsilon(n, f), entry.kappa(n, f))
            want = (info["kind"], info["requirement"], info["reference"], info.get("epsilon"), info.get("kappa"))
            if got != want:
                out.append(f"{name} at n={n}, f={f}: declared {got}, the class says {want}")
                break
    return out


def gossip_mismatches(declared: Mapping[str, Any]) -> list[str]:
    registered = robust_gossip._REGISTRY.registered()
    out = name_mismatches(tuple(declared), registered)
    for name, entry in declared.items():
        cls = registered.get(name)
        if cls is not None and (import_spec(entry.target, "target") is not cls or entry.reference != cls.reference):
            out.append(f"{name}: declared {entry}, the class is {cls.__module__}:{cls.__qualname__}")
    return out


def study_mismatches(declared: Mapping[str, Any]) -> list[str]:
    registered = studies.registry._REGISTRY.registered()
    out = name_mismatches(tuple(declared), registered)
    for name, entry in declared.items():
        cls = registered.get(name)
        if cls is not None and (import_spec(entry.target, "target") is not cls or entry.help != cls.help):
            out.append(f"{name}: declared {entry.target} with its help, the registry's differs")
    return out


def test_the_declared_data_sets_and_models_are_the_registries() -> None:
    assert not name_mismatches(catalogue.DATASETS, data.loaders._REGISTRY.registered())
    assert not name_mismatches(catalogue.MODELS, models.registry._REGISTRY.registered())


def test_the_declared_rules_are_the_registry_s_classes() -> None:
    assert not rule_mismatches(catalogue.AGGREGATORS)
    assert not gossip_mismatches(catalogue.GOSSIP_RULES)


def test_the_declared_studies_are_the_registry_s() -> None:
    assert not study_mismatches(catalogue.STUDIES)


def _edit(table: Mapping[str, Any], name: str, **change: Any) -> dict[str, Any]:
    return {**table, name: dataclasses.replace(table[name], **change)}


def _without(table: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in table.items() if k != name}


RULES = catalogue.AGGREGATORS
MUTANTS: list[tuple[str, Callable[[], list[str]]]] = [
    ("a kappa that ignores f", lambda: rule_mismatches(_edit(RULES, "cwtm", kappa=lambda n, f: 6.0))),
    ("an epsilon proven nowhere", lambda: rule_mismatches(_edit(RULES, "krum", epsilon=lambda n, f: 1.0))),
    ("a stale reference", lambda: rule_mismatches(_edit(RULES, "nnm", reference="Allouah et al., 2023"))),
    ("another default's requirement", lambda: rule_mismatches(
        _edit(RULES, "smea", requirement="n > 2f and C(n, f) <= max_subsets = 100000"))),
    ("a pre-aggregator listed as a rule", lambda: rule_mismatches(_edit(RULES, "clip", kind="rule"))),
    ("a target naming another class", lambda: rule_mismatches(
        _edit(RULES, "multikrum", target="phalanx.aggregators.krum:Krum"))),
    ("a rule left out", lambda: rule_mismatches(_without(RULES, "bulyan"))),
    ("a rule that is not there", lambda: rule_mismatches({**RULES, "trimmed2": RULES["cwtm"]})),
    ("a gossip rule's stale reference", lambda: gossip_mismatches(
        _edit(catalogue.GOSSIP_RULES, "ios", reference="Wu et al."))),
    ("a data set left out", lambda: name_mismatches(catalogue.DATASETS[:-1], data.loaders._REGISTRY.registered())),
    ("a model that is not there", lambda: name_mismatches((*catalogue.MODELS, "vgg"),
                                                          models.registry._REGISTRY.registered())),
    ("an edited help text", lambda: study_mismatches(
        _edit(catalogue.STUDIES, "hbn", help=catalogue.STUDIES["hbn"].help + " "))),
    ("a study left out", lambda: study_mismatches(_without(catalogue.STUDIES, "lora"))),
]


@pytest.mark.parametrize("check", [c for _, c in MUTANTS], ids=[i for i, _ in MUTANTS])
def test_each_check_reports_its_mutant(check: Callable[[], list[str]]) -> None:
    assert check()


@pytest.mark.parametrize("args", [[], ["-n", "7", "-f", "3"], ["-n", "10", "-f", "0"], ["-n", "1", "-f", "0"],
                                  ["-n", "41", "-f", "20"]])
@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_list_aggregators_prints_the_same_from_the_catalogue_as_from_the_classes(
        monkeypatch: pytest.MonkeyPatch, args: list[str], fmt: str) -> None:
    """The listing as printed — every cell, the numbered references, the notes — from the declared rows and from
    the registries' classes (the path a plug-in takes)."""
    command = ["list", "aggregators", *args, "--format", fmt]
    env = {"COLUMNS": "100"}
    declared = CliRunner().invoke(cli.app, command, env=env)
    monkeypatch.setattr(listing.catalogue, "rule_rows", lambda n, f: None)
    built = CliRunner().invoke(cli.app, command, env=env)
    assert declared.exit_code == built.exit_code == 0, declared.output + built.output
    assert declared.output == built.output
    if fmt == "json":  # the built path did take the classes' rows: the same 30 names
        assert len(json.loads(built.output)["rows"]) == len(catalogue.AGGREGATORS) + len(catalogue.GOSSIP_RULES)


def test_a_name_beyond_the_table_makes_the_listing_ask_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry registered in this process (as a plug-in's entry point would be) is a name the table does not
    hold: the declared rows are not used, and the names listed are the registry's."""
    monkeypatch.setitem(aggregators.registry._REGISTRY._entries, "zz-rule", aggregators.get_class("cwtm"))
    assert catalogue.rule_rows(16, 3) is None
    monkeypatch.setitem(data.loaders._REGISTRY._entries, "zz-data", lambda root, download: None)
    assert catalogue.names(catalogue.DATASETS, catalogue.DATASET_GROUP) == data.names()
    assert "zz-data" in data.names()
