"""The project's rule, kept: every Python module of the package, the benchmarks, the scripts and the tests is at
most 600 lines (a module has one job; the benchmarks' federated and training scripts had reached 1,022 and 873 lines
unnoticed, because only ``scripts/seam_counts.py`` counted, and only ``src``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 600
FOLDERS = ("src", "benchmarks", "scripts", "tests")


def over_limit(root: Path, folders: tuple[str, ...] = FOLDERS, limit: int = LIMIT) -> list[tuple[str, int]]:
    """The modules under ``root``'s ``folders`` longer than ``limit`` lines, with their lengths."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > limit:
                found.append((str(path.relative_to(root)), lines))
    return found


def test_every_module_is_at_most_600_lines() -> None:
    assert over_limit(ROOT) == []


def test_the_count_finds_a_module_one_line_over(tmp_path: Path) -> None:
    """The check's mutant input: a 601-line module is found, a 600-line one is not."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "src" / "fits.py").write_text("x = 1\n" * LIMIT)
    assert over_limit(tmp_path, ("src",)) == [("src/long.py", LIMIT + 1)]
