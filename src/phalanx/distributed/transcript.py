"""Who was heard: the transcript of a keyed run, and ``phalanx audit``, which checks it.

Rank 0 records, every round, the ranks whose rows it used — each with the SHA-256 of the payload and the sender's
Ed25519 signature — the messages and connections rejected and why, and the ranks that were missing.
``transcript.json`` in the run directory::

    {"format": "phalanx-transcript/2", "topology": "server" | "serverless" | "gossip", "config": <digest>,
     "allow_list": <SHA-256 of allow-list.json>, "workers": n, "f": f,
     "sessions": [{"nonce": <hex>, "from_round": r, "after": {"round": r', "rejected": [...]}?}, …],
     "rounds": [{"round": t, "accepted": [{"rank": r, "phase": p?, "sha256": …, "signature": …}, …],
                 "rejected": [{"rank": r | null, "reason": …, "at": r'?}, …], "missing": [r, …],
                 "chain": <hex>}, …]}

What a signature covers, by topology: the parameter server's
(:func:`~phalanx.distributed.sealed.signed_message`): ``(run nonce, config digest, round, rank, digest)``; the
serverless topology's (:func:`~phalanx.distributed.mesh.mesh_message`, domain ``phalanx/serverless/v1``, recipient
:data:`~phalanx.distributed.mesh.EVERYONE`): the same plus the kind and the ``phase`` (0: every rank's row, 1: a
Byzantine rank's row of a vector attack); the gossip topology's (domain ``phalanx/gossip/v1``): the same with the
recipient node. Gossip rounds hold, instead of ``accepted``, what every node reported at rank 0's gathering rounds
(:meth:`Transcript.reports`): ``"nodes": [{"node": i, "rounds": [{"round": u, "accepted": [...],
"missing": [...]}, …]}, …]``, the ``round`` of the entry being rank 0's gathering round.

A round's ``rejected`` holds what was refused since the previous round's entry (during round t, or while waiting
before it); ``at`` names the rank that refused it when that is not rank 0 (it reported it to rank 0). A session's
``after`` holds what was refused after its last round (the run stopped; with the mesh, also after it ended).
Format 1 (parameter server only: no ``topology``, no ``phase``) is still read.

Each round's ``chain`` is the SHA-256 of the previous round's chain and this round's entry, so a round cut out,
reordered or edited breaks every later link. The file is written like every result file (atomically, its digest in
the manifest), so ``phalanx sign`` covers it; the run directory also keeps a copy of the allow-list it ran with.

A *session* is one start of the job: a resumed run has a new nonce from its checkpoint's round on.

What the audit proves: that every accepted vector was signed, for that run, round, phase and rank (and, gossip,
recipient), by the key the allow-list gives that rank — rank 0 cannot claim it heard an honest worker it did not
hear, nor attribute a row to the wrong rank. What it cannot prove: that rank 0 *used* those rows (it could aggregate
something else) or did not drop a rank it heard (a dropped rank looks missing). docs/security.md states the whole
threat model.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.distributed.keys import ALLOW_LIST, AllowList
from phalanx.distributed.recording import WrittenWithCheckpoints
from phalanx.errors import ConfigError
from phalanx.experiments.store import file_digest, write_artifact
from phalanx.training.loop import Loop
from phalanx.training.state import Snapshot

TRANSCRIPT = "transcript.json"
FORMAT = "phalanx-transcript/2"
READS = ("phalanx-transcript/1", FORMAT)
TOPOLOGIES = ("server", "serverless", "gossip")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")


def link(previous: str, entry: dict[str, Any]) -> str:
    """The chain value of a round: SHA-256 of the previous chain value and the round's entry (canonical JSON,
    without its own ``chain``)."""
    body = {k: v for k, v in entry.items() if k != "chain"}
    return hashlib.sha256((previous + json.dumps(body, sort_keys=True, separators=(",", ":"))).encode()).hexdigest()


class Transcript(WrittenWithCheckpoints):
    """Rank 0's record of who was heard (see the module's docstring); a callback of the training loop, fed by the
    parameter server's ``on_vectors`` hook and the sealed links' accepted vectors and rejections (``links``: the
    :class:`~phalanx.distributed.sealed.SealedLinks`), or by a sealed mesh transport's ``on_rows`` / ``on_reports``
    (``links``: the :class:`~phalanx.distributed.mesh.Mesh`)."""

    def __init__(self, run_dir: Path, links: Any, identity: Any, config: str, workers: int, f: int,
                 due: Callable[[int], bool], topology: str = "server") -> None:
        super().__init__(due)
        self.topology = topology
        self.run_dir = run_dir
        self.links = links
        self.identity = identity
        self.config = config
        self.workers = workers
        self.f = f
        self.sessions: list[dict[str, Any]] = []
        self.rounds: list[dict[str, Any]] = []
        self.pending: dict[str, Any] | None = None

    def on_start(self, loop: Loop) -> None:
        path = self.run_dir / TRANSCRIPT
        if loop.resumed and path.exists():
            old = json.loads(path.read_text())
            self.sessions = [s for s in old["sessions"] if s["from_round"] < loop.state.round]
            self.rounds = [r for r in old["rounds"] if r["round"] < loop.state.round]
        self.sessions.append({"nonce": self.links.nonce.hex(), "from_round": loop.state.round})
        allow = self.identity.allow
        if not (self.run_dir / ALLOW_LIST).exists():
            write_artifact(self.run_dir, ALLOW_LIST, allow.path.read_bytes())

    def vectors(self, t: int, used: dict[int, bytes], missing: list[int]) -> None:
        """The parameter server's hook: round t aggregated the rows of ``used``; ``missing`` did not arrive."""
        accepted = []
        for rank in sorted(used):
            got = self.links.accepted(t, rank)
            if got is not None:
                accepted.append({"rank": rank, "sha256": got.sha256, "signature": got.signature})
            elif rank == 0:  # the server's own row: signed here, as the workers sign theirs
                digest = hashlib.sha256(used[0]).digest()
                from phalanx.distributed.sealed import signed_message

                sig = self.identity.sign(signed_message(self.links.nonce, self.config, t, 0, digest))
                accepted.append({"rank": 0, "sha256": digest.hex(), "signature": sig.hex()})
        self.rows(t, accepted, missing)

    def rows(self, t: int, accepted: list[dict[str, Any]], missing: list[int]) -> None:
        """Round t used the rows of ``accepted`` (rank, phase, SHA-256, signature); ``missing`` did not arrive."""
        self._append({"round": t, "accepted": accepted, "rejected": self._rejected(), "missing": sorted(missing)})

    def reports(self, t: int, nodes: list[dict[str, Any]]) -> None:
        """Gossip, at rank 0's gathering round t: what every node reported of its rounds since its last report."""
        self._append({"round": t, "nodes": nodes, "rejected": self._rejected()})

    def _rejected(self) -> list[dict[str, Any]]:
        return [{"rank": r.rank, "reason": r.reason, **({} if r.at is None else {"at": r.at})}
                for r in self.links.new_rejections()]

    def _append(self, entry: dict[str, Any]) -> None:
        entry["chain"] = link(self.rounds[-1]["chain"] if self.rounds else "", entry)
        self.rounds.append(entry)

    def _after(self, t: int) -> None:
        """What was rejected after the last round's entry (the run stopped, or ended): in the session's record."""
        rejected = self._rejected()
        if rejected:
            after = self.sessions[-1].setdefault("after", {"round": t, "rejected": []})
            after["round"] = t
            after["rejected"] += rejected

    def on_abort(self, loop: Loop, snapshot: Snapshot) -> str | None:
        self._after(loop.state.round)
        return super().on_abort(loop, snapshot)

    def on_finish(self, loop: Loop) -> None:
        if self.topology != "server":  # (the parameter server's workers leave by closing their uplinks, which its
            self._after(loop.state.round)  # links record as failures after the last round; the mesh says goodbye)
        super().on_finish(loop)

    def write(self) -> None:
        """Write ``transcript.json`` (atomically, recorded in the manifest)."""
        doc = {"format": FORMAT, "topology": self.topology, "config": self.config,
               "allow_list": self.identity.allow.digest, "workers": self.workers, "f": self.f,
               "sessions": self.sessions, "rounds": self.rounds}
        write_artifact(self.run_dir, TRANSCRIPT, json.dumps(doc, indent=0).encode())


