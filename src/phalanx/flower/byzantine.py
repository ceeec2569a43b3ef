"""Byzantine Flower clients with Phalanx's attacks: a ``ClientApp`` mod, a data-poisoning helper and a rendezvous
through which colluding clients share their honest updates.

A Flower mod is a callable ``(msg, context, call_next) -> Message`` wrapped around the ``ClientApp``'s functions
(``ClientApp(mods=[...])``, or ``@app.train(mods=[...])``; ``flwr.clientapp.typing.Mod``). :class:`ByzantineMod`
turns an honest client into a Byzantine one. On a train instruction carrying the global model w (its
``ArrayRecord``) it

1. lets the honest client train (``call_next``) and reads the reply's model wᵢ;
2. forms the honest update Δᵢ = wᵢ − w, all arrays flattened in the global record's key order (as
   :class:`~phalanx.flower.strategy.PhalanxFedAvg` forms it, :mod:`phalanx.flower.replies`);
3. computes the Byzantine update with the Phalanx attack's own code — ``attack(ctx)`` for a vector attack, with
   ``ctx.honest`` = the rows the client knows (below), ``ctx.n_byzantine`` = that many rows, ``ctx.round`` = the
   server round − 1 (Phalanx counts rounds from 0), ``ctx.generator`` a CPU generator seeded from ``seed`` and the
   round; ``attack.update(Δᵢ, previous)`` for a data attack (its ``boost``, model replacement's projection,
   Neurotoxin's mask);
4. replies w + Δ_byz with the honest reply's keys, order, shapes and dtypes, and the rest of its content (metrics)
   unchanged.

What the client knows decides which attacks it can run (each attack's metadata, :mod:`phalanx.attacks.base`):

* **alone** — ``ctx.honest`` is the client's own update, one row. Allowed: attacks that read no honest vector
  (``nan``, ``inf``, ``gaussian``: zero vectors with ``sigma=0``, huge values with a large ``mu``) and those that read
  only the honest mean (``signflip`` and its scale, ``ipm``, ``foe``, ``gaussian(center="mean")``, ``none``): the
  attack's ``solo`` flag. The mean of one row is that row, so the attack is exactly the paper's, computed on the
  attacker's own estimate of the honest mean.
* **colluders** (``attack_knowledge = "colluders"``: Baruch et al., NeurIPS 2019, §3) — k clients share their
  honest updates for the round through a :class:`Rendezvous` (a directory all of them can write); ``ctx.honest`` is
  the k updates in colluder order, and every colluder computes the same k Byzantine rows (the same rows, the same
  seed, the same round) and sends its own row. Allowed: every vector attack that reads honest vectors (ALIE, IPM,
  min-max, min-sum, Fang, mimic, sign flip…); one that needs the honest spread or several rows (not ``solo``)
  needs k ≥ 2.

Refused with a one-line :class:`~phalanx.errors.ConfigError` naming the attack and why: an attack that calls the
server's rule (``optimal``: a client does not run the server's aggregator), one whose rows round away in the reply's
weights w + y (``subnormal``: ``Attack.through_weights``), a non-``solo`` attack without colluders, and a
rendezvous for an attack that reads no honest vector (what the colluders know changes nothing, as
``attack_knowledge = "colluders"`` is refused for it in a Phalanx run). A data attack poisons the client's own data
— its training code calls :func:`poison` — and the mod applies the attack's update step (``boost``…) to what that
training produced.

:func:`from_config` builds the mod from the run and node configuration (``byzantine = true`` in a node's config
makes it attack; the attack and its parameters come from the ``byzantine-*`` keys), so one ``ClientApp`` serves
honest and Byzantine nodes. See docs/flower.md, "Byzantine clients".
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.common.logger import log

from phalanx import attacks
from phalanx.attacks import Attack, AttackContext, DataAttack
from phalanx.errors import ConfigError, PhalanxError
from phalanx.files import write_atomic
from phalanx.flower.replies import Layout, _flatten
from phalanx.validate import check_choice, check_int, check_real

__all__ = ["CONFIG_KEYS", "ByzantineMod", "ConfiguredByzantineMod", "Rendezvous", "from_config", "poison"]

ClientAppCallable = Callable[[Message, Context], Message]
T = TypeVar("T")

ON_TIMEOUT = ("fail", "present")
"""What a colluder does when not all k honest updates arrived in time: fail the round (the client's reply is
Flower's error reply, which PhalanxFedAvg counts as a lost vote), or attack with the updates present (its own at
least; colluders that saw different sets then send different rows)."""

_STATE_KEY = "phalanx.byzantine.previous-global"
"""Where a data attack that reads the previous aggregate (Neurotoxin) keeps the last global model it saw, in the
node's ``context.state``."""


