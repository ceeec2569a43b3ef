"""TEST-ONLY fault injection. Never set these variables in a real run.

``PHALANX_TEST_SLEEP="RANK:ROUND:WHAT[,RANK:ROUND:WHAT…]"`` makes rank RANK stop answering before it computes its
vector of round ROUND: for WHAT seconds when WHAT is a number, else until the file WHAT exists (a test wakes it at a
point it chose); WHAT = ``exit`` makes it die there instead (``os._exit(1)``, as a crash: its sockets close). Each
entry acts once, at the first round ≥ ROUND the rank computes: an asynchronous worker on a loaded machine may be
handed version 4 after version 2, and its crash "at version 3" must still happen (the latest of the entries it
passed acts; ``exit`` before any sleep).

``PHALANX_TEST_HOLD="ROUND:PATH[,ROUND:PATH…]"`` makes the parameter server stop before it publishes θ of round
ROUND, say ``holding round ROUND`` on stderr, and wait until the file PATH exists: a test can then act on the workers
at a known point (every live worker is waiting for that θ) instead of racing the job.

``PHALANX_TEST_JOURNAL="RANK:KIND[+KIND…]"`` makes gossip node RANK (keyed) send rank 0, at its successive gathering
rounds, a journal of each KIND in turn instead of its own: ``junk`` (a list of non-entries, signed), ``deep`` (1,200
nested lists), ``huge`` (512 KiB), ``unsigned`` (its journal with a signature that is not one), ``forged`` (its
journal, signed, each message it took with a signature its sender never made), ``other`` (its journal, signed, of
other rounds); ``own`` sends its own.

``PHALANX_TEST_REPORT="RANK:KIND[+KIND…]"`` makes rank RANK (a parameter-server worker, keyed or not, or a serverless
rank, keyed or not) send, with its successive vectors, a worker-stage report of each KIND in turn instead of its own
(:mod:`phalanx.distributed.wire`: ``m/<t>/<r>``, or enclosed with the vector, signed on sealed links):
``huge`` (every number 1e300), ``nan`` (NaN and −∞), ``short`` (its report less one byte), ``other`` (its report
under another tag: a peer of another release), ``lie`` (every number 1: a claim within any count's bounds);
``own`` sends its own.

``PHALANX_TEST_ROWS="RANK:KIND[+KIND…]"`` makes gossip node RANK (keyed) send rank 0, at its successive gathering
rounds, monitoring rows of each KIND in turn instead of its own: ``none`` (θ is None), ``meta`` (θ a tensor of the
right dtype and shape with no data), ``sparse`` (θ a sparse tensor of the right dtype and shape); ``own`` sends its
own.

``PHALANX_TEST_STATE="RANK[,RANK…]"`` makes parameter-server worker RANK, where it plays a Byzantine worker of a
vector attack, send 0xff bytes of the right length in place of its attack stream's state (which no random generator
takes: rank 0 must not keep it, or every resume of the run fails).

``PHALANX_TEST_NONCE="KIND:ARG"`` makes keyed rank 0 (parameter server or sealed mesh) a mutant at the session nonce
(what :func:`phalanx.distributed.contribution.fix` gave): ``reuse:HEX`` sends the nonce HEX (another run's) with the
other ranks' true contributions, ignoring them; ``drop:RANK`` marks rank RANK's contribution absent, ``alter:RANK``
flips a bit of it — each with the nonce derived from the list it sends.
"""

from __future__ import annotations

import math
import os
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

VAR = "PHALANX_TEST_SLEEP"
HOLD_VAR = "PHALANX_TEST_HOLD"
JOURNAL_VAR = "PHALANX_TEST_JOURNAL"
REPORT_VAR = "PHALANX_TEST_REPORT"
NONCE_VAR = "PHALANX_TEST_NONCE"
STATE_VAR = "PHALANX_TEST_STATE"
ROWS_VAR = "PHALANX_TEST_ROWS"


def _entries(var: str, fields: int) -> list[list[str]]:
    raw = os.environ.get(var, "").strip()
    return [p.strip().split(":", fields - 1) for p in raw.split(",") if p.strip()]


_SLEEP = {(int(r), int(t)): what for r, t, what in _entries(VAR, 3)}
_HOLD = {int(t): path for t, path in _entries(HOLD_VAR, 2)}
_JOURNAL = {int(r): kinds.split("+") for r, kinds in _entries(JOURNAL_VAR, 2)}
_REPORT = {int(r): kinds.split("+") for r, kinds in _entries(REPORT_VAR, 2)}
_STATE = {int(r[0]) for r in _entries(STATE_VAR, 1)}
_ROWS = {int(r): kinds.split("+") for r, kinds in _entries(ROWS_VAR, 2)}


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


_FIRED: set[tuple[int, int]] = set()


