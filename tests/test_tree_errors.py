"""Issue 39, item 2: a value is checked once, by its key's declaration (the schema's type and range, the
component's own check), and the error names the key as the user wrote it — ``[model].hidden`` in a tree, the flat
``model_params.hidden`` in a flat config (whose messages ``tests/test_user_errors.py`` pins) — through every way in
(:func:`~phalanx.experiments.config.validate`, a grid, a file with ``--set``). Each check has its mutant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phalanx.errors import ConfigError
from phalanx.experiments import config, grid, make_config, spelling, tree, treetext

BOTH: list[tuple[dict[str, Any], str, dict[str, Any], str]] = [
    ({"run": {"workers": 10}, "rule": {"f": 20}}, r"\[rule\]\.f=20",
     {"workers": 10, "f": 20}, r"f=20"),
    ({"run": {"workers": "x"}}, r"\[run\]\.workers='x'", {"workers": "x"}, r"workers='x'"),
    ({"model": {"hiden": [3]}}, r"\[model\]\.hiden=",
     {"model_params": {"hiden": [3]}}, r"mlp parameter="),
    ({"model": {"params": {"hiden": [3]}}}, r"\[model\]\.params\.hiden=",
     {"model_params": {"hiden": [3]}}, r"mlp parameter="),
    ({"server": {"optimizer": {"name": "adam", "beta9": 1}}}, r"\[server\.optimizer\]\.beta9=",
     {"server_optimizer": "adam", "server_optimizer_params": {"beta9": 1}}, r"adam parameter="),
    ({"server": {"optimizer": {"name": "adam", "beta1": 7}}}, r"\[server\.optimizer\]\.beta1=7",
     {"server_optimizer": "adam", "server_optimizer_params": {"beta1": 7}}, r"server_optimizer_params\.beta1=7"),
    ({"server": {"optimizer": {"momentum": 2}}}, r"\[server\.optimizer\]\.momentum=2",
     {"server_momentum": 2}, r"server_momentum=2"),
    ({"stages": {"dp": {"noise": -1}}}, r"\[stages\.dp\]\.noise=-1", {"dp_noise": -1}, r"dp_noise=-1"),
    ({"stages": {"crfl": {"clip": -1}}}, r"\[stages\.crfl\]\.clip=-1",
     {"server_projection": "crfl", "server_projection_params": {"clip": -1}}, r"server_projection_params\.clip=-1"),
    ({"run": {"workers": 7}, "stages": {"update_clip": {"c": -1}}}, r"\[stages\.update_clip\]\.c=-1",
     {"workers": 7, "stages": {"update_clip": {"c": -1}}}, r"stages\.update_clip\.c=-1"),
    ({"run": {"workers": 7}, "stages": {"update_clip": {"cc": 1}}}, r"\[stages\.update_clip\]\.cc=1",
     {"workers": 7, "stages": {"update_clip": {"cc": 1}}}, r"stages\.update_clip\.cc=1"),
    ({"run": {"workers": 7}, "stages": {"adaptive_clip": {"quantile": 2}}}, r"\[stages\.adaptive_clip\]\.quantile=2",
     {"workers": 7, "stages": {"adaptive_clip": {"quantile": 2}}}, r"stages\.adaptive_clip\.quantile=2"),
    ({"algorithm": {"name": "gossip"}, "run": {"byzantine": 0}, "attack": {"name": "none"},
      "rule": {"spec": "mean", "f": 0}, "stages": {"update_clip": {}}}, r"\[stages\.update_clip\]='update_clip'",
     {"algorithm": "gossip", "byzantine": 0, "attack": "none", "aggregator": "mean", "f": 0,
      "stages": {"update_clip": {}}}, r"stages\.update_clip='update_clip'"),
    ({"run": {"workers": 7}, "stages": {"nope": {}}}, r"\[stages\.nope\]='nope'",
     {"workers": 7, "stages": {"nope": {}}}, r"stages\.nope='nope'"),
    ({"attack": {"name": "alie", "z": "x"}}, r"\[attack\]\.z='x'",
     {"attack": "alie", "attack_params": {"z": "x"}}, r"z='x'"),
    ({"algorithm": {"name": "fedavg", "local_steps": 0}}, r"\[algorithm\]\.local_steps=0",
     {"algorithm": "fedavg", "local_steps": 0}, r"local_steps=0"),
    ({"rule": {"spec": "nope"}}, r"\[rule\]\.spec='nope'", {"aggregator": "nope"}, r"aggregator='nope'"),
    ({"data": {"params": {"zz": 1}}}, r"\[data\]\.params\.zz=1", {"dataset_params": {"zz": 1}},
     r"dataset_params\.zz=1"),
]
"""(a tree, the start of its error, the same config flat, the start of the flat one's — today's message)."""


@pytest.mark.parametrize(("as_tree", "tree_error", "flat", "flat_error"), BOTH, ids=[b[1] for b in BOTH])
def test_an_error_names_the_key_as_it_was_written(as_tree: dict[str, Any], tree_error: str, flat: dict[str, Any],
                                                 flat_error: str) -> None:
    assert tree.to_flat(as_tree) == flat  # one config, two spellings
    with pytest.raises(ConfigError, match=rf"^{tree_error}.* is invalid: allowed ") as from_tree:
        make_config(as_tree)
    with pytest.raises(ConfigError, match=rf"^{flat_error}.* is invalid: allowed ") as from_flat:
        make_config(flat)
    # the one check: the same allowed range and hint, only the key's name differs
    assert (from_tree.value.allowed, from_tree.value.hint) == (from_flat.value.allowed, from_flat.value.hint)
    assert "\n" not in str(from_tree.value)


def test_the_mutant_that_forgets_the_spelling_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: validation that names the flat key whatever the user wrote (the check before issue 39's item 2)
    fails the test above."""
    monkeypatch.setattr(spelling, "respelled", lambda exc, written, flat_keys=(): exc)
    with pytest.raises(ConfigError) as caught:
        make_config({"model": {"name": "mlp", "hiden": [3]}})
    assert not str(caught.value).startswith("[model].hiden")


