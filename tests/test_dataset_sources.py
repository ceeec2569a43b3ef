"""``phalanx list datasets`` says where each data set comes from (a first-hour review could not tell which load with
no file and no network): every built-in data set has its line, and those it calls "built in … no network" load from
an empty data root with every socket refused. Mutants: a data set without a line, or one that needs files called
built in, fail it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from phalanx import catalogue, cli, data


def test_every_data_set_says_where_it_comes_from() -> None:
    assert set(catalogue.DATASET_SOURCES) == set(catalogue.DATASETS)
    res = CliRunner().invoke(cli.app, ["list", "datasets", "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert "digits,\"built in: shipped inside Phalanx, no network\"" in res.stdout


@pytest.mark.parametrize("name", sorted(n for n, where in catalogue.DATASET_SOURCES.items() if "no network" in where))
def test_a_built_in_data_set_loads_with_no_files_and_no_network(name: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{name} opened a socket")

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setenv("PHALANX_DATA", str(tmp_path))  # an empty data root, whatever this machine holds
    monkeypatch.setenv("HOME", str(tmp_path))
    loaded = data.load(name, root=tmp_path / "empty", download=False)
    assert loaded is not None
