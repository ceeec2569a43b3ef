"""What travels between ranks of the parameter-server topology: key names, tensors as bytes, byte counts.

Every message of round t has t in its key, so a late worker's vector for round t can never be read as the vector of
a later round: the server reads only ``v/<t>/<rank>`` in round t. Keys of rounds older than :data:`KEEP_ROUNDS` are
removed by a background thread of the server (its own store connection, off the round's critical path): ``v/`` and
``h/`` keys are deleted; ``s/<t>`` is replaced by the 1-byte tombstone ``b"L"`` ("lapsed"), so that a worker that
fell that far behind and asks for it gets an answer at once (then reads ``latest`` and skips ahead) instead of
blocking on a key that will never come back.

=================  ==========================================  =====================================
key                value                                       written by / read by
=================  ==========================================  =====================================
``init``           torch.save of the start state               rank 0 / every worker
``ready/<r>``      ``b"1"``                                    rank r / rank 0
``latest``         the round rank 0 is in (ASCII)              rank 0 / workers (to skip lost rounds)
``s/<t>``          ``b"T"`` + θ, ``b"X"`` + reason (stop), or   rank 0 / every worker
                   ``b"L"`` (lapsed: the round is long over)
``h/<t>``          ``b"H"`` + honest vectors (h', d), ``b"C"``   rank 0 / Byzantine ranks (vector attacks)
                   + honest vectors and the server's context
                   (:func:`honest_message`), or ``X``
``v/<t>/<r>``      the rank's vector (+ its attack-stream       rank r / rank 0
                   state, Byzantine ranks of vector attacks)
``m/<t>/<r>``      :data:`REPORT` + the rank's worker-stage     rank r (with its vector, one request) /
                   measurements of round t (float64s)          rank 0 (:func:`absorb_reports`)
=================  ==========================================  =====================================

A report (``m/``) is written only in runs with a worker stage that reports (:attr:`WorkerStage.reports`
<phalanx.training.stages.base.WorkerStage.reports>`), in the same request as the vector and before it, so rank 0
finds it whenever it finds the vector. Its length is fixed by the run's stages; one of another length or tag (a peer
of another release, a Byzantine rank) is dropped unread, as if the rank had reported nothing, and what it holds is a
claim that only fills metric columns.

The same report travels on the other engines *enclosed* (:func:`enclose`: a 2-byte length, then the report) ahead of
the rank's vector, so that a report of any length — one byte short, of another tag — is cut from the vector exactly
and dropped alone, never taking the vector with it: in a keyed server job's ``REPORTED_VECTOR`` frame, under the
worker's signature (:mod:`phalanx.distributed.sealed`); in a serverless job's gathered row, after the vector in a
fixed slot (:func:`slot`, gloo) or signed in the sealed mesh's row (:mod:`phalanx.distributed.serverless`).
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from phalanx.training.stages.base import Stage, WorkerStage

THETA = b"T"
HONEST = b"H"
HONEST_CONTEXT = b"C"
STOP = b"X"
LAPSED = b"L"
REPORT = b"R1"
"""The tag and version of a worker-stage report: a report with another is dropped (its rank reported nothing)."""
REPORT_BYTES = 1 << 12
"""The most an enclosed report may hold (:func:`enclose`): a stage's report is 2 + 8k bytes, k ≤ 511 numbers."""
_Bytes = TypeVar("_Bytes", bytes, bytearray)
KEEP_ROUNDS = 16
"""Keys of rounds older than this are deleted; a worker further behind skips ahead to the current round."""


def key_server(t: int) -> str:
    """The server's message of round t (θ or stop)."""
    return f"s/{t}"


def key_honest(t: int) -> str:
    """The honest vectors of round t, for the Byzantine ranks of an omniscient (vector) attack."""
    return f"h/{t}"


def key_vector(t: int, rank: int) -> str:
    """A rank's vector of round t."""
    return f"v/{t}/{rank}"


def key_report(t: int, rank: int) -> str:
    """A rank's worker-stage report of round t."""
    return f"m/{t}/{rank}"


def reporting(stages: Sequence[Stage]) -> list[WorkerStage]:
    """The run's worker stages that report their measurements to rank 0 (in the run's order: every rank's same)."""
    return [s for s in stages if isinstance(s, WorkerStage) and s.reports > 0]


def marked(digest: str, stages: Sequence[Stage]) -> str:
    """The config digest a serverless start snapshot carries: ``digest``, marked with :data:`REPORT` when the run's
    rows carry worker-stage reports — so that a rank of an earlier release (rows without them) and this one refuse
    each other at the start in one line (:func:`~phalanx.distributed.parameter_server.check_digest`) instead of
    all-gathering rows of two formats."""
    return f"{digest}+reports/{REPORT.decode()}" if reporting(stages) else digest


def report_message(stages: Sequence[WorkerStage]) -> bytes:
    """:data:`REPORT` + each stage's :meth:`~WorkerStage.report` as float64s (NaN for a stage that has none)."""
    values: list[float] = []
    for stage in stages:
        got = stage.report()
        if got is not None and len(got) != stage.reports:
            raise ValueError(f"{stage.name} reported {len(got)} numbers, not its {stage.reports}")
        values += [math.nan] * stage.reports if got is None else [float(v) for v in got]
    return REPORT + struct.pack(f"<{len(values)}d", *values)


