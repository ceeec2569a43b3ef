"""A grid's spawned processes ignore the terminal's Ctrl-C from their first Phalanx import (``phalanx._spawned``),
before torch: a Ctrl-C to the process group while the workers were still importing printed a 50-line traceback and
"Aborted." (issue 38)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from phalanx import _spawned

# Python's own handler first: a suite started in the background (``cmd &``) inherits SIGINT ignored
PROBE = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); {flag}import phalanx._spawned; "
         "print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN, 'torch' in sys.modules, "
         "'phalanx.experiments' in sys.modules)")


def _probe(flag: bool) -> str:
    code = PROBE.format(flag="sys.argv.append('--multiprocessing-fork'); " if flag else "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_a_spawned_child_ignores_sigint_at_its_first_import_and_before_torch() -> None:
    """In a spawned child (its command line ends in ``--multiprocessing-fork``) importing the module ignores SIGINT
    and imports neither torch nor ``phalanx.experiments`` (whose package imports torch: the former initializers'
    module, the mutant, took one to three seconds to import with Python's KeyboardInterrupt handler in place)."""
    assert _probe(flag=True) == "True False False"


def test_the_parent_importing_it_keeps_its_handler() -> None:
    """The grid's own process imports the module for the initializers' names: its SIGINT handler stays (it must
    hear the Ctrl-C that stops the grid)."""
    assert _probe(flag=False) == "False False False"


def test_the_pool_and_the_manager_get_the_light_initializers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The worker pool and the progress queue's manager are handed ``phalanx._spawned.run`` with their initializer's
    name, so a child unpickles that module first. Mutant: ``local._worker_init`` handed directly (its module imports
    torch)."""
    from phalanx.experiments import local

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    class FakeManager:
        def __init__(self, ctx: Any) -> None:
            pass

        def start(self, initializer: Any, initargs: tuple[Any, ...] = ()) -> None:
            seen["manager"] = (initializer, initargs)

        def __enter__(self) -> FakeManager:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    class FakePool:
        def __init__(self, max_workers: int, mp_context: Any, initializer: Any, initargs: tuple[Any, ...]) -> None:
            seen["pool"] = (initializer, initargs)
            raise Stop

    monkeypatch.setattr(local, "SyncManager", FakeManager)
    monkeypatch.setattr(local, "ProcessPoolExecutor", FakePool)
    executor = local.LocalExecutor(jobs=2)
    with pytest.raises(Stop):
        executor._run_parallel([], local.Hooks(), local.Outcome())  # type: ignore[attr-defined]
    assert seen == {"manager": (_spawned.run, ("phalanx.experiments.local:_manager_init",)),
                    "pool": (_spawned.run, ("phalanx.experiments.local:_worker_init",))}


def test_the_command_lines_children_re_import_the_light_module_as_their_main(tmp_path: Path) -> None:
    """Spawn re-imports the parent's main module first of all: the console script's is the whole command line
    (typer, rich; about a second in which a Ctrl-C ended a starting worker with a traceback). For pip's wrapper
    (``re``, ``sys``, ``main`` and nothing else) the entry point's ``_light_main`` names ``phalanx._spawned`` instead;
    a script of one's own that sets something up before calling ``main`` keeps its main module (its workers
    re-import it, as a test harness's instrumentation needs). Mutant: the wrapper left as it is (its path)."""
    wrapper = ("import re\nimport sys\nfrom phalanx.cli import main\n{own}"
               "if len(sys.argv) > 1:\n    sys.modules['phalanx.cli']._light_main()\n"
               "__import__('multiprocessing.spawn')\n"
               "print(sys.modules['multiprocessing.spawn'].get_preparation_data('probe').get('init_main_from_name'), "
               "bool(sys.modules['multiprocessing.spawn'].get_preparation_data('probe').get('init_main_from_path')))\n")

    def prepared(own: str, *args: str) -> list[str]:
        script = tmp_path / "phalanx"
        script.write_text(wrapper.format(own=own))
        return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                              check=True).stdout.split()

    assert prepared("", "light") == ["phalanx._spawned", "False"]
    assert prepared("") == ["None", "True"]  # the mutant: no _light_main
    assert prepared("RULES = ['mine']\n", "light") == ["None", "True"]  # a script of one's own keeps its main
