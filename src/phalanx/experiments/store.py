"""Run directories: resolved config, manifest, metrics and checkpoints, all written atomically.

Layout of a run directory::

    config.json           the resolved configuration
    manifest.json         versions, seed, data fingerprint, start time, the device it trains on (``device``, and
                          ``gpu``: the GPU's name; ``resumed_on``: the devices of later sessions, when they
                          differ), and the SHA-256 of every file below
    metrics.jsonl         one row per evaluated round (rewritten atomically at every checkpoint)
    checkpoint.safetensors  θ, worker momentum, previous aggregate, normalisation statistics, random-stream states,
                            server optimizer state (:mod:`phalanx.experiments.checkpoint`); round, and the record
                            of the sessions that trained it (:mod:`phalanx.experiments.provenance`) (atomic)
    metrics.parquet       the same rows as Parquet, written when the run finishes
    DONE                  marker of a finished run

Integrity: every file the run writes is recorded in the manifest (``artifacts``: its SHA-256 and the previous one)
*before* it replaces the old file, so a crash between the two leaves a file whose digest is one of the two recorded.
Resuming a run and reading its metrics (reports, tables, the planner) check the files they read against the manifest
and refuse a changed, truncated or missing one (:class:`~phalanx.errors.IntegrityError`); ``PHALANX_FORCE=1`` (the
CLI's ``--force``) uses them anyway. The digests are an unkeyed checksum: they catch damage and edits by hand, not
someone who rewrites a file and its digest; against that, a run's ``sign_key`` (docs/security.md). Before a grid
skips a finished run, every file it wrote is checked (:func:`check_finished`). Every file is read back with bounded
memory (:mod:`phalanx.experiments.runfiles`).

Errors: a write that fails (permission denied, disk full, ``--out`` naming a file) is an
:class:`~phalanx.errors.OutputError` naming the path; the file it was replacing is left as it was, and no temporary
file stays behind. A file that cannot be read back as Phalanx wrote it (truncated, garbage, a tensor of the wrong
shape) is a :class:`~phalanx.errors.ConfigError` naming it and the run directory to delete — this is what catches
damage in directories written before digests were recorded, and in ones used with ``--force``.

Permissions: every file written here gets the mode a plain ``open(path, "w")`` would give it, ``0o666 & ~umask``
(0644 under the usual umask 022, 0600 under 077) — not the 0600 of the temporary file it starts as
(:func:`file_mode`). Private keys are written elsewhere (:mod:`phalanx.signing`, always 0600).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from phalanx import __version__, code_digest
from phalanx.errors import ConfigError, IntegrityError, OutputError
from phalanx.experiments import checkpoint, dirfd, runfiles
from phalanx.experiments.runfiles import damaged
from phalanx.experiments.runfiles import reason as _reason
from phalanx.experiments.schema import MAX_ROWS, RESULT_NEUTRAL_KEYS
from phalanx.files import file_mode, sync_file, temporary, write_atomic
from phalanx.training import metric_rows
from phalanx.training.state import Snapshot


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an :class:`OSError` raised while writing ``path`` into an :class:`OutputError` naming it (one line: the
    cause and what to do)."""
    try:
        yield
    except OSError as exc:
        raise OutputError.of(path, exc) from None


def make_dir(path: Path) -> Path:
    """Create a directory (and its parents) if needed; an :class:`OutputError` if it cannot be (a file of that name,
    no permission, ...)."""
    with writing(path):
        path.mkdir(parents=True, exist_ok=True)
    return path


_link_refused = dirfd.link_refused


def make_run_dir(path: Path) -> Path:
    """:func:`make_dir` for a run directory, which must be a directory of its own, not a symbolic link: one planted
    by a co-user of a shared ``runs/`` folder would send every file of the run (and the lock's truncation) to
    wherever it points. Checked by opening it ``O_DIRECTORY | O_NOFOLLOW`` (:func:`phalanx.experiments.dirfd.check`);
    while a run holds it (:func:`phalanx.experiments.dirfd.held`), its writes go through that descriptor, so a swap
    after the check cannot redirect them. An :class:`OutputError` naming it otherwise."""
    dirfd.check(path)
    return path


