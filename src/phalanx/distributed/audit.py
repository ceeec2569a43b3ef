"""``phalanx audit RUN``: check a keyed run's transcript (:mod:`phalanx.distributed.transcript`) against the run
directory and the allow-list, reading it line by line with bounded memory, one line per problem found (an
asynchronous run's experiment — its model and data — is first built from the directory's ``config.json``: at most
:data:`CONFIG_BYTES` bytes, its model sized on the ``meta`` device and refused above
:data:`~phalanx.distributed.async_transcript.AUDIT_DIM` parameters before anything of its size is built; a
``module:attr`` spec in it is refused, never imported). The directory's small files are read with
:func:`~phalanx.experiments.runfiles.open_regular` — no link followed, no FIFO waited on, at most their bound + 1
byte — and the transcript is sized against its bound before it is hashed or read (issue 38).

What a passing audit proves, and against whom:

- **It is rank 0's record of this run.** The last line is rank 0's Ed25519 signature of every byte before it, with the
  key the allow-list gives rank 0 (a transcript written by any other rank — its own signed rows and nothing else —
  or edited by anyone without rank 0's key, e.g. rejections erased or rounds cut, does not verify). Its header names
  the run: the config digest equals the digest of the run directory's ``config.json`` (another run's transcript
  copied in does not), n, f and the rounds are the config's, the allow-list is the one checked against; its
  sessions — each with the nonce it drew at random — are the ones the run directory's checkpoint names in its
  metadata (:data:`~phalanx.distributed.transcript.BINDING`, written by rank 0 in the checkpoint's own rename), so
  another run's transcript of the *same* config, signed by the same rank 0, copied in does not pass either.
- **Every round is accounted for.** Rounds run contiguously from 0 to the round the run directory reached (``DONE``:
  every round; else its checkpoint's round); each session starts where the previous one ended. In a server or
  serverless round the accepted ranks and the missing ranks are together every rank, each once (none deleted, none
  both); at most f are missing (serverless: none). In a gossip gathering round the nodes that reported and the
  silent ones are together every node, node 0 (rank 0 itself) reported, and each report covers exactly the rounds
  since that node's last one.
- **Its nonces are not rank 0's alone** (keyed parameter server, sealed mesh): each session line lists every
  rank's contribution to its nonce, and the nonce is SHA-256 of them
  (:func:`~phalanx.distributed.contribution.session_problem`); a session line without the list (a transcript written
  before) is read as before and counted in ``AuditReport.uncontributed``.
- **Who was heard.** Every accepted row verifies with its sender's key for this run's nonce, config, round, phase,
  rank (gossip: and recipient) and digest; every gossip journal verifies with its own node's key.
- **It is a transcript.** Every line is at most :func:`~phalanx.distributed.transcript.line_limit` bytes and no
  denser in dicts, lists, keys and strings than a writer's line (both checked before it is parsed:
  :mod:`phalanx.distributed.lines`), nests at most :data:`~phalanx.distributed.transcript.MAX_DEPTH` levels, and
  has its type's fields with their types and ranges; the file is at most
  :func:`~phalanx.distributed.transcript.size_bound` bytes for the config's rounds and n (checked before it is
  read; :data:`NO_ROUNDS_BYTES` when the config names no valid rounds). A file that breaks this is one problem line.
- **It is the record the checkpoint marked** (:mod:`phalanx.distributed.chain`): a line ends at the offset the
  checkpoint's mark names, the bytes before it hash to the mark's digest, signed by rank 0; nothing unsigned follows
  it (a run not done may end exactly there: it stopped without closing its record).
- **An asynchronous run's steps** (a keyed FedBuff or BASGD run: ``step`` lines,
  :mod:`phalanx.distributed.async_transcript`): every step's updates are signed by their own workers for their
  versions, within the staleness bound with the staleness recorded truly, each worker's versions increasing; the
  rows are the algorithm's ``assemble`` of them and the result the rule over the rows (a rule without context or
  state), recomputed from the run's ``config.json``.

What it cannot prove: that rank 0 aggregated the rows it names (rank 0 runs the rule), that it did not drop a row
it heard (a dropped rank looks missing), or that a gossip node's journal is complete (it is the node's own word).
docs/security.md states the threat model and the test behind each claim.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from phalanx.distributed.async_filters import unchecked
from phalanx.distributed.async_transcript import STEP_KEYS, ZERO_STEP_KEYS, StepCheck, experiment_of
from phalanx.distributed.chain import Chain, MarkCheck
from phalanx.distributed.channel import Kind
from phalanx.distributed.contribution import session_problem
from phalanx.distributed.journal import JOURNAL_ITEM_CHARS, canonical, read_journal
from phalanx.distributed.keys import ALLOW_LIST, AllowList
from phalanx.distributed.mesh import EVERYONE, mesh_message
from phalanx.distributed.rejections import GROUPS_PER_ROUND, KIND_CHARS, MAX_COUNT, PEER_CHARS, REASON_CHARS, SAMPLES
from phalanx.distributed.runfacts import CONFIG_BYTES as CONFIG_BYTES
from phalanx.distributed.runfacts import RunFacts, _int
from phalanx.distributed.sealed import signed_message
from phalanx.distributed.transcript import (
    DOMAIN,
    FORMAT,
    HEADER_KEYS,
    OLD_TRANSCRIPT,
    TOPOLOGIES,
    TRANSCRIPT,
    Lines,
    Unreadable,
    line_limit,
    size_bound,
)
from phalanx.errors import ConfigError, PhalanxError
from phalanx.experiments.runfiles import open_regular, problem_of, read_json

MAX_PROBLEMS = 200
"""Problems kept one line each; beyond this many, only counted."""
MAX_KINDS = 64
"""Kinds of rejection tallied by name; the others are tallied together."""
MANIFEST_BYTES = 16 << 20
NO_ROUNDS_BYTES = 4 << 30
"""The largest transcript read (hashed) when the run's ``config.json`` names no valid ``rounds`` to bound it by."""
TRACKED = 1 << 16
"""(round, recording rank) pairs whose groups the audit counts at most (a hostile file of many rounds: the rest are
not counted; a transcript rank 0 wrote has at most rounds × n)."""
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")
_KEYS = {
    "session": {"type", "nonce", "from_round", "contributions"},
    "rejected": {"type", "round", "at", "rank", "peer", "kind", "count", "samples"},
    "round": {"type", "round", "accepted", "missing"},
    "journal": {"type", "round", "node", "rounds", "signature"},
    "gathered": {"type", "round", "gathered", "silent"},
    "step": STEP_KEYS,
    "signature": {"type", "sha256", "signature"},
}


