"""The figures of issue 39 for a source tree: which source files read each feature's config key, the modules over
600 lines, and the way a run's config goes from ``phalanx run`` to the built algorithm, rule and transport.

    PYTHONPATH=src python scripts/seam_counts.py [--src src/phalanx]

* **reads** — a file *reads* a key when its code (not a docstring or a comment) names it: an attribute
  ``x.<key>``, or a string constant equal to the key (``"dp_noise"``, ``"robust-online"``). A key's declaration in
  the schema counts (it is a reader of the flat config). The catalogue (``phalanx/catalogue/``) is not counted: it
  is the text ``phalanx list`` prints without importing torch (a stage's name, the key that switches it on), reads
  no config — it imports no Phalanx module that could (``tests/test_seam_counts.py`` checks its imports) — and
  ``tests/test_catalogue.py`` checks it against the registries.
* **stops** — the distinct Phalanx functions called with the run's config — a ``RunConfig`` argument, or a
  ``ValidRun`` (the validated-run value that wraps it: a value around the config must not hide the config's path
  from the count) — from the command line until the loop opens its transport (by then the algorithm, the rule and
  the transport are built), in the order first met; the config's own methods and the methods a dataclass generates
  for the value (its ``__init__``) are not counted. A *climb back up* is a stop that the stop before it did not call
  (the config went back up the call stack, to be handed down again). ``tests/test_seam_counts.py`` checks that a
  function called with the value alone counts.

Run it from a tree's root with that tree's ``src`` on the path to measure that tree (the figures in
docs/design.md were made so, on this branch and on ``main``).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

KEYS = {
    "DP": ("dp_noise", "dp_clip", "dp_delta"),
    "CRFL": ("server_projection", "server_projection_params"),
    "robust-online": ("robust-online",),
    "server momentum": ("server_momentum",),
    "norm statistics": ("norm_stats",),
}


CATALOGUE = "catalogue"
"""The package of listing text that :func:`readers` leaves out (the module's docstring)."""


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # attribute docstrings
            ids.add(id(node.value))
    return ids


def readers(src: Path, keys: tuple[str, ...]) -> list[str]:
    """The files under ``src`` whose code names one of ``keys`` (see the module's docstring)."""
    out = []
    for path in sorted(src.rglob("*.py")):
        if path.relative_to(src).parts[0] == CATALOGUE:
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            named = (isinstance(node, ast.Attribute) and node.attr in keys) or (
                isinstance(node, ast.Constant) and node.value in keys and id(node) not in docs)
            if named:
                out.append(str(path.relative_to(src)))
                break
    return out


def long_modules(src: Path, limit: int = 600) -> list[tuple[str, int]]:
    """The modules over ``limit`` lines."""
    sizes = [(str(p.relative_to(src)), len(p.read_text().splitlines())) for p in sorted(src.rglob("*.py"))]
    return [(p, n) for p, n in sizes if n > limit]


def carries_config(value: Any) -> bool:
    """Whether ``value`` is the run's config or the validated-run value that carries it (a stop's argument)."""
    from phalanx.experiments.schema import RunConfig
    from phalanx.experiments.validrun import ValidRun

    return isinstance(value, RunConfig | ValidRun)


def stops() -> list[tuple[str, int]]:
    """``phalanx run`` of a one-round config: the functions first called with its RunConfig or its ValidRun
    (:func:`carries_config`) until the loop opens, each with its depth in the call stack."""
    from typer.testing import CliRunner

    from phalanx.cli import app

    return trace(lambda out: CliRunner().invoke(app, [
        "run", "--set", "rounds=1", "--set", "eval_every=1", "--set", "seed=0", "--set", "aggregator=cwtm",
        "--set", "attack=none", "--out", out]))


def trace(call: Callable[[str], Any]) -> list[tuple[str, int]]:
    """The stops of ``call(out)`` (``out``: an empty temporary directory) until the loop opens its transport."""
    from phalanx.training.loop import Loop

    seen: dict[str, int] = {}
    done = False

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal done
        if done or event != "call":
            return
        code = frame.f_code
        module = frame.f_globals.get("__name__", "")
        if code is Loop.open.__code__:
            done = True
            return
        if not module.startswith("phalanx.") or module == "phalanx.experiments.schema":
            return
        if "__create_fn__" in code.co_qualname:  # a dataclass's generated method (the value's own __init__)
            return
        args = [frame.f_locals.get(name) for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]]
        name = f"{module}.{code.co_qualname}"
        if name not in seen and any(carries_config(a) for a in args):
            depth, f = 0, frame
            while f is not None:
                depth, f = depth + 1, f.f_back
            seen[name] = depth

    with tempfile.TemporaryDirectory() as out:
        sys.setprofile(profile)
        try:
            call(out)
        finally:
            sys.setprofile(None)
    return list(seen.items())


def climbs_of(path: list[tuple[str, int]]) -> int:
    """The climbs back up of a path of stops: each stop no deeper than the one before it."""
    return sum(1 for (_, a), (_, b) in itertools.pairwise(path) if b <= a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=None)
    args = parser.parse_args()
    import phalanx

    src = args.src or Path(phalanx.__file__).resolve().parent
    print(f"source: {src}")
    for feature, keys in KEYS.items():
        files = readers(src, keys)
        print(f"{feature} ({', '.join(keys)}): read in {len(files)} files: {', '.join(files)}")
    print("modules over 600 lines:", long_modules(src) or "none")
    path = stops()
    climbs = climbs_of(path)
    modules = {name.rsplit(".", 2)[0] if name.rsplit(".", 2)[1][:1].isupper() else name.rsplit(".", 1)[0]
               for name, _ in path}
    print(f"phalanx run → algorithm, rule, transport: {len(path)} stops in {len(modules)} modules, {climbs} climbs "
          "back up")
    for name, depth in path:
        print(f"   {depth:3d} {name}")

if __name__ == "__main__":
    main()
