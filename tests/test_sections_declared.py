"""Issue 39, item 2: each config section without a constructor is declared once, by the value that reads it
(``experiments/specs.py``: ``RunShape.section`` is ``[run]`` …; ``experiments/declare.py``), each other flat key by
the component that reads it (a built-in algorithm's ``config_section``, SGD's, the privacy stage's, the workers'
optimisation on ``AlgorithmSpec``: ``concerns.checked()``), and everything else is derived from that declaration —
the schema's fields, the adapter's table, ``phalanx list sections``, the range check and its error. Each key's range
and each component parameter's name is checked once; the schema has no range of its own. Each check has its
mutant."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field, ValidationError, create_model

from phalanx.errors import ConfigError
from phalanx.experiments import concerns, config, declare, make_config, specs, tree
from phalanx.experiments.declare import Key, Section
from phalanx.experiments.schema import RunConfig

PLUGINS = Path(__file__).resolve().parents[1] / "examples" / "plugins"
BLOBS = "mylab.data:blobs"  # a data set of one's own that takes `classes`, `dim`, `per_class`
CLASSES = Key("classes", "dataset_params.classes", int, 2, "classes of a generated data set", ge=2, le=100)
"""The key the "declared once" test adds to ``[data]``'s declaration (a path into the loader's table)."""


def _listing() -> str:
    from typer.testing import CliRunner

    from phalanx import cli

    res = CliRunner().invoke(cli.app, ["list", "sections", "--format", "csv"])
    assert res.exit_code == 0, res.output
    return res.output


def test_a_key_added_to_one_declaration_is_in_the_tree_the_listing_and_the_range_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """"Declared once": one key added to ``[data]``'s declaration (``DataSpec.section``) — and no other edit — is
    accepted in a tree, written back into it, listed by ``phalanx list sections`` with its type, range and
    description, and range-checked with its allowed range in the error, named as written."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    table = {"data": {"name": BLOBS, "classes": 3}, "run": {"workers": 4, "rounds": 2, "eval_every": 1}}
    with pytest.raises(ConfigError, match=r"^\[data\]\.classes=3 is invalid: allowed a key of \[data\]: name, "):
        tree.to_flat(table)  # not declared yet: not a key of [data]
    assert "data,classes," not in _listing()

    monkeypatch.setattr(specs.DataSpec, "section", concerns.DATA.with_key(CLASSES))
    flat = tree.to_flat(table)
    assert flat["dataset_params"] == {"classes": 3}
    assert tree.to_tree(flat)["data"] == {"name": BLOBS, "classes": 3}
    assert make_config(table).dataset_params == {"classes": 3}  # accepted: the loader takes it
    assert 'data,classes,dataset_params.classes,all,int,"≥ 2, ≤ 100",2,classes of a generated data set' in _listing()
    with pytest.raises(ConfigError, match=r"^\[data\]\.classes=1 is invalid: allowed greater than or equal to 2$"):
        make_config({**table, "data": {"name": BLOBS, "classes": 1}})
    with pytest.raises(ConfigError, match=r"^dataset_params\.classes=101 is invalid: allowed less than or equal to "
                       r"100$"):
        make_config({"dataset": BLOBS, "dataset_params": {"classes": 101}})  # flat: named flat
    with pytest.raises(ConfigError, match=r"^\[data\]\.classes='3' is invalid: allowed an integer$"):
        make_config({**table, "data": {"name": BLOBS, "classes": "3"}})


def test_the_docs_recipe_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/config.md's "Adding a config section, or a key of one": its block runs (its declaration undone after)."""
    import re

    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setattr(specs.DataSpec, "section", concerns.DATA)  # restored after the block replaced it
    text = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    exec(compile(block, "docs/config.md", "exec"), {})
    assert specs.DataSpec.section.by_key["classes"] == CLASSES


