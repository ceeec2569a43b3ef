"""The setting of benchmarks/training.py: the worker counts it measures, its target, and the round every
implementation runs (model width, batch, learning rate, momentum, seed, b = f = n/10)."""

from __future__ import annotations

FULL_NS = (10, 50, 200)
BIG_N = 1000
QUICK_N = 10
TARGET = 10.0
"""Phalanx should be at least this many times faster than ByzFL at n ≥ :data:`TARGET_FROM_N`."""
TARGET_FROM_N = 50
BIG_N_BUDGET_S = 60.0
"""ByzFL and the loop run at n = 1000 when (1 warm-up + 2 timed rounds) are extrapolated to take at most this."""
DESIGN_BYZFL = {10: 0.013, 50: 0.10, 200: 0.49}
"""ByzFL's DSGD round as first measured on the development machine before Phalanx existed (same setting, 2 threads),
seconds: docs/benchmarks.md, "Peers measured before Phalanx"."""

IMPLS = ("byzfl", "loop", "vmap", "phalanx")
HIDDEN = 100
BATCH = 32
LR = 0.1
MOMENTUM = 0.9
SEED = 0


def byzantine_of(n: int) -> int:
    """b = f = n/10 (at least 1)."""
    return max(1, n // 10)

