"""Start-up of the command line: the commands that compute nothing import no torch (issue 37 item 5).

Importing torch is most of a command's start-up (``benchmarks/startup.py``, docs/benchmarks.md "Start-up"), so the
help pages, ``--version``, a wrong directory given to ``status`` / ``report``, the listings of data sets, models,
aggregators, attacks, round algorithms and stages and the study groups' help pages (``tension --help``,
``experiment --help``; read from the torch-free :mod:`phalanx.catalogue`) must answer without it. Each case runs the
command in a fresh interpreter and reads ``sys.modules`` when it ends; the mutants (an eager ``import torch`` in a
command module, as ``phalanx.cli.analysis`` had; in the catalogue; a listing that asks the registry again) must fail
the same check. Installed plug-ins are still listed: by name, without loading them, for data sets and models;
``list aggregators``, ``list attacks``, ``list algorithms`` and a plug-in study's line in ``experiment --help`` need
the plug-in's class, and load it (and torch) then.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LIGHT = (["--help"], ["--version"], ["list", "--help"], ["run", "--help"], ["sweep", "--help"], ["keys", "--help"],
         ["launch", "--help"], ["status", "/nonexistent-phalanx-dir"], ["report", "/nonexistent-phalanx-dir"],
         ["list", "datasets"], ["list", "models"], ["list", "aggregators"],
         ["list", "aggregators", "-n", "7", "-f", "3", "--format", "json"], ["list", "attacks"], ["list", "algorithms"],
         ["list", "stages"], ["list", "stages", "--format", "csv"], ["list", "trackers"],
         ["tension", "--help"], ["experiment", "--help"], ["tension"], ["experiment"])
"""Commands that compute nothing: none may import torch."""

_PROBE = """
import atexit, json, sys
atexit.register(lambda: sys.__stderr__.write("\\nMODULES " + json.dumps(sorted(
    m for m in sys.modules if m == "torch" or m.startswith(("phalanx", "mylab")))) + "\\n"))
