"""Issue 39, "a config section … by writing one file": the section registry
(:mod:`phalanx.experiments.section_registry`).

A brand-new section module — ``[run_notes]``, ``title`` (a string of at most 200 characters) and ``tags`` (a list
of strings), result-neutral, read by a tracker — installed as a plug-in is (entry point ``phalanx.sections``), with
no other edit: listed by ``phalanx list sections``, validated in a tree and flat, refused in one line naming
``[run_notes].title`` and its range, no change of run id, its value received by a tracker. A section whose name
another has is refused in one line (the mutant without the check: the later one silently replaces the earlier); the
tree's sections are the registry's, in its order (no fixed list again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from phalanx.errors import ConfigError, shown
from phalanx.experiments import concerns, section_registry, tree
from phalanx.experiments.declare import Key, Section
from phalanx.experiments.section_registry import SectionRegistry

SRC = Path(__file__).resolve().parents[1] / "src"

NOTES = (Path(__file__).resolve().parents[1] / "examples" / "plugins" / "mylab" / "notes.py").read_text()
"""The newcomer's one file: the section, declared and registered."""

TRACKER = '''\
import json
from pathlib import Path


class Notes:
    """A tracker that writes what it was told of its run to ``uri``."""

    def __init__(self, uri=None):
        self.uri = uri

    def start(self, run):
        Path(self.uri).write_text(json.dumps(run.params))

    def log(self, step, metrics):
        pass

    def finish(self, end):
        pass
'''

SCRIPT = '''
import json, sys
from typer.testing import CliRunner
from phalanx import cli
from phalanx.errors import ConfigError
from phalanx.experiments import apply_overrides, make_config, grid, tree, train
out = {}
listing = CliRunner().invoke(cli.app, ["list", "sections", "--format", "csv"])
out["listing"] = listing.output
out["sections"] = list(tree.SECTIONS)
tiny = {"run": {"workers": 4, "byzantine": 0, "rounds": 1, "eval_every": 1}, "model": {"name": "logreg"},
        "rule": {"spec": "mean"}}
plain = make_config(tiny)
noted = make_config({**tiny, "run_notes": {"title": "x", "tags": ["a", "b"]}})
out["flat"] = make_config({"workers": 4, "byzantine": 0, "rounds": 1, "eval_every": 1, "model": "logreg",
                           "aggregator": "mean", "title": "x"}).title
out["ids"] = [grid.run_id(plain), grid.run_id(noted)]
out["values"] = [noted.title, noted.tags]
out["tree"] = tree.to_tree(noted.model_dump())["run_notes"]
out["set"] = make_config(apply_overrides(tiny, ["run_notes.title=from the command line"])).title
out["points"] = [len(grid.expand({**tiny, "run_notes": {"tags": ["a", "b"]}})),
                 len(grid.expand({**tiny, "rule": {"spec": ["mean", "cwtm"]}, "run_notes": {"tags": ["a", "b"]}}))]
errors = []
for bad in ({"title": "y" * 201}, {"title": 3}, {"tags": ["a"] * 33}, {"titel": "x"}):
    try:
        make_config({**tiny, "run_notes": bad})
    except ConfigError as exc:
        errors.append(str(exc))
    else:
        errors.append("accepted")
out["errors"] = errors
told = sys.argv[1]
cfg = make_config({**tiny, "run_notes": {"title": "x"}, "run": {**tiny["run"], "tracking": ["mylab_tracker:Notes"]},
                   "tracking_params": {"mylab_tracker:Notes": {"uri": told}}})
train(cfg, sys.argv[2])
print(json.dumps(out))
'''


def _site(tmp_path: Path, sections: dict[str, str], modules: dict[str, str]) -> Path:
    """A site directory with one installed distribution (``phalanx.sections`` entry points ``sections``) and the
    modules ``modules`` (name → source)."""
    site = tmp_path / "site"
    meta = site / "mylab_notes-0.1.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab-notes\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text("[phalanx.sections]\n" + "".join(
        f"{name} = {target}\n" for name, target in sections.items()))
    for name, source in modules.items():
        path = site / f"{name.replace('.', '/')}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(source)
    return site


