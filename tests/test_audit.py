"""``phalanx audit`` against the transcripts an attacker can write (issue 33, item 2): each forged case is a mutant of
a real keyed run's transcript that the audit must reject, with its one line.

The honest transcript comes from a real keyed parameter-server job (4 ranks, rank 3 Byzantine as itself, outsiders
knocking on rank 0's port while it holds before round 3, so that the record holds rejections). Every mutant is
played twice where it applies: as the attacker can write it — holding any key but rank 0's, the Byzantine rank's
included, and editing the manifest too (it is unsigned) — and re-signed with rank 0's key, which isolates the check
that must still catch it (the audit must not rest on the signature alone). Hostile files — oversized, deeply nested,
malformed — are one line each, read with bounded memory.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.test_distributed import run_dir, wait_for
from tests.test_distributed_sealed import SEALED, job
from typer.testing import CliRunner

from phalanx.cli import app
from phalanx.distributed.audit import AuditReport, audit
from phalanx.distributed.keys import Identity, init_keys, load_identity
from phalanx.distributed.transcript import (
    OLD_TRANSCRIPT,
    TRANSCRIPT,
    Lines,
    Unreadable,
    load,
    render,
    signature_line,
    size_bound,
)
from phalanx.experiments import make_config
from phalanx.experiments.store import write_artifact

Edit = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_keys(d / "job", 4)
    return d / "job"


@pytest.fixture(scope="module")
def honest(keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A keyed job's run directory; outsiders send plain bytes to rank 0's port while it holds before round 3."""
    tmp = tmp_path_factory.mktemp("honest")
    hold = tmp / "go"

    def script(procs: list[subprocess.Popen[bytes]], errs: Path, port: int) -> None:
        wait_for("holding round 3", errs, procs[0])
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port)) as plain:
                plain.sendall(b"GET / HTTP/1.0\r\n\r\n")
        hold.touch()

    code, errs, _ = job({**SEALED, "keys": str(keys)}, tmp / "out", tmp, env={"PHALANX_TEST_HOLD": f"3:{hold}"},
                        script=script)
    assert code == 0, errs[-3000:]
    return run_dir(tmp / "out")


def test_the_honest_transcript_is_signed_bound_and_audits(honest: Path) -> None:
    doc = load(honest / TRANSCRIPT, load_identity_public(honest))
    assert doc["format"] == "phalanx-transcript/3" and doc["signer"] == 0 and doc["total_rounds"] == 10
    assert (doc["workers"], doc["f"]) == (4, 1)
    assert [r["round"] for r in doc["rounds"]] == list(range(10))
    assert all([a["rank"] for a in r["accepted"]] == [0, 1, 2, 3] and r["missing"] == [] for r in doc["rounds"])
    groups = [g for r in doc["rounds"] for g in r["rejected"]]
    assert sum(g["count"] for g in groups) >= 5 and all(g["peer"] == "127.0.0.1" for g in groups), groups
    report = audit(honest)
    assert report.ok, report.problems
    assert report.accepted == 40 and sum(report.rejected.values()) == sum(g["count"] for g in groups)
    res = CliRunner().invoke(app, ["audit", str(honest)])
    assert res.exit_code == 0 and "audit passed" in res.output, res.output
    res = CliRunner().invoke(app, ["audit", str(honest), "--format", "json"])  # the same findings, as tables
    summary, kinds, _, problems = json.loads(res.stdout)["tables"]
    assert res.exit_code == 0 and problems["rows"] == [], res.output
    assert (summary["rows"][0]["rounds"], summary["rows"][0]["accepted vectors"]) == ("10", "40")
    assert {r["kind"]: int(r["count"]) for r in kinds["rows"]} == report.rejected


def load_identity_public(run: Path) -> Any:
    from phalanx.distributed.keys import AllowList

    return AllowList.load(run / "allow-list.json").public_key(0)


