"""Signatures that prove provenance (phalanx.experiments.provenance): every checkpoint carries the chain of the
training sessions that wrote it, each signed with the run's ``sign_key``; a run resumes under a key only if every
session before was signed by it, and ``phalanx verify`` says which rounds were trained under the key.

The attacker of these tests can write the run directory (a co-user of a shared ``runs/`` folder) but holds no key:
they plant another run's files, rewrite ``config.json``, the manifest's digests, the checkpoint and its metadata.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("model_signing")

from safetensors.torch import load_file, save_file

import _rundirs
from _interrupt import train_interrupted
from _rundirs import one_line, rehash, sha
from phalanx import signing
from phalanx.experiments import make_config, provenance, runfiles, train
from phalanx.experiments.provenance import ProvenanceError
from phalanx.experiments.runner import run_grid

ROOT = Path(__file__).resolve().parent.parent
BASE: dict[str, Any] = {"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 8, "eval_every": 2,
                        "checkpoint_every": 4}


keys = _rundirs.keys  # the victim's and a co-user's key pairs (a fixture)


def _cfg(keys: dict[str, Path] | None = None, **over: Any) -> Any:
    extra = {} if keys is None else {"sign_key": str(keys["key"])}
    return make_config({**BASE, **extra, **over})


@pytest.fixture(scope="module")
def signed_grid(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]) -> tuple[Path, Path]:
    """Seed 0's and seed 1's finished runs, trained and signed under the key."""
    out = tmp_path_factory.mktemp("grid")
    a, b = run_grid([_cfg(keys, seed=0), _cfg(keys, seed=1)], out)
    return a, b


@pytest.fixture(scope="module")
def two_sessions(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]) -> Path:
    """A signed run of 12 rounds stopped after round 8, trained in two sessions (0–4, 4–8)."""
    cfg = _cfg(keys, rounds=12)
    out = tmp_path_factory.mktemp("two") / "run"
    train_interrupted(cfg, out, 4)
    train_interrupted(cfg, out, 8)
    return out


def _copy(src: Path, tmp_path: Path, name: str = "run") -> Path:
    return Path(shutil.copytree(src, tmp_path / name))


def _meta(d: Path) -> dict[str, str]:
    return runfiles.checkpoint_header(d / "checkpoint.safetensors").metadata


def _rewrite_checkpoint(d: Path, meta: dict[str, str], change: Any = None) -> None:
    path = d / "checkpoint.safetensors"
    tensors = load_file(str(path))
    if change is not None:
        change(tensors)
    save_file(tensors, str(path), metadata=meta)


def _chain(d: Path) -> list[dict[str, Any]]:
    return json.loads(_meta(d)[provenance.KEY])


def _set_chain(d: Path, entries: list[dict[str, Any]] | None) -> None:
    meta = dict(_meta(d))
    if entries is None:
        del meta[provenance.KEY]
    else:
        meta[provenance.KEY] = json.dumps(entries)
    _rewrite_checkpoint(d, meta)


def _plant(src: Path, dst: Path, victim: Any) -> None:
    """The issue's attack: another seed's finished run under the victim's run id, made to look unfinished — DONE, the
    signature and the Parquet file removed, ``config.json`` the victim's, the manifest's seed and digests
    recomputed."""
    shutil.copytree(src, dst)
    for name in ("DONE", signing.SIGNATURE, "metrics.parquet"):
        (dst / name).unlink()
    (dst / "config.json").write_text(json.dumps(victim.identity(), indent=2, sort_keys=True))
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["seed"] = victim.seed
    (dst / "manifest.json").write_text(json.dumps(manifest))
    rehash(dst)


def _forged_chain(d: Path, victim: Any) -> list[dict[str, Any]]:
    """An unsigned record of one session that trained the victim's run from round 0 to the checkpoint on disk — what
    an attacker without the key can write."""
    ckpt = d / "checkpoint.safetensors"
    header = runfiles.checkpoint_header(ckpt)
    round_ = int(header.metadata["round"])
    from phalanx.experiments import store

    end = provenance.Point(round_, runfiles.tensors_digest_of_file(ckpt, header), store.rows_upto(d, round_)[1])
    data = store.recorded_fingerprint(d) or ""  # the data set the run directory names, as a consistent forger writes
    seg = {"type": provenance.FORMAT, "run": provenance.run_digest(victim.identity()), "data": data,
           "segment": 1, "from": provenance.FRESH.json(), "to": end.json(), "signer": None, "phalanx": "0"}
    return [{"statement": json.dumps(seg, sort_keys=True, separators=(",", ":")), "bundle": None}]


# ------------------------------------------------------------------------------------------- signed, resumed, proven


def test_a_run_resumed_under_its_key_is_signed_and_verify_says_every_round_was_trained_under_it(
        tmp_path: Path, keys: dict[str, Path], two_sessions: Path) -> None:
    run = _copy(two_sessions, tmp_path)
    train(_cfg(keys, rounds=12), run)  # a third session finishes it
    signing.verify(run, keys["pub"])
    found = provenance.inspect(run, keys["pub"])
    assert found.proven, found.lines()
    assert [(s.start.round, s.end.round) for s in found.chain or []] == [(0, 4), (4, 8), (8, 12)]
    assert found.lines()[0].startswith("provenance: proven — rounds 0–12 ") and "3 session(s)" in found.lines()[0]
    assert all("signed by key" in line for line in found.lines()[1:])
    proc = subprocess.run([sys.executable, "-m", "phalanx.cli", "verify", str(run), "--key", str(keys["pub"])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "signature verified" in proc.stdout and "provenance: proven — rounds 0–12" in proc.stdout


def test_a_segment_is_a_bundle_the_librarys_own_cli_verifies(tmp_path: Path, keys: dict[str, Path],
                                                             two_sessions: Path) -> None:
    """No signature scheme of ours: each session's statement is signed as model-signing signs a file."""
    entry = _chain(two_sessions)[0]
    (tmp_path / signing.STATEMENT_NAME).write_text(entry["statement"])
    (tmp_path / "segment.sig").write_text(entry["bundle"])
    statement = tmp_path / signing.STATEMENT_NAME
    done = subprocess.run([sys.executable, "-m", "model_signing", "verify", "key", str(statement), "--signature",
                           str(tmp_path / "segment.sig"), "--public_key", str(keys["pub"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_sigkilled_signed_run_resumes_and_is_still_proven(tmp_path: Path, keys: dict[str, Path]) -> None:
    """A real SIGKILL (the fault harness) just before the round-8 checkpoint replaces the round-4 one, then the same
    command again: the run resumes from round 4, finishes, is signed, and every round is proven."""
    cfg = tmp_path / "job.toml"
    cfg.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in {**BASE, "sign_key": str(keys["key"])}.items()))
    cmd = [sys.executable, str(ROOT / "scripts" / "_fault_harness.py"), "run", str(cfg), "--out", str(tmp_path / "o")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "PHALANX_FAULT_KILL": json.dumps({"nth": 1, "kind": "rename", "file": "checkpoint.safetensors",
                                             "phase": "checkpoint 8"})}
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    del env["PHALANX_FAULT_KILL"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = [p.parent for p in (tmp_path / "o").glob("*/DONE")]
    signing.verify(run, keys["pub"])
    found = provenance.inspect(run, keys["pub"])
    assert found.proven and [(s.start.round, s.end.round) for s in found.chain or []] == [(0, 4), (4, 8)]


# --------------------------------------------------------------------------------------------------- the planted run


@pytest.mark.parametrize("signed", [True, False], ids=["with sign_key", "without sign_key"])
def test_a_planted_unfinished_run_is_refused_not_resumed_and_signed(
        tmp_path: Path, keys: dict[str, Path], signed_grid: tuple[Path, Path], signed: bool) -> None:
    """The issue's attack, as the attacker left it: seed 1's finished run under seed 0's id as unfinished, config
    and digests rewritten. Its checkpoint's own record names seed 1's run: refused before a round is trained."""
    victim = _cfg(keys if signed else None, seed=0)
    run = tmp_path / signed_grid[0].name
    _plant(signed_grid[1], run, victim)
    before = sha(run / "checkpoint.safetensors")
    with pytest.raises(ProvenanceError) as info:
        run_grid([victim], tmp_path)
    one_line(info.value, "names another configuration", "delete")
    assert not (run / "DONE").exists() and not (run / signing.SIGNATURE).exists()
    assert sha(run / "checkpoint.safetensors") == before


PLANTED = {
    # what the attacker also does to the planted checkpoint's record → (refusal with sign_key, resumes without?)
    "record removed": (lambda d, v: _set_chain(d, None), "carries no provenance record"),
    "record rewritten, unsigned": (lambda d, v: _set_chain(d, _forged_chain(d, v)), "were trained without a key"),
    "signed record edited to name the victim": (
        lambda d, v: _set_chain(d, [{**e, "statement": e["statement"].replace(
            json.loads(e["statement"])["run"], provenance.run_digest(v.identity()))} for e in _chain(d)]),
        "a signature that does not hold"),
}


@pytest.mark.parametrize("attack", list(PLANTED))
def test_a_planted_run_with_a_forged_record_is_refused_under_sign_key(
        tmp_path: Path, keys: dict[str, Path], signed_grid: tuple[Path, Path], attack: str) -> None:
    forge, needle = PLANTED[attack]
    victim = _cfg(keys, seed=0)
    run = tmp_path / signed_grid[0].name
    _plant(signed_grid[1], run, victim)
    forge(run, victim)
    rehash(run)
    with pytest.raises(ProvenanceError) as info:
        run_grid([victim], tmp_path)
    one_line(info.value, "not resumed under sign_key", needle, "resume it without sign_key")
    assert not (run / "DONE").exists() and not (run / signing.SIGNATURE).exists()


@pytest.mark.parametrize("attack", list(PLANTED))
def test_without_a_key_a_consistently_forged_plant_resumes_the_documented_limit(
        tmp_path: Path, keys: dict[str, Path], signed_grid: tuple[Path, Path], attack: str) -> None:
    """docs/security.md: without a key nothing can tell a planted run whose every record was rewritten consistently
    from one's own — it resumes (here: it is finished, nothing left to train), and is not signed."""
    forge, _ = PLANTED[attack]
    victim = _cfg(None, seed=0)
    run = tmp_path / signed_grid[0].name
    _plant(signed_grid[1], run, victim)
    forge(run, victim)
    rehash(run)
    run_grid([victim], tmp_path)
    assert (run / "DONE").exists() and not (run / signing.SIGNATURE).exists()
    assert not provenance.inspect(run, keys["pub"]).proven  # and a verifier with the key is told so


# -------------------------------------------------------------------------------------- sessions without the key


def test_a_session_trained_without_the_key_is_refused_a_signed_resume_and_reported_by_verify(
        tmp_path: Path, keys: dict[str, Path]) -> None:
    cfg = _cfg(keys, rounds=12)
    run = tmp_path / "run"
    train_interrupted(cfg, run, 4)  # session 1: under the key
    train_interrupted(_cfg(None, rounds=12), run, 8)  # session 2: without it (resuming without signing is allowed)
    with pytest.raises(ProvenanceError) as info:
        train(cfg, run)
    one_line(info.value, "not resumed under sign_key: rounds 4–8 (session 2) were trained without a key",
              f"delete {run}", "resume it without sign_key")
    train(_cfg(None, rounds=12), run)
    signing.sign(run, keys["key"])  # by hand: the key vouches for the files
    signing.verify(run, keys["pub"])
    found = provenance.inspect(run, keys["pub"])
    assert not found.proven
    assert found.lines() == [
        "provenance: NOT proven — rounds not trained under the key: 4–8 (unsigned), 8–12 (unsigned)",
        f"  session 1: rounds 0–4, signed by key {found.key[:16]}…",
        "  session 2: rounds 4–8, not signed (trained without a key)",
        "  session 3: rounds 8–12, not signed (trained without a key)",
    ]
    proc = subprocess.run([sys.executable, "-m", "phalanx.cli", "verify", str(run), "--key", str(keys["pub"])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "signature verified" in proc.stdout and "NOT proven" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_another_key_cannot_resume_a_run_and_a_run_without_record_cannot_be_resumed_under_a_key(
        tmp_path: Path, keys: dict[str, Path], two_sessions: Path) -> None:
    run = _copy(two_sessions, tmp_path)
    other = make_config({**BASE, "rounds": 12, "sign_key": str(keys["other"])})
    with pytest.raises(ProvenanceError) as info:
        train(other, run)
    one_line(info.value, "rounds 0–4 (session 1) were signed by another key")
    _set_chain(run, None)  # a checkpoint written before provenance was recorded
    rehash(run)
    with pytest.raises(ProvenanceError) as info:
        train(_cfg(keys, rounds=12), run)
    one_line(info.value, "carries no provenance record")
    assert train(_cfg(None, rounds=12), run)[-1]["round"] == 12  # without the key it resumes
    assert [(s.start.round, s.end.round) for s in provenance.inspect(run, keys["pub"]).chain or []] == [(8, 12)]


# ------------------------------------------------------------------------------- every check and its mutant attack


def _edit_last_statement(d: Path, change: Any) -> None:
    entries = _chain(d)
    seg = json.loads(entries[-1]["statement"])
    change(seg)
    entries[-1]["statement"] = json.dumps(seg, sort_keys=True, separators=(",", ":"))
    _set_chain(d, entries)


def _flip_theta(d: Path) -> None:
    def flip(t: dict[str, Any]) -> None:
        t["theta"][0] += 1.0
    _rewrite_checkpoint(d, _meta(d), flip)


def _edit_row(d: Path) -> None:
    lines = (d / "metrics.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["test_accuracy"] = 1.0
    lines[1] = json.dumps(row)
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


TAMPERINGS = {
    # name: (change, what the refusal says, refused without a key too)
    "session 1 removed": (lambda d: _set_chain(d, _chain(d)[1:]), "numbers segment 1 as 2", True),
    "sessions reordered": (lambda d: _set_chain(d, _chain(d)[::-1]), "numbers segment 1 as 2", True),
    "session 1 dropped, 2 renumbered": (
        lambda d: (_set_chain(d, _chain(d)[1:]), _edit_last_statement(d, lambda s: s.update(segment=1))),
        "rounds 0–4 have no provenance record", False),
    "last statement claims other tensors": (
        lambda d: _edit_last_statement(d, lambda s: s["to"].update(tensors="0" * 64)), "tensors differ", True),
    "checkpoint's θ changed": (_flip_theta, "its tensors differ", True),
    "a metric row changed": (_edit_row, "metric rows differ", True),
    "round metadata changed": (lambda d: _rewrite_checkpoint(d, {**_meta(d), "round": "10"}), "its round differ", True),
    "bundles swapped": (lambda d: _set_chain(d, [{**a, "bundle": b["bundle"]} for a, b in zip(
        _chain(d), _chain(d)[::-1])]), "a signature that does not hold", False),
    "signature removed": (lambda d: _set_chain(d, [{**e, "bundle": None} for e in _chain(d)]),
                          "were trained without a key", False),
}


@pytest.mark.parametrize("tamper", list(TAMPERINGS))
def test_every_tampering_of_the_chain_or_what_it_names_is_refused(
        tmp_path: Path, keys: dict[str, Path], two_sessions: Path, tamper: str) -> None:
    change, needle, unsigned_too = TAMPERINGS[tamper]
    run = _copy(two_sessions, tmp_path)
    change(run)
    rehash(run)
    with pytest.raises(ProvenanceError) as info:
        train(_cfg(keys, rounds=12), run)
    one_line(info.value, needle)
    assert not provenance.inspect(run, keys["pub"]).proven
    if unsigned_too:
        with pytest.raises(ProvenanceError):
            train(_cfg(None, rounds=12), run)


def test_force_resumes_an_unsigned_run_from_a_checkpoint_its_record_does_not_match(
        tmp_path: Path, keys: dict[str, Path], two_sessions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _copy(two_sessions, tmp_path)
    _flip_theta(run)
    rehash(run)
    monkeypatch.setenv("PHALANX_FORCE", "1")
    with pytest.raises(ProvenanceError):  # never under the key
        train(_cfg(keys, rounds=12), run)
    assert train(_cfg(None, rounds=12), run)[-1]["round"] == 12
    chain = provenance.inspect(run, keys["pub"]).chain or []
    assert [(s.start.round, s.end.round) for s in chain] == [(8, 12)]  # no record of what came before


# ------------------------------------------------------------------------------------- finished runs a grid reuses


def test_an_unsigned_config_swap_with_recomputed_digests_is_refused_by_the_checkpoints_own_record(
        tmp_path: Path, signed_grid: tuple[Path, Path]) -> None:
    """The issue's unsigned case: seed 1's finished run under seed 0's id, config.json rewritten and its digest
    recomputed (DONE kept). The checkpoint's record still names seed 1: refused before the grid skips it as done."""
    victim = _cfg(None, seed=0)
    run = tmp_path / signed_grid[0].name
    shutil.copytree(signed_grid[1], run)
    (run / "config.json").write_text(json.dumps(victim.identity(), indent=2, sort_keys=True))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["seed"] = 0
    (run / "manifest.json").write_text(json.dumps(manifest))
    rehash(run)
    with pytest.raises(ProvenanceError) as info:
        run_grid([victim], tmp_path)
    one_line(info.value, "names another configuration")
    _set_chain(run, _forged_chain(run, victim))  # the documented limit: a consistent rewrite passes unsigned …
    rehash(run)
    run_grid([victim], tmp_path)


def test_verify_key_refuses_a_finished_run_whose_files_are_signed_but_not_its_training(
        tmp_path: Path, keys: dict[str, Path]) -> None:
    """… and under verify_key it is refused: a signature by hand over a run trained without the key proves bytes,
    not training."""
    cfg = _cfg(None)
    (run,) = run_grid([cfg], tmp_path)
    signing.sign(run, keys["key"])
    checked = make_config({**BASE, "verify_key": str(keys["pub"])})
    with pytest.raises(ProvenanceError) as info:
        run_grid([checked], tmp_path)
    one_line(info.value, "NOT proven", "leave out verify_key")


def test_the_signature_is_made_after_every_callback_that_writes_into_the_directory(
        tmp_path: Path, keys: dict[str, Path]) -> None:
    """torchrun's recorders (distributed.json, the transcript) write when the run finishes, after DONE: the
    signature must cover what they wrote."""
    from phalanx.experiments import store
    from phalanx.experiments.build import from_config
    from phalanx.experiments.rundir import RunDirectory
    from phalanx.experiments.wiring import Recording, run_experiment
    from phalanx.training.loop import Callback, Loop

    class Late(Callback):
        def __init__(self, path: Path) -> None:
            self.path = path

        def on_finish(self, loop: Loop) -> None:
            store.write_artifact(self.path, "late.json", b"{}")

    cfg = _cfg(keys)
    run = tmp_path / "run"
    recording = Recording(run, cfg.identity(), cfg.checkpoint_every, sign_key=cfg.sign_key)
    run_experiment(from_config(cfg), None, recording,
                   recorders=lambda d: [Late(d.path)] if isinstance(d, RunDirectory) else [])
    assert "late.json" in signing.covered_files(run)
    signing.verify(run, keys["pub"])


def _edit_statement(d: Path, index: int, change: Any) -> None:
    entries = _chain(d)
    seg = json.loads(entries[index]["statement"])
    change(seg)
    entries[index]["statement"] = json.dumps(seg, sort_keys=True, separators=(",", ":"))
    _set_chain(d, entries)


STRUCTURE = {
    # a chain broken in one way each (unsigned checks: refused with or without a key)
    "a session that ends before it starts": (lambda s: s["to"].update(round=2), 1, "ends (round 2) before it starts"),
    "a session that does not start where the one before ended": (lambda s: s["from"].update(round=2), 1,
                                                                 "broken between segments 1 and 2"),
    "a statement missing a field": (lambda s: s.pop("data"), 0, "not a phalanx/segment/v1 statement"),
    "a point of the wrong shape": (lambda s: s.update({"from": {"round": -1, "tensors": None, "rows": None}}), 0,
                                   "malformed point"),
}


@pytest.mark.parametrize("case", list(STRUCTURE))
def test_every_structural_check_of_the_chain_rejects_its_mutant(tmp_path: Path, keys: dict[str, Path],
                                                               two_sessions: Path, case: str) -> None:
    change, index, needle = STRUCTURE[case]
    run = _copy(two_sessions, tmp_path)
    _edit_statement(run, index, change)
    rehash(run)
    for cfg in (_cfg(keys, rounds=12), _cfg(None, rounds=12)):
        with pytest.raises(Exception) as info:
            train(cfg, run)
        one_line(info.value, needle)


def test_a_run_resumed_more_often_than_a_record_holds_is_refused_a_new_session(
        tmp_path: Path, two_sessions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance, "MAX_SEGMENTS", 2)
    with pytest.raises(ProvenanceError) as info:
        train(_cfg(None, rounds=12), _copy(two_sessions, tmp_path))
    one_line(info.value, "trained in 2 sessions already")


def test_a_resume_on_another_data_set_is_refused_and_the_mutant_extends_the_record(
        tmp_path: Path, keys: dict[str, Path], two_sessions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding 11: the data set's fingerprint each session records was never compared. A resume whose data set
    is another (files changed under ``data_root``: its fingerprint differs) is refused in one line naming the
    session; the mutant without the comparison resumes and extends a "proven" record over other data."""
    from phalanx.data.base import Dataset

    other = "0" * 64
    run = _copy(two_sessions, tmp_path)
    monkeypatch.setattr(Dataset, "fingerprint", lambda self: other)
    with pytest.raises(ProvenanceError) as exc:
        train(_cfg(keys, rounds=12), run)
    one_line(exc.value, "trained on the data set of fingerprint", "session 1")
    mutant = _copy(two_sessions, tmp_path, "mutant")
    monkeypatch.setattr(provenance, "data_mismatch", lambda chain, data: None)
    train(_cfg(keys, rounds=12), mutant)
    assert provenance.inspect(mutant, keys["pub"]).chain[-1].data == other  # type: ignore[index]


def test_verify_does_not_call_proven_a_run_whose_manifest_names_other_data(
        tmp_path: Path, keys: dict[str, Path], signed_grid: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sessions' signed fingerprints against the data set the manifest records: one that differs makes the run
    not proven, naming the session (the mutant without the comparison calls it proven)."""
    run = _copy(signed_grid[0], tmp_path)
    assert provenance.inspect(run, keys["pub"]).proven
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["data_fingerprint"] = "f" * 64
    (run / "manifest.json").write_text(json.dumps(manifest))
    found = provenance.inspect(run, keys["pub"])
    assert not found.proven and "trained on the data set of fingerprint" in found.lines()[0], found.lines()
    monkeypatch.setattr(provenance, "data_mismatch", lambda chain, data: None)
    assert provenance.inspect(run, keys["pub"]).proven