def open_lock(path: Path) -> int:
    """A descriptor on the lock file ``path``, created if missing (as ``open(path, "w")``: the umask applies),
    opened read-write only if it is a plain file of its own: ``O_NOFOLLOW`` (a symbolic link is refused, never
    followed), ``O_NONBLOCK`` (a FIFO does not block the open), then ``fstat`` on the descriptor: a regular file with
    one link (a hard link to another file is refused too). Nothing is written before these checks, so a planted
    link can no longer make the lock's holder record truncate the file it points at. An :class:`OutputError` naming
    ``path`` otherwise."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    held = dirfd.fd_of(path.parent)  # in a held run directory: the one checked, whatever its name points at now
    try:
        fd = os.open(path, flags, 0o666) if held is None else os.open(path.name, flags, 0o666, dir_fd=held)
    except OSError as exc:
        if path.is_symlink():  # ELOOP (Linux) or EMLINK (FreeBSD): O_NOFOLLOW met a link
            raise _link_refused(path, "a symbolic link where a lock file goes") from None
        raise OutputError.of(path, exc) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "not a regular file (a FIFO, a device or a directory)" if not stat.S_ISREG(st.st_mode) else \
            f"a file with {st.st_nlink} hard links where a lock file goes"
        raise _link_refused(path, what)
    return fd


def atomic_write_bytes(path: Path, payload: bytes, mode: int | None = None) -> None:
    """Write a file so that readers see the old or the new content, never a torn one
    (:func:`phalanx.files.write_atomic`), creating its directory; an :class:`OutputError` if it cannot be written
    (the old content then stays, and no temporary file). ``mode``: the file's permissions (default what
    ``open(path, "w")`` would give; 0o600 for a private key, which is never readable by others, not even while it is
    written: the temporary file is created 0600)."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, payload, mode)


def atomic_write_text(path: Path, text: str) -> None:
    """Text version of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode())


MANIFEST = "manifest.json"
INTEGRITY_VERSION = 1


def file_digest(path: Path) -> str:
    """The SHA-256 of a regular file, hex (:func:`phalanx.experiments.runfiles.open_regular`: a symbolic link or a
    FIFO is a one-line error naming it)."""
    h = hashlib.sha256()
    with runfiles.open_regular(path) as fh:  # a symbolic link is refused, not followed; a FIFO does not block
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def recorded_fingerprint(out: Path, key: str = "data_fingerprint") -> str | None:
    """The data set's fingerprint the run directory's manifest records (``None``: no manifest, or none recorded);
    ``key="code"``: the digest of the code that started the run (:func:`phalanx.code_digest`)."""
    if not (Path(out) / MANIFEST).exists():
        return None
    value = _read_manifest(Path(out)).get(key)
    return value if isinstance(value, str) else None


def _read_manifest(out: Path, via: Path | None = None) -> dict[str, Any]:
    """The run directory's manifest, read with bounded memory (:mod:`phalanx.experiments.runfiles`); ``via``: the
    directory to read it from (:func:`phalanx.experiments.dirfd.scratch`: the held one), errors naming ``out``'s."""
    try:
        data = runfiles.read_json((via or out) / MANIFEST)
    except FileNotFoundError:
        raise IntegrityError(str(out / MANIFEST), "missing (every run directory has one)") from None
    except OSError as exc:
        raise IntegrityError(str(out / MANIFEST), f"unreadable ({type(exc).__name__})") from None
    except ConfigError as exc:
        raise IntegrityError(str(out / MANIFEST), f"unreadable ({exc.hint.split(';')[0] if exc.hint else exc})"
                             ) from None
    if not isinstance(data, dict):
        raise IntegrityError(str(out / MANIFEST), "not a JSON object")
    artifacts = data.get("artifacts", {})
    if not isinstance(artifacts, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("sha256"), str) and (e.get("previous") is None
                                                                         or isinstance(e["previous"], str))
            for e in artifacts.values()):
        raise IntegrityError(str(out / MANIFEST), "its 'artifacts' are not a map of file names to digests")
    return data