def forge(honest: Path, tmp: Path, edit: Edit, signer: Identity | None) -> Path:
    """A copy of the honest run whose transcript is edited by ``edit`` and signed by ``signer`` (None: the honest
    signature line kept); the manifest records the forged file, as an attacker would make it."""
    copy = tmp / "run"
    shutil.copytree(honest, copy)
    doc = load(copy / TRANSCRIPT)
    edit(doc)
    body = render(doc)
    last = (honest / TRANSCRIPT).read_bytes().splitlines(keepends=True)[-1]
    write_artifact(copy, TRANSCRIPT, body + (last if signer is None else signature_line(body, signer)))
    if signer is not None:  # the signer marks the forged record at the checkpoint too (chain.py)
        mark(copy, len(body), signer)
    return copy


def mark(run: Path, offset: int, signer: Identity) -> None:
    """Rewrite the checkpoint's mark of the transcript: its first ``offset`` bytes, signed by ``signer``."""
    import hashlib

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from phalanx.distributed.chain import END, mark_json, mark_message

    head = hashlib.sha256((run / TRANSCRIPT).read_bytes()[:offset]).digest()
    ckpt = run / "checkpoint.safetensors"
    with safe_open(str(ckpt), framework="pt") as fh:
        meta = {**(fh.metadata() or {}), END: mark_json([offset, head.hex(), signer.sign(mark_message(offset, head))
                                                         .hex()])}
    save_file(load_file(str(ckpt)), str(ckpt), metadata=meta)


def one_line(report: AuditReport, expected: str) -> None:
    """The audit failed, and ``expected`` is one of its lines."""
    assert not report.ok
    assert any(expected in p for p in report.problems), report.problems


UNSIGNED = "does not verify with rank 0's key on the allow-list"


def _byzantine_alone(doc: dict[str, Any]) -> None:
    for r in doc["rounds"]:
        r["accepted"] = [a for a in r["accepted"] if a["rank"] == 3]
        r["missing"] = []


def _f_raised(doc: dict[str, Any]) -> None:
    doc["f"] = 3
    doc["rounds"][4]["accepted"] = doc["rounds"][4]["accepted"][:1]
    doc["rounds"][4]["missing"] = [1, 2, 3]


def _rank_1_deleted(doc: dict[str, Any]) -> None:
    for r in doc["rounds"]:
        r["accepted"] = [a for a in r["accepted"] if a["rank"] != 1]


def _rank_1_both(doc: dict[str, Any]) -> None:
    doc["rounds"][2]["missing"] = [1]


def _missing(doc: dict[str, Any], at: int, ranks: list[int]) -> None:
    doc["rounds"][at]["accepted"] = [a for a in doc["rounds"][at]["accepted"] if a["rank"] not in ranks]
    doc["rounds"][at]["missing"] = ranks


def _rank_2_twice(doc: dict[str, Any]) -> None:
    accepted = doc["rounds"][3]["accepted"]
    accepted.append(dict(next(a for a in accepted if a["rank"] == 2)))  # its genuine signed entry, listed again


def _no_rounds(doc: dict[str, Any]) -> None:
    doc["rounds"] = []


def _last_five_cut(doc: dict[str, Any]) -> None:
    doc["rounds"] = doc["rounds"][:5]


def _rejections_erased(doc: dict[str, Any]) -> None:
    for r in doc["rounds"]:
        r["rejected"] = []
    for s in doc["sessions"]:
        s.pop("after", None)


