"""Who was heard: the transcript of a keyed parameter-server run, and ``phalanx audit``, which checks it.

Rank 0 records, every round, the ranks whose vectors were aggregated — each with the SHA-256 of the payload and the
sender's Ed25519 signature over ``(run nonce, config digest, round, rank, digest)`` — the messages and connections
it rejected and why, and the ranks that were missing. ``transcript.json`` in the run directory::

    {"format": "phalanx-transcript/1", "config": <digest>, "allow_list": <SHA-256 of allow-list.json>,
     "workers": n, "f": f, "sessions": [{"nonce": <hex>, "from_round": r}, …],
     "rounds": [{"round": t, "accepted": [{"rank": r, "sha256": …, "signature": …}, …],
                 "rejected": [{"rank": r | null, "reason": …}, …], "missing": [r, …], "chain": <hex>}, …]}

A round's ``rejected`` holds what was refused since the previous round's entry (during round t, or while the server
waited before it).

Each round's ``chain`` is the SHA-256 of the previous round's chain and this round's entry, so a round cut out,
reordered or edited breaks every later link. The file is written like every result file (atomically, its digest in
the manifest), so ``phalanx sign`` covers it; the run directory also keeps a copy of the allow-list it ran with.

A *session* is one start of the job: a resumed run has a new nonce from its checkpoint's round on.

What the audit proves: that every accepted vector was signed, for that run, round and rank, by the key the
allow-list gives that rank — a server cannot claim it heard an honest worker it did not hear, nor attribute a vector
to the wrong rank. What it cannot prove: that the server *used* those vectors (it could aggregate something else)
or did not drop a worker it heard (a dropped worker looks missing). docs/security.md states the whole threat model.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.distributed.keys import ALLOW_LIST, AllowList
from phalanx.errors import ConfigError
from phalanx.experiments.store import file_digest, write_artifact
from phalanx.training.loop import Callback, Loop, RoundInfo
from phalanx.training.state import Snapshot

TRANSCRIPT = "transcript.json"
FORMAT = "phalanx-transcript/1"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")


def link(previous: str, entry: dict[str, Any]) -> str:
    """The chain value of a round: SHA-256 of the previous chain value and the round's entry (canonical JSON,
    without its own ``chain``)."""
    body = {k: v for k, v in entry.items() if k != "chain"}
    return hashlib.sha256((previous + json.dumps(body, sort_keys=True, separators=(",", ":"))).encode()).hexdigest()


class Transcript(Callback):
    """Rank 0's record of who was heard (see the module's docstring); a callback of the training loop, fed by the
    parameter server's ``on_vectors`` hook and the sealed links' accepted vectors and rejections."""

    def __init__(self, run_dir: Path, links: Any, identity: Any, config: str, workers: int, f: int,
                 due: Any) -> None:
        self.run_dir = run_dir
        self.links = links
        self.identity = identity
        self.config = config
        self.workers = workers
        self.f = f
        self.due = due
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
        rejected = [{"rank": r.rank, "reason": r.reason} for r in self.links.new_rejections()]
        entry = {"round": t, "accepted": accepted, "rejected": rejected, "missing": sorted(missing)}
        entry["chain"] = link(self.rounds[-1]["chain"] if self.rounds else "", entry)
        self.rounds.append(entry)

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        if self.due(loop.state.round):
            self.write()

    def on_abort(self, loop: Loop, snapshot: Snapshot) -> str | None:
        self.write()
        return None

    def on_finish(self, loop: Loop) -> None:
        self.write()

    def write(self) -> None:
        """Write ``transcript.json`` (atomically, recorded in the manifest)."""
        doc = {"format": FORMAT, "config": self.config, "allow_list": self.identity.allow.digest,
               "workers": self.workers, "f": self.f, "sessions": self.sessions, "rounds": self.rounds}
        write_artifact(self.run_dir, TRANSCRIPT, json.dumps(doc, indent=0).encode())


@dataclass
class AuditReport:
    """What ``phalanx audit`` found."""

    rounds: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
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
    """Check a run's transcript: every accepted sender on the allow-list, no sender twice in a round, missing ≤ f
    every round, every signature valid for its run, round, rank and digest, the rounds contiguous and chained, and
    the file the one the manifest records. Problems are collected, not raised; an unreadable transcript is a
    :class:`ConfigError`."""
    from cryptography.exceptions import InvalidSignature

    from phalanx.distributed.sealed import signed_message

    run_dir = Path(run_dir)
    path = run_dir / TRANSCRIPT
    if not path.exists():
        raise ConfigError("RUN", str(run_dir), "a run directory of a keyed parameter-server run (it has "
                          f"{TRANSCRIPT})", "runs without keys record no transcript: nothing says who was heard")
    try:
        doc = json.loads(path.read_text())
        rounds, sessions = doc["rounds"], doc["sessions"]
        f = int(doc["f"])
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
    keys = {r: allow.public_key(r) for r in allow.by_rank}
    starts = sorted((int(s["from_round"]), bytes.fromhex(s["nonce"])) for s in sessions)
    chain = ""
    expected_round = rounds[0]["round"] if rounds else 0
    for entry in rounds:
        t = entry["round"]
        report.rounds += 1
        if t != expected_round:
            problems.append(f"round {expected_round} is followed by round {t} (rounds missing or reordered)")
        expected_round = t + 1
        if entry.get("chain") != link(chain, entry):
            problems.append(f"round {t}: the chain does not match (the round or one before it was edited)")
        chain = str(entry.get("chain"))
        nonce = next((n for start, n in reversed(starts) if start <= t), None)
        seen: set[int] = set()
        for acc in entry["accepted"]:
            rank, digest, sig = acc.get("rank"), str(acc.get("sha256")), str(acc.get("signature"))
            report.accepted += 1
            if rank not in keys:
                problems.append(f"round {t}: accepted rank {rank!r}, which is not on the allow-list")
                continue
            if rank in seen:
                problems.append(f"round {t}: rank {rank} was heard twice")
            seen.add(rank)
            if not _HEX64.fullmatch(digest) or not _HEX128.fullmatch(sig) or nonce is None:
                problems.append(f"round {t}: rank {rank}'s entry has no valid digest or signature")
                continue
            try:
                keys[rank].verify(bytes.fromhex(sig), signed_message(nonce, doc["config"], t, rank,
                                                                     bytes.fromhex(digest)))
            except InvalidSignature:
                problems.append(f"round {t}: rank {rank}'s signature does not verify with its key on the allow-list")
        missing = entry.get("missing", [])
        if len(missing) > f:
            problems.append(f"round {t}: {len(missing)} ranks missing, more than f = {f}")
        if missing:
            report.rounds_with_missing += 1
            report.most_missing = max(report.most_missing, len(missing))
        for rej in entry.get("rejected", []):
            kind = _reason_kind(str(rej.get("reason")))
            report.rejected[kind] = report.rejected.get(kind, 0) + 1
    return report
