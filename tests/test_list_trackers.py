"""``phalanx list trackers``: the built-in trackers declared in :mod:`phalanx.catalogue.trackers` (so the listing
imports no torch: ``tests/test_startup.py``) are their classes — target, package, extra, parameters, what each
records — and the listing prints the same from the declared rows as from the classes (the path a plug-in takes)."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from phalanx import cli
from phalanx.catalogue import trackers as declared_trackers
from phalanx.cli import listing
from phalanx.experiments import tracking
from phalanx.plugins import import_spec


def mismatches(declared: dict[str, Any]) -> list[str]:
    """Every difference between the declared trackers and the registry's classes."""
    out = sorted(set(declared) ^ set(tracking.TRACKERS.registered()))
    for name, entry in declared.items():
        cls = tracking.TRACKERS.registered().get(name)
        if cls is None:
            continue
        params = tuple(declared_trackers.parameter(p.name, p.annotation, p.default)
                       for p in list(inspect.signature(cls.__init__).parameters.values())[1:])
        got = (import_spec(entry.target, "target"), entry.package, entry.extra, entry.parameters, entry.summary)
        want = (cls, cls.package, cls.extra, params, cls.summary)
        if got != want:
            out.append(f"{name}: declared {got}, the class says {want}")
    return out


def _edit(name: str, **change: Any) -> dict[str, Any]:
    table = declared_trackers.TRACKERS
    return {**table, name: dataclasses.replace(table[name], **change)}


def test_the_declared_trackers_are_the_registrys_classes() -> None:
    assert not mismatches(declared_trackers.TRACKERS)


@pytest.mark.parametrize("mutant", [
    _edit("wandb", parameters=("uri: str | None = None", "project: str | None = None")),  # a parameter left out
    _edit("mlflow", extra="tracking"),
    _edit("tensorboard", summary="scalars"),
    {k: v for k, v in declared_trackers.TRACKERS.items() if k != "wandb"},
])
def test_a_stale_declaration_is_caught(mutant: dict[str, Any]) -> None:
    assert mismatches(mutant)


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_list_trackers_prints_the_same_from_the_catalogue_as_from_the_classes(
        monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    command = ["list", "trackers", "--format", fmt]
    env = {"COLUMNS": "100"}
    declared = CliRunner().invoke(cli.app, command, env=env)
    monkeypatch.setattr(declared_trackers, "tracker_rows", lambda: None)
    built = CliRunner().invoke(cli.app, command, env=env)
    assert declared.exit_code == built.exit_code == 0, declared.output + built.output
    assert declared.output == built.output


def test_a_tracker_whose_package_is_missing_is_listed_as_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    out = CliRunner().invoke(cli.app, ["list", "trackers", "--format", "json"])
    rows = {row["name"]: row for row in json.loads(out.output)["tables"][0]["rows"]}
    assert rows["wandb"]["installed"] == "no" and rows["wandb"]["extra"] == "phalanx[wandb]"


def test_a_registered_tracker_is_listed_from_its_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tracker registered in this process (as a plug-in's entry point would be) is a name the table does not
    hold: the rows come from the registry, its own included."""

    class Mine:
        """Rows to a lab's own dashboard."""

        def __init__(self, uri: str | None = None, token_file: str = "~/.lab") -> None:
            pass

        def start(self, run: Any) -> None: ...

        def log(self, step: int, metrics: Any) -> None: ...

        def finish(self, end: str) -> None: ...

    monkeypatch.setitem(tracking.TRACKERS._entries, "lab", Mine)
    assert declared_trackers.tracker_rows() is None
    out = CliRunner().invoke(cli.app, ["list", "trackers", "--format", "json"])
    rows = {row["name"]: row for row in json.loads(out.output)["tables"][0]["rows"]}
    assert rows["lab"]["records"] == "Rows to a lab's own dashboard." and rows["lab"]["extra"] == "—"
    assert "token_file: str = '~/.lab' (tracking_params.lab.token_file)" in rows["lab"]["parameters"]
    assert set(rows) == {"lab", "mlflow", "tensorboard", "wandb"}
    assert listing.tracker_rows()[0][0] == "lab"
