"""Every test the docs name exists: a claim in ``docs/`` or the README names the test that would fail if it were
false (``tests/test_x.py::test_name``, or a prefix ending in ``…``), and a test renamed or moved to another file —
four of the sealed mesh's moved this week — must take its references with it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"tests/(test_[A-Za-z0-9_]+\.py)::(test_[A-Za-z0-9_]+)(…)?")


def dangling(texts: dict[str, str], tests: Path) -> list[str]:
    """The references in ``texts`` (name → text) to a test file under ``tests`` that is missing, or that defines no
    test of that name (of that prefix, for a name ending in ``…``)."""
    found = []
    for name, text in texts.items():
        for m in REFERENCE.finditer(text):
            path = tests / m.group(1)
            source = path.read_text(encoding="utf-8") if path.is_file() else ""
            pattern = rf"def {re.escape(m.group(2))}" + ("" if m.group(3) else r"\(")
            if not re.search(pattern, source):
                found.append(f"{name}: {m.group(0)}")
    return found


def test_every_test_the_docs_name_exists() -> None:
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
             for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
    assert dangling(texts, ROOT / "tests") == []


def test_a_moved_or_renamed_test_is_found(tmp_path: Path) -> None:
    """The check's mutant inputs: a test moved to another file, a renamed one, a prefix that matches nothing."""
    (tmp_path / "test_a.py").write_text("def test_kept(x):\n    pass\n\ndef test_prefix_long_name():\n    pass\n")
    texts = {"doc.md": "`tests/test_a.py::test_kept`, `tests/test_a.py::test_prefix_…`, "
                       "`tests/test_b.py::test_kept`, `tests/test_a.py::test_gone`, `tests/test_a.py::test_other_…`"}
    assert dangling(texts, tmp_path) == ["doc.md: tests/test_b.py::test_kept", "doc.md: tests/test_a.py::test_gone",
                                         "doc.md: tests/test_a.py::test_other_…"]
