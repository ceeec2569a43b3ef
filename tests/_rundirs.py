"""What the tests of hostile run directories share: a finished run to copy and attack, and the attacker's moves —
recompute the manifest's digests after an edit, strip the manifest's ``integrity`` so its files are read unchecked —
and the assertion that an error is one line naming what it must.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from phalanx.experiments import make_config, train

FINISHED = {"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 4, "eval_every": 2, "checkpoint_every": 2}
"""The configuration of :func:`finished`: four rounds, checkpoints at rounds 2 and 4."""


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished, unsigned run directory (:data:`FINISHED`), trained once a module: copy it before attacking it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train(make_config(FINISHED), out)
    return out


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two signing key pairs (PEM files): ``key``/``pub``, the victim's; ``other``/``other_pub``, a co-user's."""
    from phalanx import signing

    d = tmp_path_factory.mktemp("keys")
    key, pub = signing.keygen(d / "k.pem", d / "k.pub")
    other, other_pub = signing.keygen(d / "o.pem", d / "o.pub")
    return {"key": key, "pub": pub, "other": other, "other_pub": other_pub}


def sha(path: Path) -> str:
    """The SHA-256 of a file, hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rehash(d: Path) -> None:
    """What the attacker does after an edit: recompute every digest the manifest records, drop the deleted files, and
    record ``metrics.jsonl``, ``DIVERGED`` and ``config.json`` when they exist (an unkeyed checksum)."""
    manifest = json.loads((d / "manifest.json").read_text())
    artifacts = manifest["artifacts"]
    for name in list(artifacts):
        if (d / name).exists():
            artifacts[name] = {"sha256": sha(d / name), "previous": None}
        else:
            del artifacts[name]
    for name in ("metrics.jsonl", "DIVERGED", "config.json"):
        if (d / name).exists():
            artifacts[name] = {"sha256": sha(d / name), "previous": None}
    (d / "manifest.json").write_text(json.dumps(manifest))


def forge_rows(d: Path, acc: float) -> None:
    """The attacker's rows: every evaluated round after round 0 reports the test accuracy ``acc``."""
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    for r in rows:
        if r["round"] > 0:
            r["test_accuracy"] = acc
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def reported(out: Path, seed: int) -> float:
    """The final accuracy the report reads for the run of ``seed`` under ``out``."""
    from phalanx.experiments import report

    rows = [r for r in report.collect(out) if r["seed"] == seed]
    return float(max(rows, key=lambda r: r["round"])["test_accuracy"])


def legacy(d: Path) -> None:
    """A run directory as written before digests were recorded: what the attacker makes of one to skip the manifest
    (its files are then read as they are)."""
    manifest = json.loads((d / "manifest.json").read_text())
    manifest.pop("integrity", None)
    (d / "manifest.json").write_text(json.dumps(manifest))


def one_line(exc: BaseException, *needles: str) -> str:
    """``exc``'s message, asserted to be one line, no traceback, holding every one of ``needles``."""
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text, text
    for needle in needles:
        assert needle in text, (needle, text)
    return text


def file_states(d: Path) -> dict[str, tuple[int, bytes]]:
    """Each file's inode and bytes: a write by name replaces the inode (an atomic rename) even where the same config
    and seed rewrite the same bytes, an append changes the bytes."""
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in d.iterdir()}


def swap_for_link(run: Path, victim: Path) -> Path:
    """The attacker's move: the checked run directory renamed away, a link to ``victim`` put in its place."""
    moved = run.with_name(run.name + ".moved")
    os.rename(run, moved)
    run.symlink_to(victim)
    return moved