@dataclass
class AuditReport:
    """What ``phalanx audit`` found."""

    rounds: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    rejected_at: dict[int, int] = field(default_factory=dict)
    """How many rejections each rank recorded (0: rank 0's own; others: what they reported to it)."""
    rounds_with_missing: int = 0
    most_missing: int = 0
    problems: list[str] = field(default_factory=list)
    allow_list: str = ""

    @property
    def ok(self) -> bool:
        """No problem found."""
        return not self.problems


def _reason_kind(reason: str) -> str:
    """A rejection's reason without its numbers and addresses (to count rejections by kind)."""
    return re.sub(r"\d+(\.\d+)*", "N", reason)[:120]


def audit(run_dir: Path, allow_list: Path | None = None) -> AuditReport:
    """Check a run's transcript: every accepted sender on the allow-list, no sender twice in a round and phase,
    missing ≤ f every round (server, serverless), every rank's row in every serverless round, every signature valid
    for its run, round, phase, rank (and gossip recipient) and digest, the rounds contiguous (gossip: increasing,
    each node's rounds reported once) and chained, and the file the one the manifest records. Problems are collected,
    not raised; an unreadable transcript is a :class:`ConfigError`."""
    run_dir = Path(run_dir)
    path = run_dir / TRANSCRIPT
    if not path.exists():
        raise ConfigError("RUN", str(run_dir), "a run directory of a keyed torchrun run (it has "
                          f"{TRANSCRIPT})", "runs without keys record no transcript: nothing says who was heard")
    try:
        doc = json.loads(path.read_text())
        rounds, sessions = doc["rounds"], doc["sessions"]
        f, workers = int(doc["f"]), int(doc["workers"])
        topology = str(doc.get("topology", "server"))
        if doc.get("format") not in READS or topology not in TOPOLOGIES:
            raise ValueError(f"format {doc.get('format')!r}, topology {topology!r}")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("file", str(path), f"a {FORMAT} document", f"unreadable ({type(exc).__name__})") from None
    report = AuditReport()
    problems = report.problems
    manifest_path = run_dir / "manifest.json"
    try:
        recorded = json.loads(manifest_path.read_text())["artifacts"][TRANSCRIPT]["sha256"]
        if recorded != file_digest(path):
            problems.append(f"{TRANSCRIPT} is not the file the manifest records (edited after the run)")
    except (OSError, ValueError, KeyError, TypeError):
        problems.append(f"the manifest does not record {TRANSCRIPT}")
    own = allow_list is None
    allow = AllowList.load(run_dir / ALLOW_LIST if own else Path(allow_list))  # type: ignore[arg-type]
    report.allow_list = f"{allow.path}" + (" (the run directory's copy)" if own else "")
    if allow.digest != doc.get("allow_list"):
        problems.append(f"the run used another allow-list (sha256 {str(doc.get('allow_list'))[:12]}…) than "
                        f"{allow.path} (sha256 {allow.digest[:12]}…)")
    check = _Checker(report, {r: allow.public_key(r) for r in allow.by_rank}, topology, str(doc["config"]),
                     sorted((int(s["from_round"]), bytes.fromhex(s["nonce"])) for s in sessions))
    chain = ""
    previous: int | None = None
    reported: dict[int, int] = {}  # gossip: the last round each node reported
    for entry in rounds:
        t = entry["round"]
        report.rounds += 1
        if topology != "gossip" and previous is not None and t != previous + 1:
            problems.append(f"round {previous + 1} is followed by round {t} (rounds missing or reordered)")
        if topology == "gossip" and previous is not None and t <= previous:
            problems.append(f"round {previous} is followed by round {t} (rounds reordered)")
        previous = t
        if entry.get("chain") != link(chain, entry):
            problems.append(f"round {t}: the chain does not match (the round or one before it was edited)")
        chain = str(entry.get("chain"))
        if topology == "gossip":
            for node_report in entry.get("nodes", []):
                node = node_report.get("node")
                for item in node_report.get("rounds", []):
                    u = item.get("round")
                    if not isinstance(u, int) or u > t or u <= reported.get(node, -1):
                        problems.append(f"round {t}: node {node!r} reports round {u!r} twice, out of order, or "
                                        "ahead of the gathering")
                        continue
                    reported[node] = u
                    check.accepted(item.get("accepted", []), u, node, f"round {u}, node {node}")
                    report.rounds_with_missing += bool(item.get("missing"))
                    report.most_missing = max(report.most_missing, len(item.get("missing", [])))
        else:
            phases = check.accepted(entry["accepted"], t, None, f"round {t}")
            if topology == "serverless" and sorted(phases.get(0, [])) != list(range(workers)):
                problems.append(f"round {t}: the rows of ranks {sorted(set(range(workers)) - set(phases.get(0, [])))}"
                                " are not recorded (a serverless round needs every rank's)")
            missing = entry.get("missing", [])
            if len(missing) > f:
                problems.append(f"round {t}: {len(missing)} ranks missing, more than f = {f}")
            if missing:
                report.rounds_with_missing += 1
                report.most_missing = max(report.most_missing, len(missing))
        check.rejected(entry.get("rejected", []))
    for session in sessions:
        check.rejected(session.get("after", {}).get("rejected", []))
    return report