def test_the_ownership_of_an_added_key_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a key added to ``[data]``'s declaration whose flat key ``[run]`` owns (``seed``) is caught by
    the ownership check (``tests/test_tree.py``) without any list to extend."""
    from tests.test_tree import ownership_problems

    monkeypatch.setattr(specs.DataSpec, "section", concerns.DATA.with_key(Key("seed", "seed", int, 0, "x", ge=0)))
    assert ownership_problems(tree.owners()) == ["seed: ['run', 'data']"]


def _pydantic_words(key: Key, value: Any) -> str:
    """What pydantic said of ``value`` when ``key``'s range was a constraint of the schema's field (as before)."""
    bounds = {b: getattr(key, b) for b in ("ge", "gt", "le", "lt") if getattr(key, b) is not None}
    model = create_model("M", __config__={"strict": True, "allow_inf_nan": False}, x=(key.type, Field(**bounds)))
    try:
        model(x=value)
    except ValidationError as exc:
        return str(exc.errors()[0]["msg"]).removeprefix("Input should be ")
    return ""


def _outside(key: Key) -> list[Any]:
    """Values just outside ``key``'s range, of its type."""
    out = []
    for bound, step in ((key.ge, -1), (key.gt, 0), (key.le, 1), (key.lt, 0)):
        if bound is not None:
            value = bound + step
            out.append(key.type(value) if key.type in (int, float) else value)
    return out


def test_every_range_error_reads_as_it_did_on_the_schema() -> None:
    """Each declared range, checked by its declaration, refuses what the schema's constraint refused, in pydantic's
    words (every message users saw stays byte for byte: ``tests/test_user_errors.py``, ``tests/test_tree_errors.py``
    pin some; this pins each range), naming the flat key — and a value in range passes."""
    seen = 0
    for section in concerns.checked():
        for key in section.keys:
            for value in _outside(key):
                # server_lr is federated averaging's own key (with dsgd, it is lr's role spelling: lr)
                context = {"algorithm": "fedavg"} if key.flat == "server_lr" else {}
                with pytest.raises(ConfigError) as caught:
                    make_config({key.flat: value, **context})
                assert str(caught.value) == f"{key.flat}={value!r} is invalid: allowed {_pydantic_words(key, value)}"
                seen += 1
            if key.ge is not None or key.gt is not None:
                declare.check({key.flat: key.default}, [section])  # the default is in range
    assert seen >= 34  # workers (both sides), byzantine, rounds, seed, …, lr, clients_per_round, dp_delta (both), …


def _flat_keys() -> set[str]:
    return {k.flat for s in concerns.checked() for k in s.keys if "." not in k.flat}


def _counted_checks(table: dict[str, Any]) -> Counter[str]:
    """How many times each declared key's range is checked while ``table`` is validated."""
    counted: Counter[str] = Counter()
    real = Key.refusal

    def counting(self: Key, value: Any) -> str | None:
        counted[self.flat] += 1
        return real(self, value)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Key, "refusal", counting)
        make_config(table)
    return counted


FEDAVG_DP = {"run": {"workers": 6, "rounds": 3}, "rule": {"f": 1},
             "algorithm": {"name": "fedavg", "clients_per_round": 4, "local_epochs": 0.5, "lr": 0.05},
             "server": {"optimizer": {"lr": 0.5, "momentum": 0.5}}, "stages": {"dp": {"noise": 1.0, "clip": 1.0}}}
"""A run that sets keys of every kind of declaration: [run], [rule], fedavg's own, SGD's, the privacy stage's."""


def test_the_schema_checks_no_declared_range_a_second_time() -> None:
    """One check: the schema's fields carry no constraint of their own (the declaration's check is the one), and the
    range of every declared key — the tree's sections', the workers' optimisation, fedavg's and gossip's own keys,
    SGD's, the privacy stage's — is checked exactly once per validation, a run that sets them or not."""
    assert _constrained() == []
    for table in ({"run": {"workers": 5, "rounds": 3}, "rule": {"f": 1}}, FEDAVG_DP):
        counted = _counted_checks(table)
        assert set(counted.values()) == {1}, counted
        assert set(counted) == _flat_keys()


