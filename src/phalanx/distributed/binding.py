"""What a run directory's checkpoint says of its keyed run's transcript (the review's F4): rank 0 records, in every
checkpoint's own metadata (:data:`~phalanx.distributed.transcript.BINDING`, written in the checkpoint's atomic
rename: :meth:`~phalanx.distributed.transcript.Transcript.binding`), the transcript's sessions ``[[from_round, nonce],
…]``, each nonce 32 random bytes drawn by its session; ``phalanx audit`` (:mod:`phalanx.distributed.audit`) refuses a
transcript whose sessions are not these — another run's transcript of the same config, signed by the same rank 0,
copied beside this run's checkpoint. Read with bounded memory: the metadata value at most :data:`BINDING_CHARS`."""

from __future__ import annotations

import json
import re
from pathlib import Path

from phalanx.distributed.chain import END

BINDING = "transcript_sessions"
"""The checkpoint metadata key under which rank 0 records its transcript's sessions
(:meth:`~phalanx.distributed.transcript.Transcript.binding`)."""

BINDING_CHARS = 1 << 20
"""The longest list of transcript sessions a checkpoint's metadata may hold (an honest one: about 80 bytes a
session, and a run has at most :data:`~phalanx.experiments.provenance.MAX_SEGMENTS` sessions)."""
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 62


def checkpoint_metadata(run_dir: Path) -> dict[str, str] | None:
    """The checkpoint's metadata ({}: no checkpoint; None: unreadable — a symbolic link, a FIFO or anything not a
    regular file included, refused without following it or blocking: :func:`~phalanx.experiments.runfiles.
    checkpoint_header`, whose header is read bounded and checked before its metadata is used)."""
    from phalanx.errors import ConfigError
    from phalanx.experiments.runfiles import checkpoint_header

    ckpt = run_dir / "checkpoint.safetensors"
    if not ckpt.is_symlink() and not ckpt.exists():
        return {}
    try:
        return checkpoint_header(ckpt).metadata
    except (ConfigError, OSError, ValueError):
        return None


def checkpoint_round(meta: dict[str, str] | None) -> int | None:
    if meta is None:
        return None
    if not meta:
        return 0
    try:
        value = int(meta["round"])
    except (ValueError, KeyError, TypeError):
        return None
    return value if value >= 0 else None


def checkpoint_sessions(meta: dict[str, str] | None) -> tuple[list[tuple[int, str]] | None, str]:
    """The transcript sessions a checkpoint's metadata names, or None and what it holds instead."""
    if meta is None:
        return None, "an unreadable checkpoint"
    if not meta:
        return None, "no checkpoint"
    text = meta.get(BINDING)
    if not isinstance(text, str):
        return None, "a checkpoint that names no transcript sessions"
    try:
        if len(text) > BINDING_CHARS:
            raise ValueError
        value = json.loads(text)
        sessions = [(int(r), str(n)) for r, n in value if _int(r) and isinstance(n, str) and _HEX64.fullmatch(n)]
        if len(sessions) != len(value):
            raise ValueError
    except (ValueError, TypeError, RecursionError):
        return None, "a checkpoint whose transcript sessions cannot be read"
    return sessions, ""


def checkpoint_end(meta: dict[str, str] | None) -> tuple[tuple[int, str, str] | None, str]:
    """The transcript mark a checkpoint's metadata names (:data:`~phalanx.distributed.chain.END`:
    ``[offset, head, signature]``), or None and what it holds instead ("": none — no checkpoint, or one written
    before transcripts were appended)."""
    text = (meta or {}).get(END)
    if text is None:
        return None, ""
    try:
        if not isinstance(text, str) or len(text) > 1024:
            raise ValueError
        offset, head, sig = json.loads(text)
        if not (_int(offset) and isinstance(head, str) and _HEX64.fullmatch(head) and isinstance(sig, str)
                and _HEX128.fullmatch(sig)):
            raise ValueError
    except (ValueError, TypeError, RecursionError):
        return None, "a checkpoint whose transcript end cannot be read"
    return (offset, head, sig), ""
