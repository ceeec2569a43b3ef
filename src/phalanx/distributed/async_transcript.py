"""The transcript of a keyed *asynchronous* run (:mod:`phalanx.distributed.async_server`): one ``step`` line per
server step, and the audit's check of it, which recomputes the step from what it records.

The synchronous transcript (:mod:`phalanx.distributed.transcript`) binds a row to a *round*; an asynchronous update
is bound to the model *version* it was computed at — the version label rank 0 sent with θ *and* SHA-256 of that θ,
both under the worker's signature (not the step t) — and a step aggregates updates of several versions. So a keyed
asynchronous run's transcript holds, instead of ``round`` lines (and with ``"dim": d`` in its header)::

    step  {"type": "step", "round": t,
           "updates": [{"rank": j, "version": v, "staleness": t − v, "sha256": <hex 64>, "signature": <hex 128>,
                        "theta": <hex 64>, "body": <base64 of the update's d values>}, …],
           "rows": [<hex 64>, …], "result": <hex 64>}

— the updates step t aggregated, in the order the server took them, each with its worker's Ed25519 signature over (run
nonce, config, **version**, rank, SHA-256 of SHA-256(θ) ‖ the body) (:func:`~phalanx.distributed.sealed.signed_message`,
made by the worker over the θ it computed at, checked by the links before the update was used, and its θ digest by the
server against the θ it published as that version: :class:`~phalanx.distributed.async_server.SealedArrivals`); ``theta``
is that SHA-256(θ); the SHA-256 of each row the algorithm's
:meth:`~phalanx.training.algorithms.asynchronous.Asynchronous.assemble` made of them (FedBuff: Δᵢ/√(1 + sᵢ), Nguyen et
al., AISTATS 2022; BASGD: the buffer means, Yang & Li, ICML 2021); and the SHA-256 of the rule's result over those rows
(what the server steps θ by, before the learning rate).

**What the audit checks** (:class:`StepCheck`, for each step line, besides the file's own checks in
:mod:`phalanx.distributed.audit`): each update is a worker's (rank 1 … n − 1, on the allow-list; rank 0 computes
nothing), once per step; its body is d values and, after its θ digest, hashes to the recorded SHA-256; every update of
one version carries one θ digest and version 0's is θ₀'s, which the config's seed fixes — so a rank 0 that sends two
workers different θ under one version label, or another θ₀, is refused (the review's I1); the signature verifies with
*that rank's* key for this session's nonce, the config and the version — so neither rank 0 nor a Byzantine worker
holding its own valid key can put an update in another rank's name; 0 ≤ version ≤ t and no older than its session's
first round (a resumed server never published an older version: it drops one, ``unpublished``), the recorded staleness
is t − version and at most ``max_staleness``; a worker's versions increase from step to step (the server keeps each
worker's freshest and drops an older one after a newer: :attr:`~phalanx.distributed.async_buffer.Buffer.newest`) — so a
step that keeps a worker's older update after a newer one was aggregated is refused; the values are finite; the step is
one the algorithm takes — ``full`` of the recorded order is exactly its length (FedBuff: exactly K updates; BASGD: the
shortest prefix that puts an update in every buffer), so the rule never runs over rows the algorithm never makes; the
rows are ``assemble`` of the recorded updates and staleness, digest for digest; and the result is the run's rule over
those rows, digest for digest, when the rule takes no context (a stateful, stochastic or centred rule's result is
recorded but not recomputed: the audit does not hold its state — counted in
:attr:`~phalanx.distributed.audit.AuditReport.results_unchecked`). Whatever ``full``, ``assemble`` or the rule raises on
what the file holds is that step's problem line, never an exception out of the audit. A non-finite row or result
recomputed digest for digest from finite updates (an overflow that a Byzantine worker's huge finite values cause under
a non-robust rule) is what an honest server computes, so it is not refused — that would let a worker frame rank 0; the
0/0 of an empty BASGD buffer is refused, as a step the algorithm does not take.

A **zero step** (the filter rejected every live worker's update of the newest version) is a step line with no
updates, θₜ and the rejected updates: :mod:`phalanx.distributed.async_zero` says what it holds and what the audit
checks of it (:class:`~phalanx.distributed.async_zero.ZeroCheck`).

What it cannot prove: that the server did not leave out an update it received (an update that never appears in
the transcript leaves no trace the audit can read), or that θ moved by the recorded result.

**Size.** A step line holds at most n − 1 updates of d values: at most :func:`step_bytes` bytes, one per step — what
an attacker can make the server record is bounded by K ≤ n − 1 and d, whatever it sends.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from phalanx.distributed import wire
from phalanx.distributed.async_filters import rows_unchecked
from phalanx.distributed.async_zero import ZERO_KEYS, ZeroCheck, zero_fields
from phalanx.distributed.sealed import signed_message
from phalanx.errors import PhalanxError

if TYPE_CHECKING:
    from phalanx.distributed.async_buffer import Update
    from phalanx.training.experiment import Experiment

STEP_KEYS = {"type", "round", "updates", "rows", "result"}
STEP_FIELDS = ("round", "updates", "rows", "result", *ZERO_KEYS)
"""A step line's fields after its type, in their order (a zero step's last two only on a zero step)."""
ZERO_STEP_KEYS = STEP_KEYS | set(ZERO_KEYS)
"""A zero step's line (:mod:`phalanx.distributed.async_zero`): a step line with θₜ and the rejected updates."""
UPDATE_KEYS = {"rank", "version", "staleness", "sha256", "signature", "theta", "body"}
UPDATE_BYTES = 512
"""The most bytes one update entry takes besides its body."""
MAX_DIM = 1 << 28
"""The largest d a transcript's header may name."""
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")


