"""Worker-stage reports under ``phalanx launch`` (issue 39's trial, finding 3): every parameter-server worker sends
rank 0 its worker stages' measurements of the round with its update (``m/<t>/<r>``, :mod:`phalanx.distributed.wire`),
and rank 0's stage merges the plausible ones into its columns. A report is its sender's claim: one out of the stage's
bounds or of another length or tag is dropped, a plausible lie is counted as reported, and none changes the run.
Keyed server jobs carry it signed with the vector (``REPORTED_VECTOR``), serverless jobs in every rank's row; the
real launches of those engines are in ``tests/test_stage_reports_engines.py``.

The honest launch (the columns equal the simulated run's) is
``tests/test_update_clip.py::test_under_phalanx_launch_the_rows_count_every_worker_and_the_run_is_the_simulated_one``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _processes import JOB_TIMEOUT_S
from phalanx.distributed import wire
from phalanx.distributed.channel import Kind, Violation
from phalanx.distributed.keys import init_keys, load_identity
from phalanx.distributed.sealed import SIGNATURE_BYTES, SealedLinks, signed_message
from phalanx.experiments import store
from phalanx.training.stages.base import WorkerUpdate
from phalanx.training.stages.update_clip import UpdateClip


def _stage(rows: torch.Tensor, c: float = 1.0, workers: int = 4) -> UpdateClip:
    """Rank 0's stage after its own update of ``rows`` in a round of ``workers`` computing workers."""
    stage = UpdateClip(c=c)
    stage.update(rows.clone(), WorkerUpdate(workers, slice(0, rows.shape[0]), {}))
    return stage


def _report(*values: float) -> bytes:
    return wire.REPORT + struct.pack(f"<{len(values)}d", *values)


def test_a_report_round_trips_and_merges_into_the_columns() -> None:
    worker = _stage(torch.tensor([[3.0, 4.0]]))  # norm 5 > 1: clipped
    assert worker.report() == (1.0, 5.0)
    payload = wire.report_message([worker])
    assert len(payload) == len(wire.REPORT) + 16 and wire.parse_report([worker], payload) == [(1.0, 5.0)]
    idle = _stage(torch.zeros(0, 2))
    assert wire.parse_report([idle], wire.report_message([idle])) == [None]  # no row: no claim
    rank0 = _stage(torch.tensor([[0.3, 0.4]]))  # norm 0.5: not clipped
    dropped = wire.absorb_reports([rank0], {1: payload, 2: wire.report_message([idle])})
    assert dropped == 0
    assert rank0.columns(None) == {"update_clip_clipped": 1, "update_clip_max_norm": 5.0,  # type: ignore[arg-type]
                                   "update_clip_reported": 1}


BAD: list[tuple[str, bytes]] = [
    ("a count above n", _report(5.0, 2.0)), ("a huge count", _report(1e300, 1e300)),
    ("a negative count", _report(-1.0, 0.5)), ("a fractional count", _report(0.5, 2.0)),
    ("a NaN count", _report(math.nan, 2.0)), ("an infinite count", _report(math.inf, 2.0)),
    ("a NaN norm", _report(1.0, math.nan)), ("a negative norm", _report(0.0, -1.0)),
    ("clipped with a norm within C", _report(1.0, 0.5)), ("not clipped with a finite norm above C", _report(0.0, 2.0)),
    ("a report one byte short", _report(1.0, 2.0)[:-1]), ("a report one byte long", _report(1.0, 2.0) + b"\0"),
    ("another tag (a peer of another release)", b"R0" + _report(1.0, 2.0)[2:]), ("empty", b""),
    ("8 MiB", _report(1.0, 2.0) * (1 << 19)),
]
"""Reports a Byzantine rank (or a peer of another release) may send: each is dropped."""


@pytest.mark.parametrize(("case", "payload"), BAD, ids=[b[0] for b in BAD])
def test_a_report_out_of_bounds_is_dropped_and_the_columns_stay_rank_0s(case: str, payload: bytes) -> None:
    rank0 = _stage(torch.tensor([[0.3, 0.4]]))
    before = rank0.columns(None)  # type: ignore[arg-type]
    wire.absorb_reports([rank0], {3: payload})
    assert rank0.columns(None) == before  # type: ignore[arg-type]
    assert before["update_clip_reported"] == 0


def test_a_plausible_lie_is_counted_as_reported_and_an_infinite_norm_is_a_row_left_unclipped() -> None:
    rank0 = _stage(torch.tensor([[0.3, 0.4]]))
    wire.absorb_reports([rank0], {1: _report(1.0, 1.5), 2: _report(0.0, math.inf)})
    cols = rank0.columns(None)  # type: ignore[arg-type]
    assert cols == {"update_clip_clipped": 1, "update_clip_max_norm": math.inf, "update_clip_reported": 2}


