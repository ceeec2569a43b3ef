"""The leftovers of review38's fix (issue 38): a run directory swapped for a link *between* its check and the writes,
a symbolic link planted in a run directory that verify, sign or resume would read through, and the pin of verified
rows that ends with the process that set it.

The attacker controls the directory the victim passes (a co-user of a shared ``runs/`` folder) or runs a sibling
process that swaps things between the victim's steps; here the swap is made by a hook at a chosen round, not by
timing. Each check has its mutant (the code before the fix, monkeypatched back) and a test that the attack then
gets through.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import _rundirs
from _interrupt import train_interrupted
from _rundirs import FINISHED, file_states, forge_rows, legacy, one_line, rehash, reported, swap_for_link
from phalanx.errors import ConfigError, IntegrityError, OutputError
from phalanx.experiments import dirfd, make_config, runfiles, store, train
from phalanx.training.loop import Callback, Loop, RoundInfo

finished = _rundirs.finished  # the module's finished run (a fixture)


def _victim(finished: Path, tmp_path: Path) -> tuple[Path, dict[str, tuple[int, bytes]]]:
    """A directory of the victim's that the attacker's link will point at — another of their run directories, which
    a write by name would damage — and its files' bytes."""
    victim = Path(shutil.copytree(finished, tmp_path / "victim"))
    return victim, file_states(victim)




class _SwapAt(Callback):
    """Swaps the run directory for a link once round ``at`` is done (its checkpoint written): between the check the
    run made when it took the directory and the writes still to come."""

    def __init__(self, run: Path, victim: Path, at: int) -> None:
        self.run, self.victim, self.at = run, victim, at
        self.moved: Path | None = None

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        if loop.state.round == self.at and self.moved is None:
            self.moved = swap_for_link(self.run, self.victim)


def _untouched(victim: Path, before: dict[str, tuple[int, bytes]]) -> None:
    assert file_states(victim) == before  # no file written, replaced, added or removed through the link


# -- 1: the run directory checked by its descriptor, the writes through it -------------------------------------------

def test_a_run_directory_swapped_for_a_link_after_its_check_keeps_every_write_in_the_checked_directory(
        finished: Path, tmp_path: Path) -> None:
    (victim, before), run = _victim(finished, tmp_path), tmp_path / "runs" / "r"
    swap = _SwapAt(run, victim, 2)
    train(make_config(FINISHED), run, callbacks=[swap])
    assert swap.moved is not None
    _untouched(victim, before)  # no checkpoint, row, marker, manifest or temporary file went through the link
    assert store.is_finished(swap.moved) and not any(p.name.endswith(".tmp") for p in swap.moved.iterdir())
    store.verify(swap.moved, store.RUN_FILES)  # the round-4 checkpoint, rows, Parquet and DONE, recorded there


def test_a_write_between_the_check_and_its_use_goes_to_the_checked_directory_or_is_refused(
        finished: Path, tmp_path: Path) -> None:
    """The same swap at the level of one write: a payload (manifest, rows), a file a library wrote (Parquet), a
    marker's removal, a killed write's leftovers; and the directory's signature, made by name, is refused."""
    (victim, before), run = _victim(finished, tmp_path), tmp_path / "r"
    with dirfd.held(run):
        store.prepare_run_dir(run, {"x": 1}, 0, "")
        moved = swap_for_link(run, victim)
        store.write_artifact(run, "metrics.jsonl", b'{"round": 0}\n')
        store.write_parquet(run / "metrics.parquet", [{"round": 0}])
        dirfd.unlink(run, "config.json")
        (victim / ".x.12345678.tmp").write_text("a victim's file that looks like a leftover")
        assert store.remove_temporaries(run) == 0
        assert not dirfd.still_named(run)
        from phalanx.experiments.rundir import SignDirectory

        with pytest.raises(OutputError) as caught:
            SignDirectory(run, "unused.pem").on_finish(None)  # type: ignore[arg-type]
        one_line(caught.value, str(run), "not signed")
    assert (victim / ".x.12345678.tmp").exists()
    (victim / ".x.12345678.tmp").unlink()
    _untouched(victim, before)
    assert {"metrics.jsonl", "metrics.parquet", "manifest.json"} <= {p.name for p in moved.iterdir()}
    assert not (moved / "config.json").exists()


