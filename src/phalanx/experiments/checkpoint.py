"""The checkpoint's format: which tensors a :class:`~phalanx.training.state.Snapshot` becomes, how they fit
together, and how they become a snapshot again. Writing and reading the file (atomically, recorded in the manifest,
with its provenance record) is :mod:`phalanx.experiments.store`'s.

Tensors: ``theta``, ``momentum``, ``previous``, the run's stages' states under their own keys
(``stage.<name>.<key>``; the BatchNorm / Hybrid BN global statistics as ``norm_stats``), ``algorithm.<name>`` (the
round algorithm's own state, ``RoundState.own``: FedBN's ``local_norms``, say), ``rule.<name>`` (the state of a rule
that keeps state across rounds: FoolsGold's history), ``rng.<stream>`` (random streams), ``optim.<name>`` (the
server optimizer's state). Tensors are CPU tensors whatever device the run trains on, so a checkpoint resumes on any
device (the loop moves them to the run's).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from phalanx.errors import OutputError
from phalanx.experiments.runfiles import damaged
from phalanx.files import sync_file
from phalanx.training.state import RoundState, Snapshot

LEGACY_ALGORITHM_STATE = ("local_norms",)
"""Algorithm state that checkpoints written before it was prefixed kept under its bare name (FedBN's table)."""


def tensors_of(snap: Snapshot, state: RoundState) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint of ``snap`` holds (``state``: its round state, on the CPU)."""
    tensors = {"theta": state.theta.contiguous()}
    if state.momentum is not None:
        tensors["momentum"] = state.momentum.contiguous()
    if state.previous is not None:
        tensors["previous"] = state.previous.contiguous()
    for name, t in snap.stages.items():  # each stage's state under its own keys (``stage.<name>.<key>``)
        tensors[name] = t.cpu().contiguous()
    for name, t in state.own.items():
        tensors[f"algorithm.{name}"] = t.contiguous()
    for name, g in snap.streams.items():
        tensors[f"rng.{name}"] = g.cpu()
    for name, t in snap.optimizer.items():
        tensors[f"optim.{name}"] = t.cpu().contiguous()
    for name, t in snap.rule.items():
        tensors[f"rule.{name}"] = t.cpu().contiguous()
    return tensors


def snapshot_of(tensors: dict[str, torch.Tensor], round_: int, rows: list[dict[str, object]]) -> Snapshot:
    """The snapshot a checkpoint's tensors (checked by :func:`check_tensors`) and its rows resume from."""
    state = RoundState(
        theta=tensors["theta"], momentum=tensors.get("momentum"), previous=tensors.get("previous"), round=round_,
        own=_algorithm_state(tensors),
    )
    streams = {k.removeprefix("rng."): v for k, v in tensors.items() if k.startswith("rng.")}
    optimizer = {k.removeprefix("optim."): v for k, v in tensors.items() if k.startswith("optim.")}
    rule = {k.removeprefix("rule."): v for k, v in tensors.items() if k.startswith("rule.")}  # none: a fresh rule
    stages = {k: v for k, v in tensors.items() if not _core(k)}  # each stage takes its own keys (the loop)
    return Snapshot(state, streams, optimizer, list(rows), resumed=True, rule=rule, stages=stages)


CORE = ("theta", "momentum", "previous")
CORE_PREFIXES = ("algorithm.", "rng.", "optim.", "rule.")


def _core(name: str) -> bool:
    """Whether a checkpoint tensor is the run's own (the round state, streams, optimizer, rule), not a stage's."""
    return name in CORE or name in LEGACY_ALGORITHM_STATE or name.startswith(CORE_PREFIXES)


def _algorithm_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The round algorithm's own state in a checkpoint: its ``algorithm.<name>`` tensors (and the bare names older
    checkpoints used)."""
    own = {k.removeprefix("algorithm."): v for k, v in tensors.items() if k.startswith("algorithm.")}
    for name in LEGACY_ALGORITHM_STATE:
        if name in tensors:
            own.setdefault(name, tensors[name])
    return own


def check_tensors(ckpt: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The checkpoint's tensors fit together: a floating ``theta`` of d entries — ``(d,)``, or ``(n, d)`` with a
    model per node (decentralized rounds) — ``momentum`` (rows, d), ``previous`` shaped as ``theta``, random-stream
    states as bytes; a :class:`ConfigError` naming the tensor otherwise."""
    theta = tensors.get("theta")
    if theta is None:
        raise damaged(ckpt, "it has no tensor 'theta'")
    if theta.dim() not in (1, 2) or theta.numel() == 0 or not theta.is_floating_point():
        raise damaged(ckpt, f"tensor 'theta' has shape {tuple(theta.shape)} and dtype {theta.dtype}, not a "
                      "floating vector (or a matrix of one per node)")
    d = theta.shape[-1]
    expected = {"momentum": "(rows, d)", "previous": f"{tuple(theta.shape)} (as 'theta')"}
    for name, shape in (("momentum", 2), ("previous", theta.dim())):
        t = tensors.get(name)
        if t is not None and (t.dim() != shape or t.shape[-1] != d):
            raise damaged(ckpt, f"tensor {name!r} has shape {tuple(t.shape)}, expected {expected[name]} with "
                          f"d = {d} (the size of 'theta')")
    for name, t in tensors.items():
        if name.startswith("rng.") and (t.dtype != torch.uint8 or t.dim() != 1):
            raise damaged(ckpt, f"tensor {name!r} is not a random-stream state (1-D bytes)")


def os_error(exc: SafetensorError) -> BaseException:
    """safetensors' error as the :class:`OSError` it carries (``… (os error 28)``: a full disk), so that
    :func:`phalanx.experiments.store.writing` makes it the one-line :class:`OutputError`; the error itself when it
    carries none."""
    match = re.search(r"\(os error (\d+)\)|Os \{ code: (\d+)", str(exc))
    if match is None:
        return exc
    code = int(match.group(1) or match.group(2))
    return OSError(code, os.strerror(code))


def check_written(path: Path, tmp: str, names: set[str]) -> None:
    """Flush the checkpoint just written to ``tmp`` to disk and read its header back: the library that writes it
    can drop a failed write silently (a full disk), and such a file must not replace the last good checkpoint."""
    sync_file(Path(tmp))
    try:
        with safe_open(tmp, framework="pt") as fh:
            complete = set(fh.keys()) == names
    except SafetensorError:
        complete = False
    if not complete:
        raise OutputError(str(path), "the checkpoint was not written completely (is the disk full?)",
                          "free some space, then run the same command again (the previous checkpoint is intact)")
