"""The command line: list, epsilon, demo, and clear errors."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from phalanx import cli

runner = CliRunner()


def test_list_aggregators() -> None:
    res = runner.invoke(cli.app, ["list", "aggregators", "-n", "10", "--f", "2"])
    assert res.exit_code == 0, res.output
    for name in ("cwtm", "geomed", "cc"):
        assert name in res.output


def test_epsilon_command() -> None:
    res = runner.invoke(cli.app, ["epsilon", "cwtm", "-n", "10", "--f", "3", "--trials", "5"])
    assert res.exit_code == 0, res.output
    assert "0.4286" in res.output  # 3/7


def test_demo_small() -> None:
    res = runner.invoke(cli.app, ["demo", "-n", "9", "-b", "2", "--f", "2", "-d", "50"])
    assert res.exit_code == 0, res.output
    assert "cwtm" in res.output and "mean" in res.output


def test_config_error_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["phalanx", "epsilon", "cwtm", "-n", "4", "--f", "3"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    out = capsys.readouterr().out
    assert "n=4 is invalid" in out and "Traceback" not in out