def _generator(seed: int, server_round: int, node: int | None = None) -> torch.Generator:
    """The attack stream of one round: the same (seed, round) gives the same draws on every colluder (who must draw
    alike: one attack, each its own row of it). A client that attacks alone draws its own (``node``, its Flower node
    id): b lone Gaussian attackers send b independent draws, as b Byzantine workers of a Phalanx run do — not one
    point b times, which distance-based rules would see as a tight cluster. Its seed is derived as a run's named
    streams are (``phalanx.training.streams.stream_seed``: SHA-256 of ``phalanx:<seed>:<name>``), for the stream
    ``flower-attack:<round>`` (``flower-attack:<round>:node-<id>``); the flower layer does not import training."""
    name = f"flower-attack:{server_round}" + ("" if node is None else f":node-{node}")
    digest = hashlib.sha256(f"phalanx:{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def _build_attack(attack: str | Attack | DataAttack, params: Mapping[str, Any] | None) -> Attack | DataAttack:
    if isinstance(attack, (Attack, DataAttack)):
        if params:
            raise ConfigError("params", dict(params), "none with an attack object (its parameters are set)")
        return attack
    if not isinstance(attack, str) or not attack:
        raise ConfigError("attack", attack, "a Phalanx attack name (phalanx.attacks.names()) or an attack object")
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError("params", params, "a mapping of the attack's parameters")
    return attacks.make(attack, **dict(params or {}))


def _check_attack(attack: Attack | DataAttack, colluders: int) -> None:
    """Refuse (one line naming the attack) what a Flower client cannot run with the knowledge it has."""
    if isinstance(attack, DataAttack):
        if colluders > 1:
            raise ConfigError("rendezvous", attack.name, "none for a data attack (each client poisons its own data; "
                              "what the others computed changes nothing)")
        return
    if not type(attack).through_weights:
        raise ConfigError("attack", attack.name, "an attack whose rows survive being sent as weights w + y (these "
                          "round away: the reply would be the global model, an update of zeros)")
    if type(attack).needs_aggregator or attack.describe().get("needs_aggregator"):
        raise ConfigError("attack", attack.name, "an attack that does not call the server's aggregator (a Flower "
                          "client does not run the server's rule)")
    reads = getattr(attack, "reads_honest", True)
    if colluders > 1 and not reads:
        raise ConfigError("rendezvous", attack.name, "none for an attack that reads no honest vector (what the "
                          "colluders know changes nothing)")
    if colluders == 1 and not getattr(attack, "solo", False):
        solo = ", ".join(n for n in attacks.names("vector") if getattr(attacks.get_class(n), "solo", False))
        raise ConfigError("attack", attack.name, f"an attack one client can run on its own update ({solo}; "
                          "Attack.solo), or colluders >= 2 sharing a Rendezvous",
                          "it needs honest updates other than the client's own: their spread, or several rows")


@dataclass(frozen=True)
class Rendezvous:
    """Where k colluding clients meet each round to share their honest updates: a directory all of them can write
    (one machine, or a shared file system).

    Round r of run R: colluder i writes its flat honest update to ``directory/run-R/round-r/colluder-i.npy`` (written
    under a temporary name, then renamed: a file that exists is complete) and waits until the files of all k
    colluders exist, at most ``timeout`` seconds; then every colluder reads the k updates in index order. A colluder
    removes its own file of round r − 2 when it writes round r's. Every colluder must be sampled in every round (a
    ``fraction_train`` of 1), or the others wait for one that was not: ``on_timeout="present"`` then attacks with
    the updates that came (:data:`ON_TIMEOUT`).

    Parameters: ``directory``; ``colluders`` k ≥ 1; ``index`` this colluder's i in 0 … k − 1 (distinct per
    colluder); ``timeout`` > 0 seconds; ``on_timeout`` ``"fail"`` (default) or ``"present"``; ``poll`` > 0, the
    seconds between two looks at the directory.
    """

    directory: Path
    colluders: int
    index: int
    timeout: float = 60.0
    on_timeout: str = "fail"
    poll: float = 0.01

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)) or not str(self.directory):
            raise ConfigError("rendezvous", self.directory, "a directory path every colluder can write")
        object.__setattr__(self, "directory", Path(self.directory))
        check_int("colluders", self.colluders, low=1)
        check_int("colluder", self.index, low=0, high=self.colluders - 1)
        check_real("timeout", self.timeout, low=0.0, low_open=True)
        check_choice("on_timeout", self.on_timeout, ON_TIMEOUT)
        check_real("poll", self.poll, low=0.0, low_open=True)

    def _path(self, run_id: int, server_round: int, index: int) -> Path:
        return self.directory / f"run-{run_id}" / f"round-{server_round}" / f"colluder-{index}.npy"

    def exchange(self, run_id: int, server_round: int, own: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], int]:
        """Publish ``own`` (d,) and return ``(rows, row)``: the colluders' honest updates ``(k', d)`` in index order
        and the row of this colluder's. Raises :class:`~phalanx.errors.PhalanxError` when the others did not come
        in time (``on_timeout="fail"``) or a file is not an update of the same length and dtype."""
        mine = self._path(run_id, server_round, self.index)
        mine.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # O_EXCL, mode 0600; a link planted at `mine` is replaced, never followed
        write_atomic(mine, lambda fh: np.save(fh, own, allow_pickle=False), 0o600, sync=False)
        old = self._path(run_id, server_round - 2, self.index)
        old.unlink(missing_ok=True)
        paths = [self._path(run_id, server_round, i) for i in range(self.colluders)]
        deadline = time.monotonic() + self.timeout
        while not all(p.exists() for p in paths):
            if time.monotonic() >= deadline:
                present = [i for i, p in enumerate(paths) if p.exists()]
                missing = [i for i in range(self.colluders) if i not in present]
                if self.on_timeout == "fail":
                    raise PhalanxError(
                        f"rendezvous {mine.parent}: colluders {missing} did not publish their round-{server_round} "
                        f"update within {self.timeout:g} s (on_timeout='fail'; 'present' attacks with those present)"
                    )
                log(WARNING, "phalanx: colluder %d: round %d: colluders %s did not come within %g s; attacking with "
                    "the %d present", self.index, server_round, missing, self.timeout, len(present))
                paths = [paths[i] for i in present]
                break
            time.sleep(self.poll)
        return np.stack([_read_update(p, own) for p in paths]), paths.index(mine)