def _record(out: Path, name: str, digest: str) -> None:
    """Record ``digest`` as the file ``name``'s, keeping the one it replaces (see the module's docstring).

    ``previous`` is the digest of the file on disk now, the one the rename will replace, when it is one of the two
    recorded: after a crash between an earlier record and its rename, the disk holds the *previous* file while the
    manifest already names the new one, and a second crash in the same window must still find the disk's file
    recorded (keeping the last recorded digest there lost it: two such crashes made a run unresumable)."""
    at = dirfd.scratch(out)  # in a held run directory: the one checked, whatever its name points at now
    manifest = _read_manifest(out, at)
    artifacts = manifest.setdefault("artifacts", {})
    entry = artifacts.get(name, {})
    old = entry.get("sha256")
    if entry.get("previous") is not None and entry["previous"] != old:
        try:  # the file may be the one recorded (the usual case) or the previous one (a crash in the window)
            runfiles.size_of(at / name)  # a regular file: a FIFO would block the digest's read
            if file_digest(at / name) == entry["previous"]:
                old = entry["previous"]
        except (OSError, ValueError):  # missing, not a regular file (ConfigError is a ValueError)
            pass
    artifacts[name] = {"sha256": digest, "previous": old}
    manifest["integrity"] = INTEGRITY_VERSION
    _write_manifest(out, manifest)


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    with writing(out / MANIFEST):
        dirfd.write(out, MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())


_PINNED: dict[str, dict[str, str]] = {}
"""Run directory (its absolute path) → file → SHA-256 as a verified signature states them (:func:`pin`)."""


def pin(out: Path, digests: dict[str, str]) -> None:
    """Hold the run directory ``out``'s metric rows, for every later read in this process, to the digests a signature
    was just verified to state (``digests``: :func:`phalanx.signing.verify`'s result), not to the manifest's, which
    anyone who can write the directory recomputes: the rows a report reads are then the rows that were verified, even
    if the file was swapped since (docs/security.md). A write into ``out`` by this process lifts the pin. It lasts
    this process: every process that reports under ``verify_key`` pins for itself (a grid verifies each run it reuses,
    and each it trained under both keys: :func:`phalanx.experiments.ended.check_trained`)."""
    _PINNED[os.path.abspath(out)] = dict(digests)


def record_artifact(out: Path, name: str, digest: str) -> None:
    """Record ``digest`` as the file ``name``'s in the manifest (a file written in place, appended to: rank 0's
    transcript, :mod:`phalanx.distributed.chain`)."""
    _PINNED.pop(os.path.abspath(out), None)  # this process writes it again: what was verified is not what it holds
    _record(out, name, digest)


def write_artifact(out: Path, name: str, payload: bytes) -> None:
    """Write ``out/name`` atomically and record its digest in the manifest before it replaces the old file."""
    _PINNED.pop(os.path.abspath(out), None)  # this process writes it again: what was verified is not what it holds
    digest = hashlib.sha256(payload).hexdigest()
    with writing(out / name):
        dirfd.write(out, name, payload, before_replace=lambda _: _record(out, name, digest))


def _install(out: Path, name: str, tmp: str) -> None:
    """Give the finished temporary file ``tmp`` its permissions (:func:`file_mode`), record its digest, then move it
    to ``out/name``."""
    os.chmod(tmp, file_mode())
    _record(out, name, file_digest(Path(tmp)))
    dirfd.install(out, Path(tmp), name)  # relative to the held directory: never into a link swapped in its place


def forced() -> bool:
    """Whether the user asked to use changed files anyway (``PHALANX_FORCE=1``, the CLI's ``--force``)."""
    return os.environ.get("PHALANX_FORCE", "") not in ("", "0")


def _finish_first_write(out: Path, name: str, entry: dict[str, Any]) -> bool:
    """A process killed inside the *first* write of ``name``, after the manifest recorded the new digest and before
    the rename, leaves the digest recorded (no previous one), no ``name``, and the complete temporary file: finish
    that write (the rename) and say so. A file deleted by hand leaves no such temporary file: still refused."""
    if entry.get("previous") is not None:
        return False
    for tmp in dirfd.temporaries(out):
        try:
            if file_digest(dirfd.scratch(out) / tmp) == entry.get("sha256"):
                dirfd.install(out, dirfd.scratch(out) / tmp, name)
                return True
        except (OSError, ValueError):  # gone, or not a regular file (ConfigError is a ValueError)
            continue
    return False


