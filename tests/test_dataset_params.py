"""A data set's own parameters, like the other components': ``dataset_params``, or inline in the name
(``dataset = "mylab.data:blobs(classes=3)"``) — one run whichever way it is written; a parameter the loader does not
take is a one-line error naming it, before anything loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx import data
from phalanx.errors import ConfigError
from phalanx.experiments import build, grid
from phalanx.experiments.config import make_config

PLUGINS = Path(__file__).resolve().parents[1] / "examples" / "plugins"
BLOBS = "mylab.data:blobs"
TINY = {"workers": 4, "rounds": 2, "eval_every": 1, "model_params": {"hidden": [8]}}


@pytest.fixture(autouse=True)
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))


def test_inline_parameters_are_dataset_params_and_name_the_same_run() -> None:
    inline = make_config({**TINY, "dataset": f"{BLOBS}(classes=3, dim=5)"})
    table = make_config({**TINY, "dataset": BLOBS, "dataset_params": {"classes": 3, "dim": 5}})
    assert inline.dataset == BLOBS and inline.dataset_params == {"classes": 3, "dim": 5}
    assert inline == table and grid.run_id(inline) == grid.run_id(table)
    assert grid.run_id(inline) != grid.run_id(make_config({**TINY, "dataset": BLOBS}))


def test_the_parameters_reach_the_loader() -> None:
    ds = build.load_data(make_config({**TINY, "dataset": f"{BLOBS}(classes=3, dim=5, per_class=20)"}))
    assert ds.num_classes == 3 and tuple(ds.train_x.shape) == (60, 5) and ds.n_test == 150
    assert data.load(f"{BLOBS}(classes=2)").num_classes == 2  # the API takes them inline too
    assert data.load(BLOBS, params={"classes": 2}).num_classes == 2


def test_a_run_trains_on_the_data_set_its_parameters_make(tmp_path: Path) -> None:
    from phalanx.experiments.train import train

    rows = train(make_config({**TINY, "dataset": f"{BLOBS}(classes=3, dim=5, per_class=20)"}), tmp_path / "run")
    assert rows[-1]["round"] == 2 and 0.0 <= rows[-1]["test_accuracy"] <= 1.0


def test_a_config_without_them_keeps_its_resolved_form() -> None:
    """dataset_params came later: a config that does not use it keeps its config.json and run id."""
    assert "dataset_params" not in make_config(TINY).model_dump()


@pytest.mark.parametrize(("cfg", "parameter", "allowed"), [
    ({"dataset": f"{BLOBS}(colours=3)"}, "dataset_params.colours", "classes, dim, per_class"),
    ({"dataset": BLOBS, "dataset_params": {"colours": 3}}, "dataset_params.colours", "classes, dim, per_class"),
    ({"dataset": "digits(size=3)"}, "dataset_params.size", "takes no parameters"),
    ({"dataset": f"{BLOBS}(classes=3)", "dataset_params": {"classes": 4}}, "dataset_params.classes", "inline too"),
    ({"dataset": f"{BLOBS}(classes)"}, "dataset", "key=value"),
    ({"dataset": f"{BLOBS}(classes=3, classes=4)"}, "dataset", "given twice"),
    ({"dataset": f"{BLOBS}(classes=3)", "dataset_params": "oops"}, "dataset_params", "a table"),
    ({"dataset": "nosuchset(a=1)"}, "dataset", "one of"),
])
def test_bad_parameters_are_one_line_errors_naming_them(cfg: dict[str, object], parameter: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_config({**TINY, **cfg})
    assert err.value.parameter == parameter and allowed in str(err.value) and "\n" not in str(err.value)


def test_the_cli_takes_them_inline_in_a_set(tmp_path: Path) -> None:
    env = {"PYTHONPATH": f"{PLUGINS}:{Path(data.__file__).parents[2]}"}
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "run", "--set", f"dataset={BLOBS}(classes=3, dim=5, per_class=20)",
         *[a for kv in ("workers=4", "byzantine=0", "f=0", "attack=none", "rounds=1", "eval_every=1")
          for a in ("--set", kv)], "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    configs = [json.loads(c.read_text()) for c in (tmp_path / "out").glob("*/config.json")]
    assert configs and all(c["dataset"] == BLOBS and c["dataset_params"] == {"classes": 3, "dim": 5, "per_class": 20}
                           for c in configs)
