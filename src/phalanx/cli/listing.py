"""``phalanx list …``: what Phalanx provides — aggregators, attacks, round algorithms, stages, data sets, models."""

from __future__ import annotations

from typing import Annotated

import typer

from phalanx import catalogue
from phalanx.catalogue import rounds
from phalanx.cli.common import _fmt, _references, console, list_app
from phalanx.cli.output import FormatOption, Tabular, check_format, emit
from phalanx.errors import ConfigError, PhalanxError


@list_app.command("aggregators")
def list_aggregators(
    workers: Annotated[int, typer.Option("--workers", "-n", min=1, help="n, for the ε and κ columns.")] = 16,
    f: Annotated[int, typer.Option("--f", "-f", min=0, help="f, the number of Byzantine workers tolerated.")] = 3,
    fmt: FormatOption = "table",
) -> None:
    """Rules and pre-aggregators with their requirement on n, ε and κ at (n, f), and their references."""
    fmt = check_format(fmt)
    if 2 * f >= workers:
        raise ConfigError("--f", f, f"< n/2 = {workers / 2:g} with -n {workers} (f ≥ n/2 is beyond any robust rule)")
    table = Tabular(f"Phalanx aggregators (ε, κ at n={workers}, f={f})",
                    ("name", "kind", "requirement", "ε", "κ", "ref."), whole=("name",))  # names stay whole (grep-able)
    declared = catalogue.rule_rows(workers, f)  # torch-free: the declared built-ins (None: a plug-in is installed)
    if declared is None:
        rows = _built_rows(workers, f)
    else:
        rows = [([name, kind, _marked(requirement, kind != "gossip" and
                                      workers < catalogue.AGGREGATORS[name].min_workers(f)),
                  *(("", "") if kind == "gossip" else (_fmt(eps), _fmt(kappa)))], ref)
                for name, kind, requirement, eps, kappa, ref in declared]
    _references(table, rows, fmt)
    if any(row[2].startswith(UNMET) for row, _ in rows):
        table.notes.append(f"{UNMET.strip()}: not defined at n = {workers} with f = {f} (its requirement is unmet: a "
                           "run with it there is refused before it starts).")
    table.notes.append(f"ε, κ: the values the literature proves (— where none; describe() names each statement). "
                       f"`phalanx epsilon SPEC -n {workers} -f {f}` and `phalanx kappa SPEC -n {workers} -f {f}` "
                       "measure certified lower bounds.")
    emit(table, fmt, console)


UNMET = "✗ "
"""What a requirement cell begins with when the rule is not defined at the listing's n and f."""


def _marked(requirement: str, unmet: bool) -> str:
    return UNMET + requirement if unmet else requirement


def _built_rows(workers: int, f: int) -> list[tuple[list[str], str]]:
    """``list aggregators``' rows from the registries' classes (torch imported): the built-ins, which
    :func:`phalanx.catalogue.rule_rows` declares alike, and installed plug-ins, which only their classes describe."""
    from phalanx import aggregators
    from phalanx.decentralized import robust_gossip

    rows: list[tuple[list[str], str]] = []
    for name in aggregators.names():
        cls = aggregators.get_class(name)
        try:
            comp = cls(f=f)
        except PhalanxError as exc:
            rows.append(([name, "?", str(exc), "", ""], cls.reference))
            continue
        info = comp.describe(workers)
        rows.append(([name, info["kind"], _marked(info["requirement"], workers < comp.min_workers()),
                      _fmt(info.get("epsilon")), _fmt(info.get("kappa"))], info["reference"]))
    for name in robust_gossip.names():  # a node's rule over its graph neighbourhood
        rows.append(([name, "gossip", catalogue.GOSSIP_REQUIREMENT, "", ""], robust_gossip.get_class(name).reference))
    return rows


