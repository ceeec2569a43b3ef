"""SMEA (Allouah, Guerraoui, Gupta, Pinot & Stephan, ICML 2023): the exact search over every subset of n − f rows,
against a transcription in R^d, ByzFL's documented example and ByzFL itself in d = 1 (where its one power-iteration
step is exact); ties averaged; the bound on the search refused before anything runs."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from phalanx import aggregators
from phalanx.errors import ConfigError
from phalanx.testing import check_aggregator


def _byzfl() -> Any:
    """ByzFL 0.0.11 as ``make bench`` installs it (its import-time-only dependencies stubbed by the benchmark's
    loader), or a skip where it is not installed."""
    if importlib.util.find_spec("byzfl") is None:
        pytest.skip("byzfl not installed (make bench installs it)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from _bench_peers import load_byzfl
    finally:
        sys.path.pop(0)
    return load_byzfl()


def reference(x: torch.Tensor, f: int) -> torch.Tensor:
    n = x.shape[0]
    best, best_lam = None, float("inf")
    for s in itertools.combinations(range(n), n - f):
        rows = x[list(s)]
        dev = rows - rows.mean(0)
        lam = float(torch.linalg.eigvalsh(dev.T @ dev / rows.shape[0])[-1])
        if lam < best_lam:
            best, best_lam = rows.mean(0), lam
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(8))
def test_the_subset_of_smallest_top_eigenvalue(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n, f = 5 + seed % 4, seed % 3
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    x[:f] *= 5.0
    out, share = aggregators.make("smea", f=f).aggregate(x)
    torch.testing.assert_close(out, reference(x, f), rtol=1e-12, atol=1e-12)
    assert int((share > 0).sum()) == n - f and float(share.sum()) == pytest.approx(1.0)


def test_byzfl_documented_example_is_one_of_two_tied_subsets() -> None:
    # {x0, x1} and {x1, x2} have the same covariance (27/4 along (1, 1, 1)): ByzFL keeps the first one in its
    # enumeration, (2.5, 3.5, 4.5); Phalanx averages the tied subsets, so the order of the rows does not matter.
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    out, share = aggregators.make("smea", f=1).aggregate(x)
    torch.testing.assert_close(out, (torch.tensor([2.5, 3.5, 4.5]) + torch.tensor([5.5, 6.5, 7.5])) / 2)
    torch.testing.assert_close(share, torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64))
    torch.testing.assert_close(aggregators.make("smea", f=1)(x.flip(0)), out)


def test_bad_rows_are_never_chosen() -> None:
    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(2))
    y = x.clone()
    y[1] = float("inf")
    y[5, 2] = float("nan")
    out, share = aggregators.make("smea", f=2).aggregate(y)
    assert share[1] == 0 and share[5] == 0
    torch.testing.assert_close(out, x[[0, 2, 3, 4, 6]].mean(0))


def test_the_search_bound_is_a_one_line_error_before_anything_runs() -> None:
    rule = aggregators.make("smea", f=3, max_subsets=100)
    with pytest.raises(ConfigError, match="max_subsets") as exc:
        rule(torch.randn(10, 2))  # C(10, 3) = 120
    assert "\n" not in str(exc.value)
    assert aggregators.make("smea", f=3, max_subsets=120)(torch.randn(10, 2)).shape == (2,)
    with pytest.raises(ConfigError, match="max_subsets"):
        aggregators.make("smea", f=1, max_subsets=0)


def test_passes_the_property_checks() -> None:
    check_aggregator("smea", trials=12)


def test_agrees_with_byzfl_in_one_dimension() -> None:
    byzfl = _byzfl()
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        n = int(torch.randint(3, 9, (1,), generator=g))
        f = int(torch.randint(0, (n - 1) // 2 + 1, (1,), generator=g))
        x = torch.randn(n, 1, generator=g, dtype=torch.float64)
        theirs = torch.as_tensor(byzfl.SMEA(f)(x.clone())).double()
        torch.testing.assert_close(aggregators.make("smea", f=f)(x), theirs, rtol=1e-6, atol=1e-6)  # float32 there
