"""A hostile run directory handed to ``phalanx audit`` (or left for a resume) cannot run code, exhaust memory or hang
it (issue 38: the attacker's review, branch attack38, findings 4–8). Each case plays the hostile directory, and a
mutant — the code before the fix put back with ``monkeypatch`` — shows the check is what refuses it.

1. ``config.json`` naming ``aggregator = "pwn:Rule"`` with ``pwn.py`` importable: refused in one line naming the key
   and the file, never imported (:func:`phalanx.plugins.no_spec_imports`).
2. ``config.json``, ``manifest.json``, ``allow-list.json`` a symbolic link (to ``/dev/zero``, or to a file outside the
   directory) or a FIFO: one line, nothing followed, nothing blocks
   (:func:`phalanx.experiments.runfiles.open_regular`).
3. A 1 TiB sparse transcript the manifest records: refused by its size before it is hashed.
4. A transcript line of zeros as long as the limit the directory's own n and d allow: refused after one chunk.
5. ``distributed.json`` on resume: a list, an extra field, not UTF-8, a link, a FIFO, too large — one
   :class:`ConfigError` naming it.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from _fifo import unblocked
from phalanx.distributed import audit as audit_mod
from phalanx.distributed import keys as keys_mod
from phalanx.distributed import runfacts
from phalanx.distributed.audit import audit
from phalanx.distributed.keys import AllowList, init_keys
from phalanx.distributed.recording import DistributedLog, RoundLog, log_bytes
from phalanx.distributed.transcript import CHUNK, TRANSCRIPT, Lines, Unreadable, size_bound
from phalanx.errors import ConfigError


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys") / "job"
    init_keys(d, 4)
    return d


def run_dir(tmp: Path, keys: Path, config: dict[str, Any] | None = None) -> Path:
    """A run directory as a hostile party hands it over: the allow-list's copy, a config, a manifest, a header."""
    d = tmp / "run"
    d.mkdir()
    (d / "allow-list.json").write_bytes((keys / "allow-list.json").read_bytes())
    cfg = config or {"rounds": 10, "topology": "server", "workers": 4}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "manifest.json").write_text('{"artifacts": {}}')
    (d / TRANSCRIPT).write_bytes(b'{"format": 3}\n')
    return d


# -- 1. a recorded config's module:attr spec is refused, never imported -------------------------------------------

PWN = "import pathlib, os\npathlib.Path(os.environ['PHALANX_TEST_PWN']).write_text('ran')\nclass Rule:\n    pass\n"


def _pwned_dir(tmp: Path, keys: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, str]:
    module = f"pwn_{os.getpid()}_{tmp.name}".replace("-", "_")
    d = run_dir(tmp, keys, {"algorithm": "fedbuff", "aggregator": f"{module}:Rule", "dataset": "digits",
                            "model": "logreg", "rounds": 2, "workers": 4, "byzantine": 0, "f": 0, "attack": "none",
                            "topology": "server"})
    (d / f"{module}.py").write_text(PWN)
    marker = tmp / "marker"
    monkeypatch.setenv("PHALANX_TEST_PWN", str(marker))
    monkeypatch.syspath_prepend(str(d))  # as `python -m phalanx.cli audit .` run from inside the directory
    monkeypatch.delitem(sys.modules, module, raising=False)
    return d, marker, module