def _constrained(fields: Any = None) -> list[str]:
    """The schema's fields — of *any* key, declared or not — that carry a constraint of their own (a range pydantic
    would check: a second check, or one no declaration holds)."""
    fields = RunConfig.model_fields if fields is None else fields
    return [name for name, f in fields.items() if f.metadata]


def test_a_schema_that_checks_a_range_again_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: ``workers`` with ``ge=1`` on the schema's field again (the range checked twice)."""
    import annotated_types

    monkeypatch.setattr(RunConfig.model_fields["workers"], "metadata", [annotated_types.Ge(1)])
    assert _constrained() == ["workers"]


def test_the_schema_checks_no_range_of_its_own() -> None:
    """The schema holds no range for any key: none on a field (above), no validator but the one that reads
    ``tracking = "mlflow"`` as ``["mlflow"]`` (a spelling, which checks nothing), and every field's key is declared by
    a component (each once), but the three the stages' adapter reads (which have no range)."""
    decorators = RunConfig.__pydantic_decorators__
    assert set(decorators.field_validators) == {"_one_tracker"} and not decorators.model_validators
    assert not decorators.validators and not decorators.root_validators
    assert set(RunConfig.model_fields) - _flat_keys() == {"server_projection", "server_projection_params", "stages"}
    twice = [k for k, n in Counter(k.flat for s in concerns.checked() for k in s.keys).items() if n > 1]
    assert twice == []


def test_a_range_put_back_on_the_schema_for_any_key_is_caught() -> None:
    """The mutants: a schema with a range written on a field again — a key that a component declares (fedavg's
    ``local_steps``, SGD's ``server_momentum``, the privacy stage's ``dp_delta``, the workers' ``lr``) or one no
    declaration holds (``stages``) — and a schema whose validator checks a range (``lr > 0``): each is found."""
    from pydantic import field_validator

    for name, annotation, field in (
        ("local_steps", int, Field(1, ge=1)), ("server_momentum", float, Field(0.0, ge=0, lt=1)),
        ("dp_delta", float, Field(1e-5, gt=0, lt=1)), ("lr", float, Field(0.1, gt=0)),
        ("stages", dict[str, dict[str, Any]], Field(default_factory=dict, max_length=64)),
    ):
        mutant = create_model("Mutant", __base__=RunConfig, **{name: (annotation, field)})  # type: ignore[call-overload]
        assert _constrained(mutant.model_fields) == [name]

    class Checking(RunConfig):
        @field_validator("lr")
        @classmethod
        def _positive(cls, value: float) -> float:
            if value <= 0:
                raise ValueError("greater than 0")
            return value

    assert set(Checking.__pydantic_decorators__.field_validators) == {"_one_tracker", "_positive"}


