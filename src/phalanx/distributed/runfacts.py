"""What a run directory itself says of its keyed run — ``config.json``'s digest, n, f, rounds and topology, how far
the run got (``DONE`` or the checkpoint's round), and what its checkpoint names of the transcript (its sessions, its
mark) — against which ``phalanx audit`` (:mod:`phalanx.distributed.audit`) compares the transcript's header. Moved out
of the audit's module unchanged (it had reached the 600-line limit)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

from phalanx.distributed.binding import checkpoint_end, checkpoint_metadata, checkpoint_round, checkpoint_sessions
from phalanx.distributed.parameter_server import config_digest
from phalanx.errors import ConfigError
from phalanx.experiments.runfiles import problem_of, read_json


class Problems(Protocol):
    """Where the facts' reader records what it cannot read (the audit's report: :class:`~phalanx.distributed.audit.
    AuditReport`; a protocol so that this module does not import the audit that imports it)."""

    def problem(self, text: str) -> None: ...

CONFIG_BYTES = 1 << 20
"""The most of ``config.json`` the audit reads."""


def _int(value: Any, low: int = 0, high: int = 1 << 62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


@dataclass
class RunFacts:
    """What the run directory itself says (``config.json``, ``DONE``, the checkpoint), against which the header is
    compared; None where it cannot be read (a problem is recorded)."""

    digest: str | None = None
    workers: int | None = None
    f: int | None = None
    rounds: int | None = None
    topology: str | None = None
    reached: int | None = None
    source: str = ""
    identity: dict[str, Any] = field(default_factory=dict)
    sessions: list[tuple[int, str]] | None = None
    """The transcript sessions the checkpoint names (:data:`~phalanx.distributed.transcript.BINDING`); None: it names
    none (or there is no checkpoint)."""
    binding: str = "no checkpoint"
    """What the checkpoint says of the sessions, when it names none that can be read (for the problem line)."""
    end: tuple[int, str, str] | None = None  # the checkpoint's mark of the transcript (chain.py); None: none
    end_why: str = ""

    @classmethod
    def read(cls, run_dir: Path, report: Problems) -> RunFacts:
        """Read ``config.json`` (at most :data:`CONFIG_BYTES`, :func:`~phalanx.experiments.runfiles.read_json`: a
        symbolic link is not followed, a FIFO or a device is refused without blocking, at most the bound + 1 byte is
        read) and how far the run got."""
        facts = cls()
        path = run_dir / "config.json"
        try:
            identity = read_json(path, CONFIG_BYTES)
            if not isinstance(identity, dict):
                raise ValueError("not a JSON object")
        except ConfigError as exc:  # runfiles.damaged: a link, not a regular file, too large, not JSON
            why: str = problem_of(exc)
        except (OSError, ValueError, RecursionError) as exc:
            why = str(exc)[:80] or type(exc).__name__
        else:
            why = ""
        if why:
            report.problem(f"the run directory's config.json cannot be read ({why}): nothing to bind the transcript "
                           "to")
            return facts
        facts.digest = config_digest(identity)
        facts.identity = identity
        facts.topology = identity.get("topology") if isinstance(identity.get("topology"), str) else None
        facts.f = identity.get("f") if _int(identity.get("f")) else None
        facts.rounds = identity.get("rounds") if _int(identity.get("rounds"), 1) else None
        facts.workers = _processes(identity)
        meta = checkpoint_metadata(run_dir)
        done = (run_dir / "DONE").exists()
        facts.reached, facts.source = (facts.rounds, "it is DONE") if done else (checkpoint_round(meta),
                                                                                 "its checkpoint")
        facts.sessions, facts.binding = checkpoint_sessions(meta)
        facts.end, facts.end_why = checkpoint_end(meta)
        return facts


def _processes(identity: dict[str, Any]) -> int | None:
    """The processes of a run of ``identity`` (a built-in algorithm's rule; a plug-in's is not imported here)."""
    from phalanx.training.algorithms.builtin import BUILT_IN

    cls = BUILT_IN.get(str(identity.get("algorithm", "dsgd")))  # (a config at its default does not name it)
    try:
        n = cls.processes(SimpleNamespace(**identity)) if cls is not None else identity.get("workers")
    except (TypeError, ValueError, AttributeError):
        return None
    return n if _int(n, 1) else None
