"""What a grid trusts an ended run for (phalanx.experiments.ended): a diverged run is held to the same checks as a
finished one, the rows reported under ``verify_key`` are the rows verified, and a run made to look unfinished is not
resumed under ``verify_key`` from a record anyone can write (review38, findings 1, 3, 5 and 9).

The attacker of these tests can write the run directory (a co-user of a shared ``runs/`` folder) but holds no key:
they delete, plant and rewrite files and recompute every digest of ``manifest.json``. Each check has its mutant: the
check monkeypatched back to what it was, under which the same attack gets the forged rows reported.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("model_signing")

from safetensors.torch import load_file, save_file

import _rundirs
from _interrupt import train_interrupted
from _rundirs import forge_rows, one_line, rehash, reported
from phalanx import __version__, signing
from phalanx.errors import ConfigError, IntegrityError
from phalanx.experiments import ended, make_config, provenance, report, runfiles, runstate, store, train
from phalanx.experiments.provenance import ProvenanceError
from phalanx.experiments.runner import run_grid

BASE: dict[str, Any] = {"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 4, "eval_every": 1,
                        "checkpoint_every": 2}


keys = _rundirs.keys  # the victim's key pair (a fixture)


def _cfg(keys: dict[str, Path] | None, *, sign: bool = True, verify: bool = True, **over: Any) -> Any:
    extra: dict[str, Any] = {}
    if keys is not None and sign:
        extra["sign_key"] = str(keys["key"])
    if keys is not None and verify:
        extra["verify_key"] = str(keys["pub"])
    return make_config({**BASE, **extra, **over})


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]) -> tuple[Path, Path]:
    """Seed 0's and seed 1's finished runs, trained and signed under the key (as the review's ``s/``)."""
    out = tmp_path_factory.mktemp("signed")
    a, b = run_grid([_cfg(keys, seed=0), _cfg(keys, seed=1)], out)
    return a, b


def _copy(runs: tuple[Path, ...], out: Path) -> list[Path]:
    return [Path(shutil.copytree(r, out / r.name)) for r in runs]


def plant_diverged(d: Path, acc: float) -> None:
    """review38_repro/plant_diverged.py: a signed finished run turned 'diverged', its rows the attacker's."""
    for name in ("DONE", signing.SIGNATURE, "checkpoint.safetensors", "metrics.parquet"):
        (d / name).unlink(missing_ok=True)
    forge_rows(d, acc)
    (d / "DIVERGED").write_text(json.dumps({"round": BASE["rounds"], "non_finite": 0, "size": 0, "when": "x"}) + "\n")
    rehash(d)


def forge_unfinished(d: Path, acc: float) -> None:
    """review38_repro/forge_unfinished.py: a signed finished run made to look unfinished, with forged rows and a
    consistent, unsigned one-session record (public formats only)."""
    ckpt = d / "checkpoint.safetensors"
    meta = dict(runfiles.checkpoint_header(ckpt).metadata)
    tensors = load_file(str(ckpt))
    forge_rows(d, acc)
    payload = (d / "metrics.jsonl").read_bytes()
    cfg = json.loads((d / "config.json").read_text())
    man = json.loads((d / "manifest.json").read_text())
    seg = {"type": provenance.FORMAT, "run": provenance.run_digest(cfg), "data": man["data_fingerprint"],
           "segment": 1, "from": provenance.FRESH.json(), "to": {"round": int(meta["round"]),
           "tensors": runfiles.tensors_digest(tensors), "rows": hashlib.sha256(payload).hexdigest()},
           "signer": None, "phalanx": __version__}
    stmt = json.dumps(seg, sort_keys=True, separators=(",", ":"))
    meta[provenance.KEY] = json.dumps([{"statement": stmt, "bundle": None}], separators=(",", ":"))
    save_file(tensors, str(ckpt), metadata=meta)
    for name in ("DONE", signing.SIGNATURE, "metrics.parquet"):
        (d / name).unlink(missing_ok=True)
    rehash(d)


def _old_check(run_dir: Path, cfg: Any) -> None:
    """The mutant of finding 1: run_grid's former branches — a finished run checked, a diverged one believed."""
    if store.is_finished(run_dir):
        if cfg.verify_key is not None:
            signing.verify(run_dir, cfg.verify_key)
        store.check_finished(run_dir, cfg.identity())
        provenance.check_recorded(run_dir, cfg.identity())
        if cfg.verify_key is not None:
            provenance.require(run_dir, Path(cfg.verify_key))


# ------------------------------------------------------------------------------------ finding 1: a planted DIVERGED


def test_a_planted_diverged_marker_is_refused_under_verify_key_and_its_mutant_reports_the_forged_rows(
        tmp_path: Path, keys: dict[str, Path], signed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    (run,) = _copy(signed[:1], tmp_path)
    plant_diverged(run, 0.99)
    with pytest.raises(ProvenanceError) as info:
        run_grid([_cfg(keys, seed=0)], tmp_path)
    one_line(info.value, str(run), "diverged", "never signed", "verify_key")
    monkeypatch.setattr(ended, "check", _old_check)  # mutant: the diverged run is skipped on the marker's word
    run_grid([_cfg(keys, seed=0)], tmp_path)
    assert reported(tmp_path, 0) == 0.99


def test_a_diverged_run_planted_without_a_key_is_refused_by_the_unkeyed_checks(
        tmp_path: Path, keys: dict[str, Path], signed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's sabotage (``rm DONE``, a ``DIVERGED`` written by hand, no manifest edit) and its variant (seed
    1's config swapped in under seed 0's id, digests recomputed, plus ``DIVERGED``): refused in one line without a
    key, as the same edits on a finished run are."""
    a, b = _copy(signed, tmp_path)
    (a / "DONE").unlink()
    (a / "DIVERGED").write_text('{"round": "x"}\n')
    victim = _cfg(keys, seed=0, verify=False)
    with pytest.raises(IntegrityError) as integrity:
        run_grid([victim], tmp_path)
    one_line(integrity.value, "DONE", "missing")
    manifest = json.loads((a / "manifest.json").read_text())
    del manifest["artifacts"]["DONE"]  # DONE's record dropped too: the marker itself is what is refused
    (a / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError) as marker:
        run_grid([victim], tmp_path)
    one_line(marker.value, "DIVERGED", "not recorded in manifest.json")
    shutil.rmtree(a)
    shutil.copytree(b, a)
    plant_diverged(a, 0.99)
    with pytest.raises(ConfigError) as swapped:  # seed 1's run under seed 0's id
        run_grid([victim], tmp_path)
    one_line(swapped.value, "differs in seed")
    monkeypatch.setattr(ended, "check", _old_check)  # mutant: skipped as diverged, seed 1's forged rows reported
    run_grid([victim], tmp_path)
    with pytest.raises(ConfigError) as misnamed:  # … but by now the report refuses a folder named as another run's
        reported(tmp_path, 1)
    one_line(misnamed.value, str(a), "named by the run id")
    monkeypatch.setattr(report, "_check_run", lambda *args: None)  # and without that check too: reported
    assert reported(tmp_path, 1) == 0.99


def test_without_a_key_a_consistently_planted_divergence_of_the_runs_own_files_is_skipped_the_documented_limit(
        tmp_path: Path, keys: dict[str, Path], signed: tuple[Path, Path]) -> None:
    """The limit docs/security.md states: unsigned, the run's own files turned 'diverged' with every digest
    recomputed are indistinguishable from an honest divergence (the same plant under verify_key is refused)."""
    (run,) = _copy(signed[:1], tmp_path)
    plant_diverged(run, 0.99)
    run_grid([_cfg(keys, seed=0, verify=False)], tmp_path)
    assert reported(tmp_path, 0) == 0.99


def test_a_diverged_marker_the_manifest_does_not_record_is_never_counted(
        tmp_path: Path, signed: tuple[Path, Path]) -> None:
    """report.collect and runstate.final_rows (what studies read) believe only a recorded marker."""
    (run,) = _copy(signed[:1], tmp_path)
    (run / "DIVERGED").write_text('{"round": 2}\n')
    for read in (report.collect, lambda _: runstate.final_rows(run), lambda _: runstate.diverged_again(run)):
        with pytest.raises(IntegrityError) as info:
            read(tmp_path)
        one_line(info.value, "DIVERGED", "not recorded in manifest.json")
    assert runstate.state(run).status == "done"  # status never raises on a hostile file


# ------------------------------------------------------------- finding 3: the rows reported are the rows verified


def test_rows_swapped_after_verify_key_checked_them_are_refused_at_report_time(
        tmp_path: Path, keys: dict[str, Path], signed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """review38_repro/swap_during_sweep.sh, driven by an event: while the sweep trains seed 1 (its first round), the
    attacker rewrites seed 0's verified rows and their manifest digest."""
    (run,) = _copy(signed[:1], tmp_path)
    swapped: list[Path] = []

    def attacker(cfg: Any, t: int, rounds: int) -> None:
        if cfg.seed == 1 and not swapped:
            forge_rows(run, 0.999)
            rehash(run)
            swapped.append(run)

    def sweep(out: Path) -> None:
        run_grid([_cfg(keys, seed=0), _cfg(keys, seed=1)], out, on_round=attacker)
        assert swapped

    sweep(tmp_path)
    with pytest.raises(IntegrityError) as info:
        report.collect(tmp_path)
    one_line(info.value, str(run / "metrics.jsonl"), "changed since its signature was verified")
    with pytest.raises(IntegrityError):
        runstate.final_rows(run)
    # mutant: nothing pinned, the later read checked against the (recomputed) manifest only
    monkeypatch.setattr(store, "pin", lambda out, digests: None)
    again = tmp_path / "again"
    again.mkdir()
    (run,) = _copy(signed[:1], again)
    swapped.clear()
    sweep(again)
    assert reported(again, 0) == 0.999


# ------------------------------------------------- finding 5: verify_key without sign_key, a run made unfinished


def test_a_run_made_to_look_unfinished_is_not_resumed_under_verify_key_alone(
        tmp_path: Path, keys: dict[str, Path], signed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    (run,) = _copy(signed[:1], tmp_path)
    forge_unfinished(run, 0.97)
    victim = _cfg(keys, seed=0, sign=False)
    with pytest.raises(ProvenanceError) as info:
        run_grid([victim], tmp_path)
    one_line(info.value, str(run), "not resumed under verify_key", "trained without a key")
    assert not (run / "DONE").exists()  # nothing resumed, nothing finished
    monkeypatch.setattr(provenance, "require_resumable", lambda *a: None)  # mutant: the former open()
    run_grid([victim], tmp_path)
    assert reported(tmp_path, 0) == 0.97


def test_a_signed_run_stopped_early_resumes_under_verify_key(tmp_path: Path, keys: dict[str, Path]) -> None:
    """The honest case the check must let through: a run trained under the key from round 0, stopped, resumed with
    verify_key alone, finishes."""
    run = tmp_path / "run"
    train_interrupted(_cfg(keys, seed=0, verify=False), run, 2)
    train(_cfg(keys, seed=0, sign=False), run)
    assert store.is_finished(run)


# ----------------------------------------------- finding 9: a row appended after the checkpoint of an unsigned run


def test_a_row_appended_after_the_final_checkpoint_is_refused_on_an_unsigned_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(None, seed=0)
    (run,) = run_grid([cfg], tmp_path)
    honest = reported(tmp_path, 0)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({**rows[-1], "round": BASE["rounds"] + 1, "test_accuracy": 0.99}) + "\n")
    rehash(run)
    with pytest.raises(ProvenanceError) as info:
        run_grid([cfg], tmp_path)
    one_line(info.value, "1 row(s) after its checkpoint's round 4 (round 5)")
    monkeypatch.setattr(provenance, "rows_beyond", lambda run_dir, round_: None)  # mutant: rows_upto(…, round_)
    run_grid([cfg], tmp_path)
    assert reported(tmp_path, 0) == 0.99 != honest


def test_a_finished_run_planted_while_the_grid_runs_is_checked_before_its_rows_are_used(
        tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A run the grid found unfinished when it started, finished and unsigned with forged rows by the time its
    engine opens it (planted while the grid trained another run: an attacker's review reported 94.6 = mean(89.3,
    99.9) under verify_key with no warning). The engine now holds a run it finds finished to the grid's checks.
    Planted here before the grid starts, with the grid's own check skipped, so that the engine finds it; mutant: the
    engine without the check reports the forged rows."""
    src = tmp_path / "src"
    (unsigned,) = run_grid([_cfg(None, seed=0)], src)
    out = tmp_path / "out"
    (run,) = _copy((unsigned,), out)
    forge_rows(run, 0.99)
    rehash(run)
    monkeypatch.setattr(runstate, "is_final", lambda d: False)  # as if planted after the grid's own checks
    with pytest.raises(signing.SignatureError) as info:
        run_grid([_cfg(keys, sign=False, seed=0)], out)
    one_line(info.value, str(run), "signature")
    monkeypatch.setattr(ended, "check_ended", lambda *a: None)  # mutant: the engine trusts what it finds finished
    run_grid([_cfg(keys, sign=False, seed=0)], out)
    assert reported(out, 0) == 0.99
