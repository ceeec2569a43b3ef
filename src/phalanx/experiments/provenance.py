"""Provenance of a run directory: the chain of training sessions that wrote its checkpoint, each signed when the run
has a ``sign_key``.

**Why.** A signature over a run directory's files (:mod:`phalanx.signing`) says that whoever holds the key vouched
for these bytes. It says nothing of where they came from: a run planted in the directory (another seed's finished
run, made to look unfinished) and *resumed* by a run with a ``sign_key`` would be signed as if this installation had
trained it. So a run is signed only when its checkpoint's whole history was trained under the key.

**The record.** Every training session of a run (one process training it, from a fresh start or from a checkpoint,
until it stops) is a *segment*: an in-toto-style statement (:data:`FORMAT`) of

* ``run``: SHA-256 of the run's identity (its resolved configuration without the result-neutral keys: what
  ``config.json`` records), ``data``: the data set's fingerprint;
* ``segment``: its number (1, 2, …);
* ``from``: the point it started from — round, :func:`~phalanx.experiments.runfiles.tensors_digest` of the
  checkpoint's tensors, SHA-256 of the metric rows up to that round (``null`` digests: a fresh start, θ₀ from the
  seed);
* ``to``: the point it wrote last, likewise;
* ``signer``: the SHA-256 of the signing key's public PEM (``null``: no key).

With a ``sign_key`` the statement is signed at every checkpoint (:func:`phalanx.signing.sign_statement`: the
library's ECDSA signature in a Sigstore bundle, no scheme of ours). The chain — every earlier segment unchanged, and
the current one — is stored in the checkpoint's own metadata (key :data:`KEY`), so it is written in the same atomic
rename as the checkpoint it describes: no state after a kill has a checkpoint without its record, or the reverse.

**What is checked.**

* Every resume: the chain must name this run (``run``), be contiguous (each segment starts where the one before
  ended), and end at the checkpoint being loaded (its round, the digest of its tensors, the digest of the rows up to
  it) — or the checkpoint is refused (:class:`ProvenanceError`). Without a key this is a consistency check only: an
  attacker who can write the directory can rewrite the unsigned record too (docs/security.md).
* A resume under ``sign_key``: in addition every segment must be signed by that key and the first must start fresh;
  else the run is refused in one line — delete it, or resume it without ``sign_key`` (then it is not signed).
* ``phalanx verify`` (:func:`inspect`): the files against the whole-directory signature, then the chain against the
  key, the recorded ``config.json`` and the checkpoint and rows on disk; it states which rounds were trained under
  the key, by how many sessions, and which were not (:meth:`Provenance.lines`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx import __version__, signing
from phalanx.errors import PhalanxError
from phalanx.experiments import runfiles, store
from phalanx.experiments.schema import RESULT_NEUTRAL_KEYS

FORMAT = "phalanx/segment/v1"
"""The ``type`` of a segment statement."""
KEY = "provenance"
"""The checkpoint metadata key that holds the chain."""
MAX_SEGMENTS = 1024
"""The most training sessions a chain may record (a run resumed a thousand times is refused a new session)."""
MAX_ENTRY_BYTES = 16 << 10
"""The largest statement or signature bundle of one segment (an honest one: about 0.5 and 1.4 kB)."""


class ProvenanceError(PhalanxError, RuntimeError):
    """A run directory's checkpoint cannot be trusted to resume (or a signature to vouch for it): its provenance
    record is missing, names another run, does not match the checkpoint, or was not signed by the key. One line:
    the run directory, what is wrong, what to do. Attributes ``run_dir``, ``problem``, ``hint``."""

    def __init__(self, run_dir: str, problem: str, hint: str) -> None:
        self.run_dir = run_dir
        self.problem = problem
        self.hint = hint
        super().__init__(f"{run_dir}: {problem} — {hint}")


@dataclass(frozen=True)
class Point:
    """A state of a run: after ``round`` rounds, its checkpoint's tensors and metric rows (digests; ``None`` for
    both at a fresh start)."""

    round: int
    tensors: str | None = None
    rows: str | None = None

    @property
    def fresh(self) -> bool:
        return self.round == 0 and self.tensors is None and self.rows is None

    def json(self) -> dict[str, Any]:
        return {"round": self.round, "tensors": self.tensors, "rows": self.rows}


FRESH = Point(0)


@dataclass(frozen=True)
class Segment:
    """One training session as its statement records it, with the statement's bytes and its bundle (if signed)."""

    index: int
    run: str
    data: str
    start: Point
    end: Point
    signer: str | None
    statement: bytes
    bundle: str | None

    def entry(self) -> dict[str, Any]:
        return {"statement": self.statement.decode(), "bundle": self.bundle}

    @property
    def rounds(self) -> str:
        return f"{self.start.round}–{self.end.round}"