def step_bytes(workers: int, dim: int) -> int:
    """The most bytes a step line of an ``workers``-rank job with d = ``dim`` takes: n − 1 updates, each its entry
    and its body in base64 (at most 8 bytes a value), and as many row digests."""
    body = 4 * ((8 * dim + 2) // 3)
    return 512 + workers * (UPDATE_BYTES + body + 70)


def digest(x: Tensor) -> str:
    """The SHA-256 (hex) of a row's bytes."""
    return hashlib.sha256(wire.tensor_bytes(x)).hexdigest()


def step_entry(t: int, used: list[Update], rows: Tensor, result: Tensor,
               zero: tuple[Tensor, list[Update]] | None = None) -> dict[str, Any]:
    """Step t's record (see the module's docstring): the updates (each with its links' proof), rows and result;
    ``zero``: a zero step's θₜ and rejected updates (:mod:`phalanx.distributed.async_zero`)."""

    def entries(updates: list[Update]) -> list[dict[str, Any]]:
        out = []
        for u in updates:
            sha, sig, theta = u.proof if u.proof is not None else ("", "", "")
            out.append({"rank": u.rank, "version": u.version, "staleness": t - u.version, "sha256": sha,
                        "signature": sig, "theta": theta, "body": base64.b64encode(wire.tensor_bytes(u.row)).decode()})
        return out

    extra = {} if zero is None else zero_fields(zero[0], zero[1], entries)
    return {"round": t, "updates": entries(used), "rows": [digest(r) for r in rows], "result": digest(result), **extra}


def _int(value: Any, low: int = 0, high: int = 1 << 62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


class StepCheck:
    """The audit's check of a keyed asynchronous run's step lines (see the module's docstring), for the run's
    experiment (built from its ``config.json``: the algorithm, the rule, n, d and the staleness bound)."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        algo: Any = exp.algorithm
        self.algo = algo
        self.workers = exp.workers
        self.dim = exp.problem.dim
        self.dtype = exp.problem.initial_theta().dtype
        self.max_staleness = int(algo.max_staleness)  # (an Asynchronous algorithm: experiment_of)
        rule: Any = exp.rule
        self.reshaped = rows_unchecked(algo)
        """Whether the filter passed on other rows than the signed updates (Zeno++): rows and result not recomputed."""
        self.recomputes = not rule.context_keys and not getattr(rule, "stateful", False) and not self.reshaped
        """Whether the result is recomputed (a rule without context or state, rows recomputable)."""
        self.newest: dict[int, int] = {}
        self.theta0 = digest(exp.problem.initial_theta())
        """SHA-256 of θ₀ (version 0), drawn from the config's seed as the run drew it."""
        self.thetas: dict[int, tuple[str, int]] = {}
        """The θ digest each version's updates carry, with the first rank seen carrying it (the versions a step may
        still hold: the last S + 1)."""
        self.zero = ZeroCheck(self)
        """The check of a zero step's line (:mod:`phalanx.distributed.async_zero`)."""

    def check(self, rec: dict[str, Any], t: int, nonce: bytes, config: str, keys: dict[int, Any],
              since: int = 0) -> list[str]:
        """The problems of step t's line (empty: it is the step it claims); ``since``: the round its session started
        from (an update of an older version is one the session never published)."""
        if "judged" in rec:  # (a zero step: async_zero)
            zero = self.zero.check(rec, t, lambda u, at: self._entry(u, at, nonce, config, keys, since))
            self._forget(t)
            return zero
        updates, rows, result = rec["updates"], rec["rows"], rec["result"]
        where = f"step {t}"
        if not (isinstance(updates, list) and 1 <= len(updates) < self.workers and isinstance(rows, list)
                and len(rows) <= len(updates) and all(isinstance(r, str) and _HEX64.fullmatch(r) for r in rows)
                and isinstance(result, str) and _HEX64.fullmatch(result)):
            return [f"{where}: 'updates', 'rows' or 'result' is not 1 … n − 1 updates and their digests"]
        problems: list[str] = []
        ranks: list[int] = []
        values: list[Tensor] = []
        staleness: list[int] = []
        for u in updates:
            found, rank, version, _, row = self._entry(u, t, nonce, config, keys, since)
            problems += found
            if rank is None or version is None or row is None:
                continue
            if rank in ranks:
                problems.append(f"{where}: two updates of rank {rank} (a step takes one per worker)")
            if not bool(torch.isfinite(row).all()):
                problems.append(f"{where}: rank {rank}'s update has a non-finite value")
            ranks.append(rank)
            values.append(row)
            staleness.append(t - version)
        self._forget(t)
        if problems:
            return problems
        return self._recompute(where, ranks, values, staleness, rows, result)

    def _forget(self, t: int) -> None:
        for v in [v for v in self.thetas if v < t - self.max_staleness]:
            del self.thetas[v]

    def _entry(self, u: Any, t: int, nonce: bytes, config: str, keys: dict[int, Any], since: int
               ) -> tuple[list[str], int | None, int | None, str | None, Tensor | None]:
        """One update entry of step t (aggregated, or rejected in a zero step): its problems, rank, version, θ
        digest and values (None where the entry does not hold them)."""
        from cryptography.exceptions import InvalidSignature

        where = f"step {t}"
        if not isinstance(u, dict) or set(u) != UPDATE_KEYS:
            return [f"{where}: an update entry is not {{{', '.join(sorted(UPDATE_KEYS))}}}"], None, None, None, None
        rank, version, s, sha, sig, theta, body = (u[k] for k in ("rank", "version", "staleness", "sha256",
                                                                   "signature", "theta", "body"))
        if not _int(rank, 1, self.workers - 1) or rank not in keys:
            return ([f"{where}: an update of rank {str(rank)[:20]!r}, which is not a worker of the job"], None, None,
                    None, None)
        if not _int(version, 0, t):
            return ([f"{where}: rank {rank}'s update has version {str(version)[:20]!r}, not 0 … {t}"], rank, None,
                    None, None)
        problems: list[str] = []
        if version < since:
            problems.append(f"{where}: rank {rank}'s update of version {version} predates this session (from "
                            f"round {since}), which never published it (the server drops it as unpublished)")
        if s != t - version:
            problems.append(f"{where}: rank {rank}'s update of version {version} is recorded with staleness "
                            f"{str(s)[:20]}, not {t - version} (edited)")
        if t - version > self.max_staleness:
            problems.append(f"{where}: rank {rank}'s update of version {version} is beyond the staleness bound "
                            f"({t - version} > max_staleness = {self.max_staleness})")
        if version <= self.newest.get(rank, -1):
            problems.append(f"{where}: rank {rank}'s update of version {version} is not newer than its update "
                            f"of version {self.newest[rank]} aggregated before (a stale one kept)")
        self.newest[rank] = max(version, self.newest.get(rank, -1))
        try:
            raw = base64.b64decode(body, validate=True) if isinstance(body, str) else b""
        except (binascii.Error, ValueError):
            raw = b""
        size = self.dim * torch.empty((), dtype=self.dtype).element_size()
        if len(raw) != size or not (isinstance(sha, str) and _HEX64.fullmatch(sha) and isinstance(sig, str)
                                    and _HEX128.fullmatch(sig) and isinstance(theta, str)
                                    and _HEX64.fullmatch(theta)):
            problems.append(f"{where}: rank {rank}'s update has no body of d = {self.dim} values, digest, "
                            "signature and θ digest")
            return problems, rank, version, None, None
        if hashlib.sha256(bytes.fromhex(theta) + raw).hexdigest() != sha:
            problems.append(f"{where}: rank {rank}'s θ digest and update body do not hash to its recorded SHA-256")
        for other in (self._same_theta(rank, version, theta), self.zero.theta_of(t, version, rank, theta)):
            if other is not None:
                problems.append(f"{where}: {other}")
        try:
            keys[rank].verify(bytes.fromhex(sig), signed_message(nonce, config, version, rank, bytes.fromhex(sha)))
        except InvalidSignature:
            problems.append(f"{where}: rank {rank}'s signature of version {version} does not verify with its "
                            "key on the allow-list (not its update)")
        return problems, rank, version, theta, wire.bytes_tensor(raw, self.dtype)

    def _same_theta(self, rank: int, version: int, theta: str) -> str | None:
        """Why rank's update of ``version``, computed at the θ of SHA-256 ``theta`` (signed by the worker), cannot be
        of the θ rank 0 published as that version: version 0 is θ₀, which the config's seed fixes; every update of a
        version carries one θ digest (None: it holds)."""
        if version == 0 and theta != self.theta0:
            return (f"rank {rank}'s update of version 0 was computed at θ {theta[:12]}…, not at θ₀ of the config's "
                    f"seed ({self.theta0[:12]}…): rank 0 sent another model as version 0")
        first = self.thetas.setdefault(version, (theta, rank))
        if first[0] != theta:
            return (f"rank {rank}'s update of version {version} was computed at θ {theta[:12]}…, rank {first[1]}'s "
                    f"of the same version at θ {first[0][:12]}…: rank 0 sent two models under one version")
        return None

    def _recompute(self, where: str, ranks: list[int], values: list[Tensor], staleness: list[int], rows: list[str],
                   result: str) -> list[str]:
        """The step is one the algorithm takes (its buffer full after exactly the recorded updates), its rows are
        ``assemble`` of them, and its result the rule over them (when the rule takes no context or state); whatever
        the algorithm or the rule raises on what the file holds is a problem of the step, never an exception out of
        the audit."""
        ids = torch.tensor(ranks, dtype=torch.int64)
        m, name = len(ranks), self.exp.algorithm.name
        try:
            take = self.algo.full(self.workers, ids, torch.ones(m, dtype=torch.bool))
            if take != m:
                return [f"{where}: {m} updates, not a step {name} takes (" + (
                    "its buffer is not full with them: FedBuff takes exactly K, BASGD one update in every buffer)"
                    if take == 0 else f"its buffer is full after the first {take})")]
            if self.reshaped:  # (Zeno++: the rows are g̃ = ‖v‖/‖g‖·g, v not recorded: counted unchecked)
                return []
            made, _, _ = self.algo.assemble(self.exp, ids, torch.stack(values), torch.tensor(staleness,
                                                                                             dtype=torch.int64))
            if [digest(r) for r in made] != rows:
                return [f"{where}: the recorded rows are not the algorithm's rows of the recorded updates "
                        f"({name}'s assemble)"]
            if not self.recomputes:
                return []
            out = self.exp.rule(made)
        except (PhalanxError, ArithmeticError, LookupError, RuntimeError, TypeError, ValueError) as exc:
            return [f"{where}: {name} or {self.exp.rule.name} cannot take the recorded updates "
                    f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"]
        if digest(out) != result:
            return [f"{where}: the recorded result is not {self.exp.rule.name} over the recorded rows"]
        return []


AUDIT_DIM = 1 << 24
"""The largest d whose experiment the audit builds from a run directory's ``config.json`` (16,777,216 parameters:
the model and θ₀ at most 64 MiB each in float32); a config naming a larger model is refused in one line before
anything of its size is allocated (the review's F6: the audit's memory was set by an untrusted config)."""


def experiment_of(identity: dict[str, Any], path: str = "config.json") -> Experiment | None:
    """The experiment of a run's ``config.json`` when its algorithm is asynchronous (None otherwise): what the audit
    recomputes its steps with. A config that does not validate raises its one-line :class:`ConfigError`; so does one
    whose model has more than :data:`AUDIT_DIM` parameters, counted on the ``meta`` device
    (:func:`phalanx.models.planned_parameters`: shapes only) before the model, θ₀ or the workers' shards are built.
    The data set is read from this machine's disk only (never downloaded, whatever the config says), so its size is
    the auditor's files', not the config's; a model of one's own (not built on ``meta``) is refused, as its size
    cannot be known before it is built. The config is whoever wrote the run directory's: a ``module:attr`` spec in
    it is refused (a one-line :class:`ConfigError` naming the key and ``path``), never imported
    (:func:`phalanx.plugins.no_spec_imports`) — only registered names and installed entry points are built."""
    from phalanx.plugins import no_spec_imports

    with no_spec_imports(path):
        return _experiment_of(identity, path)


def _experiment_of(identity: dict[str, Any], path: str) -> Experiment | None:
    from phalanx import data, models
    from phalanx.errors import ConfigError
    from phalanx.experiments.build import from_config
    from phalanx.experiments.config import validate
    from phalanx.training.algorithms import builtin
    from phalanx.training.algorithms.asynchronous import Asynchronous

    try:
        cls = builtin.algorithm_class(str(identity.get("algorithm", "dsgd")))
    except Exception:  # (an unknown algorithm: not an asynchronous one of this build; the header check says more)
        return None
    if not issubclass(cls, Asynchronous):
        return None
    run = validate(identity)
    spec, model = run.specs.data, run.specs.model
    ds = data.load(spec.name, root=spec.root, download=False, params=spec.params)
    d = models.planned_parameters(model.name, ds.input_shape, ds.num_classes, **model.params)
    if d is None or d > AUDIT_DIM:
        size = "no size known before it is built" if d is None else f"{d:,} parameters"
        raise ConfigError(path, f"model {model.name!r} ({size}): not built",
                          f"a built-in model of at most {AUDIT_DIM:,} parameters (AUDIT_DIM), sized on the meta device")
    return from_config(run, ds)