@list_app.command("attacks")
def list_attacks(fmt: FormatOption = "table") -> None:
    """Attacks with their kind, their config section (the constructor's parameters, each set by
    attack_params.<p>) and their reference."""
    fmt = check_format(fmt)
    table = Tabular("Phalanx attacks", ("name", "kind", "section: its parameters", "ref."), whole=("name",))
    declared = rounds.attack_rows()  # torch-free: the declared built-ins (None: a plug-in is installed)
    _references(table, attack_rows() if declared is None else declared, fmt)
    emit(table, fmt, console)


def attack_rows() -> list[tuple[list[str], str]]:
    """``list attacks``' rows from the registries' classes (torch imported): the built-ins, which
    :func:`phalanx.catalogue.rounds.attack_rows` declares alike, and installed plug-ins, which only their classes
    describe. Each row: (name, kind, section), reference."""
    from phalanx import attacks
    from phalanx.attacks.base import DataAttack
    from phalanx.decentralized import gossip_attacks
    from phalanx.experiments.sections import attack_section

    def kind(cls: type) -> str:
        if getattr(cls, "baseline", False):  # honest, none: no attack at all
            return "baseline: no attack (" + ("real gradients on own data" if issubclass(cls, DataAttack)
                                             else "replays honest rows") + ")"
        return "data: poisons its batches" if issubclass(cls, DataAttack) else "vector: sends rows"

    def section(name: str) -> str:
        return "\n".join(p.text() for p in attack_section(name)) or "—"

    rows = [([name, kind(attacks.get_class(name)), section(name)], attacks.get_class(name).reference)
            for name in attacks.names()]
    rows += [([name, rounds.GOSSIP_ATTACK_KIND, "—"], gossip_attacks.get_class(name).reference)
             for name in gossip_attacks.names()]
    return rows


@list_app.command("algorithms")
def list_algorithms(fmt: FormatOption = "table") -> None:
    """The round algorithms a config's 'algorithm' names: how each is configured, its config section (its
    constructor's parameters, each with its type, default and the key that sets it) and what it is (its reference
    where it declares one, else its docstring's first line)."""
    fmt = check_format(fmt)
    table = Tabular("Phalanx round algorithms", ("name", "configured by", "section: its parameters", "ref."),
                    whole=("name",))
    declared = rounds.algorithm_rows()  # torch-free, as attacks
    _references(table, algorithm_rows() if declared is None else declared, fmt)
    emit(table, fmt, console)


def algorithm_rows() -> list[tuple[list[str], str]]:
    """``list algorithms``' rows from the registry's classes (torch imported), as :func:`attack_rows`: (name,
    configured by, section), reference."""
    from phalanx.experiments.sections import algorithm_section
    from phalanx.training.algorithms import base, builtin

    rows = []
    for name in base.names():
        cls = builtin.algorithm_class(name)
        how = "its config keys" if name in builtin.BUILT_IN else "algorithm_params"
        section = "\n".join(p.text() for p in algorithm_section(name)) or "—"
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        rows.append(([name, how, section], str(getattr(cls, "reference", "") or doc or "—")))
    return rows


@list_app.command("stages")
def list_stages(fmt: FormatOption = "table") -> None:
    """The round's stages (docs/design.md, 'Stages'): each with its side, how a config turns it on, its config
    section (its parameters) and its reference."""
    fmt = check_format(fmt)
    table = Tabular("Phalanx stages", ("name", "side", "turned on by", "section: its parameters", "ref."),
                    whole=("name",))
    declared = rounds.stage_rows()  # torch-free, as attacks
    _references(table, stage_rows() if declared is None else declared, fmt)
    emit(table, fmt, console)


def stage_rows() -> list[tuple[list[str], str]]:
    """``list stages``' rows from the registry's classes (torch imported), as :func:`attack_rows`: (name, side,
    turned on by, section), reference."""
    from phalanx.experiments import legacy
    from phalanx.training.stages import registry

    rows = []
    for name in registry.names():
        cls = registry.get(name)
        on = cls.brought_by or legacy.FLAT_STAGES.get(name) or f"{legacy.TREE}.{name} (a TOML table)"
        section = "\n".join(f"{p}: {text}" for p, text in cls.parameters.items()) or "—"
        rows.append(([name, cls.side, on, section], cls.reference or "—"))
    return rows