# (the mutant, the line the audit must say about it once re-signed with rank 0's key: None where only the
# signature can tell — what rank 0 itself records about refusals is its own word)
CASES: dict[str, tuple[Edit, str | None]] = {
    "f-raised": (_f_raised, "round 4: 3 ranks missing, more than f = 1"),
    "f-plus-one-missing": (lambda doc: _missing(doc, 4, [2, 3]), "round 4: 2 ranks missing, more than f = 1"),
    "rank-2-heard-twice": (_rank_2_twice, "round 3: rank 2 was heard twice"),
    "rank-1-deleted-from-every-round": (_rank_1_deleted, "round 9: ranks [1] are neither accepted nor missing"),
    "rank-1-accepted-and-missing": (_rank_1_both, "round 2: ranks [1] are both accepted and missing"),
    "zero-rounds": (_no_rounds, "the transcript records no round; the run reached round 10 (it is DONE)"),
    "last-5-of-10-rounds-cut": (_last_five_cut, "the transcript's last round is 4; the run reached round 10"),
    "every-rejection-erased": (_rejections_erased, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_forged_transcript_fails_without_rank_0s_key(honest: Path, keys: Path, tmp_path: Path, case: str) -> None:
    """The attacker holds the Byzantine rank's key (or none) and edits the transcript: rank 0's signature no longer
    verifies — and re-signing it with the key the attacker holds names that key instead."""
    edit, _ = CASES[case]
    kept = audit(forge(honest, tmp_path / "kept", edit, None))
    one_line(kept, "the signature line names another digest")
    one_line(kept, UNSIGNED)
    report = audit(forge(honest, tmp_path / "byzantine", edit, load_identity(keys, 3, 4)))
    one_line(report, "the transcript is signed by rank 3's key, not rank 0's")


@pytest.mark.parametrize("case", [c for c, (_, line) in CASES.items() if line is not None])
def test_a_forged_transcript_fails_even_re_signed_by_rank_0(honest: Path, keys: Path, tmp_path: Path,
                                                           case: str) -> None:
    """The same mutants signed with rank 0's key (a check that rested on the signature alone would pass them): the
    check each one breaks says so, in one line each."""
    edit, line = CASES[case]
    assert line is not None
    report = audit(forge(honest, tmp_path, edit, load_identity(keys, 0, 4)))
    one_line(report, line)
    assert not any(UNSIGNED in p or "signed by rank" in p for p in report.problems), report.problems
    if case == "f-raised":
        one_line(report, "the transcript says f = 3, the run's config.json f = 1")
    if case == "rank-1-deleted-from-every-round":
        assert len(report.problems) == 10  # one line per round, each naming the round
    res = CliRunner().invoke(app, ["audit", str(tmp_path / "run")])
    assert res.exit_code == 1 and line in res.output and "audit failed" in res.output, res.output


def test_exactly_f_missing_in_a_round_audits(honest: Path, keys: Path, tmp_path: Path) -> None:
    """The other side of "missing ≤ f": a round missing exactly f = 1 rank (here the transcript re-signed by rank 0)
    passes, while f + 1 fails (``CASES["f-plus-one-missing"]``); a bound off by one either way fails one of them."""
    report = audit(forge(honest, tmp_path, lambda doc: _missing(doc, 4, [3]), load_identity(keys, 0, 4)))
    assert report.ok, report.problems


def test_a_transcript_written_by_the_byzantine_rank_alone_fails(honest: Path, keys: Path, tmp_path: Path) -> None:
    """Only the Byzantine rank's own signed rows, nobody missing, signed with its own key: not rank 0's record, and
    three ranks of every round neither accepted nor missing."""
    report = audit(forge(honest, tmp_path, _byzantine_alone, load_identity(keys, 3, 4)))
    one_line(report, "the transcript is signed by rank 3's key, not rank 0's: it is not the server's record")
    one_line(report, "round 0: ranks [0, 1, 2] are neither accepted nor missing")


def test_another_keyed_runs_transcript_copied_in_fails(honest: Path, tmp_path: Path) -> None:
    """The transcript of a run of another config, signed by the same rank 0, copied into this run's directory: its
    signature verifies, its config digest is not this run's config.json's."""
    other = tmp_path / "other"
    shutil.copytree(honest, other)
    identity = make_config({**SEALED, "engine": "torchrun", "seed": 6}).identity()
    assert identity != json.loads((honest / "config.json").read_text())
    write_artifact(other, "config.json", json.dumps(identity, indent=2, sort_keys=True).encode())
    report = audit(other)
    one_line(report, "the transcript is of another config")
    assert len(report.problems) == 1, report.problems  # its signature is rank 0's: only the binding tells


def _contribution_replaced(doc: dict[str, Any]) -> None:
    """What a rank 0 that reused another run's nonce records: a session line whose nonce is not SHA-256 of the
    contributions beside it (rank 2's swapped for other bytes; the nonce, and so every row's signature, kept)."""
    doc["sessions"][0]["contributions"][2] = "5a" * 32


def test_a_session_nonce_that_does_not_follow_from_its_contributions_fails(
    honest: Path, keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Re-signed and re-marked with rank 0's key, every row still verifying under the session's nonce: the audit
    recomputes the nonce from the session line's contributions and refuses it in one line. Mutant: the audit without
    the recomputation passes it."""
    from phalanx.distributed import audit as audit_module

    (session,) = load(honest / TRANSCRIPT)["sessions"]
    assert len(session["contributions"]) == 4 and None not in session["contributions"]
    forged = forge(honest, tmp_path, _contribution_replaced, load_identity(keys, 0, 4))
    report = audit(forged)
    one_line(report, "the session from round 0 has a nonce that does not follow from its contributions")
    assert len(report.problems) == 1, report.problems
    res = CliRunner().invoke(app, ["audit", str(forged)])
    assert res.exit_code == 1 and "does not follow from its contributions" in res.output, res.output
    monkeypatch.setattr(audit_module, "session_problem", lambda rec, n: None)
    assert audit(forged).ok


def test_a_transcript_without_contributions_is_read_as_before_and_labelled(
    honest: Path, keys: Path, tmp_path: Path,
) -> None:
    """A transcript written before the workers' share (its session line has no ``contributions``: rank 0 drew the
    nonce alone) still audits, counted and said as "nonce not contributed"; the honest one has none such."""
    assert audit(honest).uncontributed == 0
    res = CliRunner().invoke(app, ["audit", str(honest)])
    assert "not contributed" not in res.output, res.output

    def older(doc: dict[str, Any]) -> None:
        for session in doc["sessions"]:
            del session["contributions"]

    run = forge(honest, tmp_path, older, load_identity(keys, 0, 4))
    assert b"contributions" not in (run / TRANSCRIPT).read_bytes()
    report = audit(run)
    assert report.ok and report.uncontributed == 1, report.problems
    res = CliRunner().invoke(app, ["audit", str(run)])
    assert res.exit_code == 0 and "1 sessions' nonce not contributed" in res.output, res.output


def _checkpoint_names(run: Path, sessions: str | None) -> None:
    """Rewrite the checkpoint's metadata so that it names ``sessions`` (None: none) as its transcript's."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from phalanx.distributed.transcript import BINDING

    ckpt = run / "checkpoint.safetensors"
    with safe_open(str(ckpt), framework="pt") as fh:
        meta = dict(fh.metadata() or {})
    tensors = load_file(str(ckpt))
    meta.pop(BINDING, None)
    if sessions is not None:
        meta[BINDING] = sessions
    save_file(tensors, str(ckpt), metadata=meta)


def test_a_same_config_runs_transcript_copied_in_fails(honest: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reviewer's F4 (whoever hands over the run directory, with no key): run A's transcript — the same config,
    the same allow-list, signed by the same rank 0, so its header, rows and signature all verify — copied beside run
    B's checkpoint, which names B's session (its nonce drawn at random). The audit refuses it, and a checkpoint that
    names no sessions (stripped, or written by another build) binds nothing and is refused too. Mutant: an audit
    without the binding check (``_Audit.bound`` a no-op) passes the copy — the check is what catches it."""
    from safetensors import safe_open

    from phalanx.distributed import audit as audit_module
    from phalanx.distributed.transcript import BINDING

    sessions = [[s["from_round"], s["nonce"]] for s in load(honest / TRANSCRIPT)["sessions"]]
    with safe_open(str(honest / "checkpoint.safetensors"), framework="pt") as fh:
        assert json.loads((fh.metadata() or {})[BINDING]) == sessions  # rank 0 bound the honest run
    other = tmp_path / "b"
    shutil.copytree(honest, other)
    _checkpoint_names(other, json.dumps([[0, "5a" * 32]]))  # run B's checkpoint: B's own session
    report = audit(other)
    one_line(report, "the transcript's sessions (0:")
    assert "are not the ones the run directory's checkpoint names (0:5a5a5a5a…): it is another run's" in \
        report.problems[0]
    assert len(report.problems) == 1, report.problems  # signature, config, rows: all A's and valid
    for meta, said in ((None, "a checkpoint that names no transcript sessions"),
                       ("[[0, 1]]", "a checkpoint whose transcript sessions cannot be read"),
                       ("[" * 100_000, "a checkpoint whose transcript sessions cannot be read")):
        _checkpoint_names(other, meta)
        one_line(audit(other), f"the run directory holds {said}: nothing binds the transcript to this run")
    (other / "checkpoint.safetensors").unlink()  # DONE, and no checkpoint: nothing names the transcript
    one_line(audit(other), "the run directory holds no checkpoint: nothing binds the transcript to this run")
    _checkpoint_names(shutil.copytree(honest, tmp_path / "mutant"), json.dumps([[0, "5a" * 32]]))
    monkeypatch.setattr(audit_module._Audit, "bound", lambda self: None)
    assert audit(tmp_path / "mutant").ok  # without the check, A's transcript passes in B's directory


def test_an_audit_against_another_allow_list_fails(honest: Path, tmp_path: Path) -> None:
    init_keys(tmp_path / "other", 4)
    report = audit(honest, tmp_path / "other" / "allow-list.json")
    one_line(report, "the run used another allow-list")
    one_line(report, UNSIGNED)


# -- hostile files ------------------------------------------------------------------------------------------------

def plant(honest: Path, tmp: Path, payload: bytes) -> AuditReport:
    copy = tmp / "run"
    shutil.copytree(honest, copy)
    write_artifact(copy, TRANSCRIPT, payload)
    return audit(copy)


def honest_lines(honest: Path) -> list[bytes]:
    return (honest / TRANSCRIPT).read_bytes().splitlines(keepends=True)


HOSTILE: dict[str, tuple[Callable[[list[bytes]], bytes], str]] = {
    "deeply-nested": (lambda ls: b"".join(ls[:3]) + b'{"type":"rejected","samples":' + b"[" * 50_000
                      + b"]" * 50_000 + b"}\n" + b"".join(ls[3:]), "line 4 holds more lists than"),  # (unparsed)
    "nested-past-the-parser": (lambda ls: b"".join(ls[:3]) + b'{"type":"rejected","samples":' + b"[" * 1_100
                               + b"]" * 1_100 + b"}\n" + b"".join(ls[3:]), "line 4 nests deeper than 6 levels"),
    "nested-7-levels": (lambda ls: b"".join(ls[:3]) + b'{"type":"rejected","samples":[[[[[[0]]]]]]}\n'
                        + b"".join(ls[3:]), "line 4 nests deeper than 6 levels"),
    "not-json": (lambda ls: b"".join(ls[:3]) + b'{"type":"round","round":3,\n' + b"".join(ls[3:]),
                 "line 4 is not JSON"),
    "not-an-object": (lambda ls: b"".join(ls[:3]) + b"[1, 2, 3]\n" + b"".join(ls[3:]), "line 4 is not a JSON object"),
    "cut-short": (lambda ls: b"".join(ls)[:-7], "is cut short"),
    "no-header": (lambda ls: b"".join(ls[1:]), "line 1 is not a phalanx-transcript/3 header"),
    "header-with-a-string-n": (lambda ls: ls[0].replace(b'"workers":4', b'"workers":"4"') + b"".join(ls[1:]),
                               "line 1 does not hold a topology, a config digest, n"),
    "extra-field": (lambda ls: b"".join(ls[:3]) + ls[3].replace(b'{"accepted"', b'{"x":1,"accepted"')
                    + b"".join(ls[4:]), "line 4 (round) has the fields"),
    "unknown-type": (lambda ls: b"".join(ls[:3]) + b'{"type":"vote"}\n' + b"".join(ls[3:]),
                     "line 4 is of no known type"),
    "after-the-signature": (lambda ls: b"".join(ls) + ls[2], "follows the signature"),
    "empty": (lambda ls: b"", "empty"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_malformed_transcript_is_one_line(honest: Path, tmp_path: Path, case: str) -> None:
    make, expected = HOSTILE[case]
    report = plant(honest, tmp_path, make(honest_lines(honest)))
    assert len(report.problems) == 1 and expected in report.problems[0], report.problems
    res = CliRunner().invoke(app, ["audit", str(tmp_path / "run")])
    assert res.exit_code == 1 and "Traceback" not in res.output and "audit failed: 1 problem" in res.output


def test_fields_of_the_wrong_type_or_range_are_problems_not_tracebacks(honest: Path, keys: Path,
                                                                      tmp_path: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["rounds"][1]["accepted"][2] = {"rank": True, "phase": 0, "sha256": "x", "signature": None}
        doc["rounds"][2]["accepted"][0]["rank"] = 10 ** 30
        doc["rounds"][3]["missing"] = ["1"]
        doc["rounds"][3]["rejected"] = [{"round": 3, "at": 0, "rank": -1, "peer": None, "kind": "k", "count": 1e300,
                                         "samples": [7]}]
        doc["rounds"][5]["accepted"] = {"rank": 1}

    report = audit(forge(honest, tmp_path, edit, load_identity(keys, 0, 4)))
    text = " | ".join(report.problems)
    assert "round 1: accepted rank 'True', which is not on the allow-list" in text, text
    assert "round 2: accepted rank '10000000000000000000'" in text
    assert "round 3: 'accepted' or 'missing' is not a list of ranks of the job" in text
    assert "a rejection group whose fields are not those of one" in text
    assert "round 5: 'accepted' or 'missing' is not a list of ranks of the job" in text


def test_an_oversized_transcript_is_refused_before_it_is_read(honest: Path, tmp_path: Path) -> None:
    bound = size_bound(10, 4, 11, "server")
    lines = honest_lines(honest)
    padding = b'{"type":"rejected","round":3,"at":0,"rank":null,"peer":null,"kind":"k","count":1,"samples":[]}\n'
    report = plant(honest, tmp_path, b"".join(lines[:-1]) + padding * (bound // len(padding) + 1) + lines[-1])
    assert len(report.problems) == 1 and f"more than the {bound} a transcript of 10 rounds" in report.problems[0]


def test_a_line_longer_than_its_limit_is_refused_unparsed(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a":"' + b"x" * 5000 + b'"}\n')
    with path.open("rb") as fh, pytest.raises(Unreadable, match="line 1 is longer than the 1000 bytes"):
        Lines(fh).next(1000)


def test_too_many_rejection_groups_in_a_round_are_a_problem(honest: Path, keys: Path, tmp_path: Path) -> None:
    """A record holds at most GROUPS_PER_ROUND + 2 groups per round and recording rank: more is not a record rank 0
    wrote (rank 0's own key re-signing it)."""
    def edit(doc: dict[str, Any]) -> None:
        doc["rounds"][3]["rejected"] = [{"round": 3, "at": 0, "rank": None, "peer": f"10.0.0.{i}", "kind": "k",
                                         "count": 1, "samples": []} for i in range(40)]

    one_line(audit(forge(honest, tmp_path, edit, load_identity(keys, 0, 4))),
             "round 3: rank 0 recorded more than the 18 groups of rejections")


def test_an_older_unsigned_transcript_is_one_line(honest: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(honest, copy)
    (copy / TRANSCRIPT).unlink()
    (copy / OLD_TRANSCRIPT).write_text('{"format": "phalanx-transcript/2", "rounds": []}')
    report = audit(copy)
    assert len(report.problems) == 1 and "written before transcripts were signed" in report.problems[0]


def _resume_at_round_6(run: Path, keys: Path, digest: str) -> dict[str, Any]:
    """Rank 0's transcript callback starting a session that resumes ``run`` from its round-6 checkpoint (the loop
    stubbed: resumed, round 6 of 10), with rank 0's key of ``keys`` and the session nonce 07…07; the transcript it
    continues (as :func:`load` reads it). The checkpoint's mark is taken away: the checkpoint of a build that
    rewrote the transcript whole, which a resume verifies whole and rewrites once (a checkpoint with a mark:
    tests/test_transcript_chain.py)."""
    from types import SimpleNamespace

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from phalanx.distributed.chain import END
    from phalanx.distributed.transcript import Transcript

    ckpt = run / "checkpoint.safetensors"
    with safe_open(str(ckpt), framework="pt") as fh:
        meta = {k: v for k, v in (fh.metadata() or {}).items() if k != END}
    save_file(load_file(str(ckpt)), str(ckpt), metadata=meta)
    loop = SimpleNamespace(resumed=True, state=SimpleNamespace(round=6), experiment=SimpleNamespace(rounds=10))
    record = Transcript(run, SimpleNamespace(nonce=b"\x07" * 32), load_identity(keys, 0, 4), digest, 4, 1,
                        lambda t: False)
    record.on_start(loop)  # type: ignore[arg-type]
    return load(run / TRANSCRIPT)


def test_a_stopped_run_resumes_only_with_the_list_it_was_launched_with_even_after_a_rotation(
    honest: Path, keys: Path, tmp_path: Path
) -> None:
    """docs/security.md, "Rotation": ``phalanx keys rotate`` takes effect for new runs; a stopped run resumed with
    the rotated list is refused in one line naming the run directory's allow-list (its transcript is checked
    against the one list it was started with). The old list still resumes it."""
    from phalanx.distributed.keys import rotate_key
    from phalanx.errors import ConfigError

    rotated = tmp_path / "keys"
    shutil.copytree(keys, rotated)
    rotate_key(rotated, 3)
    run = tmp_path / "run"
    shutil.copytree(honest, run)
    digest = load(honest / TRANSCRIPT)["config"]
    with pytest.raises(ConfigError, match=r"allow-list.json.*the allow-list this job was launched with"):
        _resume_at_round_6(run, rotated, digest)
    assert [s["from_round"] for s in _resume_at_round_6(run, keys, digest)["sessions"]] == [0, 6]


def test_a_resumed_run_continues_only_the_transcript_rank_0_signed(honest: Path, keys: Path, tmp_path: Path) -> None:
    """Rank 0 resuming from round 6 keeps the rounds before it as it signed them — and refuses, in one line naming
    the file, a transcript edited while the run was stopped (it would otherwise sign the edit)."""

    from phalanx.errors import ConfigError

    def resume(run: Path) -> dict[str, Any]:
        return _resume_at_round_6(run, keys, load(honest / TRANSCRIPT)["config"])

    copy = tmp_path / "kept"
    shutil.copytree(honest, copy)
    doc = resume(copy)
    assert [r["round"] for r in doc["rounds"]] == list(range(6))
    assert [s["from_round"] for s in doc["sessions"]] == [0, 6] and doc["sessions"][1]["nonce"] == "07" * 32
    edited = forge(honest, tmp_path / "edited", _rejections_erased, None)
    with pytest.raises(ConfigError, match=r"transcript.jsonl.*does not verify with rank 0's key; move it away"):
        resume(edited)


def test_a_resume_checks_the_old_transcript_with_the_launched_allow_list(honest: Path, keys: Path,
                                                                       tmp_path: Path) -> None:
    """The reviewer's F5 (an attacker with no listed key who can write the run directory while the run is stopped):
    it puts its own key in rank 0's place in the directory's ``allow-list.json``, erases the rejections and signs
    the transcript with that key. Rank 0 resuming checks the old transcript with rank 0's key of the list the job
    was *launched* with, so it refuses — in one line naming the directory's allow-list — rather than sign the
    forgery with its real key. A transcript rank 0 really signed but whose header names another config or
    allow-list (another run's record) is refused too."""

    from phalanx.errors import ConfigError

    def resume(run: Path) -> dict[str, Any]:
        return _resume_at_round_6(run, keys, load(honest / TRANSCRIPT)["config"])

    init_keys(tmp_path / "evil", 4)
    evil = load_identity(tmp_path / "evil", 0, 4)
    swapped = forge(honest, tmp_path / "swapped", _rejections_erased, evil)
    allow = json.loads((swapped / "allow-list.json").read_text())
    allow["ranks"][0] = json.loads((tmp_path / "evil" / "allow-list.json").read_text())["ranks"][0]
    (swapped / "allow-list.json").write_text(json.dumps(allow, indent=1) + "\n")
    with pytest.raises(ConfigError, match=r"allow-list.json.*the allow-list this job was launched with"):
        resume(swapped)
    shutil.copy(keys / "allow-list.json", swapped / "allow-list.json")  # the copy restored: the signature fails
    with pytest.raises(ConfigError, match=r"transcript.jsonl.*does not verify with rank 0's key"):
        resume(swapped)
    for field in ("config", "allow_list"):
        other = forge(honest, tmp_path / field, lambda d, k=field: d.update({k: "ab" * 32}), load_identity(keys, 0, 4))
        with pytest.raises(ConfigError, match=r"transcript.jsonl.*another config or allow-list"):
            resume(other)
    assert [r["round"] for r in resume(forge(honest, tmp_path / "kept", lambda d: None, None))["rounds"]] == \
        list(range(6))