def test_a_key_declared_by_two_components_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: federated averaging's declaration also declares ``batch_size`` (the workers' optimisation
    declares it): two declarations of one key, found."""
    from phalanx.training.algorithms.fedavg import FedAvg

    twice = FedAvg.config_section.with_key(Key("batch_size", "batch_size", int, 32, "x", ge=2))
    monkeypatch.setattr(FedAvg, "config_section", twice)
    assert [k for k, n in Counter(k.flat for s in concerns.checked() for k in s.keys).items() if n > 1] == [
        "batch_size"]


def test_the_components_declaration_is_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared once: a range changed on the component's own declaration (fedavg's ``local_steps`` at most 5, the
    privacy stage's ``dp_delta`` below 0.01) — and nowhere else — is the range a config is checked against, in
    pydantic's words, named as written; its listing shows it."""
    from phalanx.training.algorithms.fedavg import FedAvg
    from phalanx.training.stages.privacy import ClientDP

    fedavg = FedAvg.config_section
    steps = Key("local_steps", "local_steps", int, 1, "x", ge=1, le=5)
    monkeypatch.setattr(FedAvg, "config_section", type(fedavg)(fedavg.name, tuple(
        steps if k.key == "local_steps" else k for k in fedavg.keys)))
    dp = ClientDP.config_section
    delta = Key("delta", "dp_delta", float, 1e-5, "x", gt=0, lt=0.01)
    monkeypatch.setattr(ClientDP, "config_section", type(dp)(dp.name, tuple(
        delta if k.key == "delta" else k for k in dp.keys)))
    with pytest.raises(ConfigError, match=r"^local_steps=6 is invalid: allowed less than or equal to 5$"):
        make_config({"algorithm": "fedavg", "local_steps": 6})
    with pytest.raises(ConfigError, match=r"^\[algorithm\]\.local_steps=6 is invalid: allowed less than or equal to "
                       r"5$"):
        make_config({"algorithm": {"name": "fedavg", "local_steps": 6}})
    with pytest.raises(ConfigError, match=r"^\[stages\.dp\]\.delta=0\.5 is invalid: allowed less than 0\.01$"):
        make_config({"stages": {"dp": {"noise": 1.0, "clip": 1.0, "delta": 0.5}}})
    assert make_config({"algorithm": "fedavg", "local_steps": 5}).local_steps == 5
    assert 'algorithm,local_steps,local_steps,fedavg,int,"≥ 1, ≤ 5",1,x' in _listing()


def test_the_schema_is_made_from_the_declarations() -> None:
    """Each declared key's field: the declaration's default and description; its annotation (what a type checker
    reads) is checked against the declared type when the schema is made — the mutant declaring another type is a
    TypeError, a declared key the schema lacks too."""
    for section in concerns.checked():
        for key in section.keys:
            field = RunConfig.model_fields[key.flat]
            assert field.get_default(call_default_factory=True) == key.default and field.description == key.doc
    wrong = Section("run", (Key("workers", "workers", float, 20.0, "n"),))
    with pytest.raises(TypeError, match=r"^\[run\]\.workers: the schema's field 'workers' is <class 'int'>"):
        declare.bind(RunConfig.model_fields, [wrong])
    with pytest.raises(TypeError, match="missing"):
        declare.bind(RunConfig.model_fields, [Section("run", (Key("n", "nope", int, 1, "n"),))])


def test_the_first_error_is_the_first_key_as_before() -> None:
    """Two bad keys: the first in the schema's order is reported, whichever checks it (a declared range before a
    type the schema refuses, and the other way round) — as when pydantic checked both."""
    with pytest.raises(ConfigError, match=r"^workers=0 is invalid"):
        make_config({"batch_size": 0, "workers": 0})
    with pytest.raises(ConfigError, match=r"^workers=0 is invalid"):
        make_config({"workers": 0, "rounds": "x"})
    with pytest.raises(ConfigError, match=r"^workers='x' is invalid"):
        make_config({"workers": "x", "rounds": 0})
    with pytest.raises(ConfigError, match=r"^workers=0 is invalid"):
        make_config({"workers": 0, "nope": 1})


# --- item 2: a component parameter's name is checked once ---------------------------------------------------------

