"""Issue 39's first measured target (``scripts/seam_counts.py``): each of DP, CRFL, robust-online, server momentum and
norm statistics has its config key read in at most two source files — for the flat keys, the schema that declares
them and the legacy adapter that maps them onto the stage's (or the server optimizer's) own section; the stages read
their own parameter names.

The counter must be able to fail: a file that reads a flat key in code is counted (a mutant stage that went back to
``cfg.dp_noise``, an optimizer that names ``"server_momentum"`` in its check), and a key named only in a docstring
is not (the mutants below).

Its second figure, the config's path from ``phalanx run``: a function called with the validated-run value (which
wraps the config) counts as a stop, so the value cannot hide the config's path from the count."""

from __future__ import annotations

from pathlib import Path

import pytest

import phalanx
from _scripts import load_script
from phalanx.experiments import validrun
from phalanx.experiments.config import validate
from phalanx.experiments.schema import RunConfig

seams = load_script("scripts/seam_counts.py", "seam_counts")
SRC = Path(phalanx.__file__).resolve().parent

READERS = {
    "DP": ["experiments/legacy.py", "experiments/schema.py"],
    "CRFL": ["experiments/legacy.py", "experiments/schema.py"],
    "robust-online": ["studies/corrupted.py", "training/optim.py"],
    "server momentum": ["experiments/legacy.py", "experiments/schema.py"],
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