def test_the_mutant_check_by_name_then_write_by_name_writes_into_the_links_target(
        finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix the directory was checked with ``lstat`` and then used by name: the same swap sends the rest of
    the run into the victim's run directory, whose checkpoint, rows and manifest it overwrites."""
    monkeypatch.setattr(dirfd, "fd_of", lambda path: None)
    (victim, before), run = _victim(finished, tmp_path), tmp_path / "runs" / "r"
    train(make_config(FINISHED), run, callbacks=[_SwapAt(run, victim, 2)])
    changed = {n for n, b in file_states(victim).items() if before.get(n) != b}
    assert {"manifest.json", "checkpoint.safetensors"} <= changed


# -- 2: a symbolic link in a run directory is refused by verify, sign and resume, never followed ---------------------

LINKED = ("config.json", "manifest.json", "metrics.jsonl", "checkpoint.safetensors")


def _link_in(d: Path, name: str, outside: Path) -> None:
    """``d/name`` replaced by a link to a byte-identical copy outside the directory: only its being a link is
    wrong."""
    outside.mkdir(exist_ok=True)
    shutil.copy2(d / name, outside / name)
    (d / name).unlink()
    (d / name).symlink_to(outside / name)


@pytest.mark.parametrize("name", LINKED)
def test_a_resume_refuses_a_symlink_in_the_run_directory_naming_it(name: str, tmp_path: Path) -> None:
    cfg = make_config({**FINISHED, "rounds": 6})
    d = train_interrupted(cfg, tmp_path / "run", 2)
    _link_in(d, name, tmp_path / "outside")
    with pytest.raises((ConfigError, IntegrityError)) as caught:  # IntegrityError: the manifest
        train(cfg, d)
    one_line(caught.value, str(d / name), "symbolic link, not followed")
    assert not store.is_finished(d)


def _following(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reads before the fix: ``stat`` and ``open`` follow a link."""
    size_of, open_regular = runfiles.size_of, runfiles.open_regular
    monkeypatch.setattr(runfiles, "size_of", lambda path, follow=False: size_of(path, True))
    monkeypatch.setattr(runfiles, "open_regular", lambda path, follow=False: open_regular(path, True))


def test_the_mutant_reads_follow_the_link_and_the_run_resumes_from_files_outside_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _following(monkeypatch)
    cfg = make_config({**FINISHED, "rounds": 6})
    d = train_interrupted(cfg, tmp_path / "run", 2)
    _link_in(d, "checkpoint.safetensors", tmp_path / "outside")
    train(cfg, d)
    assert store.is_finished(d)


READERS: dict[str, Any] = {
    "config.json": lambda d: store.check_identity(d, json.loads((d.parent / "outside" / "config.json").read_text())),
    "metrics.jsonl": store.read_rows,
    "checkpoint.safetensors": lambda d: runfiles.checkpoint_header(d / "checkpoint.safetensors"),
}


@pytest.mark.parametrize("name", list(READERS))
def test_a_grids_check_and_the_bounded_readers_refuse_a_symlink_naming_it(name: str, finished: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """What a grid checks before it skips a finished run (every recorded file) and, with no digests to check, the
    readers themselves (``provenance.inspect`` — what ``phalanx verify`` reads once the signature holds — reads the
    recorded config, the checkpoint's header and the rows with them); the mutant reads through the link."""
    d = Path(shutil.copytree(finished, tmp_path / "run"))
    _link_in(d, name, tmp_path / "outside")
    identity = json.loads((tmp_path / "outside" / name).read_text()) if name == "config.json" else \
        json.loads((d / "config.json").read_text())
    with pytest.raises(ConfigError) as caught:
        store.check_finished(d, identity)
    one_line(caught.value, str(d / name), "symbolic link")
    legacy(d)  # no digests to check: the reader itself must refuse the link
    with pytest.raises(ConfigError) as caught:
        READERS[name](d)
    one_line(caught.value, str(d / name), "symbolic link")
    _following(monkeypatch)
    READERS[name](d)  # the mutant: read through the link, as if it were the run's own file


keys = _rundirs.keys  # the victim's key pair (a fixture)


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]) -> dict[str, Path]:
    """A finished run signed under the key, and the key pair."""
    pytest.importorskip("model_signing")
    out = tmp_path_factory.mktemp("signed") / "run"
    train(make_config({**FINISHED, "sign_key": str(keys["key"])}), out)
    return {"run": out, **keys}


def test_verify_and_sign_refuse_a_symlinked_signature_or_file_naming_it(
        signed: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx import signing

    d = Path(shutil.copytree(signed["run"], tmp_path / "run"))
    signing.verify(d, signed["pub"])  # the control: the copy verifies
    _link_in(d, signing.SIGNATURE, tmp_path / "outside")
    with pytest.raises(signing.SignatureError) as caught:
        signing.verify(d, signed["pub"])
    one_line(caught.value, str(d / signing.SIGNATURE), "symbolic link, not followed")
    # mutant: the bundle read by name — through the link, before model-signing's walk of the directory refuses it
    read: list[Path] = []
    monkeypatch.setattr(signing, "_refuse_link", lambda run, signature: None)
    monkeypatch.setattr(signing, "_read_signature", lambda run, signature: read.append(signature.resolve()) or
                        signature.read_bytes())
    with pytest.raises(signing.SignatureError) as caught:
        signing.verify(d, signed["pub"])
    assert read == [(tmp_path / "outside" / signing.SIGNATURE).resolve()] and "symlink" in str(caught.value)
    monkeypatch.undo()
    (d / signing.SIGNATURE).unlink()
    shutil.copy2(tmp_path / "outside" / signing.SIGNATURE, d / signing.SIGNATURE)
    _link_in(d, "metrics.jsonl", tmp_path / "outside2")
    for call in (lambda: signing.verify(d, signed["pub"]), lambda: signing.sign(d, signed["key"])):
        with pytest.raises(signing.SignatureError) as caught:
            call()
        one_line(caught.value, str(d), "metrics.jsonl", "symlink")


# -- 3: the pin of verified rows lasts one process ---------------------------------------------------------------------

def test_rows_of_a_run_trained_in_the_sweep_are_verified_and_pinned_before_the_report(
        signed: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pin of a run the sweep *reused* is set in the sweep's process, which reports; a run the sweep *trained*
    wrote its rows itself (in a worker process, whose pin ends with it, or in this one, whose writes lift the pin), so
    its rows were read back at report time against the unkeyed manifest only. The attacker rewrites seed 0's fresh
    rows and their digest while the sweep trains seed 1."""
    from phalanx import signing
    from phalanx.experiments import ended
    from phalanx.experiments.runner import run_grid

    both = {"sign_key": str(signed["key"]), "verify_key": str(signed["pub"])}
    cfgs = [make_config({**FINISHED, **both, "seed": s}) for s in (0, 1)]
    forged: list[Path] = []

    def attacker(out: Path) -> Any:
        def on_round(cfg: Any, t: int, rounds: int) -> None:
            if cfg.seed == 1 and not forged:
                (run,) = [p for p in out.iterdir() if p.is_dir() and "_s0_" in p.name]
                forge_rows(run, 0.999)
                rehash(run)
                forged.append(run)
        return on_round

    with pytest.raises(signing.SignatureError) as caught:
        run_grid(cfgs, tmp_path / "a", on_round=attacker(tmp_path / "a"))
    one_line(caught.value, str(forged[0]), "changed: ", "metrics.jsonl")
    # the honest sweep: every run it trained is pinned, so a swap after it returns is refused at report time
    dirs = run_grid(cfgs, tmp_path / "b")
    assert all(os.path.abspath(d) in store._PINNED for d in dirs)
    forge_rows(dirs[0], 0.999)
    rehash(dirs[0])
    with pytest.raises(IntegrityError):
        reported(tmp_path / "b", 0)
    # mutant: the trained runs left unpinned, as before — the forged rows are reported
    monkeypatch.setattr(ended, "check_trained", lambda run_dir, cfg: None)
    forged.clear()
    run_grid(cfgs, tmp_path / "c", on_round=attacker(tmp_path / "c"))
    assert forged and reported(tmp_path / "c", 0) == 0.999
