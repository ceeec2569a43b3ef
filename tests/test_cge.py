"""Comparative Gradient Elimination (Gupta, Liu & Vaidya 2020; Liu, Gupta & Vaidya, PODC 2021): the n − f shortest
rows averaged, norm ties shared, bad rows dropped first."""

from __future__ import annotations

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators import _rowops
from phalanx.aggregators.cge import cge_weights
from phalanx.errors import ConfigError
from phalanx.testing import check_aggregator


@pytest.mark.parametrize("seed", range(6))
def test_the_mean_of_the_n_minus_f_shortest_rows(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n, f = 9, seed % 4
    x = torch.randn(n, 5, generator=g, dtype=torch.float64) * torch.rand(n, 1, generator=g, dtype=torch.float64)
    keep = torch.argsort(x.norm(dim=1))[: n - f]
    out, share = aggregators.make("cge", f=f).aggregate(x)
    torch.testing.assert_close(out, x[keep].mean(0), rtol=0, atol=1e-14)
    assert torch.equal(share > 0, torch.isin(torch.arange(n), keep))
    assert float(share.sum()) == pytest.approx(1.0, abs=1e-15)


def test_rows_tied_at_the_cut_share_the_places_left() -> None:
    # Norms 1, 1.5, √5, √5, √5, 3, 3 with f = 3: two places are left for the three rows of norm √5, 2/3 each.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.5], [1.0, 2.0], [2.0, 1.0], [-1.0, 2.0], [3.0, 0.0], [0.0, 3.0]])
    out, share = aggregators.make("cge", f=3).aggregate(x)
    torch.testing.assert_close(share, torch.tensor([1 / 4, 1 / 4, 1 / 6, 1 / 6, 1 / 6, 0, 0], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([0.25 + 2 / 6, 0.375 + 5 / 6]))
    torch.testing.assert_close(aggregators.make("cge", f=3)(x.flip(0)), out)  # the same rows, whatever their order


def test_bad_rows_are_dropped_first() -> None:
    x = torch.tensor([[1.0, 1.0], [float("nan"), 0.0], [2.0, 0.0], [1e38, 1e38], [0.5, 0.0]])
    out, share = aggregators.make("cge", f=2).aggregate(x)
    torch.testing.assert_close(out, torch.tensor([3.5 / 3, 1.0 / 3]))
    assert share[1] == 0 and share[3] == 0
    w = cge_weights(torch.tensor([1.0, float("inf"), float("nan"), 2.0], dtype=torch.float64), 2)
    torch.testing.assert_close(w, torch.tensor([0.5, 0.0, 0.0, 0.5], dtype=torch.float64))


def test_requirement_and_properties() -> None:
    assert aggregators.make("cge", f=3).min_workers() == 7
    with pytest.raises(ConfigError, match="n >= 7"):
        aggregators.make("cge", f=3)(torch.randn(6, 2))
    check_aggregator("cge", trials=12)


def _float64_decision(x: torch.Tensor, f: int) -> torch.Tensor:
    """CGE's weights from every norm summed in float64 (the definition the one-pass norms must reproduce)."""
    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return cge_weights(_rowops.float64_row_norms(xc, _rowops.row_norms(xc)[1]), f)


def _inputs(seed: int) -> list[tuple[torch.Tensor, int]]:
    """Gaussian rows, small integers (exact ties), permutations of one row (ties that float32 rounds apart), garbage
    and overflowing rows, float64 rows whose norms differ by 1e-9 relatively — each in float32 and float64."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for kind in range(5):
        n = int(torch.randint(3, 30, (1,), generator=g))
        f = int(torch.randint(0, (n - 1) // 2 + 1, (1,), generator=g))
        d = int(torch.randint(1, 2000, (1,), generator=g))
        if kind == 0:
            x = torch.randn(n, d, generator=g)
        elif kind == 1:
            x = torch.randint(-3, 4, (n, d), generator=g).float()
        elif kind == 2:
            v = torch.randint(2**15, 2**16, (d,), generator=g).float() / 2**16
            x = torch.stack([v[torch.randperm(d, generator=g)] for _ in range(n)])
            x[0] *= 0.5
        elif kind == 3:
            x = torch.randn(n, d, generator=g)
            x[0], x[1, 0], x[2] = float("nan"), float("inf"), 3e19
        else:
            x = torch.randn(n, d, generator=g, dtype=torch.float64)
            x = x * (1 + 1e-9 * torch.randn(n, 1, generator=g, dtype=torch.float64))
        out += [(x, f), (x.double(), f), (x.half(), f)]
    return out


ESTIMATE_PATHS = ["kernel", "torch blocks"]


def use_estimates(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``row_sqnorm_estimates`` take ``path``: the C kernel's float64 sums or torch's float32 block norms (the
    path of other devices and of a build without the kernel)."""
    if path == "kernel" and _rowops._normkernel is None:
        pytest.skip("the C norm kernel is not built")
    monkeypatch.setattr(_rowops, "HAVE_NORM_KERNEL", path == "kernel")


@pytest.mark.parametrize("path", ESTIMATE_PATHS)
@pytest.mark.parametrize("seed", range(20))
def test_one_pass_norms_decide_like_float64_norms(seed: int, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fast path (one-pass estimates with an error bound, float64 norms only for rows that may sit at the cut)
    # gives exactly the weights of every norm summed in float64, ties included.
    use_estimates(path, monkeypatch)
    for x, f in _inputs(seed):
        _, share = aggregators.make("cge", f=f).aggregate(x)
        assert torch.equal(share, _float64_decision(x, f)), (x.dtype, x.shape, f)


def test_a_bound_that_ignores_rounding_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Mutant: the block estimates taken as exact (δ = η = 0). Rows that are permutations of one another have the
    # same float64 norm (a tie: they share the places left) but float32 rounds their block norms apart; the mutant
    # then keeps one and drops the other. (The kernel's float64 sums of these squares are exact: its own mutant is
    # test_kernel_estimates_keep_their_bound.)
    use_estimates("torch blocks", monkeypatch)
    g = torch.Generator().manual_seed(3)
    v = torch.randint(2**15, 2**16, (1000,), generator=g).float() / 2**16
    x = torch.stack([0.5 * v, v, v.flip(0), v[torch.randperm(1000, generator=g)], 2 * v])
    want = _float64_decision(x, 2)
    assert torch.equal(aggregators.make("cge", f=2).aggregate(x)[1], want)
    assert want[1] == want[2] == want[3] == pytest.approx(2 / 9)  # three tied rows share two places
    real = _rowops.row_sqnorm_estimates

    def no_slack(
        x: torch.Tensor, max_squares: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        est, bad, _, _ = real(x, max_squares)
        return est, bad, 0.0, 0.0

    monkeypatch.setattr(_rowops, "row_sqnorm_estimates", no_slack)
    assert not torch.equal(aggregators.make("cge", f=2).aggregate(x)[1], want)


def count_float64_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make ``_rowops.float64_row_norms`` record how many rows each call takes; returns the record."""
    seen: list[int] = []
    real = _rowops.float64_row_norms

    def counting(
        x: torch.Tensor, bad: torch.Tensor, rows: torch.Tensor | None = None, max_squares: torch.Tensor | None = None
    ) -> torch.Tensor:
        seen.append(x.shape[0] if rows is None else rows.numel())
        return real(x, bad, rows, max_squares)

    monkeypatch.setattr(_rowops, "float64_row_norms", counting)
    return seen


@pytest.mark.parametrize("path", ESTIMATE_PATHS)
def test_rows_at_the_cut_cost_at_most_their_own_float64_norms(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Availability: a Byzantine row placed exactly at the cut only makes the rows near the cut take the float64
    # path; well separated rows never do.
    use_estimates(path, monkeypatch)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 5000, generator=g) * torch.linspace(1, 2, 20)[:, None]
    x[19] = x[10]  # an attacker's copy of the row at the cut
    seen = count_float64_rows(monkeypatch)
    _, share = aggregators.make("cge", f=9).aggregate(x)
    assert seen and max(seen) <= 3
    assert share[10] == share[19] == pytest.approx(1 / 22)


@pytest.mark.parametrize("path", ESTIMATE_PATHS)
def test_a_lone_row_at_the_cut_needs_no_float64_norm(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CGE only compares keys: when one row alone may be the (n − f)-th shortest, it is, and nothing ties with it,
    so no float64 norm is computed and the weights are those of float64 norms. Mutant: every uncertain row keyed by
    its estimate (the float64 step skipped whatever the count) — rows tied in float64 but rounded apart in float32
    then no longer share their places."""
    use_estimates(path, monkeypatch)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 5000, generator=g) * torch.linspace(1, 2, 20)[:, None]  # norms far apart
    seen = count_float64_rows(monkeypatch)
    for f in (0, 3, 9):
        assert torch.equal(aggregators.make("cge", f=f).aggregate(x)[1], _float64_decision(x, f))
    assert seen == [20, 20, 20]  # only _float64_decision's own calls
    use_estimates("torch blocks", monkeypatch)  # the float32 block norms round the tied rows apart
    v = torch.randint(2**15, 2**16, (1000,), generator=torch.Generator().manual_seed(3)).float() / 2**16
    tied = torch.stack([0.5 * v, v, v.flip(0), v[torch.randperm(1000, generator=g)], 2 * v])
    want = _float64_decision(tied, 2)
    assert torch.equal(aggregators.make("cge", f=2).aggregate(tied)[1], want)

    def estimates(
        x: torch.Tensor, bad: torch.Tensor, rows: torch.Tensor | None = None, max_squares: torch.Tensor | None = None
    ) -> torch.Tensor:
        est, _, _, _ = _rowops.row_sqnorm_estimates(x if rows is None else x.index_select(0, rows))
        return torch.where(bad, torch.full_like(est, float("inf")), est.sqrt())

    monkeypatch.setattr(_rowops, "float64_row_norms", estimates)
    assert not torch.equal(aggregators.make("cge", f=2).aggregate(tied)[1], want)
