"""Rank 0's transcript written append-only (the review's F7, :mod:`phalanx.distributed.chain`): each record appended
when it is made, a running SHA-256 marked and signed by rank 0 at each checkpoint (in the checkpoint's metadata),
the last line signing every byte. The audit refuses what an attacker without rank 0's key can do to the file — a
line removed from the middle, two lines swapped, the tail cut at a line boundary, a line appended after the end —
and a resume cuts what was written after the checkpoint. Mutants: a chain that does not chain (order-insensitive:
the swapped transcript passes), a resume that does not cut (the audit refuses its file). The bytes rank 0 writes
grow linearly with the rounds (counted, not timed)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.test_audit import honest, honest_lines, keys, load_identity_public, plant  # noqa: F401 (fixtures)

from _fifo import unblocked
from phalanx.distributed import audit as audit_module
from phalanx.distributed import chain as chain_module
from phalanx.distributed.audit import AuditReport, audit
from phalanx.distributed.binding import checkpoint_end, checkpoint_metadata
from phalanx.distributed.chain import END, Chain, mark_json, mark_message
from phalanx.distributed.keys import init_keys, load_identity
from phalanx.distributed.transcript import BINDING, TRANSCRIPT, Transcript, load, records, seal_line
from phalanx.errors import ConfigError
from phalanx.experiments.store import write_artifact


def _meta(run: Path, **changes: str | None) -> None:
    """Rewrite the checkpoint's metadata: each key of ``changes`` set (None: removed)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    ckpt = run / "checkpoint.safetensors"
    with safe_open(str(ckpt), framework="pt") as fh:
        meta = dict(fh.metadata() or {})
    for k, v in changes.items():
        meta.pop(k, None)
        if v is not None:
            meta[k] = v
    save_file(load_file(str(ckpt)), str(ckpt), metadata=meta)


def _mark(run: Path) -> tuple[int, str, str]:
    end, _ = checkpoint_end(checkpoint_metadata(run))
    assert end is not None
    return end


def _problems(report: AuditReport) -> str:
    assert not report.ok
    return " | ".join(report.problems)


def _first_rejected(lines: list[bytes]) -> int:
    return next(i for i, x in enumerate(lines) if b'"type":"rejected"' in x and i > 2)


def test_the_checkpoint_marks_where_the_honest_transcript_stood(honest: Path) -> None:  # noqa: F811
    """The finished run's checkpoint (round 10) marks the end of round 9's line, signed by rank 0; the file goes on
    with the last line only (a parameter server records nothing after its last round)."""
    offset, head, sig = _mark(honest)
    data = (honest / TRANSCRIPT).read_bytes()
    assert hashlib.sha256(data[:offset]).hexdigest() == head
    load_identity_public(honest).verify(bytes.fromhex(sig), mark_message(offset, bytes.fromhex(head)))
    assert data[offset:].count(b"\n") == 1 and b'"type":"signature"' in data[offset:]
    assert audit(honest).ok


def _cut_at_mark(honest: Path, tmp: Path) -> tuple[Path, list[bytes]]:  # noqa: F811
    """A copy of the honest run as a run that stopped right after its checkpoint of round 10 (not DONE, its record
    not closed): the transcript ends at the mark."""
    copy = tmp / "stopped"
    shutil.copytree(honest, copy)
    (copy / "DONE").unlink()
    offset = _mark(honest)[0]
    write_artifact(copy, TRANSCRIPT, (honest / TRANSCRIPT).read_bytes()[:offset])
    return copy, (copy / TRANSCRIPT).read_bytes().splitlines(keepends=True)


