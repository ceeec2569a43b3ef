"""Rank 0's own records under ``phalanx launch`` — ``distributed.json`` and the keyed run's transcript — written through
the run directory's held descriptor (issue 38, as tests/test_run_dir_links.py for the experiments' writes): a co-user
who swaps the run directory for a link after its check sends none of them into the link's target.

The swap is made by the test at a known point (in-process between the check and the writes; in a real job while rank
0 holds before a round, ``PHALANX_TEST_HOLD``), not by timing. Each has its mutant: the write by name, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.test_distributed import run_dir, wait_for
from tests.test_distributed_sealed import SEALED, job

from _rundirs import file_states, swap_for_link
from phalanx.distributed.audit import audit
from phalanx.distributed.chain import Appender, Chain
from phalanx.distributed.keys import init_keys
from phalanx.distributed.recording import DistributedLog
from phalanx.distributed.transcript import TRANSCRIPT
from phalanx.errors import OutputError
from phalanx.experiments import dirfd, store
from phalanx.experiments.store import atomic_write_text

VICTIM = {"distributed.json": b'{"a victim\'s": "log"}\n', TRANSCRIPT: b'{"a victim\'s": "transcript"}\n',
          "manifest.json": b"{}\n"}


def _victim(tmp_path: Path) -> tuple[Path, dict[str, tuple[int, bytes]]]:
    """A directory of the victim's (another of their runs) that the attacker's link points at, and its files."""
    victim = tmp_path / "victim"
    victim.mkdir(parents=True)
    for name, payload in VICTIM.items():
        (victim / name).write_bytes(payload)
    return victim, file_states(victim)




def _records_after_a_swap(run: Path, victim: Path) -> Path:
    """Rank 0's writes as a run makes them, the run directory swapped between its check (the held descriptor) and
    them: the transcript opened (as a resume opens it) and appended, synced into the manifest, distributed.json
    written. Returns where the checked directory went."""
    with dirfd.held(run):
        store.prepare_run_dir(run, {"x": 1}, 0, "")
        log = DistributedLog(run / "distributed.json", "server", 3, lambda t: True)
        moved = swap_for_link(run, victim)
        out = Appender(run / TRANSCRIPT, Chain(), hashlib.sha256(), 0)
        out.append([b'{"round": 0}\n'], 0)
        out.sync()
        out.close()
        log.write()
    return moved


def test_rank0s_records_after_a_swap_stay_in_the_checked_directory(tmp_path: Path) -> None:
    (victim, before), run = _victim(tmp_path), tmp_path / "r"
    moved = _records_after_a_swap(run, victim)
    assert file_states(victim) == before  # nothing written, replaced, appended or truncated through the link
    assert (moved / TRANSCRIPT).read_bytes() == b'{"round": 0}\n'
    assert json.loads((moved / "distributed.json").read_text())["summary"]["world_size"] == 3
    manifest = json.loads((moved / "manifest.json").read_text())
    assert manifest["artifacts"][TRANSCRIPT]["sha256"] == hashlib.sha256(b'{"round": 0}\n').hexdigest()


def test_a_link_planted_as_the_transcript_is_refused_not_followed(tmp_path: Path) -> None:
    (victim, before), run = _victim(tmp_path), tmp_path / "r"
    with dirfd.held(run):
        (run / TRANSCRIPT).symlink_to(victim / TRANSCRIPT)
        with pytest.raises(OutputError) as caught:
            Appender(run / TRANSCRIPT, Chain(), hashlib.sha256(), 0)
    assert str(run / TRANSCRIPT) in str(caught.value) and "\n" not in str(caught.value)
    assert file_states(victim) == before


def _by_name(self: DistributedLog) -> None:
    """The mutant: distributed.json written by name, as before (``atomic_write_text``)."""
    payload = {"summary": self.summary(), "rounds": [vars(r) for r in self.log]}
    atomic_write_text(self.path, json.dumps(payload, indent=1))


def test_the_mutant_by_name_writes_into_the_links_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every write by name (no held descriptor) the transcript is truncated and appended and distributed.json
    replaced in the victim's directory; with only distributed.json by name, that file alone."""
    (victim, before), run = _victim(tmp_path), tmp_path / "r"
    with monkeypatch.context() as m:
        m.setattr(dirfd, "fd_of", lambda path: None)
        _records_after_a_swap(run, victim)
    changed = {n for n, b in file_states(victim).items() if before.get(n) != b}
    assert {"distributed.json", TRANSCRIPT, "manifest.json"} <= changed
    assert (victim / TRANSCRIPT).read_bytes() == b'{"round": 0}\n'
    (victim2, before2), run2 = _victim(tmp_path / "2"), tmp_path / "r2"
    monkeypatch.setattr(DistributedLog, "write", _by_name)
    _records_after_a_swap(run2, victim2)
    assert {n for n, b in file_states(victim2).items() if before2.get(n) != b} == {"distributed.json"}


# -- a real keyed job: rank 0 holds before round 7, the test swaps its run directory for a link ------------------------

@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_keys(d / "job", 4)
    return d


MUTANT_SITE = '''
import json
from phalanx.distributed.recording import DistributedLog
from phalanx.experiments.store import atomic_write_text

def _by_name(self):
    payload = {"summary": self.summary(), "rounds": [vars(r) for r in self.log]}
    atomic_write_text(self.path, json.dumps(payload, indent=1))

DistributedLog.write = _by_name
'''


def _swapped_job(keys: Path, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[Path, Path, dict[str, Any]]:
    """The keyed job (10 rounds, checkpoints at 5 and 10); while rank 0 holds before round 7 its run directory is
    swapped for a link to the victim's. Returns the victim, where the run directory went, and the victim's files."""
    victim, before = _victim(tmp_path)
    go, out, moved = tmp_path / "go7", tmp_path / "out", []

    def script(procs: list[subprocess.Popen[bytes]], errs: Path, port: int) -> None:
        wait_for("holding round 7", errs, procs[0])
        moved.append(swap_for_link(run_dir(out), victim))
        go.touch()

    code, errs, _ = job({**SEALED, "keys": str(keys / "job")}, out, tmp_path,
                        env={"PHALANX_TEST_HOLD": f"7:{go}", **(env or {})}, script=script)
    assert code == 0, errs[-3000:]
    return victim, moved[0], before


@pytest.mark.slow
def test_a_keyed_job_whose_run_directory_is_swapped_mid_run_writes_nothing_into_the_links_target(
        keys: Path, tmp_path: Path) -> None:
    victim, moved, before = _swapped_job(keys, tmp_path)
    assert file_states(victim) == before
    assert (moved / "DONE").exists()
    assert [r["round"] for r in json.loads((moved / "distributed.json").read_text())["rounds"]] == list(range(10))
    report = audit(moved)  # the transcript, signed to its last line, in the directory the run checked
    assert report.ok, report.problems


@pytest.mark.slow
def test_the_mutant_job_writes_distributed_json_into_the_links_target(keys: Path, tmp_path: Path) -> None:
    site = tmp_path / "mutant_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(MUTANT_SITE)  # rank 0 writes distributed.json by name, as before
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    victim, moved, before = _swapped_job(keys, tmp_path, env={"PYTHONPATH": path})
    assert {n for n, b in file_states(victim).items() if before.get(n) != b} == {"distributed.json"}
    assert [r["round"] for r in json.loads((victim / "distributed.json").read_text())["rounds"]] == list(range(10))
    assert [r["round"] for r in json.loads((moved / "distributed.json").read_text())["rounds"]] == list(range(5))