def _python(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter with ``site`` installed: the registry reads the entry points before the schema is made."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(SRC)])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600, check=False)


def test_a_section_of_ones_own_is_one_file(tmp_path: Path) -> None:
    """The newcomer's ``[run_notes]`` (``examples/plugins/mylab/notes.py``): one module and its entry point, no
    other edit."""
    site = _site(tmp_path, {"run_notes": "mylab.notes"}, {"mylab.notes": NOTES, "mylab_tracker": TRACKER})
    told = tmp_path / "told.json"
    res = _python(site, "-c", SCRIPT, str(told), str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    # phalanx list sections lists it, after the built-in ones, with its type, range and description
    assert 'run_notes,title,title,all,str,length ≤ 200,\'\',"the run\'s title, shown by its trackers"' in out["listing"]
    assert "run_notes,tags,tags,all,list[str],length ≤ 32,[]," in out["listing"]
    assert out["sections"] == [*tree.SECTIONS, "run_notes"]
    # validated, in the tree and flat; written back into its section
    assert out["values"] == ["x", ["a", "b"]] and out["flat"] == "x"
    assert out["tree"] == {"title": "x", "tags": ["a", "b"]}
    assert out["set"] == "from the command line"  # --set run_notes.title=…
    assert out["points"] == [1, 2]  # a list-typed key's list is its value, not a grid axis
    # refused in one line, named as written, with its range
    assert out["errors"] == [
        f"[run_notes].title={shown('y' * 201)} is invalid: allowed at most 200 characters",
        "[run_notes].title=3 is invalid: allowed a string",
        f"[run_notes].tags={['a'] * 33!r} is invalid: allowed at most 32 items",
        "[run_notes].titel='x' is invalid: allowed a key of [run_notes]: title, tags (unknown key; did you mean "
        "title?)",
    ]
    # result-neutral: the same run id as without it — the id this version gives the plain config
    plain, noted = out["ids"]
    assert plain == noted
    from phalanx.experiments import grid, make_config

    assert plain == grid.run_id(make_config({"run": {"workers": 4, "byzantine": 0, "rounds": 1, "eval_every": 1},
                                             "model": {"name": "logreg"}, "rule": {"spec": "mean"}}))
    # the tracker received the value (the whole validated config, result-neutral keys included)
    params = json.loads(told.read_text())
    assert params["title"] == "x" and params["tracking"] == ["mylab_tracker:Notes"]


def test_a_section_whose_name_is_taken_is_refused_in_one_line(tmp_path: Path) -> None:
    """A plug-in declaring ``[data]`` again, or two declaring ``[run_notes]``: ``phalanx`` refuses it in one line,
    exit code 2, naming who declared it first."""
    again = NOTES.replace('"run_notes"', '"data"').replace('"title", "title"', '"title", "data_title"').replace(
        '"tags", "tags"', '"tags", "data_tags"')
    site = _site(tmp_path, {"data": "mylab_data"}, {"mylab_data": again})
    res = _python(site, "-m", "phalanx.cli", "list", "sections")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout.strip() == ("error: section='data' is invalid: allowed a name no other section has ([data] is "
                                  "declared by phalanx.experiments.concerns; mylab_data declares it again)")


def test_a_name_or_flat_key_taken_is_refused_and_the_mutant_replaces_silently(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself, on a registry of its own: a second ``[run_notes]`` (another plug-in's) or a built-in's name
    is refused, and so is a flat key another section declares. The mutant registry without the check keeps both,
    and the later one silently replaces the earlier in every reader (the name → section map)."""
    first = Section("run_notes", (Key("title", "title", str, "", "x"),), result_neutral=True)
    second = Section("run_notes", (Key("subject", "subject", str, "", "y"),))
    registry = SectionRegistry(group="phalanx.none")
    registry.register(concerns.DataSpec, "phalanx.experiments.concerns")
    registry.register(first, "lab_a")
    with pytest.raises(ConfigError) as caught:
        registry.register(second, "lab_b")
    assert str(caught.value) == ("section='run_notes' is invalid: allowed a name no other section has ([run_notes] is "
                                 "declared by lab_a; lab_b declares it again)")
    with pytest.raises(ConfigError, match=r"^section='data' is invalid: .*declared by phalanx\.experiments\.concerns; "
                       r"lab_c declares it again\)$"):
        registry.register(Section("data", (Key("x", "x", int, 0, "x"),)), "lab_c")
    with pytest.raises(ConfigError, match=r"^\[notes2\]\.heading='title' is invalid: allowed a flat key no other "
                       r"section declares \(\[run_notes\], by lab_a, declares title\)$"):
        registry.register(Section("notes2", (Key("heading", "title", str, "", "x"),)), "lab_d")
    with pytest.raises(ConfigError, match=r"^section='tie' is invalid"):
        registry.register(Section("tie", ()), "lab_e")
    assert [s.name for s in registry.sections()] == ["data", "run_notes"]

    monkeypatch.setattr(SectionRegistry, "refusal", lambda self, section, origin: None)
    mutant = SectionRegistry(group="phalanx.none")
    mutant.register(first, "lab_a")
    mutant.register(second, "lab_b")  # accepted: nothing says so
    assert {s.name: s for s in mutant.sections()}["run_notes"] is second  # the earlier one is gone


def test_the_trees_sections_are_the_registrys() -> None:
    """No fixed list: ``tree.SECTIONS`` is the registry's order, and every declared section of the registry is one
    ``concerns.declared()`` gives (the schema's fields, the adapter's table and the listing read it). The built-in
    ones keep their order."""
    assert tuple(tree.SECTIONS) == section_registry.names() == (
        "run", "algorithm", "rule", "attack", "server.optimizer", "stages", "data", "model", "engine")
    assert concerns.declared() == section_registry.declared()
    assert isinstance(tree.SECTIONS, section_registry.Names)  # read from the registry, not a tuple kept in tree.py
    origins = section_registry.REGISTRY.origins()
    assert set(origins.values()) == {"phalanx.experiments.concerns"}  # each declared where its value is


def test_a_length_bound_is_checked_and_its_mutant_is_caught() -> None:
    """``max_len``: a string or list longer than the bound is refused in the schema's words; the mutant key without
    the bound accepts it."""
    key = Key("title", "title", str, "", "x", max_len=3)
    assert key.refusal("abcd") == "at most 3 characters" and key.refusal("abc") is None
    assert Key("tags", "tags", list[str], [], "x", max_len=1).refusal(["a", "b"]) == "at most 1 items"
    assert key.allowed() == "length ≤ 3"
    mutant = Key("title", "title", str, "", "x")
    assert mutant.refusal("abcd") is None  # unbounded: what an attacker could make a tracker record


def test_the_newcomers_module_is_one_file() -> None:
    """The section module of the first test (``examples/plugins/mylab/notes.py``) is all the newcomer writes: it
    imports only the declaration and the registry."""
    imports = [line for line in textwrap.dedent(NOTES).splitlines() if line.startswith(("from ", "import "))]
    assert imports == ["from phalanx.experiments.declare import Key, Section",
                       "from phalanx.experiments.section_registry import register"]


def test_a_section_registered_after_the_schema_is_made_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema's fields are made once, from the sections registered by then: a section registered later (a
    module imported after ``phalanx.experiments``, not by its entry point) is refused in one line. The mutant
    registry that takes it: the tree reads ``[late]`` into a flat key the schema has no field for, and the config is
    refused as if the key were unknown — the section half there."""
    from phalanx.experiments import make_config

    late = Section("late", (Key("x", "late_x", int, 0, "x", ge=0),))
    monkeypatch.setattr(section_registry.REGISTRY, "_holders", list(section_registry.REGISTRY._holders))
    with pytest.raises(ConfigError, match=r"^section='late' is invalid: allowed a section registered before the run "
                       r"config's schema is made \(by its entry point in phalanx\.sections: docs/config\.md\); "
                       r"(tests\.)?test_section_registry registers it after$"):
        section_registry.register(late)
    assert "late" not in tree.SECTIONS
    monkeypatch.setattr(section_registry.REGISTRY, "closed", False)  # the mutant: no guard
    section_registry.register(late)
    assert tree.to_flat({"late": {"x": 1}}) == {"late_x": 1}  # the tree takes it …
    with pytest.raises(ConfigError, match=r"^\[late\]\.x=1 is invalid: allowed one of the known keys .*\(unknown "
                       r"key\)$"):
        make_config({"late": {"x": 1}})  # … the schema has no field for it: its own key is "unknown"


def test_the_result_neutral_keys_are_read_from_the_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RESULT_NEUTRAL_KEYS`` is each key declared ``neutral`` (the eight every run id on disk was computed
    without: ``tests/test_compat.py``), no list kept in the schema. The mutant ``[run]`` that forgets ``tracking``'s
    flag puts it back into the identity: a run tracked or not would have two run ids."""
    from phalanx.experiments import grid, make_config, schema

    pinned = {"download", "sign_key", "verify_key", "device", "keys", "insecure", "tracking", "tracking_params"}
    assert set(schema.RESULT_NEUTRAL_KEYS) == set(schema.result_neutral_keys()) == pinned
    tiny = {"workers": 4, "rounds": 1}
    assert grid.run_id(make_config({**tiny, "tracking": ["tensorboard"]})) == grid.run_id(make_config(tiny))
    forgetting = Section("run", tuple(Key(k.key, k.flat, k.type, k.default, k.doc, k.ge, k.gt, k.le, k.lt)
                                      if k.key == "tracking" else k for k in concerns.RUN.keys), concerns.RUN.doc)
    monkeypatch.setattr(concerns.RunShape, "section", forgetting)
    assert "tracking" not in schema.result_neutral_keys()
    monkeypatch.setattr(schema, "RESULT_NEUTRAL_KEYS", schema.result_neutral_keys())
    assert grid.run_id(make_config({**tiny, "tracking": ["tensorboard"]})) != grid.run_id(make_config(tiny))