def maybe_sleep(rank: int, round_: int) -> None:
    """Stop answering if the test plan says so for this rank at a round ≤ ``round_`` it has not acted on yet (the
    module's docstring)."""
    due = sorted(k for k in _SLEEP if k[0] == rank and k[1] <= round_ and k not in _FIRED)
    if not due:
        return
    _FIRED.update(due)
    whats = [_SLEEP[k] for k in due]
    what = "exit" if "exit" in whats else whats[-1]
    if what == "exit":
        print(f"[phalanx rank {rank}] {VAR}: exiting in round {round_} (test hook)", file=sys.stderr, flush=True)
        os._exit(1)
    try:
        seconds: float | None = float(what)
    except ValueError:
        seconds = None
    say = f"sleeping {seconds:g} s" if seconds is not None else "sleeping until the test wakes it"
    print(f"[phalanx rank {rank}] {VAR}: {say} in round {round_} (test hook)", file=sys.stderr, flush=True)
    if seconds is not None:
        time.sleep(seconds)
    else:
        _wait_for(what)


def maybe_hold(round_: int) -> None:
    """Wait for the test's file before round ``round_`` if the test plan says so."""
    path = _HOLD.get(round_)
    if path is None:
        return
    print(f"[phalanx rank 0] {HOLD_VAR}: holding round {round_} (test hook)", file=sys.stderr, flush=True)
    _wait_for(path)


def _next_kind(plans: dict[int, list[str]], rank: int, var: str, what: str) -> str | None:
    """The next KIND of ``rank``'s plan (the plan rotates), said on stderr as ``what`` names it; None without one."""
    plan = plans.get(rank)
    if not plan:
        return None
    kind = plan.pop(0)
    plan.append(kind)
    print(f"[phalanx rank {rank}] {var}: {what.format(kind)} (test hook)", file=sys.stderr, flush=True)
    return kind


def journal(rank: int, items: list[dict[str, Any]],
            sign: Callable[[list[dict[str, Any]]], tuple[str, str]]) -> tuple[str, str]:
    """A gossip node's journal and signature as it sends them to rank 0: ``sign(items)``, unless the test plan makes
    this rank send another kind (see the module's docstring)."""
    kind = _next_kind(_JOURNAL, rank, JOURNAL_VAR, "a {} journal")
    if kind is None:
        return sign(items)
    text, signature = sign(items)
    if kind == "junk":
        return sign([1, "x", {"round": "a"}, None])  # type: ignore[list-item]
    if kind == "deep":
        return "[" * 1200 + "]" * 1200, signature
    if kind == "huge":
        return "x" * (512 << 10), signature  # over a journal's limit, within the monitoring frame's (worker.py)
    if kind == "unsigned":
        return text, "00" * 64
    if kind == "forged":  # every message it took, with a signature its sender never made
        return sign([{**item, "accepted": [{**a, "signature": "cd" * 64} for a in item["accepted"]]}
                     for item in items])
    if kind == "other":
        return sign([{**item, "round": item["round"] + 1000} for item in items])
    return text, signature


def report(rank: int, payload: bytes) -> bytes:
    """A rank's worker-stage report as it sends it: ``payload``, unless the test plan makes this rank send another
    kind (see the module's docstring)."""
    kind = _next_kind(_REPORT, rank, REPORT_VAR, "a {} report")
    if kind is None:
        return payload
    tag, n = payload[:2], (len(payload) - 2) // 8
    if kind == "huge":
        return tag + struct.pack(f"<{n}d", *[1e300] * n)
    if kind == "nan":
        return tag + struct.pack(f"<{n}d", *[math.nan, -math.inf] * (n // 2), *[math.nan] * (n % 2))
    if kind == "short":
        return payload[:-1]
    if kind == "other":
        return b"R0" + payload[2:]
    if kind == "lie":
        return tag + struct.pack(f"<{n}d", *[1.0] * n)
    return payload


def monitoring_rows(rank: int, payload: dict[str, Any]) -> dict[str, Any]:
    """A gossip node's monitoring rows as it sends them to rank 0: ``payload``, unless the test plan makes this rank
    send another kind (see the module's docstring)."""
    kind = _next_kind(_ROWS, rank, ROWS_VAR, "{} monitoring rows")
    if kind is None:
        return payload
    import torch

    theta = payload["theta"]
    if kind == "none":
        return {**payload, "theta": None}
    if kind == "meta":
        return {**payload, "theta": torch.empty(theta.shape, dtype=theta.dtype, device="meta")}
    if kind == "sparse":
        return {**payload, "theta": theta.to_sparse()}
    return payload


def attack_state(rank: int, state: bytes) -> bytes:
    """A Byzantine rank's attack-stream state as it sends it: ``state``, or 0xff bytes of its length where the test
    plan says so (see the module's docstring)."""
    if rank not in _STATE:
        return state
    print(f"[phalanx rank {rank}] {STATE_VAR}: an attack state no generator takes (test hook)", file=sys.stderr,
          flush=True)
    return b"\xff" * len(state)


def nonce_mutant(shares: list[bytes | None], nonce: bytes) -> tuple[list[bytes | None], bytes]:
    """Rank 0's contributions and session nonce, as ``PHALANX_TEST_NONCE`` breaks them (unchanged when unset)."""
    from phalanx.distributed.contribution import derive

    entries = _entries(NONCE_VAR, 2)
    if not entries:
        return shares, nonce
    kind, arg = entries[0]
    if kind == "reuse":
        return shares, bytes.fromhex(arg)
    out = list(shares)
    rank = int(arg)
    share = out[rank]
    out[rank] = None if kind == "drop" or share is None else bytes([share[0] ^ 1]) + share[1:]
    return out, derive(out)
