"""Peak memory of loading LEAF's text sets (Shakespeare, Sent140), as a multiple of the split's files' size.

docs/data.md quotes these figures (the "LEAF JSON" row): the worst trees that ``phalanx.data.leaf.check_text_cost``
accepts — for each number of samples and files, the shortest strings it lets through — and rows of LEAF's own shapes
(80-character Shakespeare lines, Sentiment140-shaped rows). The peak is ``tracemalloc``'s over ``phalanx.data.load``
(the parse, the checks and the conversion to arrays), divided by the bytes of the train and test files; the bound
``tests/test_data_leaf_hostile.py::test_text_codes_stay_within_a_documented_multiple_of_the_files`` asserts is
24 × + 2 MiB.

    PYTHONPATH=src .venv/bin/python benchmarks/leaf_memory.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from phalanx import data
from phalanx.data import leaf
from phalanx.data.base import DataFormatError

SENTIMENT140_ROW = ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "_TheSpecialOne_",
                    "@switchfoot http://twitpic.com/2y1zl - Awww, that's a bummer. You shoulda got David Carr"]


def _document(users: dict[str, Any]) -> dict[str, Any]:
    return {"users": list(users), "num_samples": [len(u["y"]) for u in users.values()], "user_data": users}


def _tree(name: str, x: Any, samples: int, files: int, separators: tuple[str, str] = (",", ":")) -> Path:
    """A LEAF folder (``train/``, ``test/``) of ``files`` train files of ``samples`` copies of ``x`` each; compact
    JSON by default (an attacker's smallest file), ``json.dump``'s own separators as LEAF's scripts write them."""
    root = Path(tempfile.mkdtemp(prefix="leaf-memory-"))
    for split in ("train", "test"):
        (root / split).mkdir()
    y = "a" if name == "shakespeare" else 0
    for index in range(files):
        users = {f"u{index}": {"x": [x] * samples, "y": [y] * samples}}
        (root / "train" / f"{index:05d}.json").write_text(json.dumps(_document(users), separators=separators))
    (root / "test" / "a.json").write_text(json.dumps(_document({"u": {"x": [x], "y": [y]}})))
    return root


def _sample(name: str, length: int) -> Any:
    return "a" * length if name == "shakespeare" else [0, 0, 0, 0, "a" * length]


def _peak(name: str, root: Path) -> tuple[int, int, str]:
    """(files' bytes, tracemalloc peak of loading, "loaded" or the refusal)."""
    size = sum(p.stat().st_size for p in root.rglob("*.json"))
    tracemalloc.start()
    try:
        data.load(name, root=root)
        outcome = "loaded"
    except DataFormatError as error:
        outcome = "refused (" + str(error)[-60:] + ")"
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return size, peak, outcome


def worst_accepted(name: str, samples: int, files: int) -> None:
    """The shortest strings the conversion check accepts for this tree's shape, and their peak."""
    padded = 80 if name == "shakespeare" else 144
    for length in range(0, 400):
        root = _tree(name, _sample(name, length), samples, files)
        try:
            leaf.check_text_cost(leaf.read_leaf_dir(root / "train"), padded, "w")
            break
        except DataFormatError:
            shutil.rmtree(root)
    else:
        raise SystemExit(f"{name}: no length up to 400 accepted")
    size, peak, outcome = _peak(name, root)
    shutil.rmtree(root)
    print(f"{name:11s} worst accepted: {samples:>7,} samples × {files:<3} file(s), strings of {length:>3}: files "
          f"{size:>10,} B, peak {peak:>11,} B = {peak / size:5.1f} × ({(peak - 2 ** 21) / size:5.1f} × after 2 MiB) "
          f"{outcome}", flush=True)


def conversion_ratio(name: str, train: Path) -> float:
    """What :func:`phalanx.data.leaf.check_text_cost` compares with its 16 × budget: the conversion's bytes over the
    train split's files' bytes (inputs padded to 80 for Shakespeare, 144 for Sent140)."""
    split = leaf.read_leaf_dir(train)
    padded = 80 if name == "shakespeare" else 144
    return len(split.x) * (padded * 5 + leaf.TEXT_SAMPLE_BYTES) / split.size


def real_shaped(name: str, x: Any, samples: int) -> None:
    root = _tree(name, x, samples, 1, separators=(", ", ": "))  # json.dump's defaults: LEAF's own files
    ratio = conversion_ratio(name, root / "train")
    size, peak, outcome = _peak(name, root)
    shutil.rmtree(root)
    print(f"{name:11s} {'80-character lines' if name == 'shakespeare' else 'Sentiment140 rows':18s}: {samples:>7,} "
          f"samples: conversion {ratio:4.1f} × the train files (the check's budget: 16 ×); files {size:>10,} B, peak "
          f"{peak:>11,} B = {peak / size:5.1f} × {outcome}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small trees only (seconds)")
    args = parser.parse_args()
    shapes = [(20_000, 1), (1_000, 20)] if args.quick else [(100_000, 1), (20_000, 1), (1_000, 20), (400, 100)]
    for name in ("shakespeare", "sent140"):
        for samples, files in shapes:
            worst_accepted(name, samples, files)
    real_shaped("shakespeare", "abcdefghij" * 8, 5_000 if args.quick else 25_000)
    real_shaped("sent140", SENTIMENT140_ROW, 5_000 if args.quick else 25_000)
    shipped = Path(leaf.__file__).parent / "_files" / "sent140-sample" / "train"
    print(f"sent140     the shipped sent140-sample: conversion {conversion_ratio('sent140', shipped):4.1f} × the train "
          "files", flush=True)


if __name__ == "__main__":
    main()
