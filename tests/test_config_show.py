"""``phalanx config show`` and ``phalanx run`` read a config through the same one validation (issue 39's trial,
finding 2): ``config show`` printed any stage list — an unknown stage, one a round algorithm brings, a worker stage
an algorithm's workers do not run, a server stage a decentralized run has no server for, a bad parameter — and
crashed with a traceback on a stage section that is not a table, where ``run`` refused each in one line. Now both
refuse each with the same one line and exit code 2, and nothing is printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx import cli

RUN = """\
[run]
workers = 7
byzantine = 2
rounds = 1
seed = 0

[rule]
spec = "cwtm"
f = 2

[attack]
name = "signflip"

[data]
name = "digits"

[model]
name = "logreg"
"""

GOSSIP = """\
[run]
workers = 7
byzantine = 0
rounds = 1

[algorithm]
name = "gossip"

[rule]
spec = "mean"
f = 0

[attack]
name = "none"

[data]
name = "digits"

[model]
name = "logreg"
"""

SCAFFOLD = GOSSIP.replace('"gossip"', '"scaffold"')

BAD: dict[str, tuple[str, str]] = {
    "unknown stage": (RUN + "\n[stages.nope]\nx = 1\n", "error: [stages.nope]='nope' is invalid"),
    "a stage an algorithm brings": (RUN + "\n[stages.norm_stats]\n", "error: [stages.norm_stats]='norm_stats'"),
    "a worker stage scaffold's workers skip": (SCAFFOLD + "\n[stages.update_clip]\nc = 1.0\n",
                                               "error: [stages.update_clip]='update_clip' is invalid: allowed a "
                                               "stage the workers of Scaffold run"),
    "a worker stage gossip's nodes skip": (GOSSIP + "\n[stages.update_clip]\n",
                                           "error: [stages.update_clip]='update_clip'"),
    "a server stage without a server": (GOSSIP + "\n[stages.adaptive_clip]\n",
                                        "error: [stages.adaptive_clip]='adaptive_clip' is invalid: allowed unset "
                                        "with algorithm = 'gossip'"),
    "a bad parameter": (RUN + "\n[stages.update_clip]\nc = -1\n", "error: [stages.update_clip].c=-1 is invalid"),
    "an unknown parameter": (RUN + "\n[stages.fail_closed]\nwindw = 2\n", "error: [stages.fail_closed].windw=2"),
    "a bad point of a grid over stages": ("workers = 7\nrounds = 1\nstages = [{update_clip = {c = 1.0}}, "
                                          "{update_clip = {c = -1.0}}]\n", "error: stages.update_clip.c=-1.0"),
    "a section that is no table (show crashed)": ("workers = 7\nrounds = 1\nstages = {update_clip = 5}\n",
                                                  "error: stages.update_clip=5 is invalid: allowed a table"),
    "a tree's section that is a list (show crashed)": (RUN + "\n[stages]\nupdate_clip = [{c = 1}, {c = 2}]\n",
                                                       "error: [stages.update_clip]=[{'c': 1}, {'c': 2}] is invalid"),
    "a stage list that is a string": ("workers = 7\nrounds = 1\nstages = 'update_clip'\n",
                                      "error: stages='update_clip' is invalid: allowed a table"),
    "a built-in stage's bad parameter": (RUN + "\n[stages.dp]\nnoise = -1.0\nclip = 1.0\n",
                                         "error: [stages.dp].noise=-1.0 is invalid"),
}
"""Bad stage lists: the file, and the start of the one line both commands print."""


def _phalanx(args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """The ``phalanx`` script (its entry point, as a user runs it): exit code and what it printed."""
    monkeypatch.setattr("sys.argv", ["phalanx", *args])
    try:
        cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    else:
        code = 0
    return code, capsys.readouterr().out


@pytest.mark.parametrize("case", list(BAD))
def test_config_show_refuses_what_run_refuses_with_the_same_line(case: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    text, line = BAD[case]
    path = tmp_path / "job.toml"
    path.write_text(text)
    ran = _phalanx(["run", str(path), "--out", str(tmp_path / "out")], capsys, monkeypatch)
    shown = _phalanx(["config", "show", str(path)], capsys, monkeypatch)
    flat = _phalanx(["config", "show", "--flat", str(path)], capsys, monkeypatch)
    assert ran[0] == 2 and ran[1].startswith(line) and ran[1].count("\n") == 1, ran
    assert shown == ran and flat == ran  # the same one line, the same exit code: nothing printed before it
    assert not (tmp_path / "out").exists()


def test_config_show_still_prints_what_run_takes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "job.toml"
    path.write_text(RUN + "\n[stages.update_clip]\nc = 0.5\n")
    code, out = _phalanx(["config", "show", str(path)], capsys, monkeypatch)
    assert code == 0 and "[stages.update_clip]\nc = 0.5" in out


def test_the_mutant_show_that_does_not_validate_prints_what_run_refuses(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: ``config show`` as it was, reading the file without the run's validation — it prints (exit 0) a
    config that ``run`` refuses, which the test above fails."""
    from phalanx.cli import runs

    path = tmp_path / "job.toml"
    path.write_text(BAD["a bad parameter"][0])
    with monkeypatch.context() as m:
        m.setattr(runs, "_validated_grid", lambda config, overrides: ({}, None, []))
        shown = _phalanx(["config", "show", str(path)], capsys, monkeypatch)
    ran = _phalanx(["run", str(path), "--out", str(tmp_path / "out")], capsys, monkeypatch)
    assert shown[0] == 0 and "c = -1" in shown[1] and ran[0] == 2 and shown != ran