def test_the_mutant_that_trusts_every_report_records_what_an_attacker_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a stage that merges every report that parses (no bounds): a Byzantine rank then makes rank 0 record
    a count of 1e300 and a NaN norm, which the test above refuses."""
    monkeypatch.setattr(UpdateClip, "plausible", lambda self, claim: True)
    rank0 = _stage(torch.tensor([[0.3, 0.4]]))
    wire.absorb_reports([rank0], {3: _report(1e300, math.nan)})
    assert rank0.columns(None)["update_clip_clipped"] > 1e299  # type: ignore[arg-type]


def test_an_enclosed_report_is_cut_off_exactly_whatever_its_length() -> None:
    """The envelope (``wire.enclose``) that carries a report ahead of a vector on the keyed and serverless engines:
    a report one byte short or long, of another tag, or empty leaves the vector whole (and is dropped by
    ``parse_report``); a length field over the body or over ``REPORT_BYTES`` is no envelope (None)."""
    vector = bytes(range(40))
    for report in (_report(1.0, 2.0), _report(1.0, 2.0)[:-1], _report(1.0, 2.0) + b"\0", b"R0" + _report(1.0)[2:],
                   b""):
        assert wire.disclose(wire.enclose(report, vector)) == (report, vector)
    assert wire.disclose(bytearray(wire.enclose(b"R1", vector)))[1] == bytearray(vector)  # (a frame's bytearray)
    assert wire.disclose((41).to_bytes(2, "big") + vector) is None  # a length over what follows
    too_long = b"R1" + bytes(wire.REPORT_BYTES)
    assert wire.disclose(len(too_long).to_bytes(2, "big") + too_long) is None
    assert wire.disclose(wire.enclose(too_long, vector)) == (b"", vector)  # carried empty: dropped, vector whole
    assert wire.disclose(b"\0") is None and wire.disclose(b"") is None
    stage = _stage(torch.tensor([[3.0, 4.0]]))
    size = wire.slot([stage], 4)
    assert size == 20 and size % 4 == 0  # 2 + 2 + 16 bytes: 5 float32 elements
    for report in (wire.report_message([stage]), _report(1.0, 2.0)[:-1], b"x" * 64):
        slotted = wire.in_slot(report, size)
        assert len(slotted) == size
        got = wire.disclose(slotted)
        assert got is not None and got[0] == (report if len(report) <= size - 2 else b"")


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Rank 0's sealed links of a reporting run (row of 8 bytes) and rank 1's identity, on test keys."""
    keys = tmp_path_factory.mktemp("keys")
    init_keys(keys, 4)
    links = SealedLinks(load_identity(keys, 0, 4), "127.0.0.1", 0, "cfg", 8, 4, reports=True)
    links.nonce, links.round = b"n" * 32, 3
    yield links, load_identity(keys, 1, 4)
    links.close()


def _frame(links: SealedLinks, who: Any, t: int, report: bytes, vector: bytes, signed: bytes | None = None) -> bytes:
    """A REPORTED_VECTOR frame's payload: the signature (over the SHA-256 of ``signed``, by default the enclosed
    body — as SealedWorkerLinks.send_vector signs it) and the enclosed body."""
    body = wire.enclose(report, vector)
    digest = hashlib.sha256(body if signed is None else signed).digest()
    return who.sign(signed_message(links.nonce, links.digest, t, who.rank, digest)) + body


def test_a_keyed_report_is_signed_with_its_vector_and_cut_off_before_the_vector_is_used(sealed: Any) -> None:
    links, who = sealed
    public = links.identity.allow.public_key(1)
    report, vector = _report(1.0, 2.0), bytes(range(8))
    assert links._take_vector(1, public, 3, bytearray(_frame(links, who, 3, report, vector)), True) is None
    got = links.accepted(3, 1)
    assert got is not None and bytes(got.body) == vector and got.report == report
    assert links.reports(3, [1, 2]) == {1: report}  # rank 2 sent nothing: no claim
    # the transcript's digest is the signed body's (report and vector): the audit verifies the same signature
    assert got.sha256 == hashlib.sha256(wire.enclose(report, vector)).hexdigest()
    # a short report (a lie of the sender, signed) is cut off exactly: the vector whole, the report dropped later
    short = report[:-1]
    assert links._take_vector(1, public, 2, bytearray(_frame(links, who, 2, short, vector)), True) is None
    got2 = links.accepted(2, 1)
    assert got2 is not None and bytes(got2.body) == vector and got2.report == short


def test_a_report_changed_on_the_path_never_verifies(sealed: Any) -> None:
    """A report altered after the worker signed it (or the mutant sender that signs its vector alone and carries the
    report beside it) is a violation: the vector and the report are both unused."""
    links, who = sealed
    public = links.identity.allow.public_key(1)
    frame = bytearray(_frame(links, who, 1, _report(0.0, 0.5), bytes(8)))
    frame[SIGNATURE_BYTES + 2 + 3] ^= 1  # a bit of the report's count
    assert "does not verify" in str(links._take_vector(1, public, 1, frame, True))
    mutant = _frame(links, who, 1, _report(0.0, 0.5), bytes(8), signed=bytes(8))  # signs the vector only
    assert "does not verify" in str(links._take_vector(1, public, 1, bytearray(mutant), True))
    assert links.accepted(1, 1) is None


