"""What a grid trusts a run that has ended for, before it skips it and reports its rows.

A run ends finished (``DONE``) or diverged (``DIVERGED``: its model became non-finite; it would diverge again). Both
are skipped by a grid and both are reported, so both are held to the same checks, in one place (:func:`check`):

* its recorded ``config.json`` is the file the manifest records and the configuration asked for, and every file it
  wrote — the ``DIVERGED`` marker among them — agrees with the manifest
  (:func:`phalanx.experiments.store.check_finished`); its checkpoint's record, if it has one, names this run and ends
  at the checkpoint and rows on disk (:func:`phalanx.experiments.provenance.check_recorded`);
* under ``verify_key``: its signature holds and every round was trained under the key
  (:func:`phalanx.experiments.provenance.require`), and its metric rows are held to the digest the verified
  signature states for every later read in this process (:func:`phalanx.experiments.store.pin`): the rows a report
  prints are the rows verified, not the file as it is by then (a time-of-check/time-of-use swap is refused). A
  diverged run is never signed (no directory signature, no final checkpoint), so under ``verify_key`` it is refused
  in one line — never skipped on the marker's word.

A run a grid *trains* under both ``sign_key`` and ``verify_key`` is verified and pinned the same way once the grid's
runs are done (:func:`check_trained`): its rows were read back by name at report time, and the pin of the process
that wrote them (a worker's) ends with that process.

Without a key all of it is an unkeyed checksum (docs/security.md, "Without a key").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phalanx import signing
from phalanx.experiments import provenance, store
from phalanx.experiments.provenance import ProvenanceError
from phalanx.experiments.schema import RunConfig


def refuse_diverged_under_key(run_dir: Path, verify_key: str | None) -> None:
    """A :class:`ProvenanceError` naming ``run_dir`` if it diverged and a ``verify_key`` asks for signed results: a
    diverged run carries no signature to verify."""
    if verify_key is not None and not store.is_finished(run_dir) and store.is_diverged(run_dir):
        raise ProvenanceError(str(run_dir), "it diverged, and a diverged run is never signed: under verify_key its "
                              "rows cannot be verified", f"delete {run_dir} to train it again under sign_key, or "
                              "leave out verify_key to use it unverified")


def check(run_dir: Path, cfg: RunConfig) -> None:
    """Before a grid skips the ended run in ``run_dir`` as the run ``cfg``: the checks of the module's docstring;
    one-line errors (:class:`~phalanx.errors.ConfigError`, :class:`~phalanx.errors.IntegrityError`,
    :class:`~phalanx.signing.SignatureError`, :class:`ProvenanceError`) naming the file or directory."""
    check_ended(run_dir, cfg.identity(), cfg.verify_key)


def check_ended(run_dir: Path, identity: dict[str, Any], verify_key: str | None) -> None:
    """:func:`check` for the run of configuration ``identity``: also what a run's engine calls on a directory it
    opens to train and finds finished — by a process it waited for, or by whoever can write the output directory
    while the grid ran (before, such a run was reported unchecked under ``verify_key``: an attacker's review)."""
    refuse_diverged_under_key(run_dir, verify_key)
    digests = None
    if verify_key is not None:  # its results will be used: the signed files, trained under the key
        digests = signing.verify(run_dir, verify_key)
    store.check_finished(run_dir, identity)  # trusted by what it recorded, not by its name
    if not store.is_finished(run_dir):
        store.is_diverged(run_dir)  # a DIVERGED marker the manifest does not record is refused
    provenance.check_recorded(run_dir, identity)  # its checkpoint's own record names this run and matches it
    if verify_key is not None and digests is not None:
        provenance.require(run_dir, Path(verify_key))
        store.pin(run_dir, digests)


def check_trained(run_dir: Path, cfg: RunConfig) -> None:
    """After a grid trained the run ``cfg`` into ``run_dir`` under ``sign_key`` *and* ``verify_key``: the checks of
    :func:`check`, its verified rows pinned for the reads that follow in this process. Its rows were written by this
    installation, but read back by name at report time: in a worker process (whose pin ends with it), or in this one
    (a write lifts the pin), and a swap made while the grid trained its other runs reached the report checked against
    the unkeyed manifest only. A run trained without ``sign_key`` carries no signature to verify (docs/security.md);
    a diverged one is never signed."""
    if cfg.verify_key is not None and cfg.sign_key is not None and store.is_finished(run_dir):
        check(run_dir, cfg)