@dataclass
class AuditReport:
    """What ``phalanx audit`` found."""

    rounds: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    """Rejections by kind (at most :data:`MAX_KINDS` kinds by name)."""
    rejected_at: dict[int, int] = field(default_factory=dict)
    """How many rejections each rank recorded (0: rank 0's own; others: what they reported to it)."""
    rounds_with_missing: int = 0
    most_missing: int = 0
    problems: list[str] = field(default_factory=list)
    more_problems: int = 0
    """Problems found beyond the :data:`MAX_PROBLEMS` kept."""
    allow_list: str = ""
    results_unchecked: int = 0
    """Asynchronous steps whose result was not recomputed (a rule with context or state: docs/async.md)."""
    uncontributed: int = 0
    """Sessions whose line lists no contributions to its nonce — *nonce not contributed*: drawn by rank 0 alone (a
    transcript written before the ranks' share, :mod:`phalanx.distributed.contribution`)."""
    filters_unchecked: int = 0
    """Asynchronous steps of an algorithm that filters (Kardam, Zeno++) whose filter decisions were not recomputed
    (:func:`phalanx.distributed.async_filters.unchecked`)."""

    @property
    def ok(self) -> bool:
        """No problem found."""
        return not self.problems

    def problem(self, text: str) -> None:
        """Record one problem (one line)."""
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text[:400])
        else:
            self.more_problems += 1


