"""The study seam: what a study of the field declares and does, so that ``phalanx experiment NAME`` can run any of
them — the built-ins, an installed plug-in's, a user's ``module:attr`` — without knowing one.

A study is a grid of runs chosen by a *preset* (a frozen dataclass: the data, the model, the axes of the grid, the
seeds), and what is made of the finished runs. It declares, as class attributes,

* ``name`` — its command (``phalanx experiment NAME``); ``help`` — the paragraph its ``--help`` shows;
* ``preset_type`` — its preset dataclass (its fields are what ``--set`` may change besides run keys), which has at
  least ``name``, ``description``, ``dataset``, ``fallback_dataset`` and ``seeds``; ``presets`` — the presets it
  knows by name, ``default_preset`` among them;
* ``out`` — the default ``--out`` folder; ``preset_help`` and ``set_example`` — the ``--preset`` and ``--set``
  options' help;

and provides :meth:`plan` (the cells and their run configurations), :meth:`collect` (what each cell's finished run
ended with) and :meth:`report` (the tables, figure and report files, and what the terminal shows). The command line
does the rest, the same for every study (:meth:`configure`, then train the runs of :meth:`runs`, then collect and
report). A study whose preset, plan and collect are functions of its module derives from :class:`ModuleStudy` and
names them in ``functions`` (:class:`StudyFunctions`) instead of forwarding to each.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast

from phalanx.studies.reporting import PresetLike, pick_preset, resolve_dataset

if TYPE_CHECKING:
    from phalanx.experiments.config import RunConfig
    from phalanx.experiments.validrun import ValidRun

P = TypeVar("P", bound=PresetLike)
C = TypeVar("C", bound=Hashable)
V = TypeVar("V")


def distinct(runs: list[ValidRun]) -> list[ValidRun]:
    """The runs with the same run id once, in first-seen order (cells that share a run: :meth:`Study.runs`)."""
    seen: dict[str, ValidRun] = {}
    for r in runs:
        seen.setdefault(r.run_id, r)
    return list(seen.values())


def planned(cells: Callable[[P], list[C]], config_for: Callable[[P, C, dict[str, Any] | None], RunConfig], p: P,
            overrides: dict[str, Any] | None) -> tuple[list[C], list[RunConfig]]:
    """A study's plan: its cells and each cell's run configuration, in order (equal cells give equal
    configurations; the grid runs each distinct one once)."""
    cs = cells(p)
    return cs, [config_for(p, c, overrides) for c in cs]


@dataclass(frozen=True)
class Report:
    """What a study's report made: the files it wrote, and what the terminal shows — each item a ``str``, echoed as
    it is (plain text, Markdown tables), or a rich renderable (a ``rich.table.Table``) that the console prints."""

    files: list[Path]
    terminal: list[Any]


def _tuples(value: Any) -> Any:
    """TOML lists as tuples, nested ones too (preset fields are tuples)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _refuse_unknown(overrides: dict[str, Any], fields: Any) -> None:
    """A ``--set`` key that is neither a preset field nor a run key, as one line with "did you mean" over both
    (issue 38: ``--set rulez=1`` on a study listed the fields and suggested nothing, since the run keys' check
    only looks among run keys)."""
    from phalanx.errors import ConfigError
    from phalanx.experiments.schema import RunConfig
    from phalanx.validate import suggest

    unknown = sorted(k for k in overrides if k not in RunConfig.model_fields)
    if unknown:
        known = [*fields, *RunConfig.model_fields]
        raise ConfigError("--set", unknown[0], "a field of the preset (" + ", ".join(fields) + ") or a run key "
                          "(docs/config.md lists them)", suggest(unknown[0], known))


class Timed(Protocol):
    """An estimate of how long a study's own work takes here (:meth:`Study.estimate`)."""

    @property
    def seconds(self) -> float: ...

    def text(self) -> str:
        """One clause: ``about 7.5 min for …`` and what it rests on."""
        ...


