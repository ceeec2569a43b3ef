"""The package's layers, checked on its import graph (every import, including those inside functions).

Data flows one way — data → workers → (attack) → aggregation → server optimizer → model — and so do imports: the
numeric core (aggregators, attacks, models, data, analysis, training) imports no run-directory, engine or CLI code,
and nothing in it writes files except a data set's download into its cache. docs/design.md gives the same table.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "phalanx"

ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "files": set(),  # the one atomic write: below everything that writes a file
    "memory": set(),  # how much memory is left: every plan that allocates may ask
    "waits": set(),  # the waits a stop still ends (sliced): the tracker's calls, the torchrun transports
    "walk": {"errors"},  # a handed-over tree walked without recursion
    "validate": {"errors"},
    "plugins": {"errors", "validate"},
    "aggregators": {"errors", "plugins", "validate"},
    "attacks": {"aggregators", "errors", "plugins", "validate"},
    "hub": {"errors", "files"},  # files: a checkpoint's small files size-checked before transformers reads them
    "catalogue": set(),  # what the registries hold, declared without torch: read by the command line's listings
    "data": {"errors", "files", "plugins", "validate", "hub"},  # files: a data file opened once, checked regular
    "models": {"errors", "plugins", "validate", "hub", "memory"},
    "analysis": {"aggregators", "errors", "validate", "memory"},
    "testing": {"aggregators", "attacks", "errors"},
    "signing": {"errors", "files", "walk"},
    "online": {"errors", "files", "validate"},  # files: the check's raw results and report
    "training": {"aggregators", "attacks", "data", "models", "analysis", "decentralized", "errors", "files",
                 "online", "plugins", "validate", "memory"},  # files: a trace file opened once, checked regular
    "experiments": {"training", "aggregators", "attacks", "data", "models", "analysis", "errors", "plugins", "signing",
                    "files", "decentralized", "hub", "memory", "walk",
                    "validate", "waits", "__init__", "_spawned"},
    "studies": {"experiments", "aggregators", "attacks", "analysis", "data", "decentralized", "errors", "hub",
                "plugins", "validate"},  # attacks, hub: the LoRA study checks its attack names and reads its tokenizer
    "distributed": {"experiments", "training", "aggregators", "attacks", "data", "models", "decentralized", "errors",
                    "files", "plugins", "validate",
                    "waits"},  # files: key files and transcripts opened once, checked regular
    "cli": {"catalogue", "distributed", "studies", "experiments", "training", "aggregators", "attacks", "data",
            "models", "analysis", "signing", "hub", "errors", "plugins", "validate", "executor_cli", "decentralized",
            "__init__"},
    "executor_cli": {"experiments", "errors"},
    "__main__": {"cli"},  # python -m phalanx: the command line, nothing else
    # attacks: the Byzantine clients (flower/byzantine.py); files: their exchange of updates
    "flower": {"aggregators", "attacks", "errors", "files", "validate"},
    "decentralized": {"aggregators", "attacks", "errors", "validate", "plugins"},
    "__init__": {"errors"},
    "_spawned": set(),  # a spawned child's first import: ignores SIGINT before torch (names its initializer)
}
"""What each subpackage (or top-level module) may import from the others."""

NUMERIC = ("aggregators", "attacks", "models", "data", "analysis", "training", "decentralized")
WRITES = ("write_text", "write_bytes", "save_file", "mkdir", "unlink", "rmtree")
OS_WRITES = ("replace", "rename", "remove", "makedirs")


def _package(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0]


def _imported(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "phalanx":
            parts = node.module.split(".")
            if len(parts) > 1:
                out.add(parts[1])
            else:  # from phalanx import x: x is a subpackage, or a name of phalanx/__init__.py
                out |= {a.name if (SRC / a.name).is_dir() or (SRC / f"{a.name}.py").exists() else "__init__"
                        for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("phalanx.")}
    return out


def graph() -> dict[str, dict[str, set[str]]]:
    """package → imported package → the modules that import it."""
    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for f in sorted(SRC.rglob("*.py")):
        pkg = _package(f)
        for target in _imported(ast.parse(f.read_text())) - {pkg}:
            edges[pkg][target].add(str(f.relative_to(SRC)))
    return edges


def test_every_subpackage_imports_only_the_layers_below_it() -> None:
    bad = {(pkg, target, tuple(sorted(mods))) for pkg, deps in graph().items() for target, mods in deps.items()
           if target not in ALLOWED.get(pkg, set())}
    assert not bad, f"imports across layers: {sorted(bad)}"


def test_no_import_cycle_between_subpackages() -> None:
    edges = {pkg: set(deps) for pkg, deps in graph().items()}
    seen: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        if seen.get(node) == 1:
            raise AssertionError("import cycle: " + " → ".join([*path, node]))
        if seen.get(node) == 2:
            return
        seen[node] = 1
        for nxt in edges.get(node, ()):
            visit(nxt, [*path, node])
        seen[node] = 2

    for pkg in edges:
        visit(pkg, [])


@pytest.mark.parametrize("package", NUMERIC)
def test_the_numeric_core_writes_no_files(package: str) -> None:
    """No file-writing call in the numeric packages, except a data set's download (``data/download.py``)."""
    found = []
    for f in sorted((SRC / package).rglob("*.py")):
        if f.name == "download.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                mode = node.args[1] if name == "open" and len(node.args) > 1 else None
                writes_open = isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+")
                os_call = isinstance(fn, ast.Attribute) and getattr(fn.value, "id", "") == "os" and name in OS_WRITES
                if name in WRITES or os_call or writes_open or name == "save":
                    found.append(f"{f.relative_to(SRC)}:{node.lineno} {name}")
    assert not found, found


