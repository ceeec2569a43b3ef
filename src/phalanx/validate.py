"""The one vocabulary for checking a component's parameters at construction: each check returns the value or raises
:class:`~phalanx.errors.ConfigError` naming the parameter, the value and the allowed range (``"tau=-1 is invalid:
allowed a finite number > 0"``). Used by rules, attacks, data splits, models' registries and the training objects."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from phalanx.errors import ConfigError

__all__ = ["check_choice", "check_int", "check_real", "close_matches", "suggest"]


def _describe_range(kind: str, low: float | None, low_open: bool, high: float | None, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return f"a finite {kind}" + (" " + " and ".join(parts) if parts else "")


def check_real(
    name: str, value: Any, *, low: float | None = None, low_open: bool = False, high: float | None = None,
    high_open: bool = False,
) -> float:
    """A finite real number inside an (optionally half-open) interval, returned as a float (booleans refused)."""
    allowed = _describe_range("number", low, low_open, high, high_open)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(name, value, allowed)
    try:
        v = float(value)
    except OverflowError:  # an integer beyond the float range
        raise ConfigError(name, value, allowed) from None
    if not math.isfinite(v):
        raise ConfigError(name, value, allowed)
    if low is not None and (v < low or (low_open and v == low)):
        raise ConfigError(name, value, allowed)
    if high is not None and (v > high or (high_open and v == high)):
        raise ConfigError(name, value, allowed)
    return v


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None, hint: str = "") -> int:
    """An integer in ``[low, high]`` (either bound optional; booleans refused), returned as an int."""
    if low is not None and high is not None:
        allowed = f"an integer in {low}..{high}"
    else:
        allowed = "an integer" + (f" >= {low}" if low is not None else "") + (f" <= {high}" if high is not None else "")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(name, value, allowed)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(name, value, allowed, hint or None)
    return int(value)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """One of a fixed set of strings (a close spelling is suggested)."""
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        raise ConfigError(name, value, "one of " + ", ".join(repr(c) for c in options), suggest(value, options))
    return value


def close_matches(value: Any, choices: Iterable[str], n: int = 3) -> list[str]:
    """The choices closest to ``value`` in spelling (at most ``n``)."""
    return difflib.get_close_matches(str(value), list(choices), n=n)


def suggest(value: Any, choices: Iterable[str], n: int = 3) -> str | None:
    """``"did you mean …?"`` for the choices closest to ``value``, or None."""
    close = close_matches(value, choices, n)
    return f"did you mean {', '.join(dict.fromkeys(close))}?" if close else None