def _name_checks(table: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times each component's parameter names are checked while ``table`` is validated: every call of
    the one checker (``phalanx.plugins.check_params``, as the attacks and the algorithms call it)."""
    from phalanx.attacks import registry
    from phalanx.training.algorithms import base

    counted: Counter[str] = Counter()
    real = registry.check_params

    def counting(what: str, fn: Any, params: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
        counted[what] += 1
        real(what, fn, params, skip)

    monkeypatch.setattr(registry, "check_params", counting)
    monkeypatch.setattr(base, "check_params", counting)
    monkeypatch.setattr(tree, "check_params", counting, raising=False)
    config.validate(table)
    return counted


TREE = {"run": {"workers": 5, "byzantine": 1, "rounds": 2}, "rule": {"f": 1},
        "attack": {"name": "alie", "z": 1.0}, "algorithm": {"name": "scaffold", "local_steps": 2}}
"""An attack's and an algorithm of one's own's parameters written in their sections."""


def test_each_component_parameter_name_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``[attack] z`` and ``[algorithm] local_steps`` of an algorithm of one's own: the adapter routes them to
    ``attack_params`` / ``algorithm_params``, and their names are checked once — by the component as it is built
    (a flat config's are checked by the same one check)."""
    assert _name_checks(TREE, monkeypatch) == Counter({"alie": 1, "scaffold": 1})
    monkeypatch.undo()
    flat = tree.to_flat(TREE)
    assert flat["attack_params"] == {"z": 1.0} and flat["algorithm_params"] == {"local_steps": 2}
    assert _name_checks(flat, monkeypatch) == Counter({"alie": 1, "scaffold": 1})


def test_an_adapter_that_checks_the_names_again_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: the adapter checks ``[attack]``'s keys against the attack's constructor itself (as it did before
    issue 39's item 2) and the component checks them again when it is built — counted twice."""
    from phalanx import attacks
    from phalanx.plugins import check_params

    real = tree._put

    def checking_twice(made: dict[str, Any], spelled: dict[str, str], section: str, key: str, value: Any,
                       context: dict[str, Any]) -> None:
        if section == "attack" and key != "name":
            tree.check_params(context["attack"], attacks.get_class(context["attack"]), {key: value})  # type: ignore[attr-defined]
        real(made, spelled, section, key, value, context)

    monkeypatch.setattr(tree, "check_params", check_params, raising=False)
    monkeypatch.setattr(tree, "_put", checking_twice)
    assert _name_checks(TREE, monkeypatch)["alie"] == 2


def test_the_listing_shows_a_description_as_written() -> None:
    """A declaration's description is data, not markup: ``phalanx[signing]`` in ``[run].sign_key``'s is printed as
    written in the terminal's table (the mutant that passes it as rich markup prints ``phalanx``)."""
    from typer.testing import CliRunner

    from phalanx import cli

    res = CliRunner().invoke(cli.app, ["list", "sections"], env={"COLUMNS": "2000"})
    assert res.exit_code == 0, res.output
    assert "needs phalanx[signing]" in res.output


def _listed_ranges() -> dict[str, set[str]]:
    """Flat key → the allowed ranges ``phalanx list sections`` prints for it (each row that names it)."""
    import csv
    import io

    out: dict[str, set[str]] = {}
    for row in csv.DictReader(io.StringIO(_listing().partition("\n")[2])):  # after the "# title" line
        out.setdefault(row["flat key"], set()).add(row["allowed"])
    return out


def _ranged() -> dict[str, str]:
    return {k.flat: k.allowed() for s in concerns.checked() for k in s.keys if k.allowed() != "any"}


def test_the_listing_shows_every_declared_range() -> None:
    """``phalanx list sections`` prints each key's range from the declaration of the component that reads it — the
    tree's sections', fedavg's own keys, the workers' optimisation, SGD's, the privacy stage's — on every row that
    lists the key."""
    listed = _listed_ranges()
    assert {"clients_per_round", "lr", "server_momentum", "dp_delta", "workers"} <= set(_ranged())
    for flat, allowed in _ranged().items():
        assert listed.get(flat) == {allowed}, (flat, listed.get(flat))


def test_a_listing_that_reads_the_tree_sections_only_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: the listing reads the ranges of the tree's own sections only (``specs.declared()``), not the
    components' declarations — SGD's and the privacy stage's keys, fedavg's, the workers' optimisation are then
    listed without their range."""
    from phalanx.experiments import treetext

    ranged = _ranged()
    monkeypatch.setattr(treetext.concerns, "checked", specs.declared)
    listed = _listed_ranges()
    missing = sorted(flat for flat, allowed in ranged.items() if listed.get(flat) != {allowed})
    assert {"clients_per_round", "dp_delta", "lr", "server_momentum"} <= set(missing)