def test_the_graph_sees_imports_inside_functions() -> None:
    """The checker itself: an import inside a function counts (the layers would otherwise hide there)."""
    tree = ast.parse("def f():\n    from phalanx.experiments import store\n")
    assert _imported(tree) == {"experiments"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _defined_in(init: Path) -> set[str]:
    """The names a package's ``__init__.py`` binds at its top level (definitions, assignments, imports)."""
    names: set[str] = set()
    if init.exists():
        for node in ast.walk(ast.parse(init.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _submodule(package: str, name: str) -> bool:
    """Whether ``from package import name`` imports a module of the package (a ``.py`` file, a subpackage, or a
    compiled extension — built or not: a name the package's ``__init__.py`` does not bind)."""
    base = SRC.parent.joinpath(*package.split("."))
    if not base.is_dir():
        return False
    return (base / f"{name}.py").exists() or (base / name).is_dir() or name not in _defined_in(base / "__init__.py")


def module_imports(tree: ast.AST, type_only: bool) -> set[str]:
    """The phalanx modules a module imports when it runs — at module level or inside functions — and, with
    ``type_only``, also those imported only for type checking (``if TYPE_CHECKING:``)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and not type_only and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "phalanx":
            for alias in node.names:
                out.add(f"{node.module}.{alias.name}" if _submodule(node.module, alias.name) else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "phalanx")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def module_cycles(type_only: bool) -> list[list[str]]:
    """The strongly connected components (more than one module) of the package's module import graph."""
    files = {_module_name(f): f for f in SRC.rglob("*.py")}
    edges = {m: {t for t in module_imports(ast.parse(f.read_text()), type_only) if t in files and t != m}
             for m, f in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sorted(out)


def test_no_import_cycle_between_modules() -> None:
    """No two modules import each other, directly or around a loop, when they run (imports inside functions
    included): each one can be read, tested and replaced on its own."""
    assert module_cycles(type_only=False) == []


def test_no_import_cycle_even_for_type_checking() -> None:
    """Nor through imports for type checking only (``if TYPE_CHECKING:``): they do not run, but they would still
    tie the modules' types together (an algorithm sees its run through ``phalanx.training.algorithms.base.Run``, a
    gossip
    node its settings through ``phalanx.training.neighbourhood.NodeSettings``, not the classes that build them)."""
    assert module_cycles(type_only=True) == []


def test_the_cycle_checker_sees_a_cycle() -> None:
    """The checker itself, on two modules that import each other inside functions."""
    a = ast.parse("def f():\n    from phalanx.training import loop\n")
    assert module_imports(a, type_only=False) == {"phalanx.training.loop"}
    tc = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from phalanx.training.loop import Loop\n")
    assert module_imports(tc, type_only=False) == set()
    assert module_imports(tc, type_only=True) == {"phalanx.training.loop"}


DESIGN = SRC.parent.parent / "docs" / "design.md"


def layer_table(text: str) -> dict[str, set[str]]:
    """The "## Layers" table of docs/design.md: package → the packages its last column ("may import") names, each
    in backquotes (``—``: none). A row whose first cell names no package, or a package twice, is an error."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)`", cells[0])
        assert name is not None, f"a layer row that names no package: {line}"
        assert name[1] not in rows, f"the layer {name[1]} has two rows"
        rows[name[1]] = set(re.findall(r"`(\w+)`", cells[-1]))
    return rows


def test_the_design_table_is_the_allowed_imports() -> None:
    """docs/design.md's layer table says exactly what ``ALLOWED`` enforces: every package, and for each the same
    set of packages it may import."""
    assert layer_table(DESIGN.read_text()) == ALLOWED


@pytest.mark.parametrize("edit", [
    ("| `plugins` | the one registry mechanism (names, `module:attr` specs, entry points) | `errors`, `validate` |",
     "| `plugins` | the one registry mechanism (names, `module:attr` specs, entry points) | `errors` |"),  # one less
    ("| `hub` |", "| `hubs` |"),  # a renamed package
    ("| `errors` | typed errors | — |", "| `errors` | typed errors | `files` |"),  # one more
])
def test_an_edited_layer_row_fails_the_check(edit: tuple[str, str]) -> None:
    """The mutants: the table with one row edited no longer equals ``ALLOWED``."""
    text = DESIGN.read_text()
    assert edit[0] in text
    assert layer_table(text.replace(edit[0], edit[1])) != ALLOWED