def _read_update(path: Path, own: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A colluder's published update: a regular file (a symbolic link is refused, not followed) whose ``.npy``
    header says the shape and dtype of ``own``, checked before its data is read (a header claiming a huge array
    allocates nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise PhalanxError(f"rendezvous: cannot read {path}: {type(exc).__name__}: {exc}") from None
    with os.fdopen(fd, "rb") as fh:
        try:
            version = np.lib.format.read_magic(fh)
            header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in header:
                raise ValueError(f".npy format {version} (1.0 or 2.0, as np.save writes an update)")
            shape, fortran, dtype = header[version](fh)
        except (OSError, ValueError) as exc:
            raise PhalanxError(f"rendezvous: cannot read {path}: {type(exc).__name__}: {exc}") from None
        if tuple(shape) != own.shape or dtype != own.dtype or fortran:
            raise PhalanxError(f"rendezvous: {path} holds an array of shape {tuple(shape)} and dtype {dtype}, not "
                               f"an update of shape {own.shape} and dtype {own.dtype} (another model?)")
        data = fh.read(own.nbytes + 1)
    if len(data) != own.nbytes:
        raise PhalanxError(f"rendezvous: {path} is cut short or too long ({len(data)} bytes of data, "
                           f"{own.nbytes} expected)")
    return np.frombuffer(data, dtype=own.dtype).reshape(own.shape).copy()


def _one_array_record(content: Any, key: str) -> tuple[str, ArrayRecord] | None:
    records = content.array_records
    if key in records:
        return key, records[key]
    if len(records) == 1:
        return next(iter(records.items()))
    return None


def _server_round(msg: Message, fallback: int) -> int:
    """The round: FedAvg's ``server-round`` in the instruction's config, else the message's ``group_id`` (which
    PhalanxFedAvg sets to the round), else ``fallback``."""
    for record in msg.content.config_records.values():
        value = record.get("server-round")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return int(value)
    try:
        return max(1, int(msg.metadata.group_id))
    except (TypeError, ValueError):
        return fallback


def _rebuild(record: ArrayRecord, layout: Layout, flat: np.ndarray[Any, Any]) -> ArrayRecord:
    """An ``ArrayRecord`` with ``record``'s keys, order, shapes and dtypes holding ``flat`` (in ``layout``'s key
    order, the global model's); integer and boolean arrays are rounded back."""
    start, parts = 0, {}
    for key, shape in zip(layout.keys, layout.shapes):
        size = int(np.prod(shape, dtype=np.int64))
        parts[key] = flat[start:start + size].reshape(shape)
        start += size
    out: dict[str, Array] = {}
    for key in record:
        dtype = record[key].numpy().dtype
        part = parts[key]
        if dtype.kind in "iub":
            with np.errstate(all="ignore"):
                part = np.rint(part)
        with np.errstate(all="ignore"):  # (reshaped: ascontiguousarray makes a 0-d array 1-d)
            out[key] = Array(np.ascontiguousarray(part.astype(dtype)).reshape(record[key].numpy().shape))
    return ArrayRecord(out)


class ByzantineMod:
    """A Flower ``ClientApp`` mod that makes the client send a Phalanx attack's update (see the module docstring).

    >>> app = ClientApp(mods=[ByzantineMod("signflip", {"scale": 10.0})])          # doctest: +SKIP

    Parameters
    ----------
    attack: a Phalanx attack name (``phalanx.attacks.names()``) or an attack object.
    params: the attack's parameters (with a name).
    seed: the attack stream's seed (stochastic attacks: ``gaussian``, ``fang``); colluders must share it.
    f: what the attack assumes the server tolerates (``ctx.f``).
    workers: n, the number of updates the server receives per round (``ctx.workers``: ALIE's default z), ≥ the
        number of colluders + 1; None: n = 2k.
    rendezvous: a :class:`Rendezvous` for colluders; None: the client attacks alone.
    arrayrecord_key: the key of the model's ``ArrayRecord`` (else the message's only one), as in ``FedAvg``.

    Every bad parameter is a one-line :class:`~phalanx.errors.ConfigError` raised here, before any round. Only
    train instructions are attacked; evaluation and query messages go to the client unchanged.
    """

    def __init__(
        self, attack: str | Attack | DataAttack, params: Mapping[str, Any] | None = None, *, seed: int = 0, f: int = 0,
        workers: int | None = None, rendezvous: Rendezvous | None = None, arrayrecord_key: str = "arrays",
    ) -> None:
        self.attack = _build_attack(attack, params)
        self.seed = check_int("seed", seed, low=0)
        self.f = check_int("f", f, low=0)
        if rendezvous is not None and not isinstance(rendezvous, Rendezvous):
            raise ConfigError("rendezvous", rendezvous, "a phalanx.flower.byzantine.Rendezvous or None")
        self.rendezvous = rendezvous
        k = 1 if rendezvous is None else rendezvous.colluders
        self.workers = None if workers is None else check_int("workers", workers, low=k + 1)
        if not isinstance(arrayrecord_key, str):
            raise ConfigError("arrayrecord_key", arrayrecord_key, "a string")
        self.arrayrecord_key = arrayrecord_key
        _check_attack(self.attack, k)
        self._calls = 0

    def __repr__(self) -> str:
        who = "alone" if self.rendezvous is None else f"colluder {self.rendezvous.index} of {self.rendezvous.colluders}"
        return f"ByzantineMod({self.attack!r}, {who}, seed={self.seed})"

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Train honestly (``call_next``), then replace the reply's model by w + the attack's update."""
        if not str(msg.metadata.message_type).startswith("train"):
            return call_next(msg, context)
        self._calls += 1
        found = _one_array_record(msg.content, self.arrayrecord_key)
        if found is None:
            log(WARNING, "phalanx: %r: the train instruction has no ArrayRecord %r: the reply is left honest", self,
                self.arrayrecord_key)
            return call_next(msg, context)
        layout = Layout.of(found[1])
        server_round = _server_round(msg, self._calls)
        out = call_next(msg, context)
        if out.has_error() or not out.has_content():
            return out
        mine = _one_array_record(out.content, self.arrayrecord_key)
        if mine is None:
            raise PhalanxError(f"{self!r}: the client's reply has no ArrayRecord {self.arrayrecord_key!r} to attack")
        key, record = mine
        own, why = _flatten(record, layout)
        if own is None:
            raise PhalanxError(f"{self!r}: the client's reply does not fit the global model: {why}")
        sent = self.update(own, server_round, run_id=int(msg.metadata.run_id), context=context, layout=layout)
        with np.errstate(all="ignore"):
            new = layout.flat + sent.astype(layout.compute, copy=False)
        out.content[key] = _rebuild(record, layout, new)
        log(INFO, "phalanx: %s: round %d: sent %s's update (|honest| = %.4g, |sent| = %.4g)", self, server_round,
            self.attack.name, float(np.linalg.norm(own.astype(np.float64))),
            float(np.linalg.norm(sent.astype(np.float64))))
        return out

    def update(
        self, own: np.ndarray[Any, Any], server_round: int, *, run_id: int = 0, context: Context | None = None,
        layout: Layout | None = None,
    ) -> np.ndarray[Any, Any]:
        """The Byzantine update this client sends in ``server_round`` (counted from 1, as Flower does) given its own
        honest update ``own`` (d,): the attack's own code on what the client knows (module docstring)."""
        t = server_round - 1
        if isinstance(self.attack, DataAttack):
            return self._data_update(own, t, context, layout)
        if self.rendezvous is None:
            rows, row = own[None, :], 0
            node = getattr(context, "node_id", None) if context is not None else None
        else:
            rows, row = self.rendezvous.exchange(run_id, server_round, own)
            node = None  # colluders draw one attack together
        honest = torch.from_numpy(np.ascontiguousarray(rows))
        b = int(honest.shape[0])
        ctx = AttackContext(
            honest=honest, n_byzantine=b, f=self.f, aggregator=None,
            generator=_generator(self.seed, server_round, node if isinstance(node, int) else None),
            round=t, workers=self.workers if self.workers is not None and self.workers > b else None,
            knowledge="colluders" if getattr(self.attack, "reads_honest", True) else "omniscient",
        )
        return self.attack(ctx)[row].numpy()

    def _data_update(
        self, own: np.ndarray[Any, Any], t: int, context: Context | None, layout: Layout | None,
    ) -> np.ndarray[Any, Any]:
        attack = self.attack
        assert isinstance(attack, DataAttack)
        previous = None
        if attack.needs_previous and context is not None and layout is not None:
            state = context.state
            if _STATE_KEY in state.array_records:
                last = state.array_records[_STATE_KEY]["w"].numpy()
                if last.shape == layout.flat.shape:
                    with np.errstate(all="ignore"):
                        previous = torch.from_numpy((layout.flat - last).astype(layout.compute))
            state[_STATE_KEY] = ArrayRecord({"w": Array(np.ascontiguousarray(layout.flat))})
        if not attack.active(t):
            return own
        rows = torch.from_numpy(np.array(own, copy=True))[None, :]
        return attack.update(rows, previous)[0].numpy()


def poison(
    attack: DataAttack | str, x: T, y: Any, num_classes: int, *, server_round: int = 1, seed: int = 0,
    attacker: int = 0, params: Mapping[str, Any] | None = None,
) -> tuple[T, Any]:
    """A Byzantine client's training data ``(x, y)`` poisoned with a Phalanx data attack (its own
    ``transform``: label flipping y' = C − 1 − y, a backdoor trigger and target label…), for the ``ClientApp``'s
    training code to train on; numpy arrays or torch tensors in, the same kind out.

    ``server_round`` (from 1) decides whether the attack is still active (a ``stop_round``: round − 1 is Phalanx's
    round); ``seed``, ``server_round`` and ``attacker`` seed the draws (which samples get the trigger); ``attacker``
    is which Byzantine client this is (DBA gives each its part of the trigger; each its own draws).
    ``attack.prepare`` checks the data first (a
    trigger larger than the input, a target class out of range: one-line :class:`~phalanx.errors.ConfigError`).
    A :class:`ByzantineMod` with the same attack then applies its update step (``boost``…) to the reply.
    """
    built = _build_attack(attack, params)
    if not isinstance(built, DataAttack):
        raise ConfigError("attack", built.name, "a data attack (phalanx.attacks.names('data')): a vector attack "
                          "changes the update, not the data (use ByzantineMod)")
    check_int("num_classes", num_classes, low=1)
    check_int("server_round", server_round, low=1)
    check_int("seed", seed, low=0)
    check_int("attacker", attacker, low=0)
    tx = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    ty = torch.from_numpy(np.ascontiguousarray(y)) if isinstance(y, np.ndarray) else y
    if not isinstance(tx, torch.Tensor) or not isinstance(ty, torch.Tensor):
        raise ConfigError("(x, y)", f"{type(x).__name__}, {type(y).__name__}", "numpy arrays or torch tensors")
    if not built.active(server_round - 1):
        return x, y
    built.prepare(tx, ty, num_classes)
    px, py = built.transform(tx, ty, num_classes, _generator(seed, server_round, attacker), attacker=attacker)
    out_x: Any = px.numpy() if isinstance(x, np.ndarray) else px
    return out_x, (py.numpy() if isinstance(y, np.ndarray) else py)

CONFIG_KEYS = {
    "byzantine": "true in a node's config: this node attacks (absent or false: honest)",
    "byzantine-attack": "the Phalanx attack's name",
    "byzantine-params": "the attack's parameters: a JSON object in a string, or a TOML table (byzantine-params.<name>)",
    "byzantine-seed": "the attack stream's seed (default 0)",
    "byzantine-f": "the f the attack assumes (default 0)",
    "byzantine-workers": "n, the updates the server receives per round (default: 2k)",
    "byzantine-colluders": "k, colluders sharing a rendezvous (default 1: alone)",
    "byzantine-colluder": "this node's index among the colluders, 0 … k − 1",
    "byzantine-rendezvous": "the colluders' shared directory",
    "byzantine-timeout": "seconds a colluder waits for the others (default 60)",
    "byzantine-on-timeout": "'fail' (default) or 'present'",
}
"""The configuration keys :func:`from_config` reads — from the node's config first, then the run's, then its
``defaults``."""


def _params(configs: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The attack's parameters: ``byzantine-params`` as a JSON object in a string (which replaces the table of the
    configs before it: a node's ``'{}'`` drops the run's parameters), then the ``byzantine-params.a.b = v`` keys (a
    TOML table, which Flower flattens; each sets one parameter) as the nested table {a: {b: v}}; configs in order."""
    out: dict[str, Any] = {}
    prefix = "byzantine-params."
    for config in configs:
        text = config.get("byzantine-params")
        if text is not None:
            try:
                table = json.loads(text) if isinstance(text, str) and text.strip() else {}
            except json.JSONDecodeError:
                table = None
            if not isinstance(table, dict):
                raise ConfigError("byzantine-params", text, "a JSON object of the attack's parameters, e.g. "
                                  "'{\"scale\": 10.0}' (or a TOML table: byzantine-params.scale = 10.0)")
            out = dict(table)
        for key, value in config.items():
            if key.startswith(prefix):
                *path, last = key[len(prefix):].split(".")
                table = out
                for part in path:
                    table = table.setdefault(part, {})
                table[last] = value
    return out


def _node_flag(context: Context) -> bool:
    """The default choice of who attacks: the node's config says ``byzantine = true``."""
    flag = context.node_config.get("byzantine", False)
    if not isinstance(flag, bool):
        raise ConfigError("byzantine", flag, "true or false (a node's config)")
    return flag


class ConfiguredByzantineMod:
    """The mod :func:`from_config` returns: per node, a :class:`ByzantineMod` built from its configuration (once
    per distinct configuration), or the honest client's reply as it is."""

    def __init__(
        self, is_byzantine: Callable[[Context], bool], defaults: Mapping[str, Any], arrayrecord_key: str,
    ) -> None:
        self.is_byzantine = is_byzantine
        self.defaults = dict(defaults)
        self.arrayrecord_key = arrayrecord_key
        self._mods: dict[tuple[Any, ...], ByzantineMod] = {}

    def mod_for(self, context: Context) -> ByzantineMod | None:
        """This node's :class:`ByzantineMod`, or None for an honest node."""
        if not self.is_byzantine(context):
            return None
        configs: list[Mapping[str, Any]] = [self.defaults, context.run_config, context.node_config]

        def _lookup(key: str, default: Any) -> Any:
            for config in reversed(configs):
                if key in config:
                    return config[key]
            return default

        attack = _lookup("byzantine-attack", "")
        params = _params(configs)
        colluders = check_int("byzantine-colluders", _lookup("byzantine-colluders", 1), low=1)
        workers = _lookup("byzantine-workers", 0)
        settings = dict(
            seed=_lookup("byzantine-seed", 0), f=_lookup("byzantine-f", 0),
            workers=None if workers == 0 else workers, index=_lookup("byzantine-colluder", 0),
            directory=_lookup("byzantine-rendezvous", ""), timeout=_lookup("byzantine-timeout", 60.0),
            on_timeout=_lookup("byzantine-on-timeout", "fail"),
        )
        key = (attack, colluders, repr(sorted(params.items())), repr(sorted(settings.items())))
        if key not in self._mods:
            rendezvous = None
            if colluders > 1:
                directory = settings["directory"]
                if not isinstance(directory, str) or not directory:
                    raise ConfigError("byzantine-rendezvous", directory, "a directory all colluders can write "
                                      f"(byzantine-colluders = {colluders})")
                rendezvous = Rendezvous(Path(directory), colluders, settings["index"], settings["timeout"],
                                        settings["on_timeout"])
            self._mods[key] = ByzantineMod(
                attack, params, seed=settings["seed"], f=settings["f"], workers=settings["workers"],
                rendezvous=rendezvous, arrayrecord_key=self.arrayrecord_key,
            )
        return self._mods[key]

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        mod = self.mod_for(context) if str(msg.metadata.message_type).startswith("train") else None
        return call_next(msg, context) if mod is None else mod(msg, context, call_next)


def from_config(
    is_byzantine: Callable[[Context], bool] | None = None, defaults: Mapping[str, Any] | None = None,
    arrayrecord_key: str = "arrays",
) -> ConfiguredByzantineMod:
    """A mod that makes a node Byzantine when ``is_byzantine(context)`` (default: its node config says
    ``byzantine = true``), with the attack of the ``byzantine-*`` keys (:data:`CONFIG_KEYS`: the node's config
    first, then the run's ``[tool.flwr.app.config]``, then ``defaults``); other nodes' replies pass unchanged. A bad
    key is a one-line :class:`~phalanx.errors.ConfigError` at the node's first train instruction (its reply becomes
    Flower's error reply).

    >>> app = ClientApp(mods=[from_config()])                                         # doctest: +SKIP
    """
    if is_byzantine is not None and not callable(is_byzantine):
        raise ConfigError("is_byzantine", is_byzantine, "a callable Context -> bool, or None (the node's config)")
    if defaults is not None and not isinstance(defaults, Mapping):
        raise ConfigError("defaults", defaults, "a mapping of byzantine-* keys, or None")
    if not isinstance(arrayrecord_key, str):
        raise ConfigError("arrayrecord_key", arrayrecord_key, "a string")
    return ConfiguredByzantineMod(is_byzantine or _node_flag, defaults or {}, arrayrecord_key)
