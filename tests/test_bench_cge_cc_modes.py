"""``benchmarks/cge_cc_modes.py``: ``cge`` and ``cc`` beside ByzPy / ByzFL, alternating call by call (issue 37).

A smoke run on a tiny input (every implementation timed, every ratio printed, the outputs agreeing), and the check
that no timed call changed the shared input, with a mutant implementation that does. No timing is asserted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from _scripts import load_script

modes = load_script("benchmarks/cge_cc_modes.py", "phalanx_bench_cge_cc_modes")


def _peers_installed() -> bool:
    try:
        modes.load_byzfl()
        modes.load_byzpy()
    except Exception:
        return False
    return True


needs_peers = pytest.mark.skipif(not _peers_installed(), reason="ByzFL / ByzPy not installed")


@needs_peers
def test_every_implementation_is_timed_and_agrees() -> None:
    lines = modes.run(12, 300, 2, reps=2)
    text = "\n".join(lines)
    for name in ("pass x.sum(0)", "cge: Phalanx", "cge: ByzPy", "cc: Phalanx", "cc: ByzFL", "cc: ByzPy"):
        assert f"  {name} " in text
    ratios = [line for line in lines if " / Phalanx = " in line]
    assert len(ratios) == 3
    for line in ratios:  # float32 results of the same formula: within a few float32 roundings of each other
        rel = float(line.rsplit("output| ", 1)[1].rstrip(")"))
        assert rel <= 64 * torch.finfo(torch.float32).eps


def test_a_call_that_changes_the_input_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def mutant(x: torch.Tensor, f: int) -> dict[str, Callable[[], Any]]:
        # a peer that clips its input in place, as ByzFL's Clipping does: the next implementation would see other rows
        return {"pass x.sum(0)": lambda: x.sum(0), "cge: Phalanx": lambda: x.mul_(0.5).sum(0)}

    monkeypatch.setattr(modes, "implementations", mutant)
    with pytest.raises(AssertionError, match="changed its input"):
        modes.run(6, 50, 1, reps=1)