def test_the_audit_refuses_what_the_chain_catches(honest: Path, tmp_path: Path) -> None:  # noqa: F811
    """Without rank 0's key (the honest last line kept, the manifest made to match): a rejection line removed from
    the middle, and that line swapped with the round line before it (every round still in order: only the chain
    tells), refused by the last line's digest and by the checkpoint's mark. A run that stopped at its checkpoint
    (the file ends at the mark, no last line) audits; its tail cut at a line boundary, or a line appended after its
    end, does not — and a finished run's tail cut at the mark is not signed."""
    lines = honest_lines(honest)
    i = _first_rejected(lines)
    removed = _problems(plant(honest, tmp_path / "removed", b"".join(lines[:i] + lines[i + 1:])))
    assert "the signature line names another digest" in removed
    assert "where its checkpoint says the record stood" in removed
    swapped = [*lines[:i - 1], lines[i], lines[i - 1], *lines[i + 1:]]
    text = _problems(plant(honest, tmp_path / "swapped", b"".join(swapped)))
    assert "the signature line names another digest" in text
    assert "are not the ones rank 0 marked at the checkpoint (lines removed, swapped or edited" in text
    assert "follows round" not in text  # the rounds are in order: the content checks cannot tell

    stopped, kept = _cut_at_mark(honest, tmp_path)
    assert audit(stopped).ok, audit(stopped).problems
    write_artifact(stopped, TRANSCRIPT, b"".join(kept[:-1]))
    assert f"before byte {_mark(honest)[0]} where its checkpoint says the record stood (its tail cut)" in \
        _problems(audit(stopped))
    write_artifact(stopped, TRANSCRIPT, b"".join(kept) + lines[i])
    assert "after byte" in _problems(audit(stopped)) and "are not signed by rank 0" in _problems(audit(stopped))
    done = _problems(plant(honest, tmp_path / "done-cut", b"".join(kept)))
    assert "the transcript is not signed" in done


class _Unchained(Chain):
    """The mutant: a digest that does not chain (XOR of each line's SHA-256: the order of the lines is lost)."""

    def __init__(self) -> None:
        self.acc = bytes(32)

    def update(self, line: bytes) -> None:
        self.acc = bytes(a ^ b for a, b in zip(self.acc, hashlib.sha256(line).digest(), strict=True))

    def digest(self) -> bytes:
        return self.acc