def remove_temporaries(out: Path) -> int:
    """Delete the temporary files that killed writes left in a run directory (``.NAME.XXXXXXXX.tmp``: not read here);
    call it only while holding the run's lock, after the checkpoint is loaded (:func:`verify` may finish a first
    write from one). Returns how many were removed."""
    removed = 0
    for tmp in dirfd.temporaries(out):
        try:
            dirfd.unlink(out, tmp)
            removed += 1
        except OSError:
            continue
    return removed


def verify(out: Path, names: tuple[str, ...]) -> None:
    """Check the files ``names`` of a run directory against the digests its manifest recorded; an
    :class:`IntegrityError` naming the first that differs or is missing. Run directories written before digests were
    recorded (no ``integrity`` in the manifest) are not checked."""
    if forced():
        return
    manifest = _read_manifest(out)
    if manifest.get("integrity") is None:
        return
    for name in names:
        if (accepted := _accepted(out, name, manifest)) is not None:
            runfiles.size_of(out / name)  # a regular file: a FIFO or device put in its place would block or never end
            if file_digest(out / name) not in accepted:
                raise IntegrityError(str(out / name), runfiles.CHANGED)


def _accepted(out: Path, name: str, manifest: dict[str, Any]) -> tuple[Any, ...] | None:
    """The digests ``manifest`` accepts for ``out/name`` (None: not recorded, and absent); an :class:`IntegrityError`
    if it is recorded but missing (a killed first write is finished first) or present but never recorded."""
    entry = manifest.get("artifacts", {}).get(name)
    path = out / name
    if entry is None:
        if path.exists():
            raise IntegrityError(str(path), "not recorded in manifest.json (a file this run never wrote)")
        return None
    if not path.exists() and not _finish_first_write(out, name, entry):
        raise IntegrityError(str(path), "missing (manifest.json records it)")
    return entry.get("sha256"), entry.get("previous")


def check_identity(out: Path, identity: dict[str, Any], finished: bool = False) -> None:
    """That the run directory ``out`` holds the configuration ``identity``: its ``config.json`` is the file its
    manifest records (not edited or swapped in) and says the same run. A run directory is trusted by what it
    recorded, never by its name: a finished run copied under another run's name is refused, signed or not (a
    signature says who signed the files, not which run they are). A :class:`ConfigError` naming what differs."""
    cfg_path = out / "config.json"
    verify(out, ("config.json",))
    try:
        stored = runfiles.read_json_object(cfg_path)
    except FileNotFoundError:
        raise damaged(cfg_path, "missing (every run directory has one)") from None
    existing = {k: v for k, v in stored.items() if k not in RESULT_NEUTRAL_KEYS}
    resolved = {k: v for k, v in identity.items() if k not in RESULT_NEUTRAL_KEYS}
    if existing != resolved:
        changed = sorted(k for k in set(existing) | set(resolved) if existing.get(k) != resolved.get(k))
        what = "a finished run" if finished else "a directory"
        raise ConfigError(
            "run directory", str(out), f"{what} of the same configuration (differs in {', '.join(changed)})",
            "it holds another run under this run's name: use another --out or delete it",
        )


RUN_FILES = ("config.json", "metrics.jsonl", "checkpoint.safetensors", "metrics.parquet", "DONE")
"""The files every finished run has written into its directory, each recorded in the manifest."""
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")


def plain_name(name: str) -> bool:
    """Whether ``name`` is a plain file or directory name (letters, digits, ``._-``, not starting with a dot): no
    path separator, no ``..``, so joined to a folder it stays inside it."""
    return _PLAIN_NAME.fullmatch(name) is not None


