"""Issue 39's first measured target (``scripts/seam_counts.py``): each of DP, CRFL, robust-online, server momentum and
norm statistics has its config key read in at most two source files — for the flat keys, the component that declares
them (the privacy stage, the SGD server optimizer; CRFL's, which have no range: the schema) and the legacy adapter
that maps them onto the stage's (or the server optimizer's) own section; the stages read their own parameter names.

The counter must be able to fail: a file that reads a flat key in code is counted (a mutant stage that went back to
``cfg.dp_noise``, an optimizer that names ``"server_momentum"`` in its check), and a key named only in a docstring
is not (the mutants below).

Its second figure, the config's path from ``phalanx run``: a function called with the validated-run value (which
wraps the config) counts as a stop, so the value cannot hide the config's path from the count."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, ClassVar

import pytest

import phalanx
from _scripts import load_script
from phalanx.experiments import specs, validrun
from phalanx.experiments.config import validate
from phalanx.experiments.schema import RunConfig
from phalanx.training.algorithms.dsgd import DSGD

seams = load_script("scripts/seam_counts.py", "seam_counts")
SRC = Path(phalanx.__file__).resolve().parent

READERS = {
    "DP": ["experiments/legacy.py", "training/stages/privacy.py"],
    "CRFL": ["experiments/legacy.py", "experiments/schema.py"],
    "robust-online": ["studies/corrupted.py", "training/optim.py"],
    "server momentum": ["experiments/legacy.py", "training/optim.py"],
    "norm statistics": ["training/stages/norm_stats.py"],
}


@pytest.mark.parametrize("feature", list(seams.KEYS))
def test_each_features_key_is_read_in_at_most_two_files(feature: str) -> None:
    files = seams.readers(SRC, seams.KEYS[feature])
    assert len(files) <= 2 and files == READERS[feature]


@pytest.mark.parametrize(("code", "counted"), [
    ("def f(cfg):\n    return cfg.dp_noise\n", True),
    ("from phalanx.validate import check_real\n\ndef f(m):\n    return check_real('server_momentum', m)\n", True),
    ("def f(problem):\n    return problem.norm_stats\n", True),
    ('"""Turned on by ``dp_noise``."""\n\ndef f(stage):\n    """Its noise (the flat dp_noise)."""\n'
     "    return stage.noise\n", False),
    ("def f(stage):\n    return stage.noise  # dp_noise\n", False),
])
def test_the_counter_counts_code_and_not_prose(tmp_path: Path, code: str, counted: bool) -> None:
    (tmp_path / "mutant.py").write_text(code)
    keys = seams.KEYS["DP"] + seams.KEYS["server momentum"] + seams.KEYS["norm statistics"]
    assert seams.readers(tmp_path, keys) == (["mutant.py"] if counted else [])


def test_the_catalogue_is_left_out_and_reads_no_config(tmp_path: Path) -> None:
    """The counter leaves out ``catalogue/`` (listing text: a stage's name and the key that switches it on) and only
    it: the same line elsewhere counts. The exemption hides no reader: the catalogue imports no Phalanx module but
    its own (so it cannot reach a config)."""
    (tmp_path / "catalogue").mkdir()
    (tmp_path / "catalogue" / "rounds.py").write_text("STAGES = {'dp': ('worker', 'dp_noise')}\n")
    (tmp_path / "listing.py").write_text("STAGES = {'dp': ('worker', 'dp_noise')}\n")
    assert seams.readers(tmp_path, seams.KEYS["DP"]) == ["listing.py"]
    for path in (SRC / "catalogue").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert not node.module.startswith("phalanx") or node.module.startswith("phalanx.catalogue"), path
            if isinstance(node, ast.Import):
                assert all(not a.name.startswith("phalanx") or a.name.startswith("phalanx.catalogue")
                           for a in node.names), path


SMALL = {"dataset": "digits", "model": "mlp", "workers": 6, "byzantine": 1, "f": 1, "aggregator": "cwtm",
         "attack": "none", "rounds": 1, "eval_every": 1, "seed": 0}


def test_a_function_called_with_the_validated_run_alone_is_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = seams
    run = validate(SMALL)
    names = [name for name, _ in counter.trace(lambda out: validrun.components(run))]
    assert names == ["phalanx.experiments.validrun.components"]
    # the mutant counter that counts the RunConfig alone does not see it: the check above is what catches it
    monkeypatch.setattr(counter, "carries_config", lambda value: isinstance(value, RunConfig))
    assert counter.trace(lambda out: validrun.components(validate(SMALL))) != []  # validation takes the config
    assert "phalanx.experiments.validrun.components" not in [
        name for name, _ in counter.trace(lambda out: validrun.components(run))]


def test_climbs_are_stops_no_deeper_than_the_one_before() -> None:
    counter = seams
    assert counter.climbs_of([("a", 3), ("b", 4), ("c", 4), ("d", 2), ("e", 5)]) == 2


PATH_STOPS, PATH_CLIMBS = 5, 1
"""The config's path from ``phalanx run`` to the built algorithm, rule and transport, as measured on this tree
(``PYTHONPATH=src python scripts/seam_counts.py``): issue 39's target is at most 20 stops and 3 climbs; the bound
pinned is the measured one, so that a function that takes the config again fails here."""

MUTANT = '''
def from_config(run, dataset=None, *, local_rank=None):
    resolve_device(run.cfg, local_rank)  # the mutant: a builder that takes the config again
    return built(run, dataset, local_rank=local_rank)
'''


def test_the_run_path_is_one_descent() -> None:
    """``phalanx run``'s config: read once (:func:`phalanx.experiments.specs.read`, the flat keys by the legacy
    adapter) during validation, then handed as the validated run from ``train`` down to its components — the data
    set, the split, the model, the device and the tracking take their concern's value."""
    path = seams.stops()
    names = [name for name, _ in path]
    assert names == ["phalanx.experiments.specs.read", "phalanx.experiments.legacy.read",
                     "phalanx.experiments.train.train", "phalanx.experiments.build.from_config",
                     "phalanx.experiments.validrun.components"]
    assert len(path) <= PATH_STOPS <= 20 and seams.climbs_of(path) <= PATH_CLIMBS <= 3


