"""The validated run: a run config validated once, with everything validating it derived and built, as one value
that the code downstream of validation receives instead of the config (issue 39, "validated exactly once").

:func:`phalanx.experiments.config.validate` makes it — the schema, the relations between keys, the names, the
components each checking itself (:func:`phalanx.experiments.components.build`) — and nothing after it checks the
config again or derives from it what is here: the grid names the run's directory by :attr:`ValidRun.run_id`, the
experiment takes its :attr:`~ValidRun.parts` (:func:`components`) and repeats its :attr:`~ValidRun.columns` on
every metric row, the memory check counts its :attr:`~ValidRun.processes`.

The value replaces the hand-over that kept the components on the config object itself: there is no cache, global or
on the config; a RunConfig given to :func:`~phalanx.experiments.train.train` or
:func:`~phalanx.experiments.build.from_config` (the API, a torchrun rank) is validated there, once, and a sweep's
worker process or a Slurm task validates the config it receives (a pickled config or a file: the objects built here
stay here).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.experiments import components as parts_of
from phalanx.experiments import specs as read_specs
from phalanx.experiments.components import Components
from phalanx.experiments.schema import RunConfig
from phalanx.experiments.specs import CONFIG_COLUMNS, Specs

__all__ = ["CONFIG_COLUMNS", "RUN_ID_MAX", "ValidRun", "check_named", "components", "config_columns", "name_of",
           "run_id"]


def config_columns(cfg: RunConfig) -> dict[str, Any]:
    """The values of :data:`CONFIG_COLUMNS` in ``cfg``, and of the columns its algorithm declares
    (:attr:`~phalanx.training.algorithms.base.RoundAlgorithm.config_columns`: a federated run's ``clients_per_round``
    …, a gossip run's ``graph`` …), and of the flat keys of the stages it turns on
    (:func:`phalanx.experiments.legacy.row_columns`: a run with differential privacy's ``dp_noise`` …): the
    ``columns`` of :func:`phalanx.experiments.specs.read`, which validation carries (:attr:`ValidRun.columns`)."""
    return read_specs.read(cfg).columns


RUN_ID_MAX = 100
"""The longest run directory name :func:`run_id` makes (file systems allow 255 bytes per name; this leaves room for
the temporary files written next to a run's, and for paths that end up in messages)."""


def run_id(cfg: RunConfig) -> str:
    """A short, stable directory name for a configuration: readable prefix + hash of the full config.

    The name is ``<aggregator>_<attack>_f<f>_b<byzantine>_s<seed>_<hash>``, at most :data:`RUN_ID_MAX` characters.
    Only a name that would be longer — a long aggregator chain, a long attack name — is shortened: its readable
    prefix is cut (the aggregator part first, else the whole prefix) and the hash, which covers the full
    configuration, keeps it unique. Every name of :data:`RUN_ID_MAX` characters or fewer is exactly as before, so
    existing run directories keep their names (and resume; ``tests/test_compat.py`` pins them).
    """
    return name_of(cfg.identity())


def name_of(identity: dict[str, Any]) -> str:
    """:func:`run_id` of the config whose identity (:meth:`~phalanx.experiments.schema.RunConfig.identity`: the
    resolved config without its result-neutral keys) is ``identity`` — the name is made from the identity alone."""
    payload = json.dumps(identity, sort_keys=True).encode()
    digest = hashlib.sha256(payload).hexdigest()[:10]
    agg = "".join(c if c.isalnum() else "-" for c in identity["aggregator"])
    rest = f"_{identity['attack']}_f{identity['f']}_b{identity['byzantine']}_s{identity['seed']}"
    name = f"{agg}{rest}_{digest}"
    if len(name) <= RUN_ID_MAX:
        return name
    room = RUN_ID_MAX - len(rest) - len(digest) - 1  # characters left for the aggregator part
    if room >= 16:
        return f"{agg[:room]}{rest}_{digest}"
    return f"{(agg + rest)[: RUN_ID_MAX - len(digest) - 1]}_{digest}"


RUN_ID_FORM = re.compile(r".+_[0-9a-f]{10}")
"""The form of a run id (:func:`name_of`: it ends with ``_`` and 10 hex digits of the configuration's hash): a folder
named so claims to hold that run."""


def check_named(run_dir: Path, recorded: dict[str, Any]) -> str | None:
    """The run id of the config a run directory recorded (its ``config.json``, ``recorded``), or None where it is not
    a run config's identity (a run built from objects: ``train(experiment, dir)``). A :class:`ConfigError` naming
    ``run_dir`` when its name has the form of a run id (:data:`RUN_ID_FORM`) and is another one: a grid's folder
    renamed or swapped with another, which would report (or verify) one seed's run as another's. A folder of another
    name (``train(cfg, "runs/base")``) claims no run."""
    from phalanx.errors import ConfigError

    try:
        named = name_of(recorded)
    except (KeyError, TypeError, AttributeError, ValueError):  # not a RunConfig's identity: an Experiment's
        return None
    if run_dir.name != named and RUN_ID_FORM.fullmatch(run_dir.name):
        raise ConfigError("DIR", str(run_dir), "a run directory named by the run id of the config.json it holds",
                          f"its config.json is the run {named} (seed {str(recorded.get('seed'))[:20]}): a folder "
                          "renamed or swapped with another; give it back its name, or delete it")
    return named


@dataclass(frozen=True)
class ValidRun:
    """A run config validated once (:func:`phalanx.experiments.config.validate`) and what validating it made:
    ``cfg`` (the config itself, as it is saved and named), ``run_id`` (its directory name, :func:`run_id`), ``parts``
    (its components, built and checked together: :class:`~phalanx.experiments.components.Components`), ``columns``
    (the config values repeated on every metric row: :func:`config_columns`) and
    ``processes`` (how many processes a torchrun run of it has, as its algorithm says) and ``specs`` (the config read
    once into the values its checks and builders take: :class:`~phalanx.experiments.specs.Specs`).

    ``parts`` carry state (a stateful rule's, the server optimizer's): the first experiment built from the value
    takes them, every later one builds its own (:func:`components`)."""

    cfg: RunConfig
    run_id: str
    parts: Components
    columns: dict[str, Any]
    processes: int
    specs: Specs
    _taken: list[bool] = field(default_factory=list, repr=False, compare=False)
    """Empty until an experiment took ``parts`` (a list: the value is frozen, this one mark is not)."""


def components(run: ValidRun) -> Components:
    """The components of ``run``'s experiment: those validating it built, the first time; built anew (without the
    checks: the config is valid) every later time, so that two runs of one value share no state."""
    if run._taken:
        return parts_of.build(run.specs, run.cfg if run.specs.legacy_hooks else None)
    run._taken.append(True)
    return run.parts
