"""The fault campaign (``scripts/fault_campaign.py``) on a few kill points of every family — a write point of the
checkpoint's manifest update, the Parquet file torn in its write, ``phalanx run`` killed at a random time, and
``phalanx sweep --jobs 2`` killed at a random time, then one of its workers — resumes to the reference, bit for bit,
with nothing done twice and no process left; the plan spreads ``--points`` over the families."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from _scripts import load_script
from phalanx.errors import IntegrityError

fc = load_script("scripts/fault_campaign.py", "fault_campaign")


def _reference(points: list[dict[str, Any]]) -> Any:
    return fc.Reference(Path("out"), [{"ev": "point", **p} for p in points], duration=4.0, first_write=2.0)


def _points() -> list[dict[str, Any]]:
    """The write points of a run as the harness logs them: 34 in the run directory, 6 of the command's own files."""
    pts = [("out", "torn", "grid.json", None, "open"), ("out", "rename", "grid.json", None, "open")]
    for phase, files in (("open", ("config.json",)), ("checkpoint 2", ("metrics.jsonl", "checkpoint.safetensors")),
                         ("checkpoint 4", ("metrics.jsonl", "checkpoint.safetensors")),
                         ("finish", ("metrics.jsonl", "metrics.parquet", "DONE"))):
        if phase == "open":
            pts += [("run", "torn", "manifest.json", None, phase), ("run", "rename", "manifest.json", None, phase)]
        for f in files:
            pts += [("run", "torn", f, None, phase), ("run", "torn", "manifest.json", f, phase),
                    ("run", "rename", "manifest.json", f, phase), ("run", "rename", f, None, phase)]
    pts += [("out", k, f, None, "report") for f in ("accuracy.png", "report.md") for k in ("torn", "rename")]
    keys = ("dir", "kind", "file", "ctx", "phase")
    return [{"i": i, **dict(zip(keys, p))} for i, p in enumerate(pts, 1)]


def _families(cases: list[Any]) -> dict[str, int]:
    count: dict[str, int] = {}
    for case in cases:
        for kill in case.kills:
            count[kill.family] = count.get(kill.family, 0) + 1
    return count


def test_the_plan_covers_every_family_and_every_write_point_when_they_fit() -> None:
    points = _points()
    assert len(points) == 40 and sum(p["dir"] == "run" for p in points) == 34
    ref = _reference(points)
    refs = {"run": ref, "run-short": ref, "sweep": ref}
    cases = fc.plan(50, 0, refs)
    count = _families(cases)
    assert sum(count.values()) == 50 and set(count) == set(fc.FAMILIES)
    targeted = [k.spec["nth"] for c in cases for k in c.kills if k.family == "c-targeted"]
    assert len(targeted) == len(set(targeted)) == 35
    assert {p["i"] for p in points if p["dir"] == "run"} <= set(targeted)  # every write of the run directory
    assert all(len({k.family for k in c.kills}) == 1 for c in cases)
    assert {c.command for c in cases if c.kills[0].family == "c-targeted"} == {"run-short"}
    assert max(len(c.kills) for c in cases) == 2  # some cases are killed twice
    assert all(2.0 * 0.9 <= k.delay <= 4.0 for c in cases for k in c.kills if k.spec is None)
    assert [k.delay for c in fc.plan(50, 0, refs) for k in c.kills] == [k.delay for c in cases for k in c.kills]
    big = _families(fc.plan(80, 1, refs))
    assert big["c-targeted"] == 40 and sum(big.values()) == 80  # all of them: exhaustive
    small = _families(fc.plan(4, 0, refs))
    assert small == {"a-run": 1, "b-sweep-parent": 1, "b-sweep-worker": 1, "c-targeted": 1}


def test_bad_arguments_are_one_line_errors_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--points=3 is invalid"):
        fc.main(["--points", "3"])
    (tmp_path / "x").write_text("mine")
    with pytest.raises(SystemExit, match=r"allowed a new or empty directory"):
        fc.main(["--out", str(tmp_path)])
    assert (tmp_path / "x").read_text() == "mine"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "pidfd_open") or not Path("/proc/self/environ").exists(),
                    reason="finds and waits for processes with /proc and pidfd (Linux)")