def check_finished(out: Path, identity: dict[str, Any]) -> None:
    """What a grid checks before it skips a finished run as done: its recorded ``config.json`` is the file the
    manifest records and the configuration ``identity`` asked for (:func:`check_identity`), every file the run
    wrote agrees with the manifest, and the manifest's seed is the config's. All of it is unkeyed: it catches damage,
    a run copied under another's name and a careless edit, not someone who rewrites the files and the manifest
    consistently (a signature's provenance does: :mod:`phalanx.experiments.provenance`)."""
    check_identity(out, identity, finished=True)
    if forced():
        return
    manifest = _read_manifest(out)
    if manifest.get("integrity") is not None:  # every recorded file (of a plain name: no path leads elsewhere)
        recorded = {n for n in manifest.get("artifacts", {}) if _PLAIN_NAME.fullmatch(n) and n != MANIFEST}
        verify(out, tuple(sorted(recorded | {n for n in RUN_FILES if (out / n).exists()})))
    seed = manifest.get("seed")
    if "seed" in identity and seed is not None and seed != identity["seed"]:
        raise IntegrityError(str(out / MANIFEST), f"records seed {str(seed)[:20]}, but config.json says seed "
                             f"{identity['seed']} (the run is not the one its config names)")


def prepare_run_dir(
    out: Path, identity: dict[str, Any], seed: int, data_fingerprint: str, device: dict[str, str] | None = None,
) -> None:
    """Create the run directory, or check that an existing one holds the same configuration.

    ``identity`` is what names the run (a config's :meth:`~phalanx.experiments.config.RunConfig.identity`); the
    resolved configuration is written as ``config.json``, with a manifest of versions, seed, data fingerprint, the
    intra-op thread count it starts with and ``device`` (:func:`phalanx.training.devices.describe`: where the run
    trains; default the CPU).
    """
    make_run_dir(out)
    if (out / "config.json").exists():
        check_identity(out, identity)
        return
    manifest = {
        "phalanx": __version__, "code": code_digest(), "torch": torch.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "seed": seed, "data_fingerprint": data_fingerprint,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "integrity": INTEGRITY_VERSION, "artifacts": {},
        "threads": torch.get_num_threads(),  # a float result depends on it (phalanx.training.threads)
        **(device or {"device": "cpu"}),
    }
    _write_manifest(out, manifest)
    write_artifact(out, "config.json", json.dumps(identity, indent=2, sort_keys=True).encode())


def note_device(out: Path, device: dict[str, str], round_: int) -> bool:
    """Record in the manifest that an unfinished run goes on from round ``round_`` on ``device`` when that differs
    from where it last trained (the manifest's ``device`` / ``gpu``, or the last entry of ``resumed_on``); a run
    directory written before devices were recorded trained on the CPU. Returns whether it wrote. A finished run is
    left alone (its manifest may be signed)."""
    if is_finished(out):
        return False
    manifest = _read_manifest(out)
    later = manifest.get("resumed_on") or []
    last = later[-1] if later else {"device": manifest.get("device", "cpu"), "gpu": manifest.get("gpu")}
    if (last.get("device"), last.get("gpu")) == (device.get("device"), device.get("gpu")):
        return False
    manifest["resumed_on"] = [*later, {"round": round_, **device}]
    _write_manifest(out, manifest)
    return True


Provenance = Callable[[int, str, str | None], str]
"""What a checkpoint's provenance record is made by: ``(round, digest of its tensors, digest of the metric rows)`` →
the metadata value (:meth:`phalanx.experiments.provenance.Session.record`)."""


def save_checkpoint(out: Path, snap: Snapshot, provenance: Provenance | None = None,
                    extra: dict[str, str] | None = None) -> Path:
    """Write the metric rows so far, then the checkpoint (both atomically; rows first, so none are lost).

    Tensors: :func:`phalanx.experiments.checkpoint.tensors_of`; metadata: ``round``, the number of rows and, given
    ``provenance``, the record of the sessions that trained it (:mod:`phalanx.experiments.provenance`), written in
    the same rename as the tensors it describes; ``extra``: more metadata of the caller's (a keyed torchrun run's
    transcript sessions: :meth:`phalanx.distributed.transcript.Transcript.binding`), in the same rename.
    """
    state, rows = snap.state.to("cpu"), snap.rows
    payload = "".join(json.dumps(r) + "\n" for r in rows).encode()
    write_artifact(out, "metrics.jsonl", payload)
    tensors = checkpoint.tensors_of(snap, state)
    path = out / "checkpoint.safetensors"
    meta = {**(extra or {}), "round": str(state.round), "rows": str(len(rows))}
    if provenance is not None:
        digest = hashlib.sha256(payload).hexdigest() if payload else None
        meta["provenance"] = provenance(state.round, runfiles.tensors_digest(tensors), digest)
    with writing(path), temporary(dirfd.scratch(out) / path.name) as tmp:
        try:
            save_file(tensors, str(tmp), metadata=meta)
        except SafetensorError as exc:  # its I/O errors come as text ("… (os error 28)"): the OSError
            raise checkpoint.os_error(exc) from None
        checkpoint.check_written(path, str(tmp), set(tensors))
        _install(out, path.name, str(tmp))
    return path


