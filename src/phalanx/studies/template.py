"""The study template: what every grid study does — plan its cells into runs validated once, read each ended run,
write its report files — written once, so that a study declares only what differs: its grid (``cells``), the run
keys of one cell (``keys``), what it reads of one ended run (``final``) and its report (:meth:`GridStudy.document`).

A *grid study* is a :class:`~phalanx.studies.base.Study` whose every cell is one training run (cells that are equal
share it). Its steps:

1. **plan** — ``cells(preset)`` in order; for each cell ``keys(preset, cell)`` (a dict of run keys, not validated),
   the command line's run keys over it, validated once by :func:`phalanx.experiments.config.validate` into a
   :class:`~phalanx.experiments.validrun.ValidRun` (cells with equal run keys share one). The runner trains these
   values as they are: no study's run is validated a second time (``tests/test_study_template.py`` counts the
   components built, and the validations of shared cells).
2. **collect** — each cell's ended run (finished, or diverged: :func:`phalanx.experiments.runstate.final_rows`) under
   ``runs_dir / run.run_id``, read by ``final(cell, run, rows)`` into the study's raw value (the rows of ``runs.csv``,
   :mod:`phalanx.studies.raw`).
3. **report** — :meth:`GridStudy.document` makes the report's text, its ``cells.csv``, its figure and what the
   terminal shows from the collected values; the template writes them (atomically:
   :func:`~phalanx.studies.reporting.write_report_files`).

Adding a study is one module (its preset dataclass and presets, its cell, the three functions, its tables) and its
test: docs/design.md, "Adding a study".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from phalanx.studies.base import C, P, Report, Study, V
from phalanx.studies.reporting import write_report_files

if TYPE_CHECKING:
    from phalanx.experiments.validrun import ValidRun


@dataclass(frozen=True)
class GridFunctions:
    """What a grid study declares as functions (its module's, usually): ``preset(name, **changes)`` (the preset,
    checked), ``cells(preset)`` (every cell of the grid, in order), ``keys(preset, cell)`` (the run keys of one
    cell, not validated: the template applies the command line's run keys and validates once) and
    ``final(cell, run, rows)`` (what the cell's ended run, whose metric rows are ``rows``, ended with; None: the
    study's :meth:`GridStudy.collect` reads its runs itself — the async study times its sync cells with what all its
    runs name); ``check(overrides)`` refuses, before any run is validated, the command line's run keys the grid
    sets itself (a ``ConfigError``; None: every run key may be set)."""

    preset: Callable[..., Any]
    cells: Callable[[Any], list[Any]]
    keys: Callable[[Any, Any], dict[str, Any]]
    final: Callable[[Any, ValidRun, list[dict[str, Any]]], Any] | None = None
    check: Callable[[dict[str, Any]], None] | None = None


@dataclass(frozen=True)
class Document:
    """A study's report as made from its collected values: ``text`` (``report.md``; the template appends the figure
    under ``caption``), ``csv`` (``cells.csv``), ``figure`` (its file name) and ``draw`` (writes it to the path
    given, returns the path), and what the terminal shows (:class:`~phalanx.studies.base.Report`)."""

    text: str
    csv: str
    figure: str
    caption: str
    draw: Callable[[Path], Path]
    terminal: list[Any]


class GridStudy(Study[P, C, V]):
    """A study whose every cell is one run (module docstring): it declares the command's attributes
    (:class:`~phalanx.studies.base.Study`), its ``functions`` (:class:`GridFunctions`) and :meth:`document`; the
    plan, the collection and the writing of the report are the template's."""

    functions: ClassVar[GridFunctions]
    """The study's preset, cells, keys and final functions."""
    def preset(self, name: str, **changes: Any) -> P:
        return cast(P, self.functions.preset(name, **changes))

    def run(self, preset: P, cell: C, overrides: dict[str, Any] | None = None) -> ValidRun:
        """One cell's run: its keys with ``overrides`` (run keys; those the grid sets itself refused by
        :attr:`GridFunctions.check`) over them, validated once."""
        from phalanx.experiments.config import validate

        self._check(overrides or {})
        return validate({**self.functions.keys(preset, cell), **(overrides or {})})

    def plan(self, preset: P, overrides: dict[str, Any]) -> tuple[list[C], list[ValidRun]]:
        """Every cell and its run (:meth:`run`). Cells whose run keys are equal share one run, validated once (the
        async study's always-first sync cells share the vector attack's run)."""
        import json

        from phalanx.experiments.config import validate

        self._check(overrides)
        cells = self.functions.cells(preset)
        made: dict[str, ValidRun] = {}
        runs = []
        for c in cells:
            data = {**self.functions.keys(preset, c), **overrides}
            key = json.dumps(data, sort_keys=True, default=repr)
            if key not in made:
                made[key] = validate(data)
            runs.append(made[key])
        return cells, runs

    def _check(self, overrides: dict[str, Any]) -> None:
        if self.functions.check is not None:
            self.functions.check(overrides)

    def collect(self, cells: list[C], configs: list[ValidRun], runs_dir: Path) -> dict[C, V]:
        """``final`` of every cell's ended run under ``runs_dir``."""
        from phalanx.experiments import runstate

        final = self.functions.final
        if final is None:
            raise NotImplementedError(f"{type(self).__name__} declares a final function or its own collect()")
        return {c: final(c, r, runstate.final_rows(runs_dir / r.run_id)) for c, r in zip(cells, configs)}

    def document(
        self, preset: P, cells: list[C], collected: dict[C, V], *, command: str, wall_seconds: float | None,
        runs: int,
    ) -> Document:
        """The study's report from its planned cells and collected values (:class:`Document`); ``command``,
        ``wall_seconds`` and ``runs`` as :meth:`~phalanx.studies.base.Study.report` receives them."""
        raise NotImplementedError(f"{type(self).__name__} declares document()")

    def report(
        self, preset: P, cells: list[C], collected: dict[C, V], out: Path, *, command: str,
        wall_seconds: float | None, runs: int, overrides: dict[str, Any],
    ) -> Report:
        """:meth:`document`, written into ``out``: ``report.md``, ``cells.csv`` and the figure."""
        d = self.document(preset, cells, collected, command=command, wall_seconds=wall_seconds, runs=runs)
        return Report(write_report_files(out, d.text, d.csv, d.figure, d.caption, d.draw), d.terminal)