@list_app.command("trackers")
def list_trackers(fmt: FormatOption = "table") -> None:
    """Experiment trackers a config's 'tracking' names (docs/tracking.md): the extra that installs each, whether it
    is installed here, its parameters (each set by tracking_params.NAME.P) and what it records."""
    from phalanx.catalogue import trackers

    fmt = check_format(fmt)
    table = Tabular("Phalanx trackers", ("name", "extra", "installed", "parameters", "records"), whole=("name",))
    declared = trackers.tracker_rows()  # torch-free, as attacks (None: a plug-in tracker is installed)
    for row in tracker_rows() if declared is None else declared:
        table.add(*row)
    table.notes.append("`--track NAME` (or `--track NAME=URI`) on run, sweep and launch adds one; "
                       "pip install 'phalanx[tracking]' installs all three built-ins.")
    emit(table, fmt, console)


def tracker_rows() -> list[list[str]]:
    """``list trackers``' rows from the registry's classes (torch imported), as :func:`attack_rows`: name, extra,
    installed, parameters, what it records (``summary``, else the docstring's first line)."""
    import inspect

    from phalanx.catalogue import trackers
    from phalanx.experiments import tracking

    rows = []
    for name in tracking.names():
        cls = tracking.TRACKERS.get(name, "tracking")
        extra = getattr(cls, "extra", None)
        params = tuple(trackers.parameter(p.name, p.annotation, p.default)
                       for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
                       if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD)
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        rows.append([name, f"phalanx[{extra}]" if extra else "—", trackers.installed(getattr(cls, "package", None)),
                     trackers.section(name, params), getattr(cls, "summary", "") or doc or "—"])
    return rows


@list_app.command("datasets")
def list_datasets(fmt: FormatOption = "table") -> None:
    """Data sets Phalanx can load."""
    names = catalogue.names(catalogue.DATASETS, catalogue.DATASET_GROUP)  # torch-free: plug-ins by name, unloaded
    rows = [[name, catalogue.DATASET_SOURCES.get(name, "a plug-in (its package's entry point)")] for name in names]
    emit(Tabular("Phalanx data sets", ("name", "where it comes from"), rows, whole=("name",)), check_format(fmt),
         console)


@list_app.command("models")
def list_models(fmt: FormatOption = "table") -> None:
    """Models Phalanx can build: the registry's, then the pre-trained transformers with LoRA adapters (hf:NAME:
    the embedded ones, or a local directory / a model in the Hugging Face cache; docs/lora.md)."""
    from phalanx import hub

    rows = [[name] for name in catalogue.names(catalogue.MODELS, catalogue.MODEL_GROUP)]  # torch-free, as data sets
    rows += [[hub.PREFIX + name] for name in sorted(hub.EMBEDDED)] + [[hub.PREFIX + "DIR"], [hub.PREFIX + "ORG/NAME"]]
    emit(Tabular("Phalanx models", ("name",), rows), check_format(fmt), console)


@list_app.command("sections")
def list_sections(fmt: FormatOption = "table") -> None:
    """The config tree's sections (docs/config.md): each key, the flat key of earlier releases it is (what the run
    id is computed from), the components that have it, and its type, allowed range, default and description —
    read from the declarations, not listed here."""
    from phalanx.experiments import treetext

    fmt = check_format(fmt)
    table = Tabular("Phalanx config sections", ("section", "key", "flat key", "for", "type", "allowed", "default",
                                                "description"), whole=("section", "key"))
    for row in treetext.declared():  # data, not markup: the terminal renderer prints cells as text, as written
        table.add(*row)
    table.notes.append("`phalanx config show CONFIG --tree` prints a config as its tree; a flat config is read as "
                       "it always was, with the same run ids.")
    emit(table, fmt, console)
