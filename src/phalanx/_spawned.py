"""The first Phalanx module a grid's spawned process imports: it makes the process deaf to the terminal's Ctrl-C
before anything heavy is imported.

Why. A ``spawn`` child of CPython starts with no signal blocked and with Python's own SIGINT handler (the one that
raises ``KeyboardInterrupt``), whatever the parent's mask — measured here on CPython 3.11: a parent's
``pthread_sigmask`` block is not kept. It then unpickles its process object, whose initializer, when it lived in
``phalanx.experiments.local``, imported torch first: for one to three seconds a Ctrl-C to the process group (what a
terminal sends) ended the child inside that import, with a 50-line traceback, and the grid said "Aborted." (issue 38).
Setting SIGINT to ignored in the parent while it starts the children would be inherited, but another thread of the
parent (torch's) then takes the parent's own Ctrl-C and drops it — measured: 2 of 4 interrupts lost.

What. The initializer the grid hands to its worker pool and progress-queue manager is this module's
:func:`run`; unpickling it imports this module, which — in a spawned child only (its command line ends in
``--multiprocessing-fork``) — ignores SIGINT at once, before torch or any Phalanx package. What is left of the
window is the interpreter's start and the standard library's multiprocessing, some tens of milliseconds. The
parent imports the module for :func:`run`'s name alone."""

from __future__ import annotations

import signal
import sys

if "--multiprocessing-fork" in sys.argv:  # a spawned child bootstrapping: the grid decides when it stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run(target: str) -> None:
    """An initializer named by ``"module:function"`` (``phalanx.experiments.local:_worker_init``), imported when it
    runs — after this module has ignored SIGINT — and called. The grid passes ``run`` with the name as its
    initializer's argument: unpickling them imports this module alone (a name, not the function: this module
    imports nothing of Phalanx, the layers' rule, tests/test_layers.py)."""
    import importlib

    module, _, name = target.partition(":")
    getattr(importlib.import_module(module), name)()
