"""The run directory as a callback of the training loop: checkpoints every ``checkpoint_every`` rounds and at the
end, the final metrics and the ``DONE`` marker (formats: :mod:`phalanx.experiments.store`). Every checkpoint carries
the record of the sessions that trained it, signed at each checkpoint with a signing key
(:mod:`phalanx.experiments.provenance`): a run resumes under a signing key only if every earlier session was signed
by it, and the finished directory is signed (:class:`SignDirectory`, after everything else has written); with a
public key a signed directory is verified before it resumes (:mod:`phalanx.signing`). The manifest records the
device the run trains on (and a later session's, when it resumes on another:
:func:`phalanx.experiments.store.note_device`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx import signing
from phalanx.data.base import Dataset
from phalanx.experiments import dirfd, provenance, store
from phalanx.training import devices
from phalanx.training.experiment import Experiment
from phalanx.training.loop import Callback, Loop, RoundInfo
from phalanx.training.state import Snapshot


class RunDirectory(Callback):
    """Writes one run's directory; :meth:`open` prepares it and returns the checkpoint to resume from, if any."""

    def __init__(
        self, path: Path, identity: dict[str, Any], *, seed: int, fingerprint: str, checkpoint_every: int,
        rounds: int, sign_key: str | None = None, verify_key: str | None = None, device: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.identity = identity
        self.seed = seed
        self.fingerprint = fingerprint
        self.every = checkpoint_every
        self.rounds = rounds
        self.sign_key = sign_key
        self.verify_key = verify_key
        self.device = device or {"device": "cpu"}
        """Where the run trains, as the manifest records it (:func:`phalanx.training.devices.describe`)."""
        self.session: provenance.Session | None = None
        """This training session's provenance (:meth:`open` sets it, unless the run has finished)."""
        self.metadata: Callable[[], dict[str, str]] | None = None
        """More checkpoint metadata, asked for at each checkpoint (a keyed torchrun run's rank 0 binds its
        transcript's sessions to the checkpoint: :meth:`phalanx.distributed.transcript.Transcript.binding`)."""

    @classmethod
    def of(
        cls, path: Path, identity: dict[str, Any], exp: Experiment, checkpoint_every: int, *,
        sign_key: str | None = None, verify_key: str | None = None,
    ) -> RunDirectory:
        """The run directory of ``exp`` (its seed, rounds, data set's fingerprint and device), named by
        ``identity``."""
        fingerprint = exp.dataset.fingerprint() if isinstance(exp.dataset, Dataset) else ""
        return cls(path, identity, seed=exp.seed, fingerprint=fingerprint, checkpoint_every=checkpoint_every,
                   rounds=exp.rounds, sign_key=sign_key, verify_key=verify_key, device=devices.describe(exp.device))

    def open(self) -> Snapshot | None:
        """Create the directory (or check that it holds the same configuration); the last checkpoint, if any. With
        a public key, a directory that carries a signature is verified first (an unfinished run has none yet). An
        unfinished run's checkpoint must match its provenance record and, with a signing key, have been trained
        under that key from round 0 (:func:`phalanx.experiments.provenance.open_session`); with a public key, under
        that key (:func:`phalanx.experiments.provenance.require_resumable`): a run made to look unfinished is not
        resumed from a record anyone can write."""
        if self.verify_key is not None and (self.path / signing.SIGNATURE).exists():
            signing.verify(self.path, self.verify_key)
        store.prepare_run_dir(self.path, self.identity, self.seed, self.fingerprint, self.device)
        loaded = store.open_checkpoint(self.path, self.rounds)
        start = None if loaded is None else loaded.snapshot
        if not store.is_finished(self.path):
            at = chain = None
            if loaded is not None:
                at = provenance.Point(loaded.snapshot.state.round, loaded.tensors, loaded.rows)
                chain = provenance.read_chain(self.path / "checkpoint.safetensors", loaded.metadata)
            self.session = provenance.open_session(self.path, self.identity, self.fingerprint, chain, at,
                                                   self.sign_key)
            if self.verify_key is not None and at is not None:  # what it resumes from is what it reports
                provenance.require_resumable(self.path, self.session.chain, Path(self.verify_key))
        store.note_device(self.path, self.device, 0 if start is None else start.state.round)
        store.remove_temporaries(self.path)  # what killed writes left (the caller holds the run's lock)
        return start

    def _record(self) -> store.Provenance | None:
        return None if self.session is None else self.session.record

    def checkpoints(self, done: int) -> bool:
        """Whether a checkpoint is due once ``done`` rounds are finished: every ``checkpoint_every`` and at the end."""
        return done % self.every == 0 or done == self.rounds

    def _extra(self) -> dict[str, str] | None:
        return None if self.metadata is None else self.metadata()

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        if self.checkpoints(loop.state.round):
            store.save_checkpoint(self.path, loop.snapshot(), self._record(), self._extra())

    def on_abort(self, loop: Loop, snapshot: Snapshot) -> str | None:
        return str(store.save_checkpoint(self.path, snapshot, self._record(), self._extra()))

    def on_finish(self, loop: Loop) -> None:
        store.finish_run(self.path, loop.rows)

    def signer(self) -> SignDirectory | None:
        """The callback that signs the finished directory (with a signing key): it must come after every callback
        that still writes into the directory when the run finishes (torchrun's ``distributed.json``, the
        transcript)."""
        return None if self.sign_key is None else SignDirectory(self.path, self.sign_key)


class SignDirectory(Callback):
    """Signs a finished run directory (:func:`phalanx.signing.sign`): the last callback that touches it."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key

    def on_finish(self, loop: Loop) -> None:
        if not dirfd.still_named(self.path):  # the library walks the directory by name: not a swapped-in one
            raise dirfd.link_refused(self.path, "no longer the run directory this run checked and wrote (replaced "
                                     "while it ran), so it is not signed")
        signing.sign(self.path, self.key)


@dataclass
class OpenedRun:
    """A run directory held by this process: the directory callback, the checkpoint to resume from (None: a fresh
    run) and, for a run that has finished already, its metric rows (then nothing is to be trained)."""

    directory: RunDirectory
    start: Snapshot | None
    finished: list[dict[str, Any]] | None


@contextmanager
def opened(
    path: Path, identity: dict[str, Any], exp: Experiment, checkpoint_every: int, *, sign_key: str | None = None,
    verify_key: str | None = None, wait: bool = False,
) -> Iterator[OpenedRun]:
    """Hold the run directory ``path`` for one run, as every engine does it: its lock (:func:`runstate.locked`;
    ``wait`` for a holder to finish), a ``FAILED`` marker on an error inside the block, the directory prepared or
    checked to hold the same configuration, the checkpoint to resume from — and the two ways a run can be over
    already: finished (its rows are returned, nothing trains) or diverged (:class:`~phalanx.training.divergence.
    Diverged` is raised again, at the same round, instead of training into the same divergence)."""
    from phalanx.experiments import ended, runstate

    directory = RunDirectory.of(path, identity, exp, checkpoint_every, sign_key=sign_key, verify_key=verify_key)
    with runstate.locked(directory.path, wait=wait), runstate.recording_failure(directory.path):
        start = directory.open()
        if store.is_finished(directory.path):  # finished (perhaps by the process this one waited for): checked
            ended.check_ended(directory.path, identity, verify_key)  # as a run the grid skips is, before its rows
            yield OpenedRun(directory, start, store.read_rows(directory.path))
            return
        ended.refuse_diverged_under_key(directory.path, verify_key)  # never signed: nothing to verify
        again = runstate.diverged_again(directory.path)
        if again is not None:  # it would diverge at the same round again
            raise again
        yield OpenedRun(directory, start, None)
