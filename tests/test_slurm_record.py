"""A Slurm job array that was submitted is never reported as a failure that asks to run the command again (which
would submit a second array): ``OUT/grid.json`` that cannot be written after the submission — its lock held by
someone else past its timeout, a full disk — is a warning naming the job (``phalanx.experiments.slurm``). No cluster
is needed: submitit's executor is replaced by one that hands back a job id."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from phalanx.errors import OutputError
from phalanx.experiments import slurm, status
from phalanx.experiments.config import make_config, validate
from phalanx.experiments.executor import Hooks


class _Executor:
    """submitit's SlurmExecutor as the grid calls it: one array submitted, job 4242."""

    submitted: ClassVar[list[Any]] = []

    def __init__(self, **kwargs: Any) -> None:
        pass

    def update_parameters(self, **kwargs: Any) -> None:
        pass

    def map_array(self, fn: Any, args: list[Any], threads: list[int]) -> list[Any]:
        _Executor.submitted.append(args)
        return [SimpleNamespace(job_id=f"4242_{i}") for i in range(len(args))]


def test_a_grid_json_that_cannot_be_recorded_after_the_submission_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    fake = SimpleNamespace(SlurmExecutor=_Executor, helpers=SimpleNamespace(Checkpointable=object))
    monkeypatch.setattr(slurm, "_submitit", lambda: fake)
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/" + name)

    def cannot(*args: Any) -> None:
        raise OutputError(str(tmp_path / "out" / status.GRID), ".grid.lock was held by other processes for 60 s",
                          "end it")

    monkeypatch.setattr(status, "record_slurm_job", cannot)
    out = tmp_path / "out"
    out.mkdir()
    run = validate(make_config({"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 2}))
    executor = slurm.SlurmExecutor(slurm.SlurmOptions(detach=True, folder=str(tmp_path / "logs")))
    _Executor.submitted.clear()
    outcome = executor.run([(run, out / "a")], out, Hooks())
    err = capsys.readouterr()
    assert len(_Executor.submitted) == 1 and outcome.submitted == {out / "a": "4242"}
    assert "submitted Slurm job array 4242" in err.out
    (line,) = [x for x in err.err.splitlines() if "warning" in x]
    assert "job array 4242 was submitted and runs" in line and "squeue -j 4242" in line and "run the command" not in \
        line.split("(")[0]