def test_the_mutant_that_forgets_a_stages_section_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant of issue 39's trial (finding 1): an adapter that records the built-in stages' sections only (as
    before) names ``[stages.update_clip] c = -1`` in a tree ``stages.update_clip.c``, unlike every other section."""
    real = tree._written

    def mutant(spelled: dict[str, str], stages: Any, made: dict[str, Any]) -> spelling.Written:
        names = real(spelled, stages, made).names
        return spelling.Written(tuple((k, v) for k, v in names if not k.startswith("stages.")))

    as_tree = {"run": {"workers": 7}, "stages": {"update_clip": {"c": -1}}}
    with pytest.raises(ConfigError, match=r"^\[stages\.update_clip\]\.c=-1 is invalid"):
        make_config(as_tree)
    monkeypatch.setattr(tree, "_written", mutant)
    with pytest.raises(ConfigError) as caught:
        make_config(as_tree)
    assert str(caught.value).startswith("stages.update_clip.c=-1")  # what the test above refuses


def test_the_adapter_records_where_each_key_was_written() -> None:
    """The mutant of the record: an adapter that spelled a filled table as its first key (``model_params`` as
    ``[model].hidden``) would name every other parameter of the table after that one key."""
    _, written = tree.read({"model": {"hidden": [3], "norm": "group"}, "stages": {"dp": {"noise": 1.0}},
                            "rule": {"spec": "cwtm", "f": 1}, "workers": 5})
    assert written.spelling("model_params") == "[model]"
    assert written.spelling("model_params.hidden.0") == "[model].hidden.0"
    assert written.spelling("model_params.other") == "[model].other"
    assert written.spelling("dp_noise") == "[stages.dp].noise"
    assert written.spelling("aggregator") == "[rule].spec"
    assert written.spelling("workers") is None  # written flat beside the sections: named flat
    _, staged = tree.read({"run": {"workers": 5}, "stages": {"update_clip": {"c": 1.0}}})
    assert staged.spelling("stages.update_clip.c") == "[stages.update_clip].c"
    assert staged.spelling("stages.update_clip") == "[stages.update_clip]"
    assert tree.read({"workers": 5, "stages": {"update_clip": {"c": 1.0}}})[1] == spelling.Written()  # flat
    assert tree.read({"workers": 5})[1] == spelling.Written()


def test_a_grid_and_a_file_name_the_key_as_written(tmp_path: Path) -> None:
    """Through every way in: a grid of trees, a tree file (the spelling travels from the file to each point), and
    ``--set`` of the flat key on a tree file (then the flat key is what the user wrote)."""
    with pytest.raises(ConfigError, match=r"^\[rule\]\.f=20 is invalid"):
        grid.runs({"run": {"workers": 10, "seed": [0, 1]}, "rule": {"f": 20}})
    with pytest.raises(ConfigError, match=r"^\[run\]\.seed=\[\] is invalid: allowed a non-empty list"):
        grid.runs({"run": {"seed": []}})
    path = tmp_path / "job.toml"
    path.write_text('[run]\nworkers = 10\nrounds = 2\n\n[rule]\nspec = "cwtm"\nf = 20\n\n[model]\nhidden = [-1]\n')
    with pytest.raises(ConfigError, match=r"^\[rule\]\.f=20 is invalid"):
        grid.runs(config.load_grid(path, []))
    with pytest.raises(ConfigError, match=r"^f=30 is invalid"):
        grid.runs(config.load_grid(path, ["f=30"]))
    with pytest.raises(ConfigError, match=r"^\[rule\]\.f=30 is invalid"):
        grid.runs(config.load_grid(path, ["rule.f=30"]))


def test_a_file_cannot_forge_the_spelling(tmp_path: Path) -> None:
    """The spelling travels under a key whose value no TOML file can hold: a file that writes the key is refused
    as an unknown key, and one that writes it beside a tree cannot rename another key's error."""
    path = tmp_path / "forged.toml"
    path.write_text('f = 20\nworkers = 10\n"[written]" = { f = "[rule].x" }\n')
    with pytest.raises(ConfigError, match=r"^\[written\]=.*\(unknown key\)"):
        grid.runs(config.load_grid(path, []))
    forged = {spelling.WRITTEN: {"names": [["f", "[run].x"]]}, "workers": 10, "f": 20}
    with pytest.raises(ConfigError) as caught:
        make_config(forged)
    assert caught.value.parameter == spelling.WRITTEN and "unknown key" in str(caught.value)
    shown = spelling.detach(config.load_grid(None, ["rule.f=3"]))[0]
    assert spelling.WRITTEN not in shown and treetext.dumps(tree.to_tree(shown))  # `config show` prints no marker