def test_killed_commands_resume_to_the_reference(tmp_path: Path) -> None:
    camp = fc.Campaign(tmp_path / "work", seed=3, grid=fc.GRID.replace("rounds = 60", "rounds = 6"))
    refs = camp.references(("run-short", "sweep"))
    rng = random.Random(3)

    def timed(family: str, ref: Any) -> Any:
        return fc.Kill(family, delay=rng.uniform(0.9 * ref.first_write, ref.duration))

    manifest = next(p for p in refs["run-short"].points if p["phase"] == "checkpoint 2" and p["kind"] == "rename"
                    and p["ctx"] == "checkpoint.safetensors")
    cases = [
        fc.Case(1, [fc.Kill("c-targeted", spec={"nth": manifest["i"]}, where=fc.describe(manifest)),
                    fc.Kill("c-targeted", spec={"kind": "torn", "file": "metrics.parquet", "nth": 1},
                            where="finish: torn temp of metrics.parquet (resumed command)"),
                    timed("a-run", refs["run-short"])], command="run-short"),
        fc.Case(2, [timed("b-sweep-parent", refs["sweep"]), timed("b-sweep-worker", refs["sweep"])]),
    ]
    results = [camp.run_case(case) for case in cases]
    lines = [line for r in results for line in r.lines()]
    print("\n".join(lines))
    assert all(r.ok for r in results), lines
    assert len(lines) == 5
    first, second = results[0].outcomes[:2]
    assert first.killed and first.where == fc.describe(manifest) and first.rc == -9
    assert second.killed and second.where == "finish: torn temp of metrics.parquet"
    summary, failed = fc.summary(results)
    assert failed == 0 and "points=5" in summary and "failed=0" in summary


def _ev(ev: str, run: str = "r", tag: str = "t1", **kw: Any) -> dict[str, Any]:
    return {"ev": ev, "run": run, "tag": tag, "pid": 1, "t": 0.0, **kw}


def test_the_event_checks_catch_rounds_done_twice_lost_or_after_the_end() -> None:
    fine = [_ev("load", round=None), _ev("ckpt-begin", round=2), _ev("ckpt-end", round=2), _ev("ckpt-begin", round=4),
            _ev("load", tag="t2", round=2), _ev("ckpt-begin", tag="t2", round=4), _ev("ckpt-end", tag="t2", round=4),
            _ev("finish-begin", tag="t2"), _ev("finish-end", tag="t2")]
    assert fc.check_events(fine) == []
    # killed after the rename of checkpoint 4, before its end was logged: resuming from 4 is right too
    assert fc.check_events([*fine[:4], _ev("load", tag="t2", round=4)]) == []
    twice = [*fine[:3], _ev("load", tag="t2", round=None), _ev("ckpt-begin", tag="t2", round=2),
             _ev("ckpt-end", tag="t2", round=2)]
    assert any("resumed from round None" in p for p in fc.check_events(twice))
    assert any("installed twice" in p for p in fc.check_events(twice))
    after = [*fine, _ev("ckpt-begin", tag="t3", round=6), _ev("finish-begin", tag="t3")]
    problems = fc.check_events(after)
    assert any("after the run finished" in p for p in problems) and any("finished twice" in p for p in problems)
    assert any("opened twice" in p for p in fc.check_events([*fine[:3], _ev("load", round=2)]))


