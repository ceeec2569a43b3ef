"""Which runs a report counts, and as which run (a review): a sweep under ``verify_key`` reported a forged, unsigned
folder planted in its ``--out`` beside the runs it verified; a copy of one run under other names counted as more
seeds; ``phalanx verify`` passed a folder that held another seed's run than its name said (two folders swapped)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import _rundirs
from _rundirs import finished, forge_rows, one_line, rehash  # noqa: F401  (finished: a fixture)
from phalanx import cli, signing
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, report, train
from phalanx.experiments.runner import run_grid
from phalanx.experiments.validrun import name_of

runner = CliRunner()

BASE: dict[str, Any] = {"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 4, "eval_every": 2,
                        "checkpoint_every": 2}

keys = _rundirs.keys  # a key pair (a fixture)


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]) -> tuple[Path, Path]:
    """Seed 0's and seed 1's finished runs, trained and signed under the key."""
    out = tmp_path_factory.mktemp("signed")
    cfgs = [make_config({**BASE, "seed": s, "sign_key": str(keys["key"])}) for s in (0, 1)]
    a, b = run_grid(cfgs, out)
    return a, b


def _copy(runs: tuple[Path, ...], out: Path) -> list[Path]:
    return [Path(shutil.copytree(r, out / r.name)) for r in runs]


def _seeds(text: str) -> list[int]:
    """The ``seeds`` column of the summary ``phalanx run --format json`` prints."""
    return [int(r["seeds"]) for r in json.loads(text)["tables"][0]["rows"]]


def test_a_sweeps_report_under_verify_key_leaves_out_a_folder_planted_beside_its_runs(
        tmp_path: Path, keys: dict[str, Path], signed: tuple[Path, Path]) -> None:
    """review: t_plant_verify.sh — an unsigned folder of another seed (seed 5, rows forged to 0.99, digests
    recomputed, named by its own run id) planted in the sweep's ``--out``: the sweep verifies its grid's runs, and
    its report is of them alone, with one line counting the folder it left out; ``phalanx report`` (no key) still
    reports every run there. On the code before, the sweep's report pooled the forged run as a third seed."""
    out = tmp_path / "out"
    out.mkdir()
    _copy(signed, out)
    planted = Path(shutil.copytree(signed[0], out / "planted"))
    cfg = json.loads((planted / "config.json").read_text())
    cfg["seed"] = 5
    (planted / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    (planted / signing.SIGNATURE).unlink()
    forge_rows(planted, 0.99)
    rehash(planted)
    planted = planted.rename(out / name_of(cfg))
    toml = tmp_path / "verified.toml"
    toml.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in {
        **BASE, "seed": [0, 1], "verify_key": str(keys["pub"])}.items()))
    res = runner.invoke(cli.app, ["run", str(toml), "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert _seeds(res.stdout) == [2], res.stdout
    assert "1 other run folder(s)" in res.output and "not runs of this grid" in res.output, res.output
    md = (out / "report.md").read_text()
    assert "99.0" not in md and "1 other run folder(s)" in md, md
    assert len({r["run"] for r in report.collect(out)}) == 3  # phalanx report DIR: every run, each a seed


def test_copies_of_one_run_are_refused_not_counted_as_seeds(tmp_path: Path, finished: Path) -> None:  # noqa: F811
    """review: t_dup.sh — one finished run copied under a made-up name beside itself was counted as two seeds (the
    report's mean and std over copies). The second folder of one run is one line naming both, in the API and in
    ``phalanx report`` (exit 2); distinct runs under free names (``train(cfg, "runs/base")``) are reported."""
    cfg = json.loads((finished / "config.json").read_text())
    out = tmp_path / "dup"
    out.mkdir()
    own = Path(shutil.copytree(finished, out / name_of(cfg)))
    copy = Path(shutil.copytree(finished, out / "zz_copy"))
    with pytest.raises(ConfigError) as info:
        report.collect(out)
    one_line(info.value, str(copy), str(own), "one folder per run")
    res = runner.invoke(cli.app, ["report", str(out)])
    assert isinstance(res.exception, ConfigError) and str(copy) in str(res.exception), res.output
    shutil.rmtree(copy)
    train(make_config({**FREE, "seed": 1}), out / "base")  # another run, a free name: no run id claimed
    assert {r["run"] for r in report.collect(out)} == {name_of(cfg), "base"}


FREE = _rundirs.FINISHED


def _swapped(signed: tuple[Path, Path], out: Path) -> tuple[Path, Path]:
    """Copies of the two signed runs in ``out``, each under the other's run id (two folders swapped)."""
    out.mkdir()
    a, b = _copy(signed, out)
    a.rename(out / "tmp")
    b.rename(a)
    (out / "tmp").rename(b)
    return a, b


def test_a_folder_named_as_another_runs_id_is_refused_in_report_and_verify(
        tmp_path: Path, keys: dict[str, Path], signed: tuple[Path, Path]) -> None:
    """review: t_dup.sh / t_verify_swap.sh — seed 0's run under seed 1's run id (a copy, or two folders swapped)
    was reported as seed 1's; each folder named as a run id must hold that run."""
    a, b = _swapped(signed, tmp_path / "swap")
    with pytest.raises(ConfigError) as info:
        report.collect(tmp_path / "swap")
    one_line(info.value, str(a), b.name, "seed 1", "named by the run id")


def test_verify_names_the_run_and_refuses_a_swapped_folder(
        tmp_path: Path, keys: dict[str, Path], signed: tuple[Path, Path]) -> None:
    """review: t_verify_swap.sh — ``phalanx verify DIR --key`` said "proven" of a folder holding seed 1's signed run
    under seed 0's name. It now names the run it proved (run id and seed), and refuses a folder named as another
    run's id in one line."""
    res = runner.invoke(cli.app, ["verify", str(signed[0]), "--key", str(keys["pub"])])
    assert res.exit_code == 0, res.output
    assert f"of the run {signed[0].name} (seed 0)" in res.output, res.output
    a, b = _swapped(signed, tmp_path / "vswap")
    res = runner.invoke(cli.app, ["verify", str(a), "--key", str(keys["pub"])])
    assert isinstance(res.exception, ConfigError), res.output
    one_line(res.exception, str(a), b.name, "seed 1")