class Study(ABC, Generic[P, C, V]):
    """A study of the field as presets (module docstring). ``P`` is its preset type, ``C`` its cell (one run of the
    grid, hashable), ``V`` what :meth:`collect` reads of a cell's run."""

    name: ClassVar[str]
    """The command: ``phalanx experiment NAME``."""
    help: ClassVar[str]
    """One paragraph: what the study measures, against what (the paper), and what it writes."""
    preset_type: ClassVar[type]
    """The preset dataclass."""
    presets: ClassVar[dict[str, Any]]
    """The presets the study knows, by name."""
    default_preset: ClassVar[str] = "quick"
    """The preset ``--preset`` defaults to."""
    out: ClassVar[str]
    """The default ``--out`` folder."""
    preset_help: ClassVar[str | None] = None
    """The ``--preset`` option's help (default: the presets' names)."""
    set_example: ClassVar[str] = "rounds=50"
    """The example in the ``--set`` option's help."""
    raw_value: ClassVar[type | None] = None
    """What :meth:`collect` gives per cell, when it is a float or a dataclass of floats: the command then writes the
    raw per-run results as ``runs.csv`` (:mod:`phalanx.studies.raw`) and ``--results FILE`` reports from such a file
    without training. None: neither."""

    def preset(self, name: str, **changes: Any) -> P:
        """``presets[name]`` with fields replaced, checked (a known name and fields, two seeds at least). A study with
        more to check overrides this."""
        return pick_preset(self.presets, name, changes, ())

    data_note: str | None = None
    """After :meth:`configure`: what to tell the reader when the preset's data set was not on this machine and it
    runs on its fallback instead (None: it runs on the data it names)."""

    def configure(self, name: str, seeds: int, sets: list[str]) -> tuple[P, dict[str, Any]]:
        """The preset the command line asks for, and the run keys it overrides: ``sets`` (``--set KEY=VALUE``) that
        name a field of the preset change the preset, the others are run keys (returned). The preset's data set falls
        back when it is not on this machine, and a data set that is nowhere is one clear error (where it looked, how
        to get it) before any run starts."""
        from phalanx import data
        from phalanx.data.base import DatasetNotFoundError
        from phalanx.experiments.config import apply_overrides

        overrides = apply_overrides({}, sets)
        root = overrides.get("data_root")

        @functools.cache  # asked twice (fallback, then the check below): load each data set once
        def available(dataset: str) -> bool:
            try:
                data.load(dataset, root=root)
            except DatasetNotFoundError:
                return False
            return True

        fields = self.preset_type.__dataclass_fields__  # type: ignore[attr-defined]
        changes = {k: _tuples(overrides.pop(k)) for k in list(overrides) if k in fields}
        _refuse_unknown(overrides, fields)
        p = self.preset(name, **{"seeds": tuple(range(seeds)), **changes})
        self.data_note = None
        if "dataset" not in changes:
            named = p.dataset
            p = resolve_dataset(p, available)
            if p.dataset != named:
                self.data_note = (f"preset {p.name} names the data set {named}, which is not on this machine: it runs "
                                  f"on {p.dataset} instead, and its numbers are not the ones the docs quote for "
                                  f"{named} (docs/data.md says how to get {named}; --set dataset={p.dataset} "
                                  "says you mean it)")
        if not available(p.dataset):  # with --set download=true this fetches the files once; else the clear error
            data.load(p.dataset, root=root, download=overrides.get("download", False) is True)
        return p, overrides

    @abstractmethod
    def plan(self, preset: P, overrides: dict[str, Any]) -> tuple[list[C], list[ValidRun]]:
        """The cells of the grid and their runs (one per cell), ``overrides`` (run keys) applied to every one, each
        validated once (:func:`phalanx.experiments.config.validate`): the command line trains these values as they
        are, without validating them again. (A study written before may still give configs, ``make_config``'s: the
        command line validates them again before training them, and gives :meth:`collect` what :meth:`plan`
        gave.)"""

    def raw_cells(self, preset: P, cells: list[C], configs: list[ValidRun]) -> tuple[list[C], list[str]]:
        """The cells :meth:`collect` gives a value for, each with the name of the run it reads (the rows of
        ``runs.csv`` and their ``run`` column): the planned ones and their runs' ids. A study whose
        collect derives more cells from a run (HBN's FedBN-global accuracy), or that trains no run directories,
        overrides this."""
        from phalanx.studies import raw

        return cells, raw.run_ids(configs)

    def runs(self, configs: list[ValidRun]) -> list[ValidRun]:
        """The configurations to train: every cell's (a study whose cells share runs gives the distinct ones)."""
        return configs

    def summary(self, preset: P, cells: list[C], runs: list[ValidRun], out: Path) -> str:
        """The line the command prints before training (rich markup)."""
        return (f"[bold]{self.name} {preset.name}[/bold]: {preset.description}; dataset {preset.dataset}; "
                f"{len(runs)} runs → {out}")

    timing: ClassVar[str | None] = None
    """What :meth:`estimate` times, said before it does (``a few GD rounds of each setting``); None: the study's work
    is its grid's runs, which the grid's own estimate times (:mod:`phalanx.experiments.estimate`)."""
    smaller: ClassVar[str] = ""
    """How to make the study smaller, said with an :meth:`estimate` over the budget; ``{preset}`` in it stands for
    the advice of a smaller preset, when there is one (``phalanx.cli.runs.smaller_preset``)."""

    def estimate(self, preset: P, cells: list[C]) -> Timed | None:
        """How long :meth:`collect`'s own work (a study whose cells are computed in process, not trained as runs)
        should take here, timed on this machine without changing any result; None (the default): no work of its own
        beyond reading the runs, or too little to time."""
        return None

    @abstractmethod
    def collect(self, cells: list[C], configs: list[ValidRun], runs_dir: Path) -> dict[C, V]:
        """What every cell's ended run under ``runs_dir`` (named by its ``run_id``) ended with."""

    @abstractmethod
    def report(
        self, preset: P, cells: list[C], collected: dict[C, V], out: Path, *, command: str,
        wall_seconds: float | None, runs: int, overrides: dict[str, Any],
    ) -> Report:
        """The tables and statistics of the collected runs, written into ``out`` (``report.md``, its figure, its
        CSV…), and what the terminal shows. ``command`` is the command line that reproduces it, ``wall_seconds`` the
        training's wall time, ``runs`` how many runs were trained (:meth:`runs`), ``overrides`` the run keys."""


