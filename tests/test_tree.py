"""The config tree (issue 39, item 2): every flat key in exactly one section, the one adapter both ways (the run id
computed from the flat form, so every pinned run id is the same written as a tree), errors generated from the
sections' declarations, ``--set`` of a tree key — each check with the mutant it must reject."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.test_compat import IDS

from phalanx.errors import ConfigError
from phalanx.experiments import concerns, config, grid, legacy, make_config, specs, tree, treetext
from phalanx.experiments.declare import Key, Section
from phalanx.experiments.schema import RunConfig

EXAMPLES = sorted(p for p in (Path(__file__).resolve().parent.parent / "examples").rglob("*.toml")
                  if p.name != "pyproject.toml")
"""Every documented example config (a Python project's pyproject.toml is not one)."""


def ownership_problems(owners: dict[str, list[str]]) -> list[str]:
    """Each schema key that no section owns or that two own."""
    return [f"{key}: {owners.get(key, [])}" for key in RunConfig.model_fields if len(owners.get(key, [])) != 1] + [
        f"{key}: no such key" for key in owners if key not in RunConfig.model_fields]


def test_every_flat_key_belongs_to_exactly_one_section() -> None:
    assert ownership_problems(tree.owners()) == []


def test_a_section_declaring_a_key_another_owns_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: [rule]'s declaration also declares ``workers`` (owned by [run])."""
    rule = concerns.RULE.with_key(Key("n", "workers", int, 20, "n"))
    monkeypatch.setattr(specs.AlgorithmSpec, "sections",
                        tuple(rule if s.name == "rule" else s for s in specs.AlgorithmSpec.sections))
    assert ownership_problems(tree.owners()) == ["workers: ['run', 'rule']"]


def test_a_key_no_section_owns_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: [run]'s declaration forgets ``seed``."""
    forgetting = Section("run", tuple(k for k in concerns.RUN.keys if k.key != "seed"))
    monkeypatch.setattr(specs.RunShape, "section", forgetting)
    assert ownership_problems(tree.owners()) == ["seed: []"]


@pytest.mark.parametrize(("what", "data", "run_id"), IDS, ids=[case[0] for case in IDS])
def test_every_pinned_run_id_is_the_same_written_as_a_tree(what: str, data: dict[str, Any], run_id: str) -> None:
    written = tree.to_tree(data)
    assert set(written) <= {*tree.SECTIONS, "server"}, written  # every key went into a section
    assert grid.run_id(make_config(written)) == run_id, what
    text = treetext.dumps(written)  # and as a TOML file
    assert grid.run_id(make_config(config.toml_loads(text))) == run_id, text


def round_trip(flat: dict[str, Any], to_flat: Callable[[Any], Any] = tree.to_flat) -> bool:
    """flat → tree → flat is the identity on ``flat`` as validation reads it."""
    return bool(to_flat(tree.to_tree(flat)) == tree._normalised(flat))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_flat_to_tree_to_flat_is_the_identity_on_every_example(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(path.parent))  # the plug-in example's own package (mylab)
    flat = tree.to_flat(config.load_toml(path))
    assert round_trip(flat)
    written = tree.to_tree(flat)
    assert set(written) <= {*tree.SECTIONS, "server", "tie", "slurm"}, written
    again = config.toml_loads(treetext.dumps(written))
    assert again == written
    assert sorted(r.run_id for r in grid.runs(again)) == sorted(r.run_id for r in grid.runs(flat))  # same runs


def test_an_adapter_that_drops_a_section_key_fails_the_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: the adapter forgets [rule].f on its way back (a run of f = 2 would become one of f = 0)."""
    real = tree._merge

    def dropping(made: dict[str, Any], spelled: dict[str, str], flat: str, value: Any, where: str) -> None:
        if flat != "f":
            real(made, spelled, flat, value, where)

    flat = CONVERTED["federated/fedavg.toml"]
    assert round_trip(flat)
    monkeypatch.setattr(tree, "_merge", dropping)
    assert not round_trip(flat)


CONVERTED = {
    "federated/fedavg.toml": {
        "algorithm": "fedavg", "dataset": "digits", "model": "mlp", "workers": 100, "clients_per_round": 10,
        "local_steps": 5, "batch_size": 8, "lr": 0.05, "momentum": 0.0, "server_lr": 1.0, "byzantine": 10, "f": 2,
        "aggregator": ["mean", "cwtm", "nnm>cwtm"], "attack": "alie", "partition": "dirichlet", "alpha": 0.5,
        "rounds": 200, "eval_every": 20, "seed": [0, 1, 2]},
    "decentralized/gossip.toml": {
        "algorithm": "gossip", "graph": "torus", "dataset": "digits", "model": "mlp",
        "model_params": {"hidden": [32]}, "workers": 16, "byzantine": 2, "f": 1, "aggregator": ["mean", "cwtm"],
        "attack": "signflip", "partition": "dirichlet", "alpha": 1.0, "batch_size": 16, "lr": 0.1, "momentum": 0.9,
        "rounds": 100, "eval_every": 25, "seed": [0, 1, 2]},
}
"""The shipped examples now written as trees, as they were written flat before."""


@pytest.mark.parametrize("name", list(CONVERTED))
def test_the_examples_written_as_trees_keep_their_run_ids(name: str) -> None:
    path = Path(__file__).resolve().parent.parent / "examples" / name
    as_tree = config.load_toml(path)
    assert tree.is_tree(as_tree)
    assert sorted(r.run_id for r in grid.runs(config.load_grid(path, []))) == sorted(
        r.run_id for r in grid.runs(CONVERTED[name]))
    assert tree.to_flat(as_tree) == CONVERTED[name] | ({"lr": 0.05} if name.startswith("fed") else {})


def test_a_table_without_sections_is_read_as_it_is() -> None:
    flat = {"workers": 10, "aggregator": "cwtm", "attack": "alie", "attack_params": {"z": 1.0}, "stages":
            {"fail_closed": {"window": 5}}}
    assert tree.to_flat(flat) is flat


def test_lr_means_one_thing_per_section() -> None:
    dsgd = tree.to_flat({"server": {"optimizer": {"lr": 0.3}}})
    fedavg = tree.to_flat({"algorithm": {"name": "fedavg", "lr": 0.05}, "server": {"optimizer": {"lr": 0.5}}})
    scaffold = tree.to_flat({"algorithm": {"name": "scaffold", "lr": 0.05}, "server": {"optimizer": {"lr": 0.5}}})
    assert dsgd == {"lr": 0.3}
    assert fedavg == {"algorithm": "fedavg", "lr": 0.05, "server_lr": 0.5}
    assert scaffold == {"algorithm": "scaffold", "algorithm_params": {"lr": 0.05}, "lr": 0.5}
    with pytest.raises(ConfigError, match=r"^\[algorithm\]\.lr=0\.3 .*lr belongs in \[server\.optimizer\]"):
        tree.to_flat({"algorithm": {"lr": 0.3}})
    with pytest.raises(ConfigError, match=r"^\[server\.optimizer\]\.lr=0\.3 .*lr belongs in \[algorithm\]"):
        tree.to_flat({"algorithm": {"name": "gossip"}, "server": {"optimizer": {"lr": 0.3}}})


def test_an_unknown_key_names_its_section_and_the_closest_key() -> None:
    with pytest.raises(ConfigError) as err:
        tree.to_flat({"rule": {"spec": "cwtm", "ff": 3}})
    assert str(err.value).startswith("[rule].ff=3 is invalid: allowed a key of [rule]: spec, f")
    assert "unknown key; did you mean f?" in str(err.value)
    # an [attack] key the section does not declare is the attack's parameter: its name is checked once, by the
    # attack as it is built (tests/test_declared.py counts it), and named as written
    assert tree.to_flat({"attack": {"name": "alie", "zz": 1}}) == {"attack": "alie", "attack_params": {"zz": 1}}
    with pytest.raises(ConfigError, match=r"^\[attack\]\.zz=\['zz'\] is invalid: allowed parameters of alie: z$"):
        make_config({"attack": {"name": "alie", "zz": 1}})
    with pytest.raises(ConfigError, match=r"^\[algorithm\]\.local_step=5 .*did you mean local_steps"):
        tree.to_flat({"algorithm": {"name": "fedavg", "local_step": 5}})


def test_a_key_in_the_wrong_section_says_which_owns_it() -> None:
    with pytest.raises(ConfigError, match=r"^\[rule\]\.workers=3 .*\(workers belongs in \[run\]\)"):
        tree.to_flat({"rule": {"workers": 3}})
    with pytest.raises(ConfigError, match=r"^\[model\]\.seed=1 .*\(seed belongs in \[run\]\)"):
        tree.to_flat({"model": {"name": "mlp", "seed": 1}})


def test_a_section_and_the_flat_spelling_of_its_key_are_refused_together() -> None:
    with pytest.raises(ConfigError, match=r"^\[rule\]\.f=3 is invalid: .*two spellings: \[rule\]\.f and f"):
        tree.to_flat({"f": 2, "rule": {"f": 3}})
    with pytest.raises(ConfigError, match=r"two spellings: \[stages\.dp\] and dp_noise"):
        tree.to_flat({"dp_noise": 1.0, "stages": {"dp": {"noise": 1.0, "clip": 1.0}}})
    # another key of the same section written flat is fine
    assert tree.to_flat({"f": 2, "rule": {"spec": "cwtm"}}) == {"f": 2, "aggregator": "cwtm"}


def test_the_built_in_stages_sections_are_their_flat_keys() -> None:
    flat = tree.to_flat({"run": {"workers": 10}, "stages": {"dp": {"noise": 1.0, "clip": 2.0},
                                                           "fail_closed": {"window": 5}}})
    assert flat == {"workers": 10, "dp_noise": 1.0, "dp_clip": 2.0, "stages": {"fail_closed": {"window": 5}}}
    assert tree.to_tree(flat)["stages"] == {"dp": {"noise": 1.0, "clip": 2.0}, "fail_closed": {"window": 5}}
    cfg = make_config({"run": {"workers": 10}, "stages": {"dp": {"noise": 1.0, "clip": 2.0}}})
    assert (cfg.dp_noise, cfg.dp_clip, cfg.stages) == (1.0, 2.0, {})


def test_pre_aggregation_is_written_before_the_rule() -> None:
    assert tree.to_flat({"rule": {"pre": "nnm", "spec": ["cwtm", "krum"], "f": 1}}) == {
        "aggregator": ["nnm>cwtm", "nnm>krum"], "f": 1}
    with pytest.raises(ConfigError, match=r"^\[rule\]\.pre="):
        tree.to_flat({"rule": {"pre": "nnm"}})


@pytest.mark.parametrize(("override", "expected"), [
    ("rule.f=3", {"f": 3}),
    ('rule={spec="krum", f=3}', {"aggregator": "krum", "f": 3}),
    ("attack.z=1.5", {"attack_params": {"z": 1.5}}),
    ("server.optimizer.lr=0.5", {"lr": 0.5}),
    ("server.optimizer.momentum=0.9", {"server_momentum": 0.9}),
    ("stages.dp.noise=1.0", {"dp_noise": 1.0}),
    ("run.workers=12", {"workers": 12}),
    ("data.name=digits", {"dataset": "digits"}),
    ("model.hidden=[16]", {"model_params": {"hidden": [16]}}),
    ("attack=alie", {"attack": "alie"}),
])
def test_set_takes_a_tree_key(override: str, expected: dict[str, Any]) -> None:
    base = {"workers": 10, "aggregator": "cwtm", "f": 1, "attack": "alie"}
    assert config.apply_overrides(base, [override]) == {**base, **expected}


def test_set_of_a_tree_key_replaces_the_files_spelling(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[rule]\nspec = "cwtm"\nf = 1\n\n[algorithm]\nname = "fedavg"\n')
    assert config.load_grid(path, ["rule.f=3", "f=4"])["f"] == 4
    assert config.load_grid(path, ["f=4", "rule.f=3"])["f"] == 3
    assert config.load_grid(path, ["server.optimizer.lr=0.5"])["server_lr"] == 0.5
    with pytest.raises(ConfigError, match=r"^\[rule\]\.ff=.*did you mean f\?"):
        config.load_grid(path, ["rule.ff=3"])


def test_a_tree_is_validated_as_its_flat_form() -> None:
    """The flat key's own check, with its own message, naming the key as written (tests/test_tree_errors.py)."""
    with pytest.raises(ConfigError, match=r"^\[rule\]\.f=20 is invalid: allowed < workers/2 = 5"):
        make_config({"run": {"workers": 10}, "rule": {"f": 20}})
    with pytest.raises(ConfigError, match=r"^f=20 is invalid: allowed < workers/2 = 5"):
        make_config({"workers": 10, "f": 20})
    assert legacy.TREE in tree.SECTIONS


def test_the_command_line_lists_the_sections_and_shows_a_config_as_its_tree(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from phalanx import cli

    runner = CliRunner()
    res = runner.invoke(cli.app, ["list", "sections", "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert "rule,spec,aggregator,all" in res.output and "server.optimizer,lr,server_lr,fedavg" in res.output
    flat = config.load_grid(None, ["f=3"])
    for how in ("--tree", "--flat"):
        res = runner.invoke(cli.app, ["config", "show", "--set", "rule.f=3", how])
        assert res.exit_code == 0, res.output
        shown = config.toml_loads(res.output)
        assert tree.is_tree(shown) == (how == "--tree")
        assert sorted(r.run_id for r in grid.runs(shown)) == sorted(r.run_id for r in grid.runs(flat))


def test_the_docs_example_is_one_run_both_ways() -> None:
    """docs/config.md's job written as a tree and flat: the same runs, with the same run ids."""
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    as_tree, as_flat = (config.toml_loads(b) for b in re.findall(r"```toml\n(.*?)```", text, flags=re.S)[:2])
    assert tree.is_tree(as_tree) and not tree.is_tree(as_flat)
    assert tree.to_flat(as_tree) == as_flat
    ids = [r.run_id for r in grid.runs(as_flat)]
    assert len(ids) == 9 and sorted(r.run_id for r in grid.runs(as_tree)) == sorted(ids)


def test_a_hostile_section_is_one_line_error() -> None:
    """A file may hold anything: a key with a line break, a section that is no table, a server table of other
    things — each a one-line ConfigError naming where, never a crash."""
    for table in ({"rule": {"a\nb": 1}}, {"rule": "cwtm"}, {"server": {"optimizer": 5}}, {"server": {"x": {}}},
                  {"algorithm": {"name": 5, "lr": 1}}, {"attack": {"name": "no-such-attack", "z": 1}}):
        try:
            make_config(table)
        except ConfigError as exc:
            assert "\n" not in str(exc), str(exc)
        else:
            raise AssertionError(f"accepted {table}")


def test_set_of_the_runs_lr_replaces_its_role_spelling() -> None:
    base = {"algorithm": "fedavg", "client_lr": 0.05}
    assert config.apply_overrides(base, ["algorithm.lr=0.2"]) == {"algorithm": "fedavg", "lr": 0.2}


SECTION_KEYS = sorted({k for keys in tree.TABLE.values() for k in keys} | {"lr", "z", "pre", "spec", "f", "noise",
                                                                           "clip", "window", "hidden", "weights"})
NAMES = ["dsgd", "fedavg", "gossip", "scaffold", "alie", "none", "cwtm", "sgd", "adam", "mlp", "digits", "crfl",
         "dp", "fail_closed", "no:such", ""]


def _values() -> Any:
    from hypothesis import strategies as st

    leaf = st.one_of(st.sampled_from(NAMES), st.integers(-3, 2**70), st.floats(allow_nan=True), st.booleans(),
                     st.text(max_size=4))
    return st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.sampled_from(SECTION_KEYS + NAMES), inner,
                                                                      max_size=3)), max_leaves=6)


def test_a_random_tree_is_read_or_refused_in_one_line() -> None:
    """Random trees (the section names, their keys and others, every kind of value; a ``[tie]`` of sections)
    through the adapter both ways, ``--set`` and validation: each succeeds or raises a one-line ConfigError — never
    another exception — and no error of validation names the flat spelling of a key the tree wrote in a section
    (it names ``[section].key``: tests/test_tree_errors.py)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from phalanx.experiments import spelling

    heads = st.sampled_from([*tree.SECTIONS, "server", "tie", "f", "workers", "attack_params"])
    section = st.dictionaries(st.sampled_from(SECTION_KEYS + NAMES), _values(), max_size=4)
    tie = st.dictionaries(st.sampled_from([*tree.SECTIONS, "local_steps", "rounds"]),
                          st.one_of(section, st.lists(_values(), min_size=2, max_size=2)), max_size=3)
    tables = st.dictionaries(heads, st.one_of(section, _values(), tie), max_size=4)
    sets = st.lists(st.tuples(st.sampled_from(["rule.f", "rule", "attack.z", "server.optimizer.lr", "algorithm.lr",
                                               "stages.dp.noise", "model.hidden", "run", "data.name", "lr"]),
                              st.sampled_from(["3", "{spec='cwtm', f=1}", "[1, 2]", "x", "1.5", "{z=1}", "true"])),
                    max_size=2)

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(tables, sets)
    def check(table: dict[str, Any], overrides: list[tuple[str, str]]) -> None:
        for step in (lambda: tree.to_tree(tree.to_flat(table)),
                     lambda: config.apply_overrides(table, [f"{k}={v}" for k, v in overrides]),
                     lambda: grid.configs({"workers": 5, "rounds": 2, **table})):
            try:
                step()
            except ConfigError as exc:
                assert "\n" not in str(exc), str(exc)
        written = spelling.Written()
        try:
            _, written = tree.read(table)
            for point in grid.expand({"workers": 5, "rounds": 2, **table}):
                config.validate(point)
        except ConfigError as exc:
            assert written.spelling(exc.parameter) is None, str(exc)

    check()
