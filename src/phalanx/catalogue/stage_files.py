"""``phalanx list stages`` for a stage file the catalogue's table does not name, read without importing it.

A stage shipped in :mod:`phalanx.training.stages` is one file there (the registry finds it by itself). The listing
reads its cells without torch: from :data:`phalanx.catalogue.rounds.STAGES` for the stages declared there, and —
so that a new stage needs no second edit — from the new file's own source, parsed with :mod:`ast` and never run:
the class whose base is ``WorkerStage`` or ``ServerStage`` (by that name) and whose class body assigns ``name``,
``parameters`` (a dict of string to string), ``reference`` and optionally ``brought_by`` as literals. Those are the
attributes the listing from the classes (:func:`phalanx.cli.listing.stage_rows`) reads, so the cells are the same
(``tests/test_catalogue.py`` compares them for every stage file of the package). A file whose stage class is not
written so — a computed attribute, another base — cannot be read this way: :func:`derived` then says so and the
listing imports the stages instead (torch: about a second), which gives the same rows.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["PACKAGE", "SKIPPED", "derived"]

PACKAGE = Path(__file__).resolve().parent.parent / "training" / "stages"
"""The directory of the stages package (next to this one; found without importing it)."""

SKIPPED = ("__init__", "base", "registry")
"""Modules of the package that define no stage (as the registry's discovery skips them)."""

SIDES = {"WorkerStage": "worker", "ServerStage": "server"}
"""A stage's side, from the base it names."""

MAX_SOURCE = 1 << 20
"""A stage file larger than this is not parsed (the listing imports the stages instead)."""


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _assigned(body: list[ast.stmt]) -> dict[str, ast.expr]:
    """``name = value`` and ``name: T = value`` at the top of a class body."""
    out: dict[str, ast.expr] = {}
    for stmt in body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            out[stmt.target.id] = stmt.value
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            out[stmt.targets[0].id] = stmt.value
    return out


def _stage_of(node: ast.ClassDef, module: str) -> tuple[str, tuple[str, ...]] | None:
    """(name, (target, side, turned on by, section lines…, reference)) of a stage class written with literals, None
    when it is not one or not readable so."""
    bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
    sides = [SIDES[b] for b in bases if b in SIDES]
    if len(sides) != 1:
        return None
    attrs = _assigned(node.body)
    name = _literal(attrs["name"]) if "name" in attrs else None
    params = _literal(attrs["parameters"]) if "parameters" in attrs else {}
    reference = _literal(attrs["reference"]) if "reference" in attrs else ""
    brought_by = _literal(attrs["brought_by"]) if "brought_by" in attrs else ""
    if not (isinstance(name, str) and name and isinstance(params, dict) and isinstance(reference, str)
            and isinstance(brought_by, str)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in params.items())):
        return None
    turned_on_by = brought_by or f"stages.{name} (a TOML table)"
    section = tuple(f"{p}: {text}" for p, text in params.items())
    return name, (f"{module}:{node.name}", sides[0], turned_on_by, *section, reference or "—")


def derived(declared_modules: Iterable[str], package: Path | None = None,
            prefix: str = "phalanx.training.stages") -> dict[str, tuple[str, ...]] | None:
    """Every stage of a ``package`` module (default :data:`PACKAGE`) not in ``declared_modules``, by name: (target,
    side, turned on by, section lines…, reference), read from the file's source; None when one such module's stage
    cannot be read so (the listing must then import the stages). A module that defines no stage class gives
    nothing. A stage that a legacy flat key turns on (``experiments.legacy.FLAT_STAGES``) is declared in the table."""
    declared = set(declared_modules)
    package = PACKAGE if package is None else package
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted(package.glob("*.py")):
        module = f"{prefix}.{path.stem}"
        if path.stem in SKIPPED or module in declared:
            continue
        try:
            if path.stat().st_size > MAX_SOURCE:
                return None
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (OSError, SyntaxError, ValueError, MemoryError, RecursionError):
            return None
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        for node in classes:  # a class with a name of its own may be a stage (the registry's test): read it or give up
            if "name" not in _assigned(node.body):
                continue
            got = _stage_of(node, module)
            if got is None:
                return None
            out[got[0]] = got[1]
    return out