def audit(run_dir: Path, allow_list: Path | None = None) -> AuditReport:
    """Check a run's transcript (see the module's docstring); problems are collected, one line each, not raised. A
    directory without a transcript (a run without keys) is a :class:`ConfigError`; so is an unreadable allow-list."""
    run_dir = Path(run_dir)
    path = run_dir / TRANSCRIPT
    report = AuditReport()
    if not path.exists():
        if (run_dir / OLD_TRANSCRIPT).exists():
            report.problem(f"{OLD_TRANSCRIPT} is a transcript of an older format, written before transcripts were "
                           "signed: nothing binds it to rank 0 or to this run")
            return report
        raise ConfigError("RUN", str(run_dir), f"a run directory of a keyed torchrun run (it has {TRANSCRIPT})",
                          "runs without keys record no transcript: nothing says who was heard")
    run = RunFacts.read(run_dir, report)
    recorded = _recorded_digest(run_dir, report)
    own = allow_list is None
    allow = AllowList.load(run_dir / ALLOW_LIST if own else Path(allow_list),  # type: ignore[arg-type]
                           follow=not own)  # the directory's copy is not followed; a list the user named may be
    report.allow_list = f"{allow.path}" + (" (the run directory's copy)" if own else "")
    before = len(report.problems)
    try:
        steps = experiment_of(run.identity, str(run_dir / "config.json")) if run.identity else None
    except (PhalanxError, ValueError, TypeError, OSError) as exc:
        report.problem(f"the run's config.json does not build its experiment ({str(exc)[:300]}): its asynchronous "
                       "steps cannot be recomputed")
        return report
    check = None if steps is None else StepCheck(steps)
    try:
        fh = open_regular(path)  # a link is refused, not followed; a FIFO does not block; the size is this file's
    except ConfigError as exc:
        report.problem(f"{TRANSCRIPT}: {problem_of(exc)}: not read")
        return report
    with fh:
        size = os.fstat(fh.fileno()).st_size
        n = run.workers or allow.size
        dim = 0 if check is None else check.dim
        if run.rounds is None and size > NO_ROUNDS_BYTES:  # (nothing to bound it by: a cap, never the whole file)
            report.problem(f"{TRANSCRIPT} has {size} bytes, more than the {NO_ROUNDS_BYTES} the audit reads when the "
                           "run's config.json names no valid rounds: not read")
            return report
        bound = size_bound(run.rounds or 0, n, (run.rounds or 0) + 1, run.topology or "serverless", dim)
        if run.rounds is not None and size > bound:
            report.problem(f"{TRANSCRIPT} has {size} bytes, more than the {bound} a transcript of {run.rounds} rounds "
                           f"and {n} ranks can have: not read")
            return report
        if recorded is not None and recorded != _digest(fh):  # hashed only once its size is within the bound
            report.problem(f"{TRANSCRIPT} is not the file the manifest records (edited after the run)")
            before = len(report.problems)
        fh.seek(0)
        try:
            _Audit(report, run, allow, check).read(Lines(fh))
        except Unreadable as exc:  # the file is not a transcript: that is the one thing to say about it
            del report.problems[before:]
            report.more_problems = 0
            report.problem(f"{TRANSCRIPT}: {exc}")
    return report