def test_a_signed_frame_whose_enclosure_is_not_one_is_a_violation(sealed: Any) -> None:
    links, who = sealed
    body = (500).to_bytes(2, "big") + bytes(8)  # a length over the body, signed by its sender
    sig = who.sign(signed_message(links.nonce, links.digest, 0, 1, hashlib.sha256(body).digest()))
    problem = links._take_vector(1, links.identity.allow.public_key(1), 0, bytearray(sig + body), True)
    assert problem is not None and "not enclosed" in problem and links.accepted(0, 1) is None


def test_a_reported_frame_is_refused_in_one_line_by_a_run_that_takes_none(sealed: Any) -> None:
    """A run without reporting stages never takes a REPORTED_VECTOR frame (one line, before its payload is read); a
    server of an earlier release, whose Kind has no 13, refuses it as "a frame of unknown kind 13" the same way."""
    links, _ = sealed
    plain = SealedLinks(links.identity, "127.0.0.1", 0, "cfg", 8, 4)
    try:
        with pytest.raises(Violation, match="REPORTED_VECTOR frame, which this end never accepts"):
            plain.vector_limits.check(int(Kind.REPORTED_VECTOR), 100)
    finally:
        plain.close()
    assert links.vector_limits.check(int(Kind.REPORTED_VECTOR), 100) == Kind.REPORTED_VECTOR
    with pytest.raises(Violation, match="a frame of unknown kind 14"):  # (how a kind this release lacks is refused)
        links.vector_limits.check(14, 100)


def test_a_serverless_rank_of_an_earlier_release_is_refused_at_the_start_in_one_line() -> None:
    """A reporting serverless run marks its start snapshot's config digest (``wire.marked``): a rank whose rows carry
    no report (an earlier release: the plain digest) and a rank of this release refuse each other's start in one line
    (``check_digest``'s ConfigError) instead of all-gathering rows of two formats; a run without reporting stages
    keeps the plain digest (its rows are unchanged)."""
    from phalanx.distributed.parameter_server import check_digest
    from phalanx.errors import ConfigError

    stages = [UpdateClip(c=1.0)]
    new = wire.marked("d" * 64, stages)
    assert new != "d" * 64 and wire.marked("d" * 64, []) == "d" * 64
    check_digest({"config": new}, new, 1)  # the same release: let in
    for init, mine in (({"config": new}, "d" * 64), ({"config": "d" * 64}, new)):  # old rank ← new rank 0, and back
        with pytest.raises(ConfigError) as err:
            check_digest(init, mine, 1)
        assert "\n" not in str(err.value)


RUN: dict[str, Any] = {
    "dataset": "digits", "workers": 4, "byzantine": 1, "f": 1, "aggregator": "cwtm", "attack": "signflip",
    "rounds": 5, "batch_size": 8, "lr": 0.1, "eval_every": 1, "checkpoint_every": 10, "seed": 0,
}


def _launch(tmp: Path, name: str, env: dict[str, str]) -> tuple[list[dict[str, Any]], torch.Tensor, str]:
    cfg = tmp / f"{name}.toml"
    cfg.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in RUN.items()) + "\n[model]\nname = \"mlp\"\n"
                   "hidden = [16]\n[stages.update_clip]\nc = 0.05\n")
    done = subprocess.run([sys.executable, "-m", "phalanx.cli", "launch", "--workers", "4", str(cfg), "--out",
                           str(tmp / name)], capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = [p for p in (tmp / name).iterdir() if p.is_dir()]
    return store.read_rows(run_dir), load_file(str(run_dir / "checkpoint.safetensors"))["theta"], done.stderr


def test_under_phalanx_launch_a_lying_rank_is_a_claim_and_changes_nothing_but_the_reported_columns(
        tmp_path: Path) -> None:
    """A real launch (topology server, 4 ranks, rank 3 signflip): rank 2 sends out-of-bounds reports of five kinds
    (the test hook ``PHALANX_TEST_REPORT``), one a round — each dropped; rank 1 reports (1, 1.0) every round — a
    plausible lie, counted as reported. θ is bit for bit the honest launch's, and the columns are bounded."""
    honest, theta, _ = _launch(tmp_path, "honest", {})
    lied, theta_lied, err = _launch(tmp_path, "lied", {"PHALANX_TEST_REPORT": "2:huge+nan+short+other+huge,1:lie"})
    assert "a huge report (test hook)" in err and "a lie report (test hook)" in err
    assert torch.equal(theta, theta_lied)  # the reports are never read by a decision
    assert [r["update_clip_reported"] for r in honest[1:]] == [2] * 5
    assert [r["update_clip_reported"] for r in lied[1:]] == [1] * 5  # rank 1's lie only: rank 2's dropped
    assert all(0 <= r["update_clip_clipped"] <= 4 and r["update_clip_max_norm"] >= 1.0 for r in lied[1:])
    assert [r["test_accuracy"] for r in lied] == [r["test_accuracy"] for r in honest]
