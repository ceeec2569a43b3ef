"""Studies: experiments of the field as presets — a grid of runs, the statistics of its tables, a plot, a report —
and the planner, on top of the run machinery of :mod:`phalanx.experiments`.

Each study is a :class:`Study` subclass in a module of its own (:mod:`~phalanx.studies.tension`,
:mod:`~phalanx.studies.convergence`, :mod:`~phalanx.studies.hbn`, :mod:`~phalanx.studies.parallelism`,
:mod:`~phalanx.studies.neighbours`, :mod:`~phalanx.studies.privacy`, :mod:`~phalanx.studies.backdoor`,
:mod:`~phalanx.studies.corrupted`, :mod:`~phalanx.studies.asynchrony`, :mod:`~phalanx.studies.lora`),
registered by name with :func:`register`; what they share is :mod:`~phalanx.studies.reporting`. ``phalanx
experiment NAME`` runs any study :func:`resolve` finds: a registered name, an installed package's entry point in the
``phalanx.studies`` group, or a ``module:attr`` spec. The planner (:mod:`~phalanx.studies.planner`, ``phalanx
tension plan``) works on the user's own config rather than a preset, and is not a :class:`Study`.
"""

# Importing a module registers its study.
from phalanx.studies import (  # noqa: F401
    asynchrony,
    backdoor,
    convergence,
    corrupted,
    hbn,
    lora,
    neighbours,
    parallelism,
    privacy,
    tension,
)
from phalanx.studies.base import Report, Study
from phalanx.studies.registry import names, register, resolve

__all__ = ["Report", "Study", "names", "register", "resolve"]
