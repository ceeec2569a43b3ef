"""A stateful rule's next rounds do not depend on where its loaded state sits in memory.

A resume hands a rule its state as tensors read from the checkpoint, where the uninterrupted run may hold slices of
larger tensors; the CPU BLAS picks a product's kernel by its operands' address alignment, so a rule that multiplied
its state where it lies would end a resumed run with other bits (FLDetector did: docs/design.md, "Randomness").
Here every stateful rule is loaded twice with the same state — fresh tensors, and views at an odd float offset
into larger buffers — and must give the same outputs and the same state bit for bit over the next rounds (the
state too: FLDetector's output is its base rule's while no one is flagged, and a score that drifts in its last bits
flags later, or never). The mutant, FLDetector's product on its operands where they lie, fails every offset on the
AVX2 development machine."""

from __future__ import annotations

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators.registry import get_class, names

STATEFUL = sorted(n for n in names() if getattr(get_class(n), "stateful", False))
SPECS = {"fldetector": "fldetector(window=2)"}  # a window the five rounds fill, so the L-BFGS product runs


def _shifted(value: torch.Tensor, offset: int) -> torch.Tensor:
    """``value``'s contents in a view that starts ``offset`` elements into a larger buffer."""
    buffer = torch.zeros(value.numel() + offset, dtype=value.dtype, device=value.device)
    view = buffer[offset:].view(value.shape)
    view.copy_(value)
    return view


def test_the_stateful_rules_are_found() -> None:
    assert {"fldetector", "foolsgold"} <= set(STATEFUL)


@pytest.mark.parametrize("name", STATEFUL)
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_state_loaded_at_any_offset_gives_the_same_rounds(name: str, offset: int) -> None:
    n, d, clients = 10, 1210, 14
    gen = torch.Generator().manual_seed(offset)
    rounds = []
    for _ in range(9):
        ids = torch.randperm(clients, generator=gen)[:n]
        rows = torch.randn(d, generator=gen) + 0.3 * torch.randn(n, d, generator=gen)
        rows[:2] *= -4.0  # two rows the rules may come to flag
        rounds.append((rows, ids))
    spec = SPECS.get(name, name)
    first = aggregators.make(spec, f=2)

    def context(ids: torch.Tensor, seed: int) -> dict[str, object]:
        given = {"ids": ids, "generator": torch.Generator().manual_seed(seed)}
        return {k: v for k, v in given.items() if k in first.context_keys}

    for rows, ids in rounds[:5]:
        first(rows, **context(ids, 1))
    state = first.state_dict()
    assert state, f"{name} kept no state after five rounds"
    fresh, shifted = aggregators.make(spec, f=2), aggregators.make(spec, f=2)
    fresh.load_state_dict({k: v.clone() for k, v in state.items()})
    shifted.load_state_dict({k: _shifted(v, offset) for k, v in state.items()})
    for r, (rows, ids) in enumerate(rounds[5:]):
        a, b = fresh(rows, **context(ids, r)), shifted(rows, **context(ids, r))
        assert torch.equal(a, b), (name, offset, r)
        after, shifted_after = fresh.state_dict(), shifted.state_dict()
        assert after.keys() == shifted_after.keys()
        assert all(torch.equal(after[k], shifted_after[k]) for k in after), (name, offset, r)  # scores too
