"""``phalanx config show``: a config (a file, the built-in job, ``--set`` overrides) as its tree of sections or as
the flat keys its run id is computed from (:mod:`phalanx.experiments.tree`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli.common import app, console

config_app = typer.Typer(help="Show a config as its tree of sections or its flat keys.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def show(
    config: Annotated[Path | None, typer.Argument(help="TOML config (default: the built-in default job).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set rule.f=2 (repeatable).")]
    = None,
    flat: Annotated[bool, typer.Option("--flat/--tree", help="The flat keys (what the run id is computed from) "
                                       "instead of the tree (the default).")] = False,
) -> None:
    """Print the config as TOML: its tree of sections (--tree, the default) or its flat keys (--flat).
    Either reads back as the same runs with the same run ids. A config 'phalanx run' refuses is refused here, by
    the same one validation, with the same one line."""
    from phalanx.cli.runs import _validated_grid
    from phalanx.experiments import spelling, tree, treetext
    from phalanx.experiments.config import load_grid

    _validated_grid(config, set_ or [])  # what `phalanx run` would refuse is refused before anything is printed
    data, _ = spelling.detach(load_grid(config, set_ or []))
    text = treetext.dumps(data if flat else tree.to_tree(data))
    console.print(text, end="", soft_wrap=True, highlight=False, markup=False)