def parse_report(stages: Sequence[WorkerStage], data: bytes | bytearray) -> list[tuple[float, ...] | None] | None:
    """Each stage's numbers in a report (None for a stage whose numbers are all NaN: no row), or None — the report
    dropped — unless it has the tag :data:`REPORT` and exactly the run's length (checked before anything is read)."""
    size = sum(s.reports for s in stages)
    if bytes(data[:len(REPORT)]) != REPORT or len(data) != len(REPORT) + 8 * size:
        return None
    values = struct.unpack(f"<{size}d", bytes(data[len(REPORT):]))
    out: list[tuple[float, ...] | None] = []
    at = 0
    for stage in stages:
        chunk = tuple(values[at:at + stage.reports])
        at += stage.reports
        out.append(None if all(math.isnan(v) for v in chunk) else chunk)
    return out


def absorb_reports(stages: Sequence[WorkerStage], payloads: Mapping[int, bytes | bytearray]) -> int:
    """Rank 0: hand each stage the reports ``payloads`` (rank → report) that parse (:func:`parse_report`), in rank
    order; returns how many were dropped. Each stage bounds what it takes (:meth:`WorkerStage.absorb`)."""
    parsed = [parse_report(stages, payloads[r]) for r in sorted(payloads)]
    kept = [p for p in parsed if p is not None]
    for i, stage in enumerate(stages):
        stage.absorb([p[i] for p in kept])
    return len(parsed) - len(kept)


def enclose(report: bytes, payload: bytes) -> bytes:
    """``len(report)`` (2 bytes, big-endian) ‖ ``report`` ‖ ``payload``: a report carried ahead of a vector; a report
    over :data:`REPORT_BYTES` is carried empty (it would be dropped anyway: not the run's length)."""
    if len(report) > REPORT_BYTES:
        report = b""
    return len(report).to_bytes(2, "big") + report + payload


def disclose(body: _Bytes) -> tuple[bytes, _Bytes] | None:
    """The report and the payload of a body :func:`enclose` made; None if its length field is over
    :data:`REPORT_BYTES` or over what follows (a body that is not one)."""
    if len(body) < 2:
        return None
    size = int.from_bytes(body[:2], "big")
    if size > REPORT_BYTES or size > len(body) - 2:
        return None
    return bytes(body[2:2 + size]), body[2 + size:]


def slot(stages: Sequence[WorkerStage], itemsize: int) -> int:
    """The bytes a serverless gloo row carries its report in after its vector: an enclosed report of the run's
    length, rounded up to whole elements of ``itemsize`` bytes (every rank's same: the collective needs one size)."""
    size = 2 + len(REPORT) + 8 * sum(s.reports for s in stages)
    return -(-size // itemsize) * itemsize


def in_slot(report: bytes, size: int) -> bytes:
    """``report`` enclosed (with no payload) and zero-padded to ``size`` bytes (:func:`slot`); a report too long for
    the slot is carried empty (dropped at every rank)."""
    body = enclose(report if 2 + len(report) <= size else b"", b"")
    return body + bytes(size - len(body))


def tensor_bytes(x: Tensor) -> bytes:
    """The raw bytes of a tensor (CPU, contiguous)."""
    return x.detach().to("cpu").contiguous().numpy().tobytes()


def bytes_tensor(data: bytes | bytearray | memoryview, dtype: torch.dtype, shape: tuple[int, ...] = (-1,)) -> Tensor:
    """A tensor over a copy of ``data`` (the inverse of :func:`tensor_bytes`)."""
    if len(data) == 0:
        return torch.empty(0, dtype=dtype).reshape(shape)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def generator_state(data: bytes | bytearray | memoryview | Tensor) -> Tensor | None:
    """``data`` as the uint8 state of a CPU :class:`torch.Generator` (an attack stream's, sent by a Byzantine rank
    for rank 0 to keep and checkpoint), or None where no generator takes it: stored unchecked, such bytes made
    every resume of the run fail in ``set_state`` (an attacker's review)."""
    state = data.detach().to("cpu", torch.uint8) if isinstance(data, Tensor) else bytes_tensor(data, torch.uint8)
    try:
        torch.Generator().set_state(state)
    except (RuntimeError, TypeError, ValueError):
        return None
    return state


def pack(obj: Any) -> bytes:
    """``torch.save`` to bytes (the start state; small, once per run)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def unpack(data: bytes) -> Any:
    """Inverse of :func:`pack` (tensors, numbers, strings and containers only)."""
    return torch.load(io.BytesIO(data), weights_only=True)


def put(store: Any, key: str, value: bytes | str) -> None:
    """``store.set`` with bytes (the c10d stubs say ``str``; the store takes both)."""
    store.set(key, value)


def put_many(store: Any, keys: list[str], values: list[bytes]) -> None:
    """Several keys in one round trip (``multi_set``)."""
    store.multi_set(keys, values)


def honest_message(honest: Tensor, context: dict[str, Tensor], attack_state: Tensor | None = None) -> bytes:
    """The ``h/<t>`` message: the honest vectors, raw, or — when an adaptive attacker needs the server's context
    (centre, reference gradient, the aggregator stream's state), or the attack stream travels with the message
    (federated rounds, whose Byzantine slots change) — all of them, packed."""
    if not context and attack_state is None:
        return HONEST + tensor_bytes(honest)
    return HONEST_CONTEXT + pack({"honest": honest, "context": context, "attack": attack_state})


def parse_honest(
    msg: bytes, dtype: torch.dtype, dim: int,
) -> tuple[Tensor, dict[str, Tensor], Tensor | None] | None:
    """The honest vectors ``(h', d)``, the server's context and the attack stream's state (or None) of an
    ``h/<t>`` message; None for a stop message."""
    if msg[:1] == HONEST:
        return bytes_tensor(msg[1:], dtype, (-1, dim)), {}, None
    if msg[:1] == HONEST_CONTEXT:
        obj = unpack(msg[1:])
        return obj["honest"], obj["context"], obj.get("attack")
    return None
