"""No rule's aggregate depends on whether its contributions are asked for.

The training loop asks for contributions on its evaluation rounds only (``training/loop.py``: ``measure``); were a
rule's output to depend on it, evaluating more often would change the run. Every registered rule, and chains with
each pre-aggregator, on rows whose magnitudes span 2⁻³⁰ … 2³⁰ (float64 sums of them depend on the order of the
additions), float32 and float64: ``rule(x)`` and ``rule.aggregate(x)[0]`` of a fresh instance are equal bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators import _sortnet, registry

PRE = {"clip", "arc", "bucketing", "nnm"}
CHAINS = ["clip(threshold=1.0)>mean", "arc>cwtm", "bucketing(s=2)>cwtm", "nnm>cwtm", "nnm>meamed"]


def _rows(n: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    scale = torch.pow(2.0, torch.randint(-30, 31, (n, 1), generator=g).to(torch.float64))
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * scale + torch.randn(d, generator=g, dtype=torch.float64)
    return x.to(dtype)


def _differs(spec: str, dtype: torch.dtype) -> bool:
    for n, f in ((11, 2), (30, 5)):
        x = _rows(n, 2000, dtype)
        context = {"reference": torch.randn(2000, generator=torch.Generator().manual_seed(1), dtype=dtype)}
        context = context if spec == "fltrust" else {}
        plain = aggregators.make(spec, f=f)(x, **context)
        asked, _ = aggregators.make(spec, f=f).aggregate(x, **context)
        if not torch.equal(plain.nan_to_num(), asked.nan_to_num()):
            return True
    return False


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spec", [name for name in registry.names() if name not in PRE] + CHAINS)
def test_the_aggregate_is_the_same_with_and_without_contributions(spec: str, dtype: torch.dtype) -> None:
    assert not _differs(spec, dtype)


def test_a_trimmed_mean_summed_in_a_pruned_networks_order_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the trimmed mean's pruned network when no contributions are asked for (before 2026-12-05)."""
    from phalanx.aggregators import coordinatewise

    if not coordinatewise.HAVE_KERNEL:
        pytest.skip("C kernel not built")
    monkeypatch.setattr(_sortnet, "network_window",
                        lambda n, mode, trim, length: (trim, length) if mode == _sortnet.MODE_TRIMMED else None)
    assert _differs("cwtm", torch.float64)