def test_a_builder_that_takes_the_config_again_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant experiment builder that resolves the device from the config again (as ``resolve_device(cfg)`` did)
    adds a stop the pinned bound refuses."""
    import importlib

    from phalanx.experiments import build

    train_module = importlib.import_module("phalanx.experiments.train")
    scope = {"__name__": "phalanx.experiments.build", "resolve_device": build.resolve_device,
             "built": build.from_config}
    exec(compile(MUTANT, "mutant", "exec"), scope)
    monkeypatch.setattr(train_module, "from_config", scope["from_config"])
    path = seams.stops()
    assert "phalanx.experiments.build.resolve_device" in [name for name, _ in path]
    assert len(path) > PATH_STOPS


class LegacyHooks(DSGD):
    """A round algorithm of one's own written for the hooks that took the run config: its check reads a key that the
    algorithm's section (:class:`~phalanx.experiments.specs.AlgorithmSpec`) does not have."""

    seeds: ClassVar[list[int]] = []

    def check_config(self, cfg: Any, rule: Any, attack: Any) -> None:
        LegacyHooks.seeds.append(cfg.seed)
        super().check_config(cfg, rule, attack)


def test_a_plug_ins_own_hooks_still_receive_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plug-in interface is kept: a class of one's own that overrides a hook outside Phalanx receives the config,
    with a DeprecationWarning; a built-in algorithm's hooks receive its section. The mutant adapter that always
    passes the section breaks the plug-in (its hook reads a key the section lacks)."""
    plug_in = {**SMALL, "algorithm": "tests.test_seam_counts:LegacyHooks", "seed": 7}
    with pytest.warns(DeprecationWarning, match=r"LegacyHooks\.check_config overrides a hook"):
        run = validate(plug_in)
    built = type(run.parts.algorithm)  # the class the spec names (its module imported by that name)
    assert run.specs.legacy_hooks and built.__name__ == "LegacyHooks" and built.seeds[-1] == 7
    assert not validate(SMALL).specs.legacy_hooks
    monkeypatch.setattr(specs, "needs_config", lambda cls: False)
    with pytest.raises(AttributeError, match="seed"):
        validate(plug_in)