sys.argv = ["phalanx", *json.loads(sys.argv[1])]
from phalanx.cli import main
main()
"""


def _run(args: list[str], src: Path = SRC, extra: tuple[Path, ...] = ()) -> tuple[list[str], str]:
    """The modules (torch, phalanx's and the example plug-in's ``mylab``) loaded when ``phalanx ARGS`` ends, in a
    fresh interpreter, with the package read from ``src`` (and ``extra`` on the path), and what it printed."""
    path = [str(src), *map(str, extra), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(args)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    line = next((x for x in proc.stderr.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, proc.stderr[-2000:]
    return list(json.loads(line.removeprefix("MODULES "))), proc.stdout


def _modules(args: list[str], src: Path = SRC) -> list[str]:
    return _run(args, src)[0]


@pytest.mark.parametrize("args", LIGHT, ids=" ".join)
def test_commands_that_compute_nothing_import_no_torch(args: list[str]) -> None:
    loaded = _modules(args)
    assert "phalanx.cli" in loaded  # the probe did run the command
    assert "torch" not in loaded, f"phalanx {' '.join(args)} imported torch"


def test_the_check_catches_an_eager_import_of_torch(tmp_path: Path) -> None:
    """Mutant: ``phalanx.cli.analysis`` importing torch at its top again (a copy of the package, that one line
    added) — ``--help`` then loads torch, and the check above sees it."""
    shutil.copytree(SRC / "phalanx", tmp_path / "phalanx", ignore=shutil.ignore_patterns("__pycache__"))
    module = tmp_path / "phalanx" / "cli" / "analysis.py"
    text = module.read_text(encoding="utf-8")
    module.write_text(text.replace("import typer\n", "import torch  # noqa: F401\nimport typer\n", 1),
                      encoding="utf-8")
    loaded = _modules(["--help"], tmp_path)
    assert "phalanx.cli.analysis" in loaded and "torch" in loaded


@pytest.mark.parametrize(("module", "old", "new", "args"), [
    ("catalogue/__init__.py", "import sys\n", "import sys\n\nimport torch  # noqa: F401\n", ["list", "datasets"]),
    ("cli/listing.py", "    names = catalogue.names(catalogue.DATASETS, catalogue.DATASET_GROUP)",
     "    from phalanx import data\n\n    names = data.names()", ["list", "datasets"]),
    ("cli/studies.py", "        if self._help_only and study in catalogue.STUDIES:", "        if False:",
     ["experiment", "--help"]),
    ("catalogue/rounds.py", "from dataclasses import dataclass\n",
     "from dataclasses import dataclass\n\nimport torch  # noqa: F401\n", ["list", "stages"]),
    ("cli/listing.py", "    declared = rounds.attack_rows()", "    declared = None", ["list", "attacks"]),
    ("cli/listing.py", "    declared = rounds.algorithm_rows()", "    declared = None", ["list", "algorithms"]),
    ("cli/listing.py", "    declared = trackers.tracker_rows()", "    declared = None", ["list", "trackers"]),
], ids=["torch-in-the-catalogue", "listing-asks-the-registry", "help-builds-each-study",
        "torch-in-the-rounds-catalogue", "attacks-ask-the-registry", "algorithms-ask-the-registry",
        "trackers-ask-the-registry"])
def test_the_check_catches_a_listing_or_help_page_that_imports_torch(tmp_path: Path, module: str, old: str, new: str,
                                                                    args: list[str]) -> None:
    """Mutants of the torch-free listings and help pages, each in a copy of the package: the catalogue importing
    torch at its top; ``list datasets`` asking the data registry (which imports torch) as before issue 37; the
    study groups' help building each study's command (importing its module); the catalogue of attacks, algorithms
    and stages importing torch at its top (``list stages``); ``list attacks`` and ``list algorithms`` asking their
    registries again. Each loads torch, and the check sees it."""
    shutil.copytree(SRC / "phalanx", tmp_path / "phalanx", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "phalanx" / module
    text = target.read_text(encoding="utf-8")
    assert old in text
    target.write_text(text.replace(old, new, 1), encoding="utf-8")
    assert "torch" in _modules(args, tmp_path)


def test_installed_plug_ins_are_still_listed(tmp_path: Path) -> None:
    """The example plug-in's entry points (examples/plugins, its metadata as pip writes it): ``list datasets`` and
    ``list models`` name its data set and model without importing it or torch; ``list aggregators`` needs its rule's
    class, and loads it; ``experiment --help`` lists its study."""
    from tests.test_extending import PLUGINS, plugin_site

    site = plugin_site(tmp_path)
    for args, name in ((["list", "datasets"], "blobs"), (["list", "models"], "tanh-mlp")):
        loaded, out = _run(args, extra=(site, PLUGINS))
        assert name in out.split()
        assert "torch" not in loaded and not any(m.startswith("mylab") for m in loaded), (args, loaded)
    loaded, out = _run(["list", "aggregators", "--format", "csv"], extra=(site, PLUGINS))
    assert "median-of-means" in out and "mylab.rules" in loaded
    assert "cwtm" in out and "clipped_gossip" in out  # the built-ins, as before
    loaded, out = _run(["experiment", "--help"], extra=(site, PLUGINS))
    assert " momentum " in out and " tension " in out
    for args, name, builtin in ((["list", "attacks", "--format", "csv"], "shift", "alie"),
                                (["list", "algorithms", "--format", "csv"], "full-gd", "dsgd")):
        loaded, out = _run(args, extra=(site, PLUGINS))
        listed = [row[0] for row in csv.reader(io.StringIO(out)) if row]
        assert name in listed and builtin in listed, (args, out[-500:])
    loaded, out = _run(["list", "stages", "--format", "csv"], extra=(site, PLUGINS))  # no plug-in stage: torch-free
    assert "torch" not in loaded and "update_clip" in out


def test_python_dash_m_phalanx_is_the_phalanx_command() -> None:
    """``python -m phalanx`` runs the same command line as the ``phalanx`` script (``src/phalanx/__main__.py``),
    torch-free for a listing like the script."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "phalanx", "list", "attacks"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fangkrum" in proc.stdout and "alie" in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported
