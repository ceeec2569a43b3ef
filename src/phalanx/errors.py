"""Typed errors raised by Phalanx.

Every error that comes from a bad parameter names the parameter, the value it got and the allowed range, so a
user sees at once what to change. Data sent by a Byzantine worker (NaN, Inf, huge values) is *not* an error: it is
an attack, and the aggregators are built to survive it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any


def _rebuild(cls: type[PhalanxError], args: tuple[Any, ...], state: dict[str, Any]) -> PhalanxError:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class PhalanxError(Exception):
    """Base class of every error Phalanx raises on purpose.

    Picklable whatever the subclass's constructor (its message and attributes are restored without calling it), so
    an error raised in a worker process of a parallel sweep reaches the parent as itself, not as a broken pool.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


SHOWN_CHARACTERS = 200
"""The most characters of a bad value a one-line error repeats: whatever a config, a flag or a peer sends, the line
that refuses it stays bounded (a 5,000-character title made a 5,063-byte line before)."""


def shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`SHOWN_CHARACTERS` with how long it was: ``'xxx…'… (5,002 characters)``."""
    text = repr(value)
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return f"{text[:SHOWN_CHARACTERS - 40]}… ({len(text):,} characters)"


class ConfigError(PhalanxError, ValueError):
    """A configuration parameter has a value outside its allowed range.

    Attributes
    ----------
    parameter: the parameter's name, as the user spells it.
    value: the value it got.
    allowed: a human-readable description of the allowed values.
    """

    def __init__(self, parameter: str, value: Any, allowed: str, hint: str | None = None) -> None:
        self.parameter = parameter
        self.value = value
        self.allowed = allowed
        self.hint = hint
        message = f"{parameter}={shown(value)} is invalid: allowed {allowed}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


class InputError(PhalanxError, ValueError):
    """The stacked input handed to an aggregator has the wrong type, rank, size or dtype.

    This is a programming error of the caller (the server builds the stacked tensor), not an attack: a Byzantine
    worker's *values* never raise it.
    """

    def __init__(self, parameter: str, value: Any, allowed: str) -> None:
        self.parameter = parameter
        self.value = value
        self.allowed = allowed
        super().__init__(f"{parameter}: got {value}, expected {allowed}")


class IntegrityError(PhalanxError, RuntimeError):
    """A file of a run directory is not the one Phalanx wrote: changed, truncated or missing since (its SHA-256 in
    ``manifest.json`` differs). ``path``: the file; ``what``: what is wrong with it, in words."""

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(
            f"{path}: {what} — it is not the file this run wrote, so it is not used; re-run that run (delete its "
            "directory), or pass --force (PHALANX_FORCE=1) to use it anyway"
        )


class WorkersLostError(PhalanxError, RuntimeError):
    """More workers were missing in a round than the configured ``f`` allows (or a collective failed).

    A checkpoint of the state at the start of the failed round was written first (when the run has a directory), so
    the same command, started again once the workers are back, resumes from it.
    """

    def __init__(
        self, round: int, missing: list[int], f: int, round_timeout: float, checkpoint: str | None,
        detail: str = "", who: str = "ranks",
    ) -> None:
        self.round = round
        self.missing = missing
        self.f = f
        self.round_timeout = round_timeout
        self.checkpoint = checkpoint
        if missing:
            ranks = ", ".join(str(r) for r in missing)
            msg = (
                f"round {round}: {len(missing)} worker(s) missing ({who} {ranks}) after waiting "
                f"round_timeout={round_timeout:g} s, more than f={f} the aggregator tolerates"
            )
        else:
            msg = f"round {round}: a rank failed or stayed silent longer than round_timeout={round_timeout:g} s"
        if detail:
            msg += f" — {detail}"
        msg += (
            f"; checkpoint written to {checkpoint}: start the same command again to resume"
            if checkpoint else "; no run directory, nothing saved"
        )
        super().__init__(msg)


class OutputError(PhalanxError, RuntimeError):
    """Phalanx could not write a file or directory it needed (permission denied, disk full, a file where a directory
    should be, ...). ``path``: what it tried to write; ``what``: the problem, in words; ``hint``: what to do.

    A run's files are written atomically: a failed write leaves the previous file (and the previous checkpoint) as it
    was, so once the cause is fixed the same command resumes.
    """

    def __init__(self, path: str, what: str, hint: str) -> None:
        self.path = path
        self.what = what
        self.hint = hint
        super().__init__(f"cannot write {path}: {what} — {hint}")

    @classmethod
    def of(cls, path: str | os.PathLike[str], exc: OSError) -> OutputError:
        """The error for ``exc``, raised while writing ``path``: its cause in words and what to do about it."""
        target = Path(path)
        code = exc.errno
        if code in (errno.EACCES, errno.EPERM, errno.EROFS):
            what = "read-only file system" if code == errno.EROFS else "permission denied"
            return cls(str(target), what, "make it writable, or write somewhere else (another --out)")
        if code in (errno.ENOSPC, errno.EDQUOT):
            what = "no space left on device" if code == errno.ENOSPC else "disk quota exceeded"
            return cls(str(target), what, "free some space, then run the same command again (a run resumes from "
                       "its last checkpoint, which is intact)")
        if code in (errno.EEXIST, errno.ENOTDIR):
            blocker = next((p for p in (target, *target.parents) if p.exists() and not p.is_dir()), target)
            return cls(str(target), f"{blocker} is a file, not a directory",
                       "choose another --out, or move that file away")
        if code == errno.ENAMETOOLONG:
            return cls(str(target), "a name is too long for the file system", "choose a shorter --out")
        what = os.strerror(code) if code is not None else (str(exc) or type(exc).__name__)
        return cls(str(target), what[:1].lower() + what[1:], "fix that, then run the same command again")