@dataclass(frozen=True)
class Loaded:
    """A checkpoint read back: the snapshot to resume from, its metadata (the provenance record among it), the digest
    of its tensors and of the metric rows up to its round (:mod:`phalanx.experiments.provenance`)."""

    snapshot: Snapshot
    metadata: dict[str, str]
    tensors: str
    rows: str | None


def load_checkpoint(out: Path) -> Snapshot | None:
    """The last checkpoint of a run directory, with the metric rows up to it; None if there is none."""
    loaded = open_checkpoint(out)
    return None if loaded is None else loaded.snapshot


def open_checkpoint(out: Path, rounds: int | None = None) -> Loaded | None:
    """The last checkpoint of a run directory (of a run of ``rounds`` rounds, when given), with the metric rows up
    to it; None if there is none. It is opened once, hashed against the manifest, its header checked against its size
    before anything is loaded, then read: one descriptor (:func:`~phalanx.experiments.runfiles.load_checked`)."""
    ckpt = out / "checkpoint.safetensors"
    verify(out, ("config.json",))
    manifest = {} if forced() else _read_manifest(out)
    loaded = runfiles.load_checked(ckpt, _accepted(out, ckpt.name, manifest) if manifest.get("integrity") else None)
    verify(out, ("metrics.jsonl",))
    if loaded is None:
        return None
    header, tensors = loaded
    meta = header.metadata
    try:
        round_ = int(meta["round"])
        n_rows = int(meta["rows"]) if "rows" in meta else None
    except (KeyError, ValueError):
        raise damaged(ckpt, f"its metadata has no valid round ({str(meta.get('round'))[:40]!r})") from None
    if round_ < 0 or (rounds is not None and round_ > rounds):
        raise damaged(ckpt, f"its metadata has round {round_}, outside 0 … {rounds if rounds is not None else '∞'}")
    checkpoint.check_tensors(ckpt, tensors)
    rows, digest = rows_upto(out, round_)
    if n_rows is not None and len(rows) < n_rows:
        raise damaged(out / "metrics.jsonl", f"{len(rows)} rows up to round {round_}, but the checkpoint of that "
                      f"round was written after {n_rows} (rows are missing)")
    snap = checkpoint.snapshot_of(tensors, round_, rows)
    return Loaded(snap, meta, runfiles.tensors_digest(tensors), digest)