@dataclass(frozen=True)
class StudyFunctions:
    """A study's module functions: ``preset(name, **changes)`` (the preset, checked), ``plan(preset, overrides)``
    (the cells and their run configurations) and ``collect(cells, configs, runs_dir)`` (what each cell's run ended
    with) — the signatures of :meth:`Study.preset`, :meth:`Study.plan` and :meth:`Study.collect` without ``self``."""

    preset: Callable[..., Any]
    plan: Callable[[Any, dict[str, Any]], tuple[list[Any], list[RunConfig]]]
    collect: Callable[[list[Any], list[RunConfig], Path], dict[Any, Any]]


class ModuleStudy(Study[P, C, V]):
    """A study whose :meth:`preset`, :meth:`plan` and :meth:`collect` are the functions its ``functions`` names (its
    module's, usually): the class declares the command's attributes and writes its :meth:`report`. Its module's
    ``plan`` gives configs (made by ``make_config``), validated here again into the runs the command line trains: a
    study on the template (:class:`phalanx.studies.template.GridStudy`) validates each run once."""

    functions: ClassVar[StudyFunctions]
    """The functions the three methods call."""

    def preset(self, name: str, **changes: Any) -> P:
        return cast(P, self.functions.preset(name, **changes))

    def plan(self, preset: P, overrides: dict[str, Any]) -> tuple[list[C], list[ValidRun]]:
        from phalanx.experiments.config import validate

        cells, configs = self.functions.plan(preset, overrides)
        return cells, [validate(c) for c in configs]

    def collect(self, cells: list[C], configs: list[ValidRun], runs_dir: Path) -> dict[C, V]:
        return self.functions.collect(cells, [r.cfg for r in configs], runs_dir)