ANYTIME = Path(__file__).resolve().parent.parent / "examples" / "decentralized" / "anytime.toml"


def test_a_tie_written_with_sections_is_its_flat_tie() -> None:
    """``[tie]`` is the grid's (no component's): its keys may be the sections' (``[tie.algorithm] lr = […]``),
    read in the run's context into the flat keys the grid ties — the same points, the same run ids."""
    flat = config.load_toml(ANYTIME)
    as_tree = tree.to_tree(flat)
    assert as_tree["tie"] == {"algorithm": {"name": ["gossip", "anytime"], "lr": [0.8, 0.016]}}
    assert "[tie.algorithm]" in treetext.dumps(as_tree)
    assert tree.to_flat(config.toml_loads(treetext.dumps(as_tree))) == flat
    small = {"rounds": 2, "eval_every": 1, "seed": 0}
    short = {**as_tree, "run": {**as_tree["run"], **small}}
    assert [r.run_id for r in grid.runs(short)] == [r.run_id for r in grid.runs({**flat, **small})]


def test_an_adapter_that_leaves_the_tie_as_written_fails_the_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: an adapter that does not read the tie's sections (the grid would then tie a table)."""
    as_tree = tree.to_tree(config.load_toml(ANYTIME))
    monkeypatch.setattr(tree, "_flat_tie", lambda tie, context: (tie, {}))
    with pytest.raises(ConfigError):  # the tie's algorithm table read as the run's algorithm: no section fits
        assert tree.to_flat(as_tree) != config.load_toml(ANYTIME)
        grid.runs(as_tree)


@pytest.mark.parametrize(("tie", "error"), [
    ({"algorithm": {"local_stepz": [1, 5]}}, r"^\[tie\.algorithm\]\.local_stepz=.*did you mean local_steps"),
    ({"rule": {"pre": ["nnm", "bucketing"], "spec": ["cwtm", "cwtm"]}}, r"^\[tie\.rule\]\.pre="),
    ({"local_steps": [1, 5], "algorithm": {"local_steps": [1, 5]}}, r"^tie\.local_steps=.*two spellings"),
    ({"algorithm": {"local_steps": [1, 0]}}, r"^\[tie\.algorithm\]\.local_steps=0"),
    ({"run": {"workers": [4, 4], "rounds": [2, 2]}}, r"^tie=.*not also set outside"),
])
def test_a_tied_section_key_is_refused_naming_it(tie: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error) as caught:
        grid.runs({"algorithm": {"name": "fedavg"}, "run": {"workers": 4}, "tie": {"run": {"rounds": [2, 2]}, **tie}})
    assert "\n" not in str(caught.value)


def test_a_hostile_key_is_named_on_one_line() -> None:
    """A file may hold a key with a line break in a section whose keys are its component's: the error names it,
    quoted, on one line (the mutant that prints it raw would split the message)."""
    for table in ({"model": {"a\nb": 1}}, {"server": {"optimizer": {"name": "adam", "x\ry": 1}}},
                  {"model": {"params": {"\n": 1}}}):
        with pytest.raises(ConfigError) as caught:
            make_config(table)
        assert "\n" not in str(caught.value) and "\r" not in str(caught.value) and caught.value.parameter[0] in "'\""
