"""The ``phalanx`` command line. Nothing in the package imports this module.

One module per command group (``common``: the app and its consoles; ``listing``, ``analysis``, ``configs``, ``runs``,
``signatures``, ``studies``; ``output``: tables in every ``--format``); importing this package registers them all.
"""

from __future__ import annotations

from phalanx.cli import analysis, configs, listing, runs, signatures, studies  # noqa: F401  (registers their commands)
from phalanx.cli.common import app, console
from phalanx.cli.runs import BUDGET_ENV, _announce, _eta, _LogProgress, _trained_eta
from phalanx.errors import PhalanxError

__all__ = ["BUDGET_ENV", "_LogProgress", "_announce", "_eta", "_trained_eta", "app", "console", "main"]


def main() -> None:
    """Entry point of the ``phalanx`` script: configuration errors become one clear line, exit code 2; a grid stopped
    by SIGINT / SIGTERM one line too (how many runs finished, how to resume), exit code 130 / 143."""
    import signal
    import sys

    from rich.markup import escape

    _light_main()
    try:
        status = _run_app()
    except PhalanxError as exc:
        # one line, as the error says it: no wrapping at the terminal's width, no markup read from the message
        code = getattr(exc, "exit_code", None)
        prefix = "[red]error:[/red] " if code is None else ""
        console.print(f"{prefix}{escape(str(exc))}", soft_wrap=True, highlight=False)
        raise SystemExit(2 if code is None else code) from None
    except BaseException as exc:
        signals = sys.modules.get("phalanx.experiments.signals")  # loaded by every command that handles signals
        if signals is None or not isinstance(exc, signals.StopRequested):
            raise
        # a signal between two steps of a command (outside a run): every file written so far is complete
        console.print(f"interrupted by {signal.Signals(exc.signum).name}: run the same command again to go on "
                      "(finished runs are skipped)", soft_wrap=True, highlight=False)
        raise SystemExit(128 + exc.signum) from None
    raise SystemExit(status)


def _run_app() -> int:
    """Run the app as click would stand alone, except that a usage error — an out-of-range option, an unknown option
    or command, a missing argument — is one line naming the parameter, its allowed range and where help is, exit
    code 2 (click's own is a usage line, a hint line and a three-line box: issue 38). Help, ``--version``,
    ``typer.Exit`` and Ctrl-C keep click's exit codes; every command returns None, so a returned value is one."""
    import click
    from rich.markup import escape

    try:
        code = app(standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # a bare group: its help, as click prints it alone
        from typer import rich_utils

        rich_utils.rich_format_error(exc)
        return exc.exit_code
    except click.ClickException as exc:
        message = " ".join(exc.format_message().split())
        context = getattr(exc, "ctx", None)
        where = f" (`{context.command_path} --help`)" if context is not None else ""
        console.print(f"[red]error:[/red] {escape(message)}{escape(where)}", soft_wrap=True, highlight=False)
        return exc.exit_code
    except click.Abort:
        console.print("Aborted!", highlight=False)
        return 1
    return code if isinstance(code, int) else 0


def _light_main() -> None:
    """Name ``phalanx._spawned`` as the main module a grid's spawned process re-imports. Multiprocessing's ``spawn``
    re-imports the parent's main module before anything else, and the console script's is ``from phalanx.cli import
    main`` — the whole command line, typer and rich: for about a second a Ctrl-C to the process group (a terminal's)
    ended a starting worker there with a traceback, and the grid said "Aborted." (issue 38). ``phalanx._spawned``
    imports nothing heavy and ignores SIGINT at once in a spawned child. Only for the console script itself — a
    main module that holds :func:`main` and nothing of its own (pip's wrapper: ``re``, ``sys``, ``main``): a script
    of a user's (or a test harness's) that sets things up and then calls :func:`main` keeps its main module, which
    its workers re-import as before."""
    import importlib.util
    import sys

    main_module = sys.modules.get("__main__")
    if main_module is None or getattr(main_module, "main", None) is not main:
        return
    own = {k for k in vars(main_module) if not k.startswith("__")}
    spec = importlib.util.find_spec("phalanx._spawned")
    if own <= {"re", "sys", "main"} and spec is not None:
        main_module.__spec__ = spec


if __name__ == "__main__":  # pragma: no cover
    main()