def test_the_result_checks_catch_a_changed_row_tensor_or_finished_run(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from phalanx.experiments import make_config, train

    cfg = make_config({"dataset": "digits", "model": "mlp", "workers": 4, "rounds": 4, "batch_size": 8,
                       "eval_every": 1, "checkpoint_every": 2})
    train(cfg, tmp_path / "ref" / "run")
    fresh = {"ref": tmp_path / "ref"}
    for name in ("same", "row", "bit"):
        fresh[name] = tmp_path / name
        train(cfg, fresh[name] / "run")
    info: dict[str, Any] = {}
    assert fc.compare(fresh["ref"], fresh["same"], info) == []
    assert info["compared"]["metrics.jsonl"] == 1
    rows = (fresh["row"] / "run" / "metrics.jsonl").read_text().replace('"round": 3,', '"round": 2,')
    (fresh["row"] / "run" / "metrics.jsonl").write_text(rows)
    problems = fc.compare(fresh["ref"], fresh["row"], {})
    assert any("rows differ" in p for p in problems) and any("more than once: [2]" in p for p in problems)
    assert any("does not record metrics.jsonl" in p for p in problems)
    ckpt = fresh["bit"] / "run" / "checkpoint.safetensors"
    tensors = load_file(str(ckpt))
    tensors["theta"][0] = tensors["theta"][0].nextafter(tensors["theta"][0] + 1)  # one ulp
    save_file(tensors, str(ckpt), metadata={"round": "4", "rows": "5"})
    assert any("tensors differ from the reference's: theta" in p for p in fc.compare(fresh["ref"], fresh["bit"], {}))
    before = fc.done_files(fresh["same"])
    (fresh["same"] / "run" / "DONE").write_text("again\n")
    events = [_ev("ckpt-begin", run="run", tag="t9", round=2)]
    problems = fc.untouched(before, fc.done_files(fresh["same"]), events, "t9")
    assert any("changed by a later command (DONE)" in p for p in problems)
    assert any("trained again (ckpt-begin)" in p for p in problems)


def test_a_first_write_killed_between_recording_and_renaming_resumes(tmp_path: Path) -> None:
    """The state a SIGKILL leaves inside the first ``store.write_artifact`` of ``metrics.jsonl`` (at the first
    checkpoint): its digest recorded in the manifest (no previous one), its temporary file complete, no
    ``metrics.jsonl`` yet. The run must resume (from round 0: there is no checkpoint): the write is finished (found
    by the fault campaign: the points 'checkpoint 2: metrics.jsonl / checkpoint.safetensors temp complete, before
    rename')."""
    import hashlib

    from phalanx.experiments import make_config, store, train

    cfg = make_config({"dataset": "digits", "model": "mlp", "workers": 4, "rounds": 4, "batch_size": 8,
                       "eval_every": 1, "checkpoint_every": 2})
    d = tmp_path / "run"
    store.prepare_run_dir(d, cfg.identity(), cfg.seed, "")
    payload = b'{"round": 0, "test_accuracy": 0.1}\n'
    (d / ".metrics.jsonl.k2j4x9a1.tmp").write_bytes(payload)
    store._record(d, "metrics.jsonl", hashlib.sha256(payload).hexdigest())
    assert train(cfg, d)[-1]["round"] == 4
    assert not list(d.glob(".metrics.jsonl.*.tmp"))  # the interrupted write was finished, then replaced
    (d / "checkpoint.safetensors").unlink()  # a file deleted by hand (no temporary file of it): still refused
    with pytest.raises(IntegrityError, match="missing"):
        train(cfg, d)


class _Killed(BaseException):
    """Stands for a SIGKILL (a BaseException: no handler of the code under test catches it)."""


def test_a_kill_at_the_rows_rename_of_a_later_checkpoint_resumes_to_the_uninterrupted_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/reliability.md: the rows are written before the checkpoint, so a kill at any moment resumes. Killed
    (deterministically, in process) right after the manifest records the second checkpoint's ``metrics.jsonl`` and
    before its rename, the run resumes from the first checkpoint to the rows of an uninterrupted run. Were the rows
    written after the checkpoint (a mutant the kill-at-random campaign let through), the checkpoint of round 4 would
    be installed with the rows of round 2 and the run would refuse to resume ("rows are missing")."""
    from phalanx.experiments import make_config, store, train

    cfg = make_config({"dataset": "digits", "model": "mlp", "workers": 4, "rounds": 6, "batch_size": 8,
                       "eval_every": 1, "checkpoint_every": 2})
    reference = train(cfg, tmp_path / "ref")
    real, seen = store._record, []

    def record_then_kill(out: Path, name: str, digest: str) -> None:
        real(out, name, digest)
        if name == "metrics.jsonl":
            seen.append(digest)
            if len(seen) == 2:  # the checkpoint of round 4: recorded, not yet renamed
                raise _Killed

    monkeypatch.setattr(store, "_record", record_then_kill)
    with pytest.raises(_Killed):
        train(cfg, tmp_path / "run")
    monkeypatch.setattr(store, "_record", real)
    assert train(cfg, tmp_path / "run") == reference