def test_a_recorded_configs_module_attr_spec_is_refused_naming_key_and_file_never_imported(
        keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, marker, module = _pwned_dir(tmp_path, keys, monkeypatch)
    report = audit(d)
    text = " | ".join(report.problems)
    assert f"aggregator='{module}:Rule' is invalid" in text and str(d / "config.json") in text, text
    assert "is not imported" in text
    assert not marker.exists() and module not in sys.modules


def test_the_mutant_that_imports_a_recorded_configs_spec_runs_the_run_directorys_code(
        keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import phalanx.plugins

    @contextmanager
    def before_the_fix(origin: str) -> Iterator[None]:
        yield

    monkeypatch.setattr(phalanx.plugins, "no_spec_imports", before_the_fix)
    d, marker, module = _pwned_dir(tmp_path, keys, monkeypatch)
    audit(d)
    assert marker.read_text() == "ran"
    sys.modules.pop(module, None)


def test_outside_a_recorded_config_a_spec_still_resolves() -> None:
    from phalanx.plugins import import_spec, no_spec_imports

    assert import_spec("phalanx.errors:ConfigError", "aggregator") is ConfigError
    with no_spec_imports("run/config.json"), pytest.raises(ConfigError, match=r"run/config\.json is a recorded"):
        import_spec("phalanx.errors:ConfigError", "aggregator")
    assert import_spec("phalanx.errors:ConfigError", "aggregator") is ConfigError


# -- 2. links and FIFOs in place of the directory's small files ---------------------------------------------------

def _plant(path: Path, how: str, outside: Path) -> None:
    path.unlink()
    if how == "zero":
        os.symlink("/dev/zero", path)
    elif how == "outside":
        os.symlink(outside, path)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("how", ["zero", "outside", "fifo"])
@pytest.mark.parametrize("name", ["config.json", "manifest.json"])
def test_a_link_or_fifo_for_config_or_manifest_is_one_problem_line(keys: Path, tmp_path: Path, name: str,
                                                                    how: str) -> None:
    d = run_dir(tmp_path, keys)
    outside = tmp_path / "elsewhere.json"
    outside.write_text((d / name).read_text())
    _plant(d / name, how, outside)
    report = audit(d)
    what = "not a regular file" if how == "fifo" else "a symbolic link, not followed"
    reader = "the run directory's config.json" if name == "config.json" else "the manifest"
    assert any(p.startswith(f"{reader} cannot be read ({what}") for p in report.problems), report.problems


@pytest.mark.parametrize("how", ["zero", "outside", "fifo"])
def test_a_link_or_fifo_for_the_directorys_allow_list_is_one_config_error(keys: Path, tmp_path: Path,
                                                                           how: str) -> None:
    d = run_dir(tmp_path, keys)
    _plant(d / "allow-list.json", how, keys / "allow-list.json")
    what = "not a regular file" if how == "fifo" else "a symbolic link, not followed"
    with pytest.raises(ConfigError, match=rf"allow-list=.*allow-list.json.*\({what}") as err:
        audit(d)
    assert "\n" not in str(err.value)


def test_a_list_the_user_names_may_be_a_link_but_not_a_fifo(keys: Path, tmp_path: Path) -> None:
    link = tmp_path / "mine.json"
    os.symlink(keys / "allow-list.json", link)
    assert AllowList.load(link).size == 4
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(ConfigError, match="not a regular file"):
        AllowList.load(tmp_path / "fifo.json")


def test_the_mutants_follow_the_link_out_of_the_directory(keys: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The readers before the fix (``stat`` then ``read_bytes``: the link followed) read a file outside the
    directory — with ``/dev/zero``, without end (not played: it exhausts memory)."""
    d = run_dir(tmp_path, keys)
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"rounds": 7, "topology": "server", "workers": 4}))
    _plant(d / "config.json", "outside", outside)
    _plant(d / "allow-list.json", "outside", keys / "allow-list.json")
    monkeypatch.setattr(runfacts, "read_json", lambda path, limit: json.loads(Path(path).read_bytes()))
    monkeypatch.setattr(keys_mod, "open_regular", lambda path, follow=False: open(path, "rb"))
    report = audit(d)
    assert not any("config.json cannot be read" in p for p in report.problems), report.problems
    assert report.allow_list.endswith("allow-list.json (the run directory's copy)")


@pytest.mark.parametrize("how", ["fifo", "link"])
def test_a_checkpoint_planted_as_a_fifo_or_a_link_to_one_is_unreadable_without_blocking(
        keys: Path, tmp_path: Path, how: str) -> None:
    """``checkpoint.safetensors`` a FIFO (or a link to one outside the directory): the audit's reading of the
    checkpoint's metadata (and the resume's, :func:`~phalanx.distributed.binding.checkpoint_metadata`) says it is
    unreadable at once; before the fix it opened the file by name and blocked for ever (a writer from this side
    unblocks it: :func:`_fifo.unblocked`)."""
    d = run_dir(tmp_path, keys)
    fifo = tmp_path / "elsewhere" if how == "link" else d / "checkpoint.safetensors"
    os.mkfifo(fifo)
    if how == "link":
        os.symlink(fifo, d / "checkpoint.safetensors")
    facts, blocked = unblocked(lambda: runfacts.RunFacts.read(d, audit_mod.AuditReport()), fifo)
    assert not blocked, "reading the checkpoint's metadata blocked on the FIFO"
    assert facts.reached is None and facts.binding == "an unreadable checkpoint", facts
    report, blocked = unblocked(lambda: audit(d), fifo)
    assert not blocked and isinstance(report, audit_mod.AuditReport), report


# -- 3. the transcript's size is checked before it is hashed -----------------------------------------------------

def test_a_huge_sparse_transcript_the_manifest_records_is_refused_by_size_unhashed(
        keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = run_dir(tmp_path, keys)
    (d / "manifest.json").write_text(json.dumps({"artifacts": {TRANSCRIPT: {"sha256": "00"}}}))
    hashed: list[int] = []
    real = audit_mod._digest
    monkeypatch.setattr(audit_mod, "_digest", lambda fh: hashed.append(1) or real(fh))
    os.truncate(d / TRANSCRIPT, 1 << 40)  # 1 TiB, no disk used
    report = audit(d)
    bound = size_bound(10, 4, 11, "server")
    assert report.problems == [f"{TRANSCRIPT} has {1 << 40} bytes, more than the {bound} a transcript of 10 rounds "
                               "and 4 ranks can have: not read"], report.problems
    assert hashed == []
    # the spy sees a hash: the same file within its bound is hashed, and found not to be the manifest's
    os.truncate(d / TRANSCRIPT, 14)
    report = audit(d)
    assert hashed == [1] and f"{TRANSCRIPT} is not the file the manifest records" in report.problems[0]


@pytest.mark.parametrize("rounds", ["10", None, 0, -3, True, 1.5], ids=repr)
def test_a_huge_sparse_transcript_is_refused_unhashed_when_the_config_names_no_valid_rounds(
        keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounds: object) -> None:
    """``config.json``'s ``rounds`` not a valid count (nothing to bound the transcript by): the 1 TiB sparse file is
    refused by an absolute cap, one line, never hashed (before, the size check was skipped and the audit hashed the
    whole file: hours of CPU). The spy counts the hashes; the file's first chunk of zeros is all a line read costs."""
    d = run_dir(tmp_path, keys, {"rounds": rounds, "topology": "server", "workers": 4})
    (d / "manifest.json").write_text(json.dumps({"artifacts": {TRANSCRIPT: {"sha256": "00"}}}))
    hashed: list[int] = []
    monkeypatch.setattr(audit_mod, "_digest", lambda fh: hashed.append(1) or "not hashed")
    os.truncate(d / TRANSCRIPT, 1 << 40)
    report = audit(d)
    assert hashed == [], "the transcript was hashed before its size was bounded"
    cap = audit_mod.NO_ROUNDS_BYTES
    assert report.problems == [f"{TRANSCRIPT} has {1 << 40} bytes, more than the {cap} the audit reads when the run's "
                               "config.json names no valid rounds: not read"], report.problems
    os.truncate(d / TRANSCRIPT, 14)  # within the cap: hashed (and the spy's digest is not the manifest's)
    audit(d)
    assert hashed == [1]


# -- 4. a line of the limit the directory chose costs one chunk ---------------------------------------------------

class Counting(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.read_bytes = 0

    def readline(self, size: int | None = -1) -> bytes:  # type: ignore[override]
        line = super().readline(size)
        self.read_bytes += len(line)
        return line


def test_a_line_of_zeros_is_refused_after_one_chunk_whatever_the_limit() -> None:
    fh = Counting(b'{"type":"header"}\n' + bytes(8 * CHUNK))
    lines = Lines(fh)
    assert lines.next(1 << 10) is not None
    with pytest.raises(Unreadable, match="line 2 is not JSON as a transcript writes it"):
        lines.next(1 << 30)
    assert fh.read_bytes <= 18 + CHUNK


def test_the_mutant_reading_the_line_whole_reads_every_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Lines, "_line", lambda self, limit, where: self.fh.readline(limit + 1))
    fh = Counting(b'{"type":"header"}\n' + bytes(8 * CHUNK))
    lines = Lines(fh)
    lines.next(1 << 10)
    with pytest.raises(Unreadable):
        lines.next(1 << 30)
    assert fh.read_bytes == 18 + 8 * CHUNK


def test_a_long_honest_line_is_read_whole_across_chunks() -> None:
    line = json.dumps({"type": "x", "body": "A" * (3 * CHUNK + 5)}).encode() + b"\n"
    got = Lines(io.BytesIO(line + line)).next(4 * CHUNK)
    assert got is not None and got[0] == line


# -- 4b. what parsing a line costs: crowded lines refused unparsed, the rest bounded -----------------------------

SIZE = 1 << 20


def _fill(prefix: bytes, unit: bytes, suffix: bytes) -> bytes:
    return prefix + unit * ((SIZE - len(prefix) - len(suffix)) // len(unit)) + suffix + b"\n"


CROWDED = {  # what the bounds refuse: the densest shapes json.loads turns into objects (47x the line, before)
    "dicts": _fill(b'{"type":"step","updates":[', b"{},", b"{}]}"),
    "lists": _fill(b'{"type":"step","updates":[', b"[],", b"[]]}"),
    "keys": b'{"missing":{' + b"".join(b'"%05d":0,' % i for i in range(SIZE // 10)) + b'"k":0},"type":"round"}\n',
    "strings": _fill(b'{"missing":[', b'"ab",', b'"a"],"type":"round"}'),
}
THROUGH = {  # what the bounds let through (the densest of each kind), and a writer's densest and bulkiest lines
    "journal-items": _fill(b'{"rounds":[', b'{"accepted":[],"missing":[],"round":0},',
                           b'{"accepted":[],"missing":[],"round":1}],"type":"journal"}'),
    "one-long-string": _fill(b'{"type":"step","updates":[{"body":"', b"A", b'"}]}'),
    "integers": _fill(b'{"missing":[', b"100000,", b'1],"type":"round"}'),
    "floats": _fill(b'{"missing":[', b"1.5,", b'1],"type":"round"}'),
    "strings": _fill(b'{"missing":[', b'"abcdefghij",', b'"a"],"type":"round"}'),
    "dicts": _fill(b'{"missing":[', b'{"k":"abcdefghijklmnopqrstuvwxyz12"},', b'{}],"type":"round"}'),
    "lists": _fill(b'{"missing":[', b"[1000000,1000001],", b'[]],"type":"round"}'),
    "keys": b'{"missing":{' + b"".join(b'"%08d":1234,' % i for i in range(SIZE // 12 - 4))
            + b'"k":0},"type":"round"}\n',
}


def _peak(line: bytes) -> tuple[float, str]:
    """tracemalloc's peak while Lines reads and parses ``line``, over its size, and what became of it."""
    import tracemalloc

    json.loads(b"{}")  # (the parser's first use allocates its own tables)
    fh = io.BytesIO(line)
    tracemalloc.start()
    try:
        Lines(fh).next(len(line))
        became = "parsed"
    except Unreadable as exc:
        became = str(exc)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / len(line), became


@pytest.mark.parametrize("kind", list(CROWDED))
def test_a_line_crowded_with_small_objects_is_refused_before_it_is_parsed(kind: str) -> None:
    """A 1 MiB line of empty dicts, empty lists, short keys or short strings is refused on its byte counts, having
    cost what reading it costs (its chunks and their join), never what parsing it would."""
    factor, became = _peak(CROWDED[kind])
    assert f"holds more {kind} than a transcript's line of" in became, became
    assert factor < 2.5, factor


@pytest.mark.parametrize("kind", ["dicts", "lists"])
def test_the_mutant_without_the_bounds_parses_a_crowded_line_at_many_times_its_size(
    kind: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from phalanx.distributed import lines as lines_mod

    monkeypatch.setattr(lines_mod, "_crowded", lambda raw: None)
    factor, became = _peak(CROWDED[kind])
    assert became == "parsed" and factor > 20, (factor, became)


@pytest.mark.parametrize("kind", list(THROUGH))
def test_what_a_line_the_bounds_let_through_costs_is_bounded(kind: str) -> None:
    """Every shape the bounds let through — at the densest they allow, and a writer's densest (journal items) and
    bulkiest (one long string) lines — parses at most 11× its size (measured: 3.0× for one long string, 9.7× for
    journal items, at most 10.5× for a hostile shape; docs/security.md)."""
    factor, became = _peak(THROUGH[kind])
    assert became == "parsed", became
    assert factor <= (3.2 if kind == "one-long-string" else 11.0), factor


def test_a_rejection_group_sampling_a_peers_brackets_is_read() -> None:
    """The text of a rejection group's samples is a peer's to choose (a claimed link, a reason): a group whose kind
    and samples are all brackets, colons and quotes is still read (:data:`~phalanx.distributed.lines.FREE`); the
    mutant without that allowance refuses a genuine transcript's line."""
    from phalanx.distributed import lines as lines_mod

    text = '[{":' * 75
    line = json.dumps({"type": "rejected", "round": 0, "at": None, "rank": 1, "peer": None, "kind": text[:120],
                       "count": 2, "samples": [text, text]}, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    assert Lines(io.BytesIO(line)).next(len(line)) is not None
    lines_mod.FREE, free = 0, lines_mod.FREE
    try:
        with pytest.raises(Unreadable, match="holds more"):
            Lines(io.BytesIO(line)).next(len(line))
    finally:
        lines_mod.FREE = free


def test_the_depth_check_costs_its_depth_not_a_tuple_per_item() -> None:
    """The nesting check after parsing walks one iterator per level; the mutant — the former walk, a stack of a
    (value, depth) tuple per item — holds another copy of the line's objects (here 100,000 integers)."""
    import tracemalloc

    from phalanx.distributed.lines import MAX_DEPTH, _depth

    def former(obj: Any) -> int:
        deepest, stack = 0, [(obj, 1)]
        while stack:
            item, d = stack.pop()
            if isinstance(item, dict | list):
                deepest = max(deepest, d)
                if d <= MAX_DEPTH:
                    stack.extend((x, d + 1) for x in (item.values() if isinstance(item, dict) else item))
        return deepest

    obj = {"a": [list(range(1000, 101_000))], "b": [[[[[[[0]]]]]]]}
    for walk in (_depth, former):
        assert walk(obj) == MAX_DEPTH + 1
    costs = []
    for walk in (_depth, former):
        tracemalloc.start()
        walk(obj)
        costs.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert costs[0] < 4096 < 1_000_000 < costs[1], costs


# -- 5. distributed.json on resume ---------------------------------------------------------------------------------

def _loop(rounds: int = 10, at: int = 5) -> Any:
    return SimpleNamespace(resumed=True, state=SimpleNamespace(round=at), experiment=SimpleNamespace(rounds=rounds))


ROW = {"round": 0, "seconds": 1.5, "missing": [2], "sent": 10, "received": 20}
HOSTILE_LOGS: dict[str, bytes | None] = {
    "a JSON list": b"[]",
    "an extra field": json.dumps({"rounds": [{**ROW, "x": 1}]}).encode(),
    "a string round": json.dumps({"rounds": [{**ROW, "round": "0"}]}).encode(),
    "a rank beyond the job": json.dumps({"rounds": [{**ROW, "missing": [4]}]}).encode(),
    "an infinite time": b'{"rounds": [{"round": 0, "seconds": Infinity, "missing": [], "sent": 0, "received": 0}]}',
    "not UTF-8": b"\xff\xfe",
    "too many rows": json.dumps({"rounds": [ROW] * 12}).encode(),
    "too large": b" " * (log_bytes(10, 4) + 1),
    "a link to /dev/zero": None,
    "a FIFO": None,
}


@pytest.mark.parametrize("case", list(HOSTILE_LOGS))
def test_a_hostile_distributed_json_is_one_config_error_naming_it(tmp_path: Path, case: str) -> None:
    path = tmp_path / "distributed.json"
    content = HOSTILE_LOGS[case]
    if case == "a FIFO":
        os.mkfifo(path)
    elif content is None:
        os.symlink("/dev/zero", path)
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"distributed\.json") as err:
        DistributedLog(path, "server", 4, lambda r: False).on_start(_loop())
    assert "\n" not in str(err.value)


def test_the_mutant_reading_distributed_json_by_name_gives_tracebacks(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def before_the_fix(self: DistributedLog, loop: Any) -> None:
        logged = json.loads(self.path.read_text())["rounds"]
        self.log = [RoundLog(**r) for r in logged if r["round"] < loop.state.round]

    monkeypatch.setattr(DistributedLog, "on_start", before_the_fix)
    for case in ("a JSON list", "an extra field", "not UTF-8"):
        path = tmp_path / f"{len(case)}.json"
        path.write_bytes(HOSTILE_LOGS[case] or b"")
        with pytest.raises((TypeError, UnicodeDecodeError)) as err:
            DistributedLog(path, "server", 4, lambda r: False).on_start(_loop())
        assert not isinstance(err.value, ConfigError)


def test_an_honest_distributed_json_is_read_back_to_the_checkpoints_round(tmp_path: Path) -> None:
    path = tmp_path / "distributed.json"
    log = DistributedLog(path, "server", 4, lambda r: False)
    log.log = [RoundLog(t, 0.25 * t, [3] if t % 2 else [], 100 * t, 200 * t) for t in range(10)]
    log.write()
    again = DistributedLog(path, "server", 4, lambda r: False)
    again.on_start(_loop(10, 6))
    assert again.log == log.log[:6]
    missing = DistributedLog(tmp_path / "none.json", "server", 4, lambda r: False)
    missing.on_start(_loop())
    assert missing.log == []
