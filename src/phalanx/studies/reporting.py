"""What the studies share: a preset picked by name and checked, the data set's fallback, a run's final accuracy, the
provenance lines under a report's title, how a Holm-corrected family of verdicts is shown, and the report's files
written atomically.

A study's own module holds its science (grid, statistics, tables, plot); this one holds what every study needs around
it, so that no study imports another.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from phalanx.analysis.stats import Estimate, holm
from phalanx.errors import ConfigError
from phalanx.experiments import runstate, store
from phalanx.validate import suggest


class PresetLike(Protocol):
    """What the presets of the studies share (frozen dataclasses)."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def dataset(self) -> str: ...

    @property
    def fallback_dataset(self) -> str | None: ...

    @property
    def seeds(self) -> tuple[int, ...]: ...


P = TypeVar("P", bound=PresetLike)


def pick_preset(presets: dict[str, P], name: str, changes: dict[str, Any], lists: tuple[str, ...]) -> P:
    """``presets[name]`` with fields replaced, checked: a known name and fields, non-empty ``lists``, at least two
    distinct seeds (the intervals need them). Shared by the study presets."""
    if name not in presets:  # the closest names too (issue 38: ``--preset quik`` listed them with no "did you mean")
        raise ConfigError("preset", name, "one of " + ", ".join(presets), suggest(name, presets))
    base = presets[name]
    fields = base.__dataclass_fields__  # type: ignore[attr-defined]
    unknown = sorted(set(changes) - set(fields))
    if unknown:
        raise ConfigError("preset field", unknown, f"fields of {type(base).__name__}: " + ", ".join(fields),
                          suggest(unknown[0], fields) if len(unknown) == 1 else None)
    p = replace(base, **changes)  # type: ignore[type-var]
    for key in lists:
        if not getattr(p, key):
            raise ConfigError(key, getattr(p, key), "a non-empty list")
    if len(set(p.seeds)) < 2:
        raise ConfigError("seeds", list(p.seeds), "at least two distinct seeds (the intervals need them)")
    return p


def resolve_dataset(p: P, available: Callable[[str], bool]) -> P:
    """Fall back to the preset's ``fallback_dataset`` when its ``dataset`` is not on this machine."""
    if available(p.dataset) or p.fallback_dataset is None:
        return p
    return replace(p, dataset=p.fallback_dataset)  # type: ignore[type-var]


def final_accuracy(run_dir: Path) -> float:
    """The last evaluated round's test accuracy of a run that ended: finished, or diverged (0, as the sweep report
    counts it)."""
    return float(runstate.final_rows(run_dir)[-1]["test_accuracy"])


def machine() -> str:
    """One line about where this ran."""
    import torch

    return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, Python "
            f"{platform.python_version()}, torch {torch.__version__}")


def provenance(command: str, wall_seconds: float | None, runs: int, what: str = "") -> list[str]:
    """The lines under a study report's title: the command that made it, the machine, how many runs (``what``
    qualifies them: ``" distinct"``) and the wall time."""
    wall = f", wall time {wall_seconds / 60:.1f} min" if wall_seconds is not None else ""
    return [f"Command: `{command}`  ", f"Machine: {machine()}  ", f"Runs: {runs}{what}{wall}"]


def holm_p(e: Estimate | None) -> str:
    """A table cell: the estimate's Holm-adjusted p-value, or — (no estimate, or not corrected)."""
    return "—" if e is None else e.holm_text()


Item = TypeVar("Item")


def holm_family(items: list[Item], field: str = "estimate") -> list[Item]:
    """``items`` (frozen dataclasses, each holding one verdict's :class:`Estimate` in ``field``) with their estimates
    Holm-corrected as one family (:func:`phalanx.analysis.stats.holm`): a report that reads them all decides each on
    its adjusted p-value."""
    adjusted = holm([getattr(x, field) for x in items])
    return [replace(x, **{field: e}) for x, e in zip(items, adjusted)]  # type: ignore[type-var]


def family_note(estimates: Iterable[Estimate | None]) -> str:
    """The sentence under a report's verdicts that says how they were decided: Holm over the family's size."""
    m = max((e.family for e in estimates if e is not None and e.p_adjusted is not None), default=0)
    return (f"Verdicts: Holm-adjusted p < 0.05 over the {m} comparisons of this report that decide something (the "
            "family-wise error rate ≤ 5 %); intervals: per comparison, 95 %.")


def write_report_files(
    out: Path, report: str, csv_text: str, figure: str, caption: str, draw: Callable[[Path], Path],
) -> list[Path]:
    """A study's outputs in ``out`` (atomically): ``report.md`` (``report`` and the figure under ``caption``),
    ``cells.csv`` and the figure ``draw`` writes to ``out / figure``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    store.atomic_write_text(path, report + f"\n![{caption}]({figure})\n")
    table = out / "cells.csv"
    store.atomic_write_text(table, csv_text)
    return [path, table, draw(out / figure)]