def test_mutant_a_chain_that_does_not_chain_passes_the_swapped_transcript(honest: Path, keys: Path,  # noqa: F811
                                                                         tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer whose digest drops the chain (signed by rank 0, mark and last line alike) and the audit with it: the
    transcript with two lines swapped by someone without the key passes — the chaining is what refuses it above."""
    rank0 = load_identity(keys, 0, 4)
    lines = honest_lines(honest)[:-1]
    offset = _mark(honest)[0]
    i = _first_rejected(lines)
    swapped = [*lines[:i - 1], lines[i], lines[i - 1], *lines[i + 1:]]
    last, seen, head = _Unchained(), 0, b""
    for line in swapped:  # (the mutant's digests do not depend on the order: the honest ones are these)
        last.update(line)
        seen += len(line)
        head = last.digest() if seen == offset else head
    copy = tmp_path / "run"
    shutil.copytree(honest, copy)
    write_artifact(copy, TRANSCRIPT, b"".join(swapped) + seal_line(last.digest(), rank0))
    _meta(copy, **{END: mark_json([offset, head.hex(), rank0.sign(mark_message(offset, head)).hex()])})
    assert not audit(copy).ok  # the real chain refuses the unchained writer's file, swapped or not
    monkeypatch.setattr(audit_module, "Chain", _Unchained)
    assert audit(copy).ok, audit(copy).problems


def _resume(run: Path, keydir: Path, config: str) -> Transcript:
    """Rank 0's transcript callback resuming ``run`` from its checkpoint of round 6 (the loop stubbed), session
    nonce 07…07; it writes its own checkpoint's metadata (the sessions and its mark) as the checkpoint would."""
    loop = SimpleNamespace(resumed=True, state=SimpleNamespace(round=6), experiment=SimpleNamespace(rounds=10))
    record = Transcript(run, SimpleNamespace(nonce=b"\x07" * 32, new_rejections=list), load_identity(keydir, 0, 4),
                        config, 4, 1, lambda t: False)
    record.on_start(loop)  # type: ignore[arg-type]
    _meta(run, **record.binding())
    return record


def _stopped_at_round_6(honest: Path, keys: Path, tmp: Path) -> tuple[Path, int]:  # noqa: F811
    """A copy of the honest run as if it had stopped after its checkpoint of round 6: the checkpoint names round 6,
    the first session and rank 0's mark of the end of round 5's line; the lines after it (rounds 6–9, the last
    line) were written after the checkpoint."""
    copy = tmp / "run"
    shutil.copytree(honest, copy)
    (copy / "DONE").unlink()
    lines, offset = honest_lines(honest), 0
    for line in lines:
        offset += len(line)
        if b'"type":"round"' in line and json.loads(line)["round"] == 5:
            break
    head = hashlib.sha256((honest / TRANSCRIPT).read_bytes()[:offset]).digest()
    sign = load_identity(keys, 0, 4).sign(mark_message(offset, head))
    nonce = load(honest / TRANSCRIPT)["sessions"][0]["nonce"]
    _meta(copy, round="6", **{BINDING: json.dumps([[0, nonce]]), END: mark_json([offset, head.hex(), sign.hex()])})
    return copy, offset


def test_a_resume_cuts_what_was_written_after_the_checkpoint(honest: Path, keys: Path, tmp_path: Path,  # noqa: F811
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Resumed from round 6, rank 0 cuts the file back to its checkpoint's mark and continues the chain: rounds 0–5
    then the new session, and the run directory (its checkpoint naming both sessions and the new mark) audits.
    Mutant: a resume that does not cut (it appends after the old tail) — the audit refuses its file."""
    config = load(honest / TRANSCRIPT)["config"]
    run, offset = _stopped_at_round_6(honest, keys, tmp_path / "real")
    _resume(run, keys, config)
    data = (run / TRANSCRIPT).read_bytes()
    assert data[:offset] == (honest / TRANSCRIPT).read_bytes()[:offset]
    kinds = [(r["type"], r.get("round", r.get("from_round"))) for r in records(run / TRANSCRIPT)]
    assert [k for k in kinds if k[0] in ("round", "session")] == [("session", 0), *[("round", t) for t in range(6)],
                                                                  ("session", 6)]
    assert audit(run).ok, audit(run).problems

    def no_cut(self: chain_module.Appender, path: Path, chain: Chain, whole: Any, offset: int) -> None:
        self.path, self.chain, self.whole, self.written, self.before = path, chain, whole, 0, None
        self.fh = open(path, "ab")  # (the mutant: on after the old tail, nothing cut)
        self.offset = path.stat().st_size

    monkeypatch.setattr(chain_module.Appender, "__init__", no_cut)
    run, _ = _stopped_at_round_6(honest, keys, tmp_path / "mutant")
    _resume(run, keys, config)
    assert (run / TRANSCRIPT).read_bytes().startswith((honest / TRANSCRIPT).read_bytes())
    assert "follows the signature" in _problems(audit(run))


def test_a_resume_refuses_a_transcript_its_mark_does_not_sign(honest: Path, keys: Path, tmp_path: Path) -> None:  # noqa: F811
    """The kept bytes edited while the run was stopped, or the mark signed by another key: refused in one line naming
    the file (rank 0 would otherwise go on signing what someone else wrote)."""
    config = load(honest / TRANSCRIPT)["config"]
    run, offset = _stopped_at_round_6(honest, keys, tmp_path / "edited")
    data = bytearray((run / TRANSCRIPT).read_bytes())
    i = data.index(b'"type":"round"')
    data[i:i + 14] = b'"type":"ruond"'
    (run / TRANSCRIPT).write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"transcript.jsonl.*are not the ones rank 0 marked"):
        _resume(run, keys, config)
    run, offset = _stopped_at_round_6(honest, keys, tmp_path / "other-key")
    init_keys(tmp_path / "evil", 4)
    head = hashlib.sha256((run / TRANSCRIPT).read_bytes()[:offset]).digest()
    forged = load_identity(tmp_path / "evil", 0, 4).sign(mark_message(offset, head))
    _meta(run, **{END: mark_json([offset, head.hex(), forged.hex()])})
    with pytest.raises(ConfigError, match=r"transcript.jsonl.*mark of it does not verify with rank 0's key"):
        _resume(run, keys, config)


@pytest.mark.parametrize("plant", ["fifo", "link", "fifo-without-a-mark"])
def test_a_resume_refuses_a_transcript_planted_as_a_fifo_or_a_link_in_one_line(
        honest: Path, keys: Path, tmp_path: Path, plant: str) -> None:  # noqa: F811
    """Whoever can write the run directory between two sessions replaces ``transcript.jsonl`` by a FIFO (rank 0
    blocked for ever in its ``open``, before), or by a link to the genuine file elsewhere (followed, before): the
    resume refuses it in one line naming the file, without blocking — on the marked path and on the former writer's
    (a checkpoint without a mark: the transcript read whole). A regressed reader is unblocked by
    :func:`_fifo.unblocked`, and the test fails."""
    config = load(honest / TRANSCRIPT)["config"]
    run, _ = _stopped_at_round_6(honest, keys, tmp_path)
    if plant == "fifo-without-a-mark":
        _meta(run, **{END: None})
    outside = tmp_path / "elsewhere"
    (run / TRANSCRIPT).rename(outside)
    if plant == "link":
        (run / TRANSCRIPT).symlink_to(outside)
    else:
        os.mkfifo(run / TRANSCRIPT)
    got, blocked = unblocked(lambda: _resume(run, keys, config), run / TRANSCRIPT)
    assert not blocked, "the resume blocked on the FIFO"
    what = "a symbolic link, not followed" if plant == "link" else "not a regular file"
    assert isinstance(got, ConfigError) and str(run / TRANSCRIPT) in str(got) and what in str(got), got
    assert "\n" not in str(got)


def test_a_checkpoint_without_a_mark_is_read_as_before(honest: Path, tmp_path: Path) -> None:  # noqa: F811
    """A run directory of the former writer (its checkpoint names the sessions, no mark): audited as before (its last
    line signs every byte); a mark that cannot be read is one line."""
    copy = tmp_path / "old"
    shutil.copytree(honest, copy)
    _meta(copy, **{END: None})
    assert audit(copy).ok, audit(copy).problems
    _meta(copy, **{END: "[1, 2"})
    assert _problems(audit(copy)).count("a checkpoint whose transcript end cannot be read") == 1


def _written(tmp: Path, keys: Path, rounds: int) -> tuple[int, int]:  # noqa: F811
    """Bytes rank 0's transcript writes over ``rounds`` rounds of 4 ranks (a checkpoint every 5), and the file's
    size: the rounds fed as the parameter server's hook feeds them."""
    tmp.mkdir()
    (tmp / "manifest.json").write_text("{}")
    loop = SimpleNamespace(resumed=False, state=SimpleNamespace(round=0), experiment=SimpleNamespace(rounds=rounds))
    links = SimpleNamespace(nonce=b"\x01" * 32, new_rejections=list)
    record = Transcript(tmp, links, load_identity(keys, 0, 4), "ab" * 32, 4, 1, lambda t: t % 5 == 0)
    record.on_start(loop)  # type: ignore[arg-type]
    entry = [{"rank": r, "sha256": "cd" * 32, "signature": "ef" * 64} for r in range(4)]
    for t in range(rounds):
        record.rows(t, entry, [])
        if (t + 1) % 5 == 0:
            record.binding()
    assert record.out is not None
    written = record.out.written
    record.write()
    return written, (tmp / TRANSCRIPT).stat().st_size


def test_the_bytes_rank_0_writes_grow_linearly_with_the_rounds(keys: Path, tmp_path: Path) -> None:  # noqa: F811
    """R and 2R rounds: each byte written once (what is written is the file, less its last line), and twice the
    rounds write twice the round lines — where the former writer rewrote the whole file at every checkpoint."""
    one, size_one = _written(tmp_path / "r", keys, 100)
    two, size_two = _written(tmp_path / "2r", keys, 200)
    assert size_one - one == size_two - two == len(seal_line(bytes(32), load_identity(keys, 0, 4)))
    fixed = 2 * one - two  # the header and the session line
    assert 0 < fixed < 1024 and two - fixed == 2 * (one - fixed)


def test_a_checkpoint_of_a_round_whose_record_was_made_marks_before_it(keys: Path, tmp_path: Path) -> None:  # noqa: F811
    """A run that stops in round 6 after the server's hook recorded it (too many workers lost: the checkpoint is of
    round 6, which is done again): the mark ends at round 5's line, so the resume cuts round 6's record and the run
    records it once (the real job: tests/test_distributed_sealed.py::test_a_keyed_run_that_lost_too_many_workers_
    resumes_and_audits, which failed with the mark at the file's end — round 6 recorded twice)."""
    tmp_path.joinpath("manifest.json").write_text("{}")
    state = SimpleNamespace(round=0)
    loop = SimpleNamespace(resumed=False, state=state, experiment=SimpleNamespace(rounds=10))
    record = Transcript(tmp_path, SimpleNamespace(nonce=b"\x01" * 32, new_rejections=list),
                        load_identity(keys, 0, 4), "ab" * 32, 4, 1, lambda t: False)
    record.on_start(loop)  # type: ignore[arg-type]
    entry = [{"rank": r, "sha256": "cd" * 32, "signature": "ef" * 64} for r in range(4)]
    for t in range(7):
        record.rows(t, entry, [])
        state.round = min(t + 1, 6)
    offset = json.loads(record.binding()[END])[0]
    data = (tmp_path / TRANSCRIPT).read_bytes()
    assert json.loads(data[:offset].splitlines()[-1])["round"] == 5
    assert json.loads(data[offset:].splitlines()[0])["round"] == 6
