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

``list attacks | algorithms | stages`` read :mod:`phalanx.catalogue.rounds` alike: each declared entry's target and
cells (an attack's kind, section and reference; an algorithm's configuration, section and reference; a stage's side,
what turns it on, its parameters and reference) are checked against the cells the registries' classes give
(:func:`phalanx.cli.listing.attack_rows`, ``algorithm_rows``, ``stage_rows``), names both ways, with mutants of each
field.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from phalanx import aggregators, attacks, catalogue, cli, data, models, studies
from phalanx.catalogue import rounds, stage_files
from phalanx.cli import listing
from phalanx.decentralized import gossip_attacks, robust_gossip
from phalanx.errors import PhalanxError
from phalanx.plugins import import_spec
from phalanx.training.algorithms import base, builtin
from phalanx.training.stages import registry as stage_registry

# The declared catalogue is Phalanx's own components; compared with what its classes give, plug-ins are hidden.
pytestmark = pytest.mark.usefixtures("built_ins_only")

GRID = [(n, f) for n in range(1, 25) for f in range((n + 1) // 2)] + [
    (n, f) for n in (49, 100, 1001, 10**6) for f in (0, 1, n // 4, (n - 1) // 2)]
"""Every (n, f) ``phalanx list aggregators`` accepts (f < n/2) up to n = 24, and the ends of the range at four larger
n (a formula copied with a slip that shows only at large n — an n² where the class has n — fails there)."""


def _is_own(obj: Any) -> bool:
    """Whether ``obj`` is Phalanx's own: defined in a ``phalanx.`` module, and not Phalanx's wrapper around a user's
    plain class (``wraps``: an installed plug-in's rule or attack is the user's, not a built-in to declare)."""
    return getattr(getattr(obj, "wraps", obj), "__module__", "").startswith("phalanx.")


def _own(registered: Mapping[str, Any]) -> set[str]:
    """The names registered by Phalanx's own modules (a test's in-process registrations left out)."""
    return {name for name, obj in registered.items() if _is_own(obj)}


def name_mismatches(declared: tuple[str, ...], registered: Mapping[str, Any]) -> list[str]:
    """Names declared but not registered, and built-ins registered but not declared."""
    return ([f"{n}: declared, not registered" for n in sorted(set(declared) - set(registered))]
            + [f"{n}: registered, not declared" for n in sorted(_own(registered) - set(declared))])


def rule_mismatches(declared: Mapping[str, Any]) -> list[str]:
    """Every difference between the declared rules and the aggregator registry's classes: names, targets, kind,
    requirement and reference (at f = 1 and every f of the grid), ε, κ and the smallest n over the grid."""
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
            got = (entry.kind, entry.requirement, entry.reference, entry.epsilon(n, f), entry.kappa(n, f),
                   entry.min_workers(f))
            want = (info["kind"], info["requirement"], info["reference"], info.get("epsilon"), info.get("kappa"),
                    cls(f=f).min_workers())
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


Fields = tuple[str, ...]


def row_mismatches(declared: Mapping[str, tuple[str, Fields]], rows: list[tuple[list[str], str]],
                   get_class: Callable[[str], type]) -> list[str]:
    """Every difference between ``declared`` (name → its target and its cells after the name, the reference last)
    and a listing's ``rows`` as the registries' classes give them: names both ways (Phalanx's own classes; a test's
    in-process registration left out), each target, each cell."""
    listed = {}
    for cells, reference in rows:
        cls = get_class(cells[0])
        if _is_own(cls):
            listed[cells[0]] = (cls, (*cells[1:], reference))
    out = ([f"{n}: declared, not registered" for n in sorted(set(declared) - set(listed))]
           + [f"{n}: registered, not declared" for n in sorted(set(listed) - set(declared))])
    for name in sorted(set(declared) & set(listed)):
        (target, got), (cls, want) = declared[name], listed[name]
        if import_spec(target, "target") is not cls:
            out.append(f"{name}: target {target} is not {cls.__module__}:{cls.__qualname__}")
        if got != want:
            out.append(f"{name}: declared {got}, the class gives {want}")
    return out


def _section(lines: tuple[str, ...]) -> str:
    return "\n".join(lines) or rounds.NO_SECTION


def _attack_class(name: str) -> type:
    return gossip_attacks.get_class(name) if name in gossip_attacks.names() else attacks.get_class(name)


def attack_mismatches(declared: Mapping[str, Any] = rounds.ATTACKS,
                      gossip: Mapping[str, Any] = rounds.GOSSIP_ATTACKS) -> list[str]:
    """The declared attacks and gossip attacks against ``list attacks``' rows from the registries."""
    cells = {name: (a.target, (a.kind, _section(a.section), a.reference)) for name, a in declared.items()}
    cells |= {name: (g.target, (rounds.GOSSIP_ATTACK_KIND, rounds.NO_SECTION, g.reference))
              for name, g in gossip.items()}
    return row_mismatches(cells, listing.attack_rows(), _attack_class)


def algorithm_mismatches(declared: Mapping[str, Any] = rounds.ALGORITHMS) -> list[str]:
    """The declared round algorithms against ``list algorithms``' rows from the registry."""
    cells = {name: (a.target, (a.configured_by, _section(a.section), a.reference)) for name, a in declared.items()}
    return row_mismatches(cells, listing.algorithm_rows(), builtin.algorithm_class)


def stage_mismatches(declared: Mapping[str, Any] = rounds.STAGES, files: bool = True) -> list[str]:
    """The declared stages, and (``files``) those read from the package's files the table does not name, against
    ``list stages``' rows from the registry."""
    cells = {name: (s.target, (s.side, s.turned_on_by, _section(s.section), s.reference))
             for name, s in declared.items()}
    read = stage_files.derived(s.target.split(":")[0] for s in declared.values()) if files else {}
    assert read is not None, "a stage file the table does not name cannot be read from its source"
    cells |= {name: (c[0], (c[1], c[2], _section(c[3:-1]), c[-1])) for name, c in read.items()}
    return row_mismatches(cells, listing.stage_rows(), stage_registry.get)


def test_the_declared_attacks_algorithms_and_stages_are_the_registries() -> None:
    assert not attack_mismatches()
    assert not algorithm_mismatches()
    assert not stage_mismatches()


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
    ("a smallest n that ignores f", lambda: rule_mismatches(_edit(RULES, "krum", min_workers=lambda f: 3))),
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
    ("an attack of another kind", lambda: attack_mismatches(
        _edit(rounds.ATTACKS, "labelflip", kind="vector: sends rows"))),
    ("an attack's stale default", lambda: attack_mismatches(
        _edit(rounds.ATTACKS, "alie", section=("z: float | None = 1.0 (attack_params.z)",)))),
    ("an attack's parameter left out", lambda: attack_mismatches(
        _edit(rounds.ATTACKS, "backdoor", section=rounds.ATTACKS["backdoor"].section[:-1]))),
    ("an attack's stale reference", lambda: attack_mismatches(_edit(rounds.ATTACKS, "fang", reference="Fang et al."))),
    ("an attack's target naming another class", lambda: attack_mismatches(
        _edit(rounds.ATTACKS, "minsum", target="phalanx.attacks.minmax:MinMax"))),
    ("an attack left out", lambda: attack_mismatches(_without(rounds.ATTACKS, "signflip"))),
    ("an attack that is not there", lambda: attack_mismatches({**rounds.ATTACKS, "alie2": rounds.ATTACKS["alie"]})),
    ("a gossip attack's stale reference", lambda: attack_mismatches(
        gossip=_edit(rounds.GOSSIP_ATTACKS, "spectral", reference="Gaucher et al."))),
    ("a gossip attack left out", lambda: attack_mismatches(gossip=_without(rounds.GOSSIP_ATTACKS, "dissensus"))),
    ("an algorithm configured another way", lambda: algorithm_mismatches(
        _edit(rounds.ALGORITHMS, "scaffold", configured_by="its config keys"))),
    ("an algorithm's stale default", lambda: algorithm_mismatches(_edit(rounds.ALGORITHMS, "dsgd", section=tuple(
        line.replace("0.9", "0.0") for line in rounds.ALGORITHMS["dsgd"].section)))),
    ("an algorithm's stale description", lambda: algorithm_mismatches(
        _edit(rounds.ALGORITHMS, "fedavg", reference="Federated averaging."))),
    ("an algorithm left out", lambda: algorithm_mismatches(_without(rounds.ALGORITHMS, "kardam"))),
    ("an algorithm that is not there", lambda: algorithm_mismatches(
        {**rounds.ALGORITHMS, "fedprox": rounds.ALGORITHMS["fedavg"]})),
    ("a stage on the other side", lambda: stage_mismatches(_edit(rounds.STAGES, "dp", side="server"))),
    ("a stage turned on by another key", lambda: stage_mismatches(
        _edit(rounds.STAGES, "crfl", turned_on_by="stages.crfl (a TOML table)"))),
    ("a stage's parameter left out", lambda: stage_mismatches(
        _edit(rounds.STAGES, "dp", section=rounds.STAGES["dp"].section[:1]))),
    ("a stage's target naming another class", lambda: stage_mismatches(
        _edit(rounds.STAGES, "dp", target="phalanx.training.stages.crfl:CRFL"))),
    ("a stage left out", lambda: stage_mismatches(_without(rounds.STAGES, "dp"), files=False)),
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
        rows = json.loads(built.output)["tables"][0]["rows"]
        assert len(rows) == len(catalogue.AGGREGATORS) + len(catalogue.GOSSIP_RULES)


def test_a_name_beyond_the_table_makes_the_listing_ask_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry registered in this process (as a plug-in's entry point would be) is a name the table does not
    hold: the declared rows are not used, and the names listed are the registry's."""
    monkeypatch.setitem(aggregators.registry._REGISTRY._entries, "zz-rule", aggregators.get_class("cwtm"))
    assert catalogue.rule_rows(16, 3) is None
    monkeypatch.setitem(data.loaders._REGISTRY._entries, "zz-data", lambda root, download: None)
    assert catalogue.names(catalogue.DATASETS, catalogue.DATASET_GROUP) == data.names()
    assert "zz-data" in data.names()


ROUND_LISTINGS = {"attacks": "attack_rows", "algorithms": "algorithm_rows", "stages": "stage_rows"}


def _phalanx_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registries as a fresh process has them: entries registered by other tests of this process (a user's
    algorithm in tests/test_sections.py) set aside for this test. The algorithms and stages are found first (their
    registries import their packages at the first look-up): found inside the test, they would be registered in the
    set-aside copy and lost with it."""
    base.names()
    stage_registry.names()
    for reg in (attacks.registry._REGISTRY, gossip_attacks._REGISTRY, base._REGISTRY, stage_registry._REGISTRY):
        monkeypatch.setattr(reg, "_entries", {k: v for k, v in reg._entries.items() if _is_own(v)})


@pytest.mark.parametrize("what", list(ROUND_LISTINGS))
@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_list_attacks_algorithms_stages_print_the_same_from_the_catalogue_as_from_the_classes(
        monkeypatch: pytest.MonkeyPatch, what: str, fmt: str) -> None:
    """``list attacks``, ``list algorithms`` and ``list stages`` as printed — every cell, the numbered references,
    the notes — from the declared rows and from the registries' classes (the path a plug-in takes)."""
    _phalanx_only(monkeypatch)
    stage_registry.names()  # the stages found (their modules imported) before the catalogue is asked
    declared_rows = getattr(rounds, ROUND_LISTINGS[what])()
    assert declared_rows is not None  # the declared rows are the ones printed first
    command, env = ["list", what, "--format", fmt], {"COLUMNS": "100"}
    declared = CliRunner().invoke(cli.app, command, env=env)
    monkeypatch.setattr(listing.rounds, ROUND_LISTINGS[what], lambda: None)
    built = CliRunner().invoke(cli.app, command, env=env)
    assert declared.exit_code == built.exit_code == 0, declared.output + built.output
    assert declared.output == built.output
    if fmt == "json":  # the built path did take the classes' rows: as many as the catalogue gives
        assert len(json.loads(built.output)["tables"][0]["rows"]) == len(declared_rows)


def test_an_attack_or_stage_beyond_the_table_makes_the_listing_ask_the_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An attack, gossip attack, algorithm or stage registered in this process (as a plug-in's entry point would
    be) is a name the tables do not hold: the declared rows are not used, and the listing shows it."""
    _phalanx_only(monkeypatch)
    stage_registry.names()
    cases = [(attacks.registry._REGISTRY, "zz-attack", attacks.get_class("alie"), "attacks"),
             (gossip_attacks._REGISTRY, "zz-gossip", gossip_attacks.get_class("spectral"), "attacks"),
             (base._REGISTRY, "zz-algorithm", builtin.algorithm_class("fedbuff"), "algorithms"),
             (stage_registry._REGISTRY, "zz-stage", stage_registry.get("adaptive_clip"), "stages")]
    for reg, name, cls, what in cases:
        assert getattr(rounds, ROUND_LISTINGS[what])() is not None
        monkeypatch.setitem(reg._entries, name, cls)
        assert getattr(rounds, ROUND_LISTINGS[what])() is None
        out = CliRunner().invoke(cli.app, ["list", what, "--format", "csv"]).output
        listed = [row[0] for row in csv.reader(io.StringIO(out))][1:]
        assert name in listed and {"attacks": "alie", "algorithms": "dsgd", "stages": "dp"}[what] in listed
        monkeypatch.delitem(reg._entries, name)


NEW_STAGE = """
from collections.abc import Mapping
from typing import ClassVar

from phalanx.training.stages.base import WorkerStage


class ZzNoise(WorkerStage):
    name: ClassVar[str] = "zz_noise"
    reference: ClassVar[str] = ("A. Author, 'A paper', "
                                "2026, §1")
    parameters: ClassVar[Mapping[str, str]] = {"sigma": "σ ≥ 0: the noise's standard deviation"}
"""


def _package_with(tmp_path: Path, source: str) -> Path:
    """A copy of the stages package's files with one more stage file, ``zz_noise.py``."""
    for path in stage_files.PACKAGE.glob("*.py"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "zz_noise.py").write_text(source)
    return tmp_path


def test_every_stage_file_read_from_its_source_gives_its_classes_cells() -> None:
    """The stages that only their file declares are listed with the cells their classes give: every stage of the
    package but those a legacy flat key turns on (dp, crfl: kept in the table) read from its source, none imported
    for it — the same rows as the listing from the classes."""
    kept = {name: s for name, s in rounds.STAGES.items() if name in ("dp", "crfl")}
    read = stage_files.derived(s.target.split(":")[0] for s in kept.values())
    assert read is not None and set(read) == _own(stage_registry._REGISTRY.registered()) - set(kept)
    assert not stage_mismatches(kept)


def test_a_new_stage_file_is_listed_without_a_catalogue_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage added as one file of the package is in ``phalanx list stages`` — read from its source, no catalogue
    line — with the cells its class gives; a file whose stage is not written with literals makes the listing ask
    the classes (None here: the command then imports the stages, whose rows are right), never drop it (mutant)."""
    before = rounds.stage_rows()
    assert before is not None and "zz_noise" not in [r[0][0] for r in before]
    monkeypatch.setattr(stage_files, "PACKAGE", _package_with(tmp_path, NEW_STAGE))
    rows = rounds.stage_rows()
    assert rows is not None and [r[0][0] for r in rows] == sorted([*(r[0][0] for r in before), "zz_noise"])
    spec = importlib.util.spec_from_file_location("zz_noise_module", tmp_path / "zz_noise.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = module.ZzNoise
    want = ([cls.name, cls.side, f"stages.{cls.name} (a TOML table)",
             "\n".join(f"{p}: {t}" for p, t in cls.parameters.items())], cls.reference)
    assert dict((r[0][0], r) for r in rows)["zz_noise"] == want
    computed = NEW_STAGE.replace('{"sigma": "σ ≥ 0: the noise\'s standard deviation"}', 'dict(sigma="σ ≥ 0")')
    assert computed != NEW_STAGE
    (tmp_path / "zz_noise.py").write_text(computed)
    assert rounds.stage_rows() is None


def test_no_coefficient_is_listed_where_its_rule_cannot_run() -> None:
    """A table that prints ε or κ at an (n, f) where the rule refuses n (Krum at n = 2f + 1, 2f + 2: κ = 18 was
    printed at n = 10, f = 4) states a property of a call that cannot happen. Mutant: Krum's κ guarded by n > 2f
    only (its Table-1 condition) fails from (1, 0) on."""
    for f in range(0, 5):
        for n in range(2 * f + 1, 2 * f + 8):
            for name, entry in catalogue.AGGREGATORS.items():
                try:
                    rule = aggregators.get_class(name)(f=f)
                except PhalanxError:
                    continue
                if n < rule.min_workers():
                    assert entry.epsilon(n, f) is None and entry.kappa(n, f) is None, (name, n, f)
                    info = rule.describe(n)
                    assert info.get("epsilon") is None and info.get("kappa") is None, (name, n, f)


def test_list_aggregators_marks_the_rules_not_defined_at_its_n_and_f() -> None:
    """At n = 10, f = 4 Bulyan (n ≥ 4f + 3), Krum and Multi-Krum (n > 2f + 2) are marked and a note says what the
    mark means; at n = 19, f = 4 none is (an extension author's review: the listing showed ε and κ at (n, f) beside
    rules a run there refuses)."""
    out = CliRunner().invoke(cli.app, ["list", "aggregators", "-n", "10", "-f", "4", "--format", "json"])
    assert out.exit_code == 0, out.output
    table = json.loads(out.output)["tables"][0]
    marked = sorted(row["name"] for row in table["rows"] if row["requirement"].startswith(listing.UNMET))
    assert marked == ["bulyan", "krum", "multikrum"]
    assert any("not defined at n = 10 with f = 4" in note for note in table["notes"])
    wide = json.loads(CliRunner().invoke(cli.app, ["list", "aggregators", "-n", "19", "-f", "4", "--format",
                                                   "json"]).output)["tables"][0]
    assert not [row for row in wide["rows"] if row["requirement"].startswith(listing.UNMET)]