class _Checker:
    """The signature and count checks of :func:`audit`, for one transcript."""

    def __init__(self, report: AuditReport, keys: dict[int, Any], topology: str, config: str,
                 starts: list[tuple[int, bytes]]) -> None:
        self.report, self.keys, self.topology, self.config, self.starts = report, keys, topology, config, starts

    def _message(self, nonce: bytes, t: int, rank: int, phase: int, to: int | None, digest: bytes) -> bytes:
        from phalanx.distributed.channel import Kind
        from phalanx.distributed.mesh import EVERYONE, mesh_message
        from phalanx.distributed.sealed import signed_message

        if self.topology == "server":
            return signed_message(nonce, self.config, t, rank, digest)
        recipient = EVERYONE if to is None else to
        return mesh_message(self.topology, nonce, self.config, Kind.ROW, phase, t, rank, recipient, digest)

    def accepted(self, accepted: list[dict[str, Any]], t: int, to: int | None, where: str) -> dict[int, list[int]]:
        """Check one round's accepted rows; the ranks heard, by phase."""
        from cryptography.exceptions import InvalidSignature

        problems = self.report.problems
        nonce = next((n for start, n in reversed(self.starts) if start <= t), None)
        heard: dict[int, list[int]] = {}
        for acc in accepted:
            rank, digest, sig = acc.get("rank"), str(acc.get("sha256")), str(acc.get("signature"))
            phase = acc.get("phase", 0)
            self.report.accepted += 1
            if rank not in self.keys:
                problems.append(f"{where}: accepted rank {rank!r}, which is not on the allow-list")
                continue
            if not isinstance(phase, int) or phase not in (0, 1):
                problems.append(f"{where}: rank {rank}'s entry has no valid phase")
                continue
            if rank in heard.get(phase, []):
                problems.append(f"{where}: rank {rank} was heard twice" + (f" (phase {phase})" if phase else ""))
            heard.setdefault(phase, []).append(rank)
            if not _HEX64.fullmatch(digest) or not _HEX128.fullmatch(sig) or nonce is None:
                problems.append(f"{where}: rank {rank}'s entry has no valid digest or signature")
                continue
            try:
                self.keys[rank].verify(bytes.fromhex(sig), self._message(nonce, t, rank, phase, to,
                                                                         bytes.fromhex(digest)))
            except InvalidSignature:
                problems.append(f"{where}: rank {rank}'s signature does not verify with its key on the allow-list")
        return heard

    def rejected(self, rejected: list[dict[str, Any]]) -> None:
        """Count rejections by kind, and by the rank that recorded them."""
        for rej in rejected:
            kind = _reason_kind(str(rej.get("reason")))
            self.report.rejected[kind] = self.report.rejected.get(kind, 0) + 1
            at = rej.get("at", 0)
            at = at if isinstance(at, int) else -1
            self.report.rejected_at[at] = self.report.rejected_at.get(at, 0) + 1
