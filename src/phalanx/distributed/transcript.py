"""Who was heard: rank 0's transcript of a keyed run — bounded, signed by rank 0's key and bound to the run — which
``phalanx audit`` (:mod:`phalanx.distributed.audit`) checks.

``transcript.jsonl`` in the run directory holds one JSON object per line (canonical: sorted keys, no spaces, ASCII),
each with a ``type``::

    header     {"type": "header", "format": "phalanx-transcript/3", "topology": "server" | "serverless" | "gossip",
                "config": <the config digest>, "allow_list": <SHA-256 of allow-list.json>, "workers": n, "f": f,
                "total_rounds": R, "signer": 0}
    session    {"type": "session", "nonce": <hex 64>, "from_round": r,                     each start of the job
                "contributions": [<hex 64> | null, …]}       (every rank's share: contribution.py)
    rejected   {"type": "rejected", "round": r, "at": a, "rank": j | null, "peer": host | null, "kind": …,
                "count": c, "samples": [reason, …]}                 a group of rejections (rejections.py)
    round      {"type": "round", "round": t, "accepted": [{"rank", "phase", "sha256", "signature"}, …],
                "missing": [j, …]}                                  server, serverless: every round
    journal    {"type": "journal", "round": g, "node": i, "rounds": [item, …], "signature": <hex 128>}
    gathered   {"type": "gathered", "round": g, "gathered": [i, …], "silent": [k, …]}
                                                                    gossip: every gathering round g (journal.py)
    step       {"type": "step", "round": t, "updates": [{"rank", "version", "staleness", "sha256", "signature",
                "body"}, …], "rows": [<hex 64>, …], "result": <hex 64>}
                                                                    asynchronous server: every step (its header
                                                                    also holds "dim": d; async_transcript.py)
    signature  {"type": "signature", "sha256": <hex 64>, "signature": <hex 128>}        the last line

A ``round`` names the ranks whose rows the round used (``accepted``, with each row's SHA-256 and its sender's Ed25519
signature: :func:`~phalanx.distributed.sealed.signed_message`, domain ``phalanx/vector/v1``, or
:func:`~phalanx.distributed.mesh.mesh_message`, ``phalanx/serverless/v1`` with ``phase`` 0 for every rank's row and 1
for a Byzantine rank's attack row; in a run whose worker stages report, the SHA-256 is of the signed body — the
report enclosed ahead of the vector, :mod:`phalanx.distributed.sealed`) and the ranks whose row it did not use
(``missing``: silent, late, or refused) — together every rank of the job, each once. A gossip gathering round holds
every node's *journal* since its last report, signed by that node (:mod:`phalanx.distributed.journal`), and names
the nodes whose journal did not come or was refused (``silent``). The ``rejected`` groups before a round are what was
refused since the previous one; those after a session's last round, what was refused until it ended.

**Signature.** The last line is rank 0's Ed25519 signature (the key of the job's allow-list, ``cryptography``) of
``DOMAIN ‖ SHA-256(every byte before it)``; the header binds the file to the run: the config digest (which the audit
recomputes from the run directory's ``config.json``), n, f, the rounds, the allow-list's digest, and each session's
nonce (what every row's signature covers) with every rank's contribution to it (rank order, null: absent;
:mod:`phalanx.distributed.contribution`), from which the audit recomputes it; a session line without them (a
transcript written before) is read as before. A transcript written or
edited without rank 0's key does not verify.
The file is written append-only, each record when it is made, and each checkpoint's metadata holds rank 0's signed
mark of where it stood (:mod:`phalanx.distributed.chain`: a resume cuts back to it, the audit checks the file passes
through it). The last line is written when the run stops or ends; a run killed between two checkpoints leaves an
unsigned tail after its checkpoint's mark, which its resume cuts.

**Size.** A round line holds at most 2n accepted entries and n missing ranks; a journal at most
:func:`~phalanx.distributed.journal.journal_limit` bytes; rejections are counted by group, at most
``GROUPS_PER_ROUND + 2`` groups per round and recording rank (:mod:`phalanx.distributed.rejections`). So the file
is at most :func:`size_bound` bytes — O(rounds × n), whatever an attacker sends — and no line is longer than
:func:`line_limit`, which is how the audit reads it: line by line, each line's length checked before it is parsed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import Tensor

from phalanx.distributed.async_transcript import MAX_DIM, STEP_FIELDS, ZERO_KEYS, step_bytes, step_entry
from phalanx.distributed.binding import BINDING, checkpoint_end, checkpoint_metadata
from phalanx.distributed.chain import END, Appender, Chain, mark_json, verify_mark
from phalanx.distributed.contribution import SHARE_BYTES, as_json
from phalanx.distributed.journal import journal_limit, read_journal, sign_journal
from phalanx.distributed.keys import ALLOW_LIST
from phalanx.distributed.lines import CHUNK as CHUNK
from phalanx.distributed.lines import MAX_DEPTH as MAX_DEPTH
from phalanx.distributed.lines import Lines, Unreadable
from phalanx.distributed.recording import WrittenWithCheckpoints
from phalanx.distributed.rejections import GROUP_BYTES, GROUPS_PER_ROUND
from phalanx.experiments.store import write_artifact
from phalanx.files import open_regular
from phalanx.training.loop import Loop, RoundInfo
from phalanx.training.state import Snapshot

TRANSCRIPT = "transcript.jsonl"
FORMAT = "phalanx-transcript/3"
OLD_TRANSCRIPT = "transcript.json"
"""Formats 1 and 2 (before transcripts were signed): read by nothing any more; the audit says what it is."""
TOPOLOGIES = ("server", "serverless", "gossip")
DOMAIN = b"phalanx/transcript/v3\x00"
HEADER_KEYS = ("format", "topology", "config", "allow_list", "workers", "f", "total_rounds", "signer")
ENTRY_BYTES = 330
"""The most bytes one accepted entry of a round takes."""


def line_limit(workers: int, dim: int = 0) -> int:
    """The longest line a transcript of ``workers`` ranks can have (a journal line is the longest kind; with
    ``dim`` > 0, an asynchronous run's step line may be longer:
    :func:`~phalanx.distributed.async_transcript.step_bytes`)."""
    return max(journal_limit(workers, 1 << 30) + (64 << 10) + 1024 * workers, step_bytes(workers, dim) if dim else 0)


def _round_bytes(workers: int) -> int:
    return 256 + 2 * workers * ENTRY_BYTES + 12 * workers


def size_bound(total_rounds: int, workers: int, sessions: int, topology: str, dim: int = 0) -> int:
    """The most bytes a transcript of ``total_rounds`` rounds, ``workers`` ranks and ``sessions`` starts can take:
    per round a round line (gossip: every node's journal items and the gathering line) and, per recording rank
    (rank 0; every rank of a mesh), ``GROUPS_PER_ROUND + 2`` rejection groups; a session line and one extra round of
    rejections per session (with each rank's contribution to its nonce: 2 × 32 hex characters and 3 bytes a rank)."""
    recorders = 1 if topology == "server" else workers
    per_round = _round_bytes(workers) + recorders * (GROUPS_PER_ROUND + 2) * GROUP_BYTES
    if topology == "gossip":
        per_round += workers * (journal_limit(workers, 1) + 512)
    if dim:  # an asynchronous run: a step line per step
        per_round += step_bytes(workers, dim)
    return 4096 + sessions * (512 + (2 * SHARE_BYTES + 3) * workers) + (total_rounds + sessions) * per_round


def dumps(obj: Any) -> bytes:
    """One canonical line (sorted keys, no spaces, ASCII, a newline)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def _header_workers(header: dict[str, Any]) -> int:
    n = header.get("workers")
    if header.get("type") != "header" or not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 1 << 20:
        raise Unreadable("line 1 is not a transcript's header")
    return n


def header_dim(header: dict[str, Any]) -> int:
    """The d an asynchronous run's header names (0: none, a synchronous run's)."""
    d = header.get("dim", 0)
    if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= MAX_DIM:
        raise Unreadable(f"line 1 names d = {str(d)[:20]}, not 1 … {MAX_DIM}")
    return d


def unreadable(path: Path, problem: str) -> Unreadable:
    """:func:`phalanx.files.open_regular`'s refusal of a transcript (a link, not a regular file), as Unreadable."""
    return Unreadable(problem)


def load(path: Path, public_key: Any = None) -> dict[str, Any]:
    """A transcript as one document — the header's fields, ``sessions`` (each with the ``after`` rejections of its
    end), ``rounds`` (each with the ``rejected`` groups before it; gossip: ``nodes``, the journals) and
    ``signature`` — read line by line; with ``public_key`` (rank 0's), its signature is checked. :class:`Unreadable`
    when it cannot be read, is not format 3, or does not verify."""
    digest = hashlib.sha256()
    doc: dict[str, Any] = {"sessions": [], "rounds": []}
    pending: list[dict[str, Any]] = []
    with open_regular(Path(path), error=unreadable) as fh:  # (a link is refused, a FIFO not waited on)
        lines = Lines(fh)
        first = lines.next(64 << 10)
        if first is None:
            raise Unreadable("empty")
        digest.update(first[0])
        header = first[1]
        if header.get("format") != FORMAT:
            raise Unreadable(f"format {str(header.get('format'))[:40]!r}, not {FORMAT}")
        limit = line_limit(_header_workers(header), header_dim(header))
        doc.update({k: header.get(k) for k in HEADER_KEYS})
        if "dim" in header:
            doc["dim"] = header["dim"]
        nodes: list[dict[str, Any]] = []
        while (got := lines.next(limit)) is not None:
            raw, rec = got
            kind = rec.get("type")
            if kind == "signature":
                doc["signature"] = rec
                if lines.next(limit) is not None:
                    raise Unreadable(f"line {lines.number} follows the signature")
                break
            digest.update(raw)
            if kind == "session":
                if pending and doc["sessions"]:
                    _after(doc["sessions"][-1], pending)
                pending = []
                doc["sessions"].append({"nonce": rec.get("nonce"), "from_round": rec.get("from_round"),
                                        **({"contributions": rec["contributions"]} if "contributions" in rec else {})})
            elif kind == "rejected":
                pending.append({k: v for k, v in rec.items() if k != "type"})
            elif kind == "round":
                doc["rounds"].append({"round": rec.get("round"), "accepted": rec.get("accepted"),
                                      "missing": rec.get("missing"), "rejected": pending})
                pending = []
            elif kind == "step":
                doc["rounds"].append({**{k: rec.get(k) for k in STEP_FIELDS if k in rec or k not in ZERO_KEYS},
                                      "rejected": pending})
                pending = []
            elif kind == "journal":
                nodes.append({"node": rec.get("node"), "rounds": rec.get("rounds"), "signature": rec.get("signature")})
            elif kind == "gathered":
                doc["rounds"].append({"round": rec.get("round"), "nodes": nodes, "gathered": rec.get("gathered"),
                                      "silent": rec.get("silent"), "rejected": pending})
                nodes, pending = [], []
            else:
                raise Unreadable(f"line {lines.number} is of no known type ({str(kind)[:40]!r})")
    if pending and doc["sessions"]:
        _after(doc["sessions"][-1], pending)
    if public_key is not None:
        _verify(doc.get("signature"), digest.hexdigest(), public_key)
    return doc


def _after(session: dict[str, Any], groups: list[dict[str, Any]]) -> None:
    after = session.setdefault("after", {"round": groups[-1].get("round"), "rejected": []})
    after["rejected"] += groups
    after["round"] = groups[-1].get("round")


def _verify(signature: Any, sha256: str, public_key: Any) -> None:
    from cryptography.exceptions import InvalidSignature

    if not isinstance(signature, dict):
        raise Unreadable("it is not signed")
    try:
        public_key.verify(bytes.fromhex(str(signature.get("signature"))), DOMAIN + bytes.fromhex(sha256))
    except (InvalidSignature, ValueError):
        raise Unreadable("its signature does not verify with rank 0's key") from None
    if signature.get("sha256") != sha256:
        raise Unreadable("its signature line names another digest")


def entry_lines(entry: dict[str, Any]) -> list[bytes]:
    """The lines of one round's entry (:func:`load`'s form): its rejection groups, then its record (a step; a
    gathering's journals and gathering line; a round)."""
    t = entry["round"]
    out = [dumps({"type": "rejected", **g}) for g in entry.get("rejected", [])]
    if "updates" in entry:
        out.append(dumps({"type": "step", **{k: entry[k] for k in STEP_FIELDS if k in entry}}))
    elif "nodes" in entry:
        out += [dumps({"type": "journal", "round": t, **node}) for node in entry["nodes"]]
        out.append(dumps({"type": "gathered", "round": t, "gathered": entry["gathered"], "silent": entry["silent"]}))
    else:
        out.append(dumps({"type": "round", "round": t, "accepted": entry["accepted"], "missing": entry["missing"]}))
    return out


def header_line(doc: dict[str, Any]) -> bytes:
    """A transcript's first line (``doc``: the header's fields)."""
    return dumps({"type": "header", **{k: doc.get(k) for k in HEADER_KEYS}, **({"dim": doc["dim"]} if "dim" in doc
                                                                                 else {})})


def render(doc: dict[str, Any]) -> bytes:
    """The lines of a transcript document (:func:`load`'s form) before the signature line."""
    out = [header_line(doc)]
    sessions = doc["sessions"]
    for i, session in enumerate(sessions):
        out.append(session_line(session))
        end = sessions[i + 1]["from_round"] if i + 1 < len(sessions) else None
        for entry in doc["rounds"]:
            t = entry["round"]
            if isinstance(t, int) and t >= session["from_round"] and (end is None or t < end):
                out += entry_lines(entry)
        out += [dumps({"type": "rejected", **g}) for g in session.get("after", {}).get("rejected", [])]
    return b"".join(out)


def session_line(session: dict[str, Any]) -> bytes:
    """A session line (``session``: its nonce, first round and, when it has them, the contributions)."""
    return dumps({"type": "session", **{k: session[k] for k in ("nonce", "from_round", "contributions")
                                        if k in session}})


def signature_line(body: bytes, identity: Any) -> bytes:
    """The last line of a transcript whose other lines are ``body``: ``identity``'s signature of them."""
    return seal_line(hashlib.sha256(body).digest(), identity)


def seal_line(digest: bytes, identity: Any) -> bytes:
    """The last line of a transcript whose other lines hash to ``digest``: ``identity``'s signature of them."""
    return dumps({"type": "signature", "sha256": digest.hex(), "signature": identity.sign(DOMAIN + digest).hex()})


def records(path: Path) -> Iterator[dict[str, Any]]:
    """Every line of a transcript as an object (small files: tests and tools; the audit streams)."""
    with Path(path).open("rb") as fh:
        lines = Lines(fh)
        limit = 64 << 10
        while (got := lines.next(limit)) is not None:
            if got[1].get("type") == "header":
                limit = line_limit(_header_workers(got[1]), header_dim(got[1]))
            yield got[1]


class Transcript(WrittenWithCheckpoints):
    """Rank 0's record of who was heard (see the module's docstring), written append-only
    (:mod:`phalanx.distributed.chain`); a callback of the training loop, fed by the parameter server's
    ``on_vectors`` hook and the sealed links' accepted vectors and rejections (``links``: the
    :class:`~phalanx.distributed.sealed.SealedLinks`), or by a sealed mesh transport's ``on_rows`` / ``on_reports``
    (``links``: the :class:`~phalanx.distributed.mesh.Mesh`). Each record is appended when it is made; each
    checkpoint asks for the mark (:meth:`binding`); the last line is written when the run stops or ends."""

    def __init__(self, run_dir: Path, links: Any, identity: Any, config: str, workers: int, f: int,
                 due: Any, topology: str = "server", dim: int | None = None) -> None:
        super().__init__(due)
        self.topology = topology
        self.run_dir = run_dir
        self.links = links
        self.identity = identity
        self.config = config
        self.workers = workers
        self.f = f
        self.dim = dim
        """d, for an asynchronous run (its header names it; its steps are ``step`` lines); None otherwise."""
        self.sessions: list[list[Any]] = []
        """Every session of the transcript, ``[from_round, nonce]`` (at most one per start of the job)."""
        self.out: Appender | None = None
        self.loop: Any = None  # the training loop (its state's round: the round a checkpoint is of)
        self.gathered = -1  # gossip: the last gathering round of this session (from_round − 1 at its start)
        self.keys = {r: identity.allow.public_key(r) for r in identity.allow.by_rank}

    def on_start(self, loop: Loop) -> None:
        path, r = self.run_dir / TRANSCRIPT, loop.state.round
        allow = self.identity.allow
        if not (self.run_dir / ALLOW_LIST).exists():
            write_artifact(self.run_dir, ALLOW_LIST, allow.path.read_bytes())
        elif loop.resumed:
            self._same_allow_list()
        if loop.resumed and os.path.lexists(path):  # the rounds before the checkpoint, as rank 0 signed them
            self.out = self._resumed(path, r)
        else:
            header = {"format": FORMAT, "topology": self.topology, "config": self.config, "allow_list": allow.digest,
                      "workers": self.workers, "f": self.f, "total_rounds": loop.experiment.rounds, "signer": 0,
                      **({} if self.dim is None else {"dim": self.dim})}
            self.out = Appender(path, Chain(), hashlib.sha256(), 0)
            self.out.append([header_line(header)])
        self.loop = loop
        self.sessions.append([r, self.links.nonce.hex()])
        shares = getattr(self.links, "contributions", None)  # (SealedLinks' and Mesh's: always set once started)
        self.out.append([session_line({"nonce": self.links.nonce.hex(), "from_round": r,
                                       **({} if shares is None else {"contributions": as_json(shares)})})])
        self.gathered = r - 1

    def binding(self) -> dict[str, str]:
        """The checkpoint metadata that binds this transcript to the run directory (asked for by the run directory
        at each checkpoint, :attr:`~phalanx.experiments.rundir.RunDirectory.metadata`, and written in the same
        atomic rename as the checkpoint): :data:`BINDING` → the sessions, ``[[from_round, nonce], …]`` in canonical
        JSON, and :data:`~phalanx.distributed.chain.END` → the mark ``[offset, head, signature]``, where the
        transcript stands (:meth:`~phalanx.distributed.chain.Appender.mark`). Each nonce is 32 random bytes of
        that session (on the parameter server SHA-256 of every rank's fresh contribution,
        :mod:`~phalanx.distributed.contribution`; 2⁻²⁵⁶ that two runs share one), so another run's transcript — the
        same config, signed by the same rank 0 — names other sessions than the checkpoint it is copied beside, and
        the audit refuses it."""
        sessions = json.dumps(self.sessions, separators=(",", ":"))
        if self.out is None:
            return {BINDING: sessions}
        return {BINDING: sessions, END: mark_json(self.out.mark(self.identity, self.round))}

    def _same_allow_list(self) -> None:
        """On resume: refuse (one-line :class:`ConfigError` naming the file) a run directory whose ``allow-list.json``
        is not the list this job was launched with — whoever can write the directory between a crash and the resume
        must not choose the key the old transcript is checked with, nor what the audit later reads."""
        from phalanx.distributed.keys import AllowList
        from phalanx.errors import ConfigError

        copy = self.run_dir / ALLOW_LIST
        try:
            digest = AllowList.load(copy, follow=False).digest  # the directory's: a link is not followed
        except ConfigError as exc:
            digest = f"unreadable ({exc})"
        if digest != self.identity.allow.digest:
            raise ConfigError("file", str(copy), f"the allow-list this job was launched with "
                              f"({self.identity.allow.path}, sha256 {self.identity.allow.digest[:12]}…)",
                              f"the run directory's copy is sha256 {digest[:60]}; the run was started with "
                              "another list or the copy was edited — resume with the list it was started with")

    def _resumed(self, path: Path, r: int) -> Appender:
        """On resume from round r: the transcript cut back to where the checkpoint's mark says it stood, its chain
        continued — the mark checked first with rank 0's key of the allow-list this job was launched with (never the
        run directory's copy), and the kept bytes against the mark's digest, line by line, with their header this
        job's config and allow-list; else a one-line :class:`ConfigError` naming the file (rank 0 would otherwise go
        on signing what someone else wrote). A checkpoint without a mark (written by a build that rewrote the
        transcript whole) resumes as that build did, once: the old transcript verified, its rounds before r kept."""
        end, why = checkpoint_end(checkpoint_metadata(self.run_dir))
        if end is None:
            if why:
                raise self._refuse(path, r, f"the checkpoint holds {why}")
            return self._rewritten(path, r)
        offset, head, sig = end
        if not verify_mark(self.identity.allow.public_key(0), offset, head, sig):
            raise self._refuse(path, r, "the checkpoint's mark of it does not verify with rank 0's key")
        chain, whole, seen = Chain(), hashlib.sha256(), 0
        try:
            with open_regular(path, error=unreadable) as fh:  # a link planted is refused, a FIFO not waited on
                lines = Lines(fh)
                while seen < offset and (got := lines.next(64 << 10 if seen == 0 else self._limit)) is not None:
                    raw, rec = got
                    if seen == 0:
                        self._same_header(path, r, rec)
                    elif rec.get("type") == "session":
                        self.sessions.append([rec.get("from_round"), rec.get("nonce")])
                    chain.update(raw)
                    whole.update(raw)
                    seen += len(raw)
        except (Unreadable, OSError) as exc:
            raise self._refuse(path, r, str(exc)) from None
        if seen != offset or chain.digest().hex() != head:
            raise self._refuse(path, r, f"its first {offset} bytes are not the ones rank 0 marked at the checkpoint")
        return Appender(path, chain, whole, offset)

    @property
    def _limit(self) -> int:
        return line_limit(self.workers, self.dim or 0)

    def _same_header(self, path: Path, r: int, header: dict[str, Any]) -> None:
        if header.get("type") != "header" or header.get("format") != FORMAT:
            raise self._refuse(path, r, f"line 1 is not a {FORMAT} header")
        if header.get("config") != self.config or header.get("allow_list") != self.identity.allow.digest:
            raise self._refuse(path, r, "its header names another config or allow-list than this job's (another "
                               "run's record)")

    def _refuse(self, path: Path, r: int, problem: str) -> Exception:
        from phalanx.errors import ConfigError

        return ConfigError("file", str(path), "the transcript rank 0 wrote and signed for this run",
                           f"{problem}; move it away to resume without the record of the rounds before round {r} "
                           "(the audit will then say they are missing)")

    def _rewritten(self, path: Path, r: int) -> Appender:
        """A transcript of the former writer (no mark in the checkpoint): verified whole, its rounds before r kept
        and rewritten once (the refusals of rounds done again still happened: its last session's ``after``)."""
        old = self._signed_before(path, r)
        sessions = [s for s in old["sessions"] if s["from_round"] < r]
        rounds: list[dict[str, Any]] = []
        for entry in old["rounds"]:
            if entry["round"] < r:
                rounds.append(entry)
            elif sessions and entry["rejected"]:
                _after(sessions[-1], entry["rejected"])
        old.update(sessions=sessions, rounds=rounds)
        self.sessions = [[s["from_round"], s["nonce"]] for s in sessions]
        out = Appender(path, Chain(), hashlib.sha256(), 0)
        out.append(render(old).splitlines(keepends=True))
        return out

    def _signed_before(self, path: Path, r: int) -> dict[str, Any]:
        """On resume from round r: the old transcript, verified with rank 0's key of the allow-list this job was
        launched with (never the run directory's copy) and bound to this job's config and allow-list — else a
        one-line :class:`ConfigError` naming the file (rank 0 would otherwise sign what someone else wrote)."""
        def refuse(problem: str) -> Exception:
            return self._refuse(path, r, problem)

        try:
            old = load(path, self.identity.allow.public_key(0))
        except (Unreadable, OSError) as exc:
            raise refuse(str(exc)) from None
        if old["config"] != self.config or old["allow_list"] != self.identity.allow.digest:
            raise refuse("its header names another config or allow-list than this job's (another run's record)")
        return old

    def vectors(self, t: int, used: dict[int, bytes], missing: list[int]) -> None:
        """The parameter server's hook: round t aggregated the rows of ``used``; ``missing`` did not arrive."""
        from phalanx.distributed.sealed import signed_message

        accepted = []
        for rank in sorted(used):
            got = self.links.accepted(t, rank)
            if got is not None:
                accepted.append({"rank": rank, "phase": 0, "sha256": got.sha256, "signature": got.signature})
            elif rank == 0:  # the server's own row: signed here, as the workers sign theirs
                digest = hashlib.sha256(used[0]).digest()
                sig = self.identity.sign(signed_message(self.links.nonce, self.config, t, 0, digest))
                accepted.append({"rank": 0, "phase": 0, "sha256": digest.hex(), "signature": sig.hex()})
        self.rows(t, accepted, missing)

    @property
    def round(self) -> int:
        """The round a checkpoint written now is of (the rounds before it are done)."""
        return int(self.loop.state.round) if self.loop is not None else 0

    def _append(self, entry: dict[str, Any]) -> None:
        assert self.out is not None, "a transcript is appended to after on_start"
        self.out.append(entry_lines(entry), entry["round"])

    def rows(self, t: int, accepted: list[dict[str, Any]], missing: list[int]) -> None:
        """Round t used the rows of ``accepted`` (rank, phase, SHA-256, signature); ``missing`` did not arrive."""
        self._append({"round": t, "accepted": [{"phase": 0, **a} for a in accepted], "missing": sorted(missing),
                      "rejected": self.links.new_rejections()})

    def step(self, t: int, used: list[Any], rows: Tensor, result: Tensor, groups: list[dict[str, Any]],
             zero: Any = None) -> None:
        """The asynchronous server's hook: step t used the updates ``used`` (with their links' proofs), made
        ``rows`` and the rule's ``result`` over them; ``groups``: the links' refusals since the previous step;
        ``zero``: a zero step's θₜ and rejected updates (:mod:`phalanx.distributed.async_zero`)."""
        self._append({**step_entry(t, used, rows, result, zero), "rejected": groups})
    def reports(self, t: int, nodes: list[dict[str, Any]]) -> None:
        """Gossip, at rank 0's gathering round t: what every node reported since its last report — node 0's
        journal (``rounds``: signed here), the others' as they sent it (``journal``: canonical JSON, ``signature``),
        each checked before it is kept (:func:`~phalanx.distributed.journal.read_journal`); a journal that fails is
        a rejection of its node, which is then silent at this gathering."""
        expected = list(range(self.gathered + 1, t + 1))
        self.gathered = t
        nonce = self.links.nonce
        kept: list[dict[str, Any]] = []
        for report in nodes:
            node = report.get("node")
            text: Any
            sig: Any
            if node == 0:
                text, sig = sign_journal(self.identity, nonce, self.config, t, report.get("rounds", []))
            else:
                text, sig = report.get("journal"), report.get("signature")
            if not isinstance(node, int) or not 0 <= node < self.workers or any(k["node"] == node for k in kept):
                continue
            items = read_journal(text, sig, node, self.workers, expected, self.keys, nonce, self.config, t)
            if isinstance(items, str):
                self.links.reject(node, f"rank {node}'s journal of round {t} is refused: {items}")
                continue
            kept.append({"node": node, "rounds": items, "signature": sig})
        gathered = sorted(k["node"] for k in kept)
        self._append({"round": t, "nodes": kept, "gathered": gathered,
                      "silent": sorted(set(range(self.workers)) - set(gathered)),
                      "rejected": self.links.new_rejections()})

    def _after(self) -> None:
        """What was rejected after the last round's entry (the run stopped, or ended): in the session's record."""
        groups = self.links.new_rejections()
        if groups and self.out is not None:
            self.out.append([dumps({"type": "rejected", **g}) for g in groups])

    def on_abort(self, loop: Loop, snapshot: Snapshot) -> str | None:
        self._after()
        return super().on_abort(loop, snapshot)

    def on_finish(self, loop: Loop) -> None:
        if self.topology != "server":  # (the parameter server's workers leave by closing their uplinks, which its
            self._after()  # links record as failures after the last round; the mesh says goodbye)
        super().on_finish(loop)

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        """Nothing to write: the round's record was appended when it was made, and the checkpoint marks it."""

    def write(self) -> None:
        """Close the transcript: rank 0's signature of every byte as the last line, synced, recorded in the
        manifest."""
        if self.out is None:
            return
        self.out.append([seal_line(self.out.chain.digest(), self.identity)])
        self.out.sync()
        self.out.close()
        self.out = None
