"""Rank 0's run directory: the same files as the simulated engine, plus ``distributed.json``.

Only rank 0 writes; every file is written atomically (:mod:`phalanx.experiments.store`). ``distributed.json`` holds
what only this engine knows, per round: its wall time, the ranks that were missing and the payload bytes rank 0
sent and received.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from phalanx.experiments import store
from phalanx.training.round import RoundResult, RoundState
from phalanx.training.trainer import Setup, evaluate_row, start_run


@dataclass
class RoundLog:
    """What rank 0 saw of one round."""

    round: int
    seconds: float
    missing: list[int]
    sent: int
    received: int


@dataclass
class Recorder:
    """Start state (fresh or resumed), evaluation, checkpoints and the final files of a run on rank 0."""

    setup: Setup
    out: Path | None
    topology: str
    world_size: int
    quiet: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)
    log: list[RoundLog] = field(default_factory=list)

    def start(self) -> tuple[RoundState, dict[str, Tensor]]:
        """The state to start from and the random-stream states at that point (resumed from a checkpoint if any)."""
        self.columns = store.config_columns(self.setup.cfg)
        start = start_run(self.setup, self.out)
        state, self.rows = start.state, start.rows
        if start.resumed:
            assert self.out is not None
            self._say(f"resuming from the checkpoint of round {state.round}")
            old = self.out / "distributed.json"
            if old.exists():
                logged = json.loads(old.read_text())["rounds"]
                self.log = [RoundLog(**r) for r in logged if r["round"] < state.round]
        return state, start.gens

    def after_round(
        self, state: RoundState, result: RoundResult | None, gens: dict[str, Tensor], log: RoundLog, measure: bool,
    ) -> None:
        """Evaluate (at evaluation rounds), log the round and write a checkpoint when one is due."""
        cfg = self.setup.cfg
        self.log.append(log)
        if measure:
            row = evaluate_row(self.setup, state, result, self.columns)
            self.rows.append(row)
            self._say(
                f"round {state.round}/{cfg.rounds}: test accuracy {row['test_accuracy']:.3f}, "
                f"loss {row['test_loss']:.3f}" + (f", missing ranks {log.missing}" if log.missing else "")
            )
        if cfg.checkpoints(state.round):
            self.checkpoint(state, gens)

    def checkpoint(self, state: RoundState, gens: dict[str, Tensor]) -> str | None:
        """Write a checkpoint of ``state`` (resumable by the same command); its path, or None without a directory."""
        if self.out is None:
            return None
        store.save_checkpoint(self.out, state, gens, [r for r in self.rows if r["round"] <= state.round])
        self._write_log()
        return str(self.out / "checkpoint.safetensors")

    def finish(self) -> None:
        """The final metrics, ``distributed.json`` and ``DONE``."""
        if self.out is not None:
            self._write_log()
            store.finish_run(self.out, self.rows)

    def summary(self) -> dict[str, Any]:
        """Median round time and mean bytes per round (over the logged rounds)."""
        secs = [r.seconds for r in self.log]
        return {
            "topology": self.topology, "world_size": self.world_size, "rounds_logged": len(self.log),
            "median_round_s": statistics.median(secs) if secs else None,
            "bytes_sent_per_round": statistics.fmean(r.sent for r in self.log) if self.log else None,
            "bytes_received_per_round": statistics.fmean(r.received for r in self.log) if self.log else None,
            "rounds_with_missing": sum(1 for r in self.log if r.missing),
        }

    def _write_log(self) -> None:
        assert self.out is not None
        payload = {"summary": self.summary(), "rounds": [vars(r) for r in self.log]}
        store.atomic_write_text(self.out / "distributed.json", json.dumps(payload, indent=1))

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(f"[phalanx rank 0] {text}", file=sys.stderr, flush=True)


def empty_momentum(rows: int, like: Tensor) -> Tensor:
    """A zero ``(rows, d)`` buffer shaped like ``like``'s flat rows (the server's copy of every worker's momentum)."""
    return torch.zeros(rows, like.numel(), dtype=like.dtype)