def run_digest(identity: dict[str, Any]) -> str:
    """SHA-256 of a run's identity (result-neutral keys left out, canonical JSON): what a segment's ``run`` holds."""
    kept = {k: v for k, v in identity.items() if k not in RESULT_NEUTRAL_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def rows_digest(payload: bytes) -> str | None:
    """SHA-256 of the metric rows as ``metrics.jsonl`` holds them (``None`` for no rows)."""
    return hashlib.sha256(payload).hexdigest() if payload else None


def _statement(seg: dict[str, Any]) -> bytes:
    return json.dumps(seg, sort_keys=True, separators=(",", ":")).encode()


def _point(path: Path, raw: Any) -> Point:
    if (not isinstance(raw, dict) or set(raw) != {"round", "tensors", "rows"} or not isinstance(raw["round"], int)
            or isinstance(raw["round"], bool) or raw["round"] < 0
            or not all(v is None or (isinstance(v, str) and len(v) == 64) for v in (raw["tensors"], raw["rows"]))):
        raise runfiles.damaged(path, "its provenance record has a malformed point")
    return Point(raw["round"], raw["tensors"], raw["rows"])


def _segment(path: Path, raw: Any) -> Segment:
    if not isinstance(raw, dict) or set(raw) != {"statement", "bundle"}:
        raise runfiles.damaged(path, "its provenance record has a malformed entry")
    text, bundle = raw["statement"], raw["bundle"]
    if not isinstance(text, str) or not (bundle is None or isinstance(bundle, str)):
        raise runfiles.damaged(path, "its provenance record has a malformed entry")
    if len(text) > MAX_ENTRY_BYTES or (bundle is not None and len(bundle) > MAX_ENTRY_BYTES):
        raise runfiles.damaged(path, f"its provenance record has an entry over {MAX_ENTRY_BYTES:,} bytes")
    statement = text.encode()
    seg = runfiles.loads(path, statement)
    fields = {"type", "run", "data", "segment", "from", "to", "signer", "phalanx"}
    if not isinstance(seg, dict) or set(seg) != fields or seg["type"] != FORMAT:
        raise runfiles.damaged(path, f"its provenance record has an entry that is not a {FORMAT} statement")
    if (not isinstance(seg["segment"], int) or isinstance(seg["segment"], bool) or not isinstance(seg["run"], str)
            or not isinstance(seg["data"], str) or not (seg["signer"] is None or isinstance(seg["signer"], str))):
        raise runfiles.damaged(path, "its provenance record has a malformed statement")
    return Segment(seg["segment"], seg["run"], seg["data"], _point(path, seg["from"]), _point(path, seg["to"]),
                   seg["signer"], statement, bundle)


def read_chain(path: Path, metadata: dict[str, str]) -> list[Segment] | None:
    """The chain a checkpoint's metadata holds (``None``: none, as in checkpoints written before it was recorded); a
    :func:`~phalanx.experiments.runfiles.damaged` error naming ``path`` if it is malformed."""
    text = metadata.get(KEY)
    if text is None:
        return None
    entries = runfiles.loads(path, text.encode())
    if not isinstance(entries, list) or not entries or len(entries) > MAX_SEGMENTS:
        raise runfiles.damaged(path, f"its provenance record is not a list of 1 to {MAX_SEGMENTS} segments")
    return [_segment(path, e) for e in entries]


def structure(chain: list[Segment], run: str) -> str | None:
    """What is wrong with a chain's structure for the run ``run`` (see the module's docstring), or ``None``."""
    for i, seg in enumerate(chain, 1):
        if seg.run != run:
            return (f"its provenance names another configuration (segment {i}: run {seg.run[:12]}…, this run's is "
                    f"{run[:12]}…)")
        if seg.index != i:
            return f"its provenance record numbers segment {i} as {seg.index} (a segment removed or reordered)"
        if seg.end.round < seg.start.round:
            return f"its provenance record's segment {i} ends (round {seg.end.round}) before it starts"
        if i > 1 and seg.start != chain[i - 2].end:
            return (f"its provenance record is broken between segments {i - 1} and {i} (segment {i} did not start "
                    f"where segment {i - 1} ended)")
    return None


def data_mismatch(chain: list[Segment], data: str) -> str | None:
    """What is wrong with ``chain`` against the data set ``data`` (the SHA-256 fingerprint a session trains on, or the
    manifest records), or ``None``: every session trained on it. A resume on another data set (files changed under
    ``data_root``, another cache) would extend a record that says nothing about which data — review finding 11."""
    for seg in chain:
        if seg.data != data:
            return (f"its session {seg.index} trained on the data set of fingerprint {seg.data[:12]}…, not "
                    f"{data[:12] or '(none)'}…")
    return None


def _end_mismatch(end: Point, at: Point) -> str | None:
    if end == at:
        return None
    parts = [what for what, a, b in (("round", end.round, at.round), ("tensors", end.tensors, at.tensors),
                                     ("metric rows", end.rows, at.rows)) if a != b]
    return f"its {', '.join(parts)} differ from what its provenance record says the last session wrote"


def status(seg: Segment, public_key: bytes) -> str:
    """``signed`` (by ``public_key``), ``unsigned``, or what is wrong with its signature, in words."""
    if seg.bundle is None:
        return "unsigned"
    if seg.signer != signing.fingerprint(public_key):
        return "signed by another key"
    return signing.verify_statement(seg.statement, seg.bundle, public_key) or "signed"


class Session:
    """The current training session of a run directory: the chain before it, where it started, and how it signs
    (:meth:`record` gives the metadata of each checkpoint it writes)."""

    def __init__(self, run: str, data: str, chain: list[Segment], start: Point, key: str | None,
                 public_key: bytes | None) -> None:
        self.run, self.data, self.chain, self.start = run, data, chain, start
        self.key, self.public_key = key, public_key
        self.signer = None if public_key is None else signing.fingerprint(public_key)

    def record(self, round_: int, tensors: str, rows: str | None) -> str:
        """The chain with this session's segment ending at ``(round_, tensors, rows)`` (signed with the key, if any),
        as the checkpoint metadata value."""
        seg = {"type": FORMAT, "run": self.run, "data": self.data, "segment": len(self.chain) + 1,
               "from": self.start.json(), "to": Point(round_, tensors, rows).json(), "signer": self.signer,
               "phalanx": __version__}
        statement = _statement(seg)
        bundle = None if self.key is None else signing.sign_statement(statement, self.key)
        entries = [s.entry() for s in self.chain] + [{"statement": statement.decode(), "bundle": bundle}]
        return json.dumps(entries, separators=(",", ":"))


def open_session(run_dir: Path, identity: dict[str, Any], data: str, chain: list[Segment] | None,
                 at: Point | None, key: str | None) -> Session:
    """The session that trains ``run_dir`` from ``at`` (the loaded checkpoint's point and ``chain`` its record;
    ``None``: a fresh start), after the checks of the module's docstring; :class:`ProvenanceError` if they fail."""
    run = run_digest(identity)
    public = None if key is None else signing.public_key_of(key)
    if at is None:
        return Session(run, data, [], FRESH, key, public)
    ckpt = run_dir / "checkpoint.safetensors"
    delete = f"delete {run_dir} to train it again from round 0"
    if chain is not None:
        problem = structure(chain, run) or _end_mismatch(chain[-1].end, at) or data_mismatch(chain, data)
        if problem is not None and (key is not None or not store.forced()):
            raise ProvenanceError(str(ckpt), f"{problem}: it is not a checkpoint this run's sessions wrote", delete)
        if problem is not None:  # forced, unsigned: go on from it with no record of what came before
            chain = None
    if chain is not None:
        if len(chain) >= MAX_SEGMENTS:
            raise ProvenanceError(str(run_dir), f"trained in {len(chain)} sessions already, the most a provenance "
                                  "record holds", delete)
    if key is not None and public is not None:
        why = _unproven(chain, public)
        if why is not None:
            raise ProvenanceError(str(run_dir), f"not resumed under sign_key: {why}; a signature would vouch for "
                                  "rounds not proven to be trained under this key",
                                  f"{delete} under the key, or resume it without sign_key (it is then not signed)")
    return Session(run, data, chain or [], at, key, public)


def require_resumable(run_dir: Path, chain: list[Segment], public_key: Path) -> None:
    """Before an unfinished run resumes under ``verify_key`` (the PEM public key ``public_key``): every round of the
    checkpoint it resumes from was trained under that key (``chain``: the record :func:`open_session` checked against
    the checkpoint and rows on disk), else :class:`ProvenanceError`. Without it, anyone who can write the directory
    makes a signed finished run look unfinished (``DONE`` and the signature deleted, an unsigned record rewritten
    consistently) and its forged rows are "resumed" and reported."""
    why = _unproven(chain or None, runfiles.read_bounded(public_key, 64 << 10, follow=True))
    if why is not None:
        raise ProvenanceError(str(run_dir), f"not resumed under verify_key: {why}; its checkpoint and rows are not "
                              "proven to be trained under the key", f"delete {run_dir} to train it again from "
                              "round 0 (under sign_key), or leave out verify_key to resume it unverified")


def _unproven(chain: list[Segment] | None, public: bytes) -> str | None:
    """Why ``chain`` does not prove that every round was trained under ``public``'s key, or ``None``."""
    if chain is None:
        return "its checkpoint carries no provenance record (written before Phalanx recorded provenance, or planted)"
    if not chain[0].start.fresh:
        return f"rounds 0–{chain[0].start.round} have no provenance record"
    for seg in chain:
        state = status(seg, public)
        if state != "signed":
            what = "were trained without a key" if state == "unsigned" else f"were {state}" if \
                state.startswith("signed") else f"have a signature that does not hold ({state})"
            return f"rounds {seg.rounds} (session {seg.index}) {what}"
    return None


@dataclass
class Provenance:
    """What a run directory's provenance record proves (:func:`inspect`)."""

    run_dir: Path
    chain: list[Segment] | None
    states: list[str]
    problem: str | None
    """What breaks the record as a whole (another run, a broken or mismatched chain), or None."""
    key: str | None
    """The public key's SHA-256 fingerprint the chain was checked against."""

    @property
    def proven(self) -> bool:
        """Every round of the checkpoint was trained under the key, from a fresh start, by contiguous sessions of this
        run, and the checkpoint and rows on disk are what the last one wrote."""
        return (self.problem is None and self.chain is not None and self.chain[0].start.fresh
                and all(s == "signed" for s in self.states))

    def lines(self) -> list[str]:
        """The statement ``phalanx verify`` prints: a summary, then one line per session."""
        key = f"key {self.key[:16]}…" if self.key else "the key"
        if self.chain is None:
            return ["provenance: NOT proven — " + (self.problem or "the checkpoint carries no provenance record "
                                                   "(written before Phalanx recorded provenance, or planted): "
                                                   "nothing records which sessions trained it")]
        last = self.chain[-1].end.round
        head = (f"provenance: proven — rounds 0–{last} of this run's configuration were trained under {key}, from a "
                f"fresh start, in {len(self.chain)} session(s); the checkpoint and metric rows are those the last "
                "session wrote" if self.proven else "provenance: NOT proven — " + (
                    self.problem or _unproven_text(self.chain, self.states)))
        out = [head]
        if not self.chain[0].start.fresh:
            out.append(f"  rounds 0–{self.chain[0].start.round}: no record")
        for seg, state in zip(self.chain, self.states):
            said = {"signed": f"signed by {key}", "unsigned": "not signed (trained without a key)"}.get(state, state)
            out.append(f"  session {seg.index}: rounds {seg.rounds}, {said}")
        if len({s.data for s in self.chain}) > 1:
            out.append("  note: the sessions trained on data sets of different fingerprints")
        return out


def _unproven_text(chain: list[Segment], states: list[str]) -> str:
    if not chain[0].start.fresh:
        return f"rounds 0–{chain[0].start.round} have no provenance record"
    bad = [f"{seg.rounds} ({state})" for seg, state in zip(chain, states) if state != "signed"]
    return "rounds not trained under the key: " + ", ".join(bad)


def _on_disk(run_dir: Path, identity: dict[str, Any]) -> tuple[list[Segment] | None, str | None]:
    """The chain of ``run_dir``'s checkpoint and what is wrong with it against ``identity`` and the checkpoint and
    rows on disk (read with bounded memory, no tensor loaded), or ``None``."""
    ckpt = run_dir / "checkpoint.safetensors"
    header = runfiles.checkpoint_header(ckpt)
    chain = read_chain(ckpt, header.metadata)
    if chain is None:
        return None, None
    try:
        round_ = int(header.metadata.get("round", ""))
    except ValueError:
        raise runfiles.damaged(ckpt, "its metadata has no valid round") from None
    at = Point(round_, runfiles.tensors_digest_of_file(ckpt, header), store.rows_upto(run_dir, round_)[1])
    problem = structure(chain, run_digest(identity)) or _end_mismatch(chain[-1].end, at)
    recorded = store.recorded_fingerprint(run_dir)
    if problem is None and recorded is not None:
        problem = data_mismatch(chain, recorded)
    if problem is None and store.is_finished(run_dir) and identity.get("rounds") not in (None, round_):
        problem = f"its checkpoint is of round {round_}, but the run has {identity.get('rounds')} rounds"
    if problem is None and store.is_finished(run_dir):
        problem = rows_beyond(run_dir, round_)
    return chain, problem


def rows_beyond(run_dir: Path, round_: int) -> str | None:
    """What is wrong with a finished run's metric rows after its final checkpoint's round ``round_``, or ``None``:
    the record covers the rows up to that round only, and a finished run writes none after it, so a later row (the
    one a report would take as final) was appended by hand."""
    later = [r["round"] for r in store.read_rows(run_dir) if r["round"] > round_]
    if not later:
        return None
    return (f"metrics.jsonl has {len(later)} row(s) after its checkpoint's round {round_} (round {max(later)}), "
            "which no session wrote")


def check_recorded(run_dir: Path, identity: dict[str, Any]) -> None:
    """Before a grid uses a finished run: its checkpoint's provenance record (if it has one) names the run
    ``identity`` and ends at the checkpoint and rows on disk; :class:`ProvenanceError` otherwise. Unsigned, this is a
    consistency check (docs/security.md)."""
    if store.forced() or not (Path(run_dir) / "checkpoint.safetensors").exists():
        return
    _, problem = _on_disk(Path(run_dir), identity)
    if problem is not None:
        raise ProvenanceError(str(Path(run_dir) / "checkpoint.safetensors"), f"{problem}: it is not the checkpoint "
                              "this run's sessions wrote", f"delete {run_dir} to train it again from round 0")


def inspect(run_dir: Path, public_key: Path | bytes) -> Provenance:
    """What the provenance record of the finished (or stopped) run in ``run_dir`` proves, checked against the PEM
    public key ``public_key``, its recorded ``config.json``, and its checkpoint and rows as they are on disk (read with
    bounded memory: :mod:`~phalanx.experiments.runfiles`)."""
    run_dir = Path(run_dir)
    public = (public_key if isinstance(public_key, bytes)
              else runfiles.read_bounded(Path(public_key), 64 << 10, follow=True))
    if not (run_dir / "checkpoint.safetensors").exists():
        return Provenance(run_dir, None, [], "the run has no checkpoint", signing.fingerprint(public))
    chain, problem = _on_disk(run_dir, runfiles.read_json_object(run_dir / "config.json"))
    states = [] if chain is None else [status(s, public) for s in chain]
    return Provenance(run_dir, chain, states, problem, signing.fingerprint(public))


def require(run_dir: Path, public_key: Path | bytes) -> Provenance:
    """:func:`inspect`, and :class:`ProvenanceError` unless it proves every round (before a finished run's results
    are used under ``verify_key``)."""
    found = inspect(run_dir, public_key)
    if not found.proven:
        raise ProvenanceError(str(run_dir), found.lines()[0].removeprefix("provenance: "),
                              "its files are signed, not proven to be trained under the key: delete it to train it "
                              "again under sign_key, or leave out verify_key to use it unproven")
    return found