def _recorded_digest(run_dir: Path, report: AuditReport) -> str | None:
    """The SHA-256 the run directory's ``manifest.json`` records of the transcript (read with
    :func:`~phalanx.experiments.runfiles.read_json`: at most :data:`MANIFEST_BYTES`, a link not followed, a FIFO not
    waited on); None, with a problem, if it records none. The transcript itself is hashed later, once its size is
    known to be within the bound (a 1 TiB sparse file is refused by size, not read)."""
    try:
        recorded = read_json(run_dir / "manifest.json", MANIFEST_BYTES)["artifacts"][TRANSCRIPT]["sha256"]
    except ConfigError as exc:
        report.problem(f"the manifest cannot be read ({problem_of(exc)}): it does not record {TRANSCRIPT}")
        return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        report.problem(f"the manifest does not record {TRANSCRIPT}")
        return None
    return recorded if isinstance(recorded, str) else ""


def _digest(fh: BinaryIO) -> str:
    """SHA-256 (hex) of the open file ``fh``, streamed in blocks of 1 MiB."""
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


class _Audit:
    """The checks of :func:`audit`, fed one line at a time."""

    def __init__(self, report: AuditReport, run: RunFacts, allow: AllowList, steps: StepCheck | None = None) -> None:
        self.report, self.run, self.allow = report, run, allow
        self.steps = steps
        self.keys = {r: allow.public_key(r) for r in allow.by_rank}
        self.digest = Chain()
        self.mark = MarkCheck(run.end, self.keys.get(0))
        self.n = self.f = 0
        self.topology = self.config = ""
        self.session: tuple[int, bytes] | None = None  # the current session: where it starts, its nonce
        self.sessions = 0
        self.named: list[tuple[int, str]] = []  # every session (from_round, nonce), as the checkpoint must name them
        self.last: int | None = None  # the last round (gossip: gathering round) recorded
        self.node_lines: dict[int, int] = {}  # gossip: the nodes with a journal line at the pending gathering
        self.journal_round: int | None = None
        self.groups: dict[tuple[int, int, int], int] = {}
        self.over: set[tuple[int, int, int]] = set()
        self.signed = False

    def problem(self, text: str) -> None:
        self.report.problem(text)

    def read(self, lines: Lines) -> None:
        first = lines.next(64 << 10)
        if first is None:
            raise Unreadable("empty")
        self.header(first[1])
        self.chained(first[0])
        limit = line_limit(self.n, 0 if self.steps is None else self.steps.dim)
        while (got := lines.next(limit)) is not None:
            raw, rec = got
            kind = rec.get("type")
            if self.signed:
                raise Unreadable(f"line {lines.number} follows the signature")
            if kind not in _KEYS:
                raise Unreadable(f"line {lines.number} is of no known type ({str(kind)[:40]!r})")
            if set(rec) != _KEYS[kind] and not (kind == "step" and set(rec) == ZERO_STEP_KEYS) and not (
                    kind == "session" and set(rec) == _KEYS[kind] - {"contributions"}):
                raise Unreadable(f"line {lines.number} ({kind}) has the fields {sorted(rec)[:10]}, not "
                                 f"{sorted(_KEYS[kind])}")
            if kind == "signature":
                self.signature(rec)
                continue
            self.chained(raw)
            if kind != "session" and self.session is None:
                raise Unreadable(f"line {lines.number} ({kind}) comes before any session")
            getattr(self, "line_" + str(kind))(rec)
        self.end()

    def chained(self, raw: bytes) -> None:
        self.digest.update(raw)
        if (problem := self.mark.line(raw, self.digest)) is not None:
            self.problem(problem)

    def header(self, h: dict[str, Any]) -> None:
        """The header's fields, and that they are this run's."""
        if h.get("type") != "header" or h.get("format") != FORMAT:
            raise Unreadable(f"line 1 is not a {FORMAT} header (format {str(h.get('format'))[:40]!r})")
        keys = {"type", *HEADER_KEYS} | (set() if self.steps is None else {"dim"})
        if set(h) != keys:
            raise Unreadable(f"line 1 has the fields {sorted(h)[:12]}, not {sorted(keys)}")
        if self.steps is not None and h["dim"] != self.steps.dim:
            raise Unreadable(f"line 1 names d = {str(h['dim'])[:20]}, the run's model has d = {self.steps.dim}")
        topology, config, n, f, total = h["topology"], h["config"], h["workers"], h["f"], h["total_rounds"]
        if topology not in TOPOLOGIES or not (isinstance(config, str) and _HEX64.fullmatch(config)) or not (
                _int(n, 1, self.allow.size) and _int(f, 0, n) and _int(total, 1)):
            raise Unreadable("line 1 does not hold a topology, a config digest, n (1 … the allow-list's size), f "
                             "and the rounds")
        run = self.run
        if run.digest is not None and config != run.digest:
            self.problem(f"the transcript is of another config (digest {config[:12]}…) than the run directory's "
                         f"config.json (digest {run.digest[:12]}…): it is another run's")
        for name, mine, theirs in (("n", n, run.workers), ("f", f, run.f), ("rounds", total, run.rounds),
                                   ("topology", topology, run.topology)):
            if theirs is not None and mine != theirs:
                self.problem(f"the transcript says {name} = {mine}, the run's config.json {name} = {theirs}")
        if h["allow_list"] != self.allow.digest:
            self.problem(f"the run used another allow-list (sha256 {str(h['allow_list'])[:12]}…) than "
                         f"{self.allow.path} (sha256 {self.allow.digest[:12]}…)")
        if h["signer"] != 0:
            self.problem(f"the transcript names {str(h['signer'])[:20]!r} as its signer: a transcript is rank 0's")
        self.topology, self.config = topology, config
        self.n = run.workers if run.workers is not None and run.workers <= self.allow.size else n
        self.f = run.f if run.f is not None else f

    def signature(self, rec: dict[str, Any]) -> None:
        """The last line: rank 0's signature of everything before it."""
        from cryptography.exceptions import InvalidSignature

        self.signed = True
        digest = self.digest.digest()
        sig = rec["signature"]
        if rec["sha256"] != digest.hex():
            self.problem("the signature line names another digest than the transcript's (lines edited, added or "
                         "removed after it was signed)")
        if not (isinstance(sig, str) and _HEX128.fullmatch(sig)):
            self.problem("the transcript's signature is not an Ed25519 signature")
            return
        signers = []
        for rank, key in sorted(self.keys.items()):
            try:
                key.verify(bytes.fromhex(sig), DOMAIN + digest)
                signers.append(rank)
            except InvalidSignature:
                continue
            if rank == 0:
                return
        if signers:
            self.problem(f"the transcript is signed by rank {signers[0]}'s key, not rank 0's: it is not the "
                         "server's record")
        else:
            self.problem("the transcript's signature does not verify with rank 0's key on the allow-list (written "
                         "or edited without it)")

    def end(self) -> None:
        done = self.run.source == "it is DONE"
        problem = self.mark.ended(self.signed, done)
        if problem is not None or self.run.end_why:
            self.problem(problem or f"the run directory holds {self.run.end_why}")
        if not self.signed and not self.mark.closed_here(self.signed, done):
            self.problem("the transcript is not signed (its last line is not rank 0's signature: cut short, or not "
                         "written by rank 0)")
        reached = self.run.reached
        if reached is None:
            self.problem("the run directory does not say which round the run reached (no readable checkpoint)")
        elif self.last is None and reached > 0:
            self.problem(f"the transcript records no round; the run reached round {reached} ({self.run.source})")
        elif self.last is not None and self.last + 1 != reached:
            self.problem(f"the transcript's last round is {self.last}; the run reached round {reached} "
                         f"({self.run.source}): rounds are missing from one or the other")
        self.bound()

    def bound(self) -> None:
        """The transcript is the one the run directory's checkpoint names: its sessions, nonce for nonce (each drawn
        at random by its session) — another run's transcript of the same config, signed by the same rank 0, is
        not. A directory without a checkpoint binds nothing, and may then hold no round (``end`` says so)."""
        named, recorded = self.named, self.run.sessions
        if recorded is None:
            if self.run.binding != "no checkpoint" or self.last is not None:
                self.problem(f"the run directory holds {self.run.binding}: nothing binds the transcript to this run "
                             "(another run's transcript of the same config would pass)")
        elif recorded != named:
            def show(ss: list[tuple[int, str]]) -> str:
                return ", ".join(f"{r}:{n[:8]}…" for r, n in ss[:4]) + (" …" if len(ss) > 4 else "")
            self.problem(f"the transcript's sessions ({show(named)}) are not the ones the run directory's checkpoint "
                         f"names ({show(recorded)}): it is another run's transcript")

    # -- lines -------------------------------------------------------------------------------------------------

    def line_session(self, rec: dict[str, Any]) -> None:
        nonce, start = rec["nonce"], rec["from_round"]
        if not (isinstance(nonce, str) and _HEX64.fullmatch(nonce)) or not _int(start):
            raise Unreadable("a session line without a nonce and a round")
        expected = 0 if self.last is None else self.last + 1
        if start != expected:
            self.problem(f"a session starts at round {start}, not at round {expected} (after the rounds recorded "
                         "before it): rounds missing, repeated or reordered")
        if "contributions" not in rec:
            self.report.uncontributed += 1
        elif (problem := session_problem(rec, self.n)) is not None:
            self.problem(problem)
        self.session = (start, bytes.fromhex(nonce))
        self.sessions += 1
        self.named.append((start, nonce))
        self.node_lines, self.journal_round = {}, None

    def _next_round(self, t: Any, what: str) -> bool:
        """Whether ``t`` may be the next round (gossip: gathering round) line; a problem if not."""
        if not _int(t):
            self.problem(f"a {what} line without a valid round ({str(t)[:20]!r})")
            return False
        assert self.session is not None
        start = self.session[0]
        if self.topology != "gossip" and t != (start if self.last is None or self.last < start else self.last + 1):
            self.problem(f"round {t} follows round {self.last} (rounds missing, repeated or reordered)")
        if self.topology == "gossip" and (t < start or (self.last is not None and t <= self.last)):
            self.problem(f"gathering round {t} follows round {self.last} (reordered or repeated)")
        if self.run.rounds is not None and t >= self.run.rounds:
            self.problem(f"round {t} is beyond the run's {self.run.rounds} rounds")
        return True

    def line_step(self, rec: dict[str, Any]) -> None:
        t = rec["round"]
        if self.steps is None:
            raise Unreadable("a step line in the transcript of a run that is not asynchronous")
        if not self._next_round(t, "step"):
            return
        self.last = t
        self.report.rounds += 1
        assert self.session is not None
        for text in self.steps.check(rec, t, self.session[1], self.config, self.keys, self.session[0]):
            self.problem(text)
        if isinstance(rec["updates"], list):
            self.report.accepted += len(rec["updates"])
        self.report.results_unchecked += not self.steps.recomputes
        self.report.filters_unchecked += unchecked(self.steps.algo)

    def line_round(self, rec: dict[str, Any]) -> None:
        t = rec["round"]
        if self.topology == "gossip":
            raise Unreadable("a round line in a gossip transcript")
        if self.steps is not None:
            raise Unreadable("a round line in the transcript of an asynchronous run (its steps are step lines)")
        if not self._next_round(t, "round"):
            return
        self.last = t
        self.report.rounds += 1
        accepted, missing = rec["accepted"], rec["missing"]
        if not (isinstance(accepted, list) and len(accepted) <= 2 * self.n and isinstance(missing, list)
                and len(missing) <= self.n and all(_int(k, 0, self.n - 1) for k in missing)
                and missing == sorted(set(missing))):
            self.problem(f"round {t}: 'accepted' or 'missing' is not a list of ranks of the job")
            return
        heard = self.accepted(accepted, t, f"round {t}")
        zero = set(heard.get(0, []))
        both = sorted(zero & set(missing))
        if both:
            self.problem(f"round {t}: ranks {both} are both accepted and missing")
        neither = sorted(set(range(self.n)) - zero - set(missing))
        if neither:
            self.problem(f"round {t}: ranks {neither} are neither accepted nor missing")
        if len(missing) > self.f:
            self.problem(f"round {t}: {len(missing)} ranks missing, more than f = {self.f}")
        if self.topology == "serverless" and missing:
            self.problem(f"round {t}: ranks {missing} missing, but a serverless round needs every rank's row")
        if missing:
            self.report.rounds_with_missing += 1
            self.report.most_missing = max(self.report.most_missing, len(missing))

    def line_journal(self, rec: dict[str, Any]) -> None:
        g, node = rec["round"], rec["node"]
        if self.topology != "gossip":
            raise Unreadable("a journal line in a transcript that is not gossip")
        if not _int(g) or not _int(node, 0, self.n - 1):
            self.problem(f"a journal line without a valid round and node ({str(g)[:20]!r}, {str(node)[:20]!r})")
            return
        if self.journal_round is None:
            if not self._next_round(g, "journal"):
                return
            self.journal_round = g
        elif g != self.journal_round:
            self.problem(f"node {node}'s journal of round {g} is among those of round {self.journal_round}")
            return
        if node in self.node_lines:
            self.problem(f"round {g}: node {node} reported twice")
            return
        self.node_lines[node] = g
        assert self.session is not None
        start, nonce = self.session
        since = max(start - 1, -1 if self.last is None else self.last)
        text = canonical(rec["rounds"])
        if g - since > len(text) // JOURNAL_ITEM_CHARS:  # before a list of the rounds it must cover is built
            self.problem(f"round {g}, node {node}: a journal of {len(text)} characters cannot cover the {g - since} "
                         f"rounds since round {since}")
            return
        expected = list(range(since + 1, g + 1))
        items = read_journal(text, rec["signature"], node, self.n, expected, self.keys, nonce, self.config, g)
        if isinstance(items, str):
            self.problem(f"round {g}, node {node}: {items}")
            return
        for item in items:
            self.report.accepted += len(item["accepted"])
            self.report.rounds_with_missing += bool(item["missing"])
            self.report.most_missing = max(self.report.most_missing, len(item["missing"]))

    def line_gathered(self, rec: dict[str, Any]) -> None:
        g, gathered, silent = rec["round"], rec["gathered"], rec["silent"]
        if self.topology != "gossip":
            raise Unreadable("a gathering line in a transcript that is not gossip")
        if self.journal_round is None and not self._next_round(g, "gathering"):
            return
        if self.journal_round is not None and g != self.journal_round:
            self.problem(f"the gathering of round {g} closes the journals of round {self.journal_round}")
        ranks = (isinstance(x, list) and all(_int(k, 0, self.n - 1) for k in x) and x == sorted(set(x))
                 for x in (gathered, silent))
        if not all(ranks):
            self.problem(f"gathering round {g}: 'gathered' or 'silent' is not a sorted list of nodes")
        else:
            if gathered != sorted(self.node_lines):
                self.problem(f"gathering round {g}: it names nodes {gathered} gathered, but the journals of "
                             f"{sorted(self.node_lines)} are recorded")
            both, neither = sorted(set(gathered) & set(silent)), sorted(set(range(self.n)) - set(gathered + silent))
            if both:
                self.problem(f"gathering round {g}: nodes {both} are both gathered and silent")
            if neither:
                self.problem(f"gathering round {g}: nodes {neither} are neither gathered nor silent")
            if 0 not in gathered:
                self.problem(f"gathering round {g}: node 0's own journal (rank 0's) is not recorded")
        self.last = g if _int(g) else self.last
        self.report.rounds += 1
        self.node_lines, self.journal_round = {}, None

    def line_rejected(self, rec: dict[str, Any]) -> None:
        t, at, rank, peer, kind, count, samples = (rec[k] for k in ("round", "at", "rank", "peer", "kind", "count",
                                                                     "samples"))
        if not (_int(t) and _int(at, 0, self.n - 1) and (rank is None or _int(rank, 0, self.n - 1))
                and (peer is None or (isinstance(peer, str) and len(peer) <= PEER_CHARS))
                and isinstance(kind, str) and len(kind) <= max(KIND_CHARS, 64) and _int(count, 1, MAX_COUNT)
                and isinstance(samples, list) and len(samples) <= SAMPLES
                and all(isinstance(s, str) and len(s) <= REASON_CHARS for s in samples)):
            self.problem("a rejection group whose fields are not those of one (round, recording rank, rank or "
                         "peer, kind, count, samples)")
            return
        key = (self.sessions, t, at)
        if key in self.groups or len(self.groups) < TRACKED:
            self.groups[key] = self.groups.get(key, 0) + 1
        if self.groups.get(key, 0) > GROUPS_PER_ROUND + 2 and key not in self.over:
            self.over.add(key)
            self.problem(f"round {t}: rank {at} recorded more than the {GROUPS_PER_ROUND + 2} groups of rejections "
                         "a transcript holds per round")
        tally = self.report.rejected
        name = kind if kind in tally or len(tally) < MAX_KINDS else "(other kinds)"
        tally[name] = tally.get(name, 0) + count
        self.report.rejected_at[at] = self.report.rejected_at.get(at, 0) + count

    # -- rows ----------------------------------------------------------------------------------------------------

    def _message(self, nonce: bytes, t: int, rank: int, phase: int, digest: bytes) -> bytes:
        if self.topology == "server":
            return signed_message(nonce, self.config, t, rank, digest)
        return mesh_message(self.topology, nonce, self.config, Kind.ROW, phase, t, rank, EVERYONE, digest)

    def accepted(self, accepted: list[Any], t: int, where: str) -> dict[int, list[int]]:
        """Check one round's accepted rows; the ranks heard, by phase."""
        from cryptography.exceptions import InvalidSignature

        assert self.session is not None
        nonce = self.session[1]
        heard: dict[int, list[int]] = {}
        for acc in accepted:
            self.report.accepted += 1
            if not isinstance(acc, dict) or set(acc) != {"rank", "phase", "sha256", "signature"}:
                self.problem(f"{where}: an accepted entry is not {{rank, phase, sha256, signature}}")
                continue
            rank, phase, digest, sig = acc["rank"], acc["phase"], acc["sha256"], acc["signature"]
            if not _int(rank, 0, self.n - 1) or rank not in self.keys:
                self.problem(f"{where}: accepted rank {str(rank)[:20]!r}, which is not on the allow-list")
                continue
            if not _int(phase, 0, 0 if self.topology == "server" else 1):  # an int, not 0.0 (it would pass `in`)
                self.problem(f"{where}: rank {rank}'s entry has no valid phase")
                continue
            if rank in heard.get(phase, []):
                self.problem(f"{where}: rank {rank} was heard twice" + (f" (phase {phase})" if phase else ""))
            heard.setdefault(phase, []).append(rank)
            if not (isinstance(digest, str) and _HEX64.fullmatch(digest) and isinstance(sig, str)
                    and _HEX128.fullmatch(sig)):
                self.problem(f"{where}: rank {rank}'s entry has no valid digest or signature")
                continue
            try:
                self.keys[rank].verify(bytes.fromhex(sig), self._message(nonce, t, rank, phase, bytes.fromhex(digest)))
            except InvalidSignature:
                self.problem(f"{where}: rank {rank}'s signature does not verify with its key on the allow-list")
        return heard
