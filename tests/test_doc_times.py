"""Every time the newcomer's path quotes comes with its load (issue 38 item 2): docs/start.md's table "How long each
step takes" gives, for each command, what was measured and the load it was measured at (or says it was not
measured, or that the step is a GPU or cluster step), and every command of the README's "Command line" block that
trains or measures something has a row there. The checks run on the real pages and on mutants of them (a row
without its load, a README command without a row, a row with no figure), each of which they reject."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE_TITLE = "## How long each step takes"
TRAINS = re.compile(r"^phalanx (?:experiment [a-z][\w-]*|tension (?:paper|theory|plan)|demo|epsilon|kappa"
                    r"|(?:run|sweep) examples/\S+)")


def table_rows(start_md: str) -> list[list[str]]:
    """The cells of every body row of the table under :data:`TABLE_TITLE` (header and rule left out)."""
    section = start_md.split(TABLE_TITLE, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in rows[2:]]


def row_problems(rows: list[list[str]]) -> list[str]:
    """What a row lacks: a command, a figure (or 'not measured' / a GPU or cluster step), a load."""
    bad = []
    for cells in rows:
        if len(cells) != 5:
            bad.append(f"{cells}: 5 cells (step, command, measured, load, GPU / cluster?)")
            continue
        _, command, measured, load, where = cells
        gpu = "GPU" in where or "cluster" in where
        if not re.search(r"`[^`]+`", command):
            bad.append(f"{command!r}: no command")
        if not (re.search(r"\d", measured) or "not measured" in measured or (gpu and measured == "—")):
            bad.append(f"{command}: no measured figure")
        if not load or (load == "—" and re.search(r"\d", measured) and not gpu):
            bad.append(f"{command}: a figure without its load")
    return bad


def key(command: str) -> str:
    """A command's identity for the match: its program, subcommand and first argument (its first words)."""
    words = command.split()
    return " ".join(words[:2] if words[1] in ("demo", "epsilon", "kappa") else words[:3])


def uncovered(readme: str, rows: list[list[str]]) -> list[str]:
    """The README's "Command line" commands that train or measure and have no row in the table."""
    block = readme.split("## Command line", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    covered = {key(m.group(1)) for cells in rows for m in re.finditer(r"`(phalanx [^`]+)`", cells[1])}
    return [c for c in commands if TRAINS.match(c) and key(c) not in covered]


def _pages() -> tuple[str, str]:
    return (ROOT / "README.md").read_text(encoding="utf-8"), (ROOT / "docs" / "start.md").read_text(encoding="utf-8")


def test_every_quoted_step_has_its_figure_and_load_and_every_readme_command_a_row() -> None:
    readme, start = _pages()
    rows = table_rows(start)
    assert len(rows) >= 10
    assert row_problems(rows) == []
    assert uncovered(readme, rows) == []


def test_the_checks_reject_their_mutants() -> None:
    """A row whose load was dropped, a row with no figure, a README command with no row: each is caught."""
    readme, start = _pages()
    rows = table_rows(start)
    demo = next(i for i, r in enumerate(rows) if r[1] == "`phalanx demo`")
    no_load = [list(r) for r in rows]
    no_load[demo][3] = ""
    assert row_problems(no_load) == ["`phalanx demo`: a figure without its load"]
    no_figure = [list(r) for r in rows]
    no_figure[demo][2] = "quick"
    assert row_problems(no_figure) == ["`phalanx demo`: no measured figure"]
    extra = readme.replace("phalanx experiment --help",
                           "phalanx experiment async --preset quick\nphalanx experiment --help")
    assert uncovered(extra, rows) == ["phalanx experiment async --preset quick"]
    assert uncovered(readme, [r for r in rows if r[1] != "`phalanx demo`"]) == ["phalanx demo"]