def finish_run(out: Path, rows: list[dict[str, Any]]) -> None:
    """Write the final metrics (JSON lines and Parquet) and mark the run finished."""
    write_artifact(out, "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    write_parquet(out / "metrics.parquet", rows)
    write_artifact(out, "DONE", (time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n").encode())


def is_finished(out: Path) -> bool:
    """Whether a run directory holds a finished run."""
    return (out / "DONE").exists()


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows to Parquet through DuckDB, atomically and durably (temporary file, fsync, rename, directory fsync)."""
    import duckdb

    at = dirfd.scratch(path.parent) / path.name  # in a held run directory: the one checked (phalanx.experiments.dirfd)
    with writing(path), temporary(at, ".jsonl.tmp") as tmp_json, temporary(at) as tmp:
        tmp_json.write_text("".join(json.dumps(r) + "\n" for r in rows))
        con = duckdb.connect()
        try:
            con.execute(
                f"COPY (SELECT * FROM read_json_auto('{tmp_json}', format='newline_delimited')) TO '{tmp}' "
                "(FORMAT parquet)"
            )
        except duckdb.IOException as exc:
            raise OutputError(str(path), _reason(exc), "fix that (free space, permissions), then run the same "
                              "command again") from None
        finally:
            con.close()
        sync_file(tmp)  # DuckDB closes its file without an fsync (strace: no fsync, no fdatasync)
        if (path.parent / MANIFEST).exists():  # a run directory's: recorded like every file it writes
            _install(path.parent, path.name, str(tmp))
        else:
            os.chmod(tmp, file_mode())
            dirfd.install(path.parent, tmp, path.name)  # the rename, then its directory synced


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Read the metric rows of a run directory (JSON lines), checked against the manifest's digest; streamed with
    bounded memory (:func:`phalanx.experiments.runfiles.jsonl_lines`)."""
    return rows_upto(path, None)[0]


def rows_upto(path: Path, round_: int | None) -> tuple[list[dict[str, Any]], str | None]:
    """The metric rows of a run directory up to round ``round_`` (all: ``None``) and the SHA-256 of their lines as
    the file holds them (``None`` for no rows: what a provenance record compares). At most
    :data:`~phalanx.experiments.schema.MAX_ROWS` + 1 rows are read; a line longer than
    :data:`~phalanx.experiments.runfiles.MAX_ROW_BYTES`, nested too deeply or not a row is one line naming the
    file. A run directory pinned to a verified signature (:func:`pin`) must hold, in the bytes read here, the signed
    file: an :class:`IntegrityError` otherwise."""
    metrics = path / "metrics.jsonl"
    signed = None if forced() else _PINNED.get(os.path.abspath(path), {}).get("metrics.jsonl", "") or None
    if not metrics.exists():
        if signed is not None:
            raise IntegrityError(str(metrics), "missing (its signature, verified earlier, covers it)")
        return [], None
    if (path / MANIFEST).exists() or (path / "config.json").exists():
        verify(path, ("metrics.jsonl",))
    rows: list[dict[str, Any]] = []
    h, whole, shared = hashlib.sha256(), hashlib.sha256(), metric_rows.Interner()
    for number, line in runfiles.jsonl_lines(metrics):
        whole.update(line)
        if not line.strip():
            continue
        if metric_rows.crowded(line):
            raise damaged(metrics, f"line {number} holds more {{ and [ than a metric row can (not parsed)")
        try:
            row = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise damaged(metrics, f"line {number} is not UTF-8 text (byte {exc.start})") from None
        except json.JSONDecodeError as exc:
            cut = not line.endswith(b"\n")
            raise damaged(metrics, f"line {number} is {'cut short' if cut else 'not JSON'} ({exc.msg})") from None
        except RecursionError:
            raise damaged(metrics, f"line {number} is JSON nested too deeply") from None
        except ValueError:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits)
            raise damaged(metrics, f"line {number} holds a number too long to read") from None
        if (why := metric_rows.problem(row)) is not None:
            raise damaged(metrics, f"line {number} is not a metric row: {why}")
        if round_ is None or row["round"] <= round_:
            if len(rows) > MAX_ROWS:
                raise damaged(metrics, f"more than {MAX_ROWS + 1:,} metric rows (the most a run writes)")
            try:
                rows.append(shared.row(row))
            except ValueError as exc:
                raise damaged(metrics, f"line {number} is not a metric row: {exc}") from None
            h.update(line)
    if signed is not None and whole.hexdigest() != signed:  # these bytes, not the file verified: the pin's reason
        raise IntegrityError(str(metrics), "changed since its signature was verified (its SHA-256 differs from the "
                             "signed one)")
    return rows, (h.hexdigest() if rows else None)


DIVERGED = "DIVERGED"
"""The marker of a run whose model became non-finite (:mod:`phalanx.experiments.runstate`)."""


def is_diverged(out: Path) -> bool:
    """Whether ``out`` holds a run that diverged: a ``DIVERGED`` marker, which must be the file the manifest records
    (:func:`verify`) — a marker planted by hand is an :class:`IntegrityError`, never a reason to skip or count a
    run."""
    if not (out / DIVERGED).exists():
        return False
    verify(out, (DIVERGED,))
    return True


def finished_rows(path: Path) -> list[dict[str, Any]]:
    """The metric rows of a finished run, by round; a :class:`ConfigError` if the run has not finished."""
    rows = read_rows(path)
    if not rows or not is_finished(path):
        raise ConfigError("run", str(path), "a finished run (run it first)")
    return sorted(rows, key=lambda r: r["round"])
