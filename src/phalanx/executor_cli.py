"""The command-line options that choose where a grid runs (``--executor local|slurm`` and the Slurm settings), shared
by every command that trains a grid (``run``, ``sweep``, ``tension paper``, ``tension plan``, ``experiment …``).

:func:`executor_options` adds the options to a command and hands it one :class:`ExecutorChoice`; with the grid
config's ``[slurm]`` table (if any), :meth:`ExecutorChoice.make` builds the executor. Flags win over the table.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from phalanx.errors import ConfigError

EXECUTORS = ("local", "slurm")


@dataclass(frozen=True)
class ExecutorChoice:
    """What the command line says about where the grid runs (``None``: not given)."""

    executor: str = "local"
    runs_per_task: int | None = None
    partition: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    gpus_per_task: int | None = None
    mem: float | None = None
    slurm: tuple[str, ...] = ()
    detach: bool = False
    wait: bool = False

    def slurm_settings(self, table: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``[slurm]`` table, then ``--slurm KEY=VALUE``, then the dedicated flags (later ones win)."""
        from phalanx.experiments.config import apply_overrides

        if table is not None and not isinstance(table, Mapping):
            raise ConfigError("slurm", table, "a table of Slurm settings ([slurm] partition = \"gpu\" …)")
        settings = apply_overrides(dict(table or {}), list(self.slurm))
        flags = {"runs_per_task": self.runs_per_task, "partition": self.partition, "time": self.time,
                 "cpus_per_task": self.cpus_per_task, "gpus_per_task": self.gpus_per_task, "mem_gb": self.mem,
                 "detach": self.detach or None}
        settings.update({k: v for k, v in flags.items() if v is not None})
        return settings

    def make(self, jobs: int, table: Mapping[str, Any] | None = None) -> Any:
        """The executor: local with ``jobs`` processes, or Slurm with the settings (validated here, before anything
        is submitted). Slurm settings without ``--executor slurm`` are an error (they would be ignored)."""
        from phalanx.experiments.local import LocalExecutor

        if self.executor not in EXECUTORS:
            raise ConfigError("--executor", self.executor, " or ".join(EXECUTORS))
        if self.executor == "local":  # a grid's [slurm] table may sit unused; flags would be ignored: an error
            flags = sorted(self.slurm_settings(None))
            if flags:
                raise ConfigError("--executor", "local", "slurm when Slurm settings are given",
                                  f"{', '.join(flags)} only apply to --executor slurm")
            return LocalExecutor(jobs, wait=self.wait)
        settings = self.slurm_settings(table)
        from phalanx.experiments.slurm import SlurmExecutor, SlurmOptions

        return SlurmExecutor(SlurmOptions.from_mapping(settings))


_OPTIONS: dict[str, tuple[Any, Any]] = {
    "executor": (Annotated[str, typer.Option("--executor", help="Where the runs train: local (this machine's "
                                             "processes) or slurm (one Slurm job array).")], "local"),
    "runs_per_task": (Annotated[int | None, typer.Option("--runs-per-task", min=1, help="Slurm: runs per array "
                                                         "task.")], None),
    "partition": (Annotated[str | None, typer.Option("--partition", help="Slurm partition.")], None),
    "time": (Annotated[str | None, typer.Option("--time", help="Slurm time limit per task (minutes or "
                                                "HH:MM:SS).")], None),
    "cpus_per_task": (Annotated[int | None, typer.Option("--cpus-per-task", min=1, help="Slurm: cores per "
                                                         "task.")], None),
    "gpus_per_task": (Annotated[int | None, typer.Option("--gpus-per-task", min=1, help="Slurm: GPUs per task "
                                                         "(the runs use them with device = auto or cuda).")], None),
    "mem": (Annotated[float | None, typer.Option("--mem", min=0, help="Slurm: memory per task, GB.")], None),
    "slurm": (Annotated[list[str] | None, typer.Option("--slurm", help="Another Slurm setting: --slurm "
                                                       "account=lab (repeatable).")], None),
    "detach": (Annotated[bool, typer.Option("--detach", help="Slurm: return once the array is submitted.")], False),
    "wait": (Annotated[bool, typer.Option("--wait", help="Wait for run directories another process is training "
                                          "(default: report them busy).")], False),
}


def executor_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the executor options to a Typer command; the command gets them as one keyword, ``executor:
    ExecutorChoice``."""
    sig = inspect.signature(command, eval_str=True)
    params = [p for p in sig.parameters.values() if p.name != "executor"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=default)
             for name, (ann, default) in _OPTIONS.items()]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in _OPTIONS if name in kwargs}
        given["slurm"] = tuple(given.get("slurm") or ())
        return command(*args, executor=ExecutorChoice(**given), **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[  # type: ignore[attr-defined]
        *[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
          else p for p in params], *extra])
    wrapper.__annotations__ = {**{p.name: p.annotation for p in params}, **{p.name: p.annotation for p in extra}}
    return wrapper
