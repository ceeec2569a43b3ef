"""Pairwise distances from one Gram matrix (``aggregators._numerics.pairwise_sqdist``) under a large common offset.

The Gram formula ``Gᵢᵢ + Gⱼⱼ − 2Gᵢⱼ`` cancels catastrophically when every row shares an offset much larger than
the rows' spread (an independent review: float32, d = 1000, honest spread 0.01, offset 100 gave distance errors of
3.8 on honest distances of 0.2, and MDA put 0.222 of its weight on the attackers). These tests pin the fix — a
re-centred recomputation when the error bound could matter — and that well-conditioned inputs keep the formula's
bits (the documented results reproduce to the digit).
"""

from __future__ import annotations

import pytest
import torch

from phalanx.aggregators import _numerics, make
from phalanx.aggregators._numerics import pairwise_sqdist, row_sqnorms

DISTANCE_SPECS = ["krum", "multikrum", "bulyan", "mda", "nnm>cwtm"]


def _reviewers_rows(c: float) -> tuple[torch.Tensor, int]:
    """11 rows, d = 1000: 9 honest at spread 0.01 and f = 2 attackers at spread 0.05 around the honest mean, all
    shifted by ``c``, in float32 (the reviewer's reproducer)."""
    n, f, d = 11, 2, 1000
    g = torch.Generator().manual_seed(0)
    h = 0.01 * torch.randn(n, d, generator=g, dtype=torch.float64)
    a = h.clone()
    a[:f] = h[f:].mean(0) + 0.05 * torch.randn(f, d, generator=g, dtype=torch.float64)
    return (a + c).float(), f


@pytest.mark.parametrize("c", [100.0, 1000.0])
@pytest.mark.parametrize("spec", DISTANCE_SPECS)
def test_large_common_offset_does_not_hand_selection_to_attackers(spec: str, c: float) -> None:
    """No weight on the attackers at offsets 100 and 1000 (before the fix: MDA 0.222 at 100, nnm>cwtm 0.112 at 100
    and 0.216 at 1000, Multi-Krum 0.111 and Bulyan 0.035 at 1000), and translation equivariance: the rule on the
    shifted float32 rows selects what it selects on the same rows shifted back exactly (in float64, where nothing
    cancels), and its output is that one plus c up to the rounding of the result near c (ulp(1000) = 6·10⁻⁵, far
    below the honest spread of 0.01). nnm>cwtm's shares are per-coordinate: in a coordinate where an attacker's
    mixed row rounds to the honest value near c, the trimmed mean may keep it (≤ 10⁻⁴ of the weight, none in
    float64), so its shares are compared to 10⁻³."""
    torch.set_num_threads(1)
    x, f = _reviewers_rows(c)
    out, w = make(spec, f=f).aggregate(x)
    back, w_back = make(spec, f=f).aggregate(x.double() - c)  # exact: float32 values minus c
    share_tol = 1e-3 if spec == "nnm>cwtm" else 0.0
    assert float(w[:f].sum()) <= share_tol, (spec, c, w[:f])
    torch.testing.assert_close(w, w_back, rtol=0, atol=share_tol)
    torch.testing.assert_close(out.double() - c, back, rtol=0, atol=4 * torch.finfo(torch.float32).eps * c)


def _old_formula(x: torch.Tensor) -> torch.Tensor:
    """pairwise_sqdist before the fix, verbatim: the common path must keep these bits."""
    sqnorms = row_sqnorms(x)
    bad = ~torch.isfinite(sqnorms)
    if bool(bad.any()):
        x = torch.where(bad[:, None], torch.zeros((), dtype=x.dtype, device=x.device), x)
    gram = x @ x.T
    gram = 0.5 * (gram + gram.T)
    sq = gram.diagonal().clone()
    bad = bad | ~torch.isfinite(sq)
    dist = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min_(0.0)
    dist.fill_diagonal_(0.0)
    dist = torch.nan_to_num(dist, nan=float("inf"), posinf=float("inf"))
    if bool(bad.any()):
        dist[bad, :] = float("inf")
        dist[:, bad] = float("inf")
    return dist


def _well_conditioned(seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 40, (1,), generator=g))
    d = int(torch.randint(1, 3000, (1,), generator=g))
    kind = seed % 4
    if kind == 0:  # centred noise
        x = torch.randn(n, d, generator=g, dtype=torch.float64)
    elif kind == 1:  # a shared mean 10× the noise in squared norm, like honest training updates
        x = torch.randn(d, generator=g, dtype=torch.float64) * 10**0.5 + torch.randn(n, d, generator=g,
                                                                                      dtype=torch.float64)
    elif kind == 2:  # small integers (exact sums), duplicates included
        x = torch.randint(-4, 5, (n, d), generator=g).double()
    else:  # noise with a few garbage rows
        x = torch.randn(n, d, generator=g, dtype=torch.float64)
        x[: max(1, n // 4)] = float("nan")
        if n > 3:
            x[n - 1, 0] = float("inf")
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_well_conditioned_inputs_keep_the_gram_formulas_bits(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On well-conditioned rows the result is bit for bit the old formula's, and the re-centred path never runs."""
    torch.set_num_threads(1)

    def refuse(*_: object) -> None:
        raise AssertionError("re-centred path taken on well-conditioned rows")

    monkeypatch.setattr(_numerics, "_centred_gram", refuse)
    for seed in range(40):
        x = _well_conditioned(seed, dtype)
        if seed % 4 == 2 and x.shape[0] > 2 and x.shape[1] == 1:
            continue  # one small-integer column: more than half the rows may coincide, which the check flags
        assert torch.equal(pairwise_sqdist(x), _old_formula(x)), (seed, tuple(x.shape))


def test_recentred_path_keeps_the_contract() -> None:
    """On the re-centred path: bad rows +inf, an exact zero diagonal, symmetry, no negative entries, the input
    dtype, and the distances of the unshifted rows (robust to an attacker in row 0, far from the others)."""
    torch.set_num_threads(1)
    x, _ = _reviewers_rows(1000.0)
    x[0] = x[0] + 50.0  # row 0 is no centre to trust
    x[3] = float("nan")
    x[5, 7] = float("inf")
    dist = pairwise_sqdist(x)
    assert dist.dtype == torch.float32
    assert torch.equal(dist, dist.T)
    assert (dist >= 0).all()
    bad = torch.zeros(x.shape[0], dtype=torch.bool)
    bad[[3, 5]] = True
    assert torch.isinf(dist[bad]).all() and torch.isinf(dist[:, bad]).all()
    good = ~bad
    assert torch.equal(dist[good][:, good].diagonal(), torch.zeros(int(good.sum())))
    xd = x.double()[good]
    exact = ((xd[:, None, :] - xd[None, :, :]) ** 2).sum(dim=2)
    torch.testing.assert_close(dist[good][:, good].double(), exact, rtol=1e-5, atol=1e-6)


def test_integer_rows_with_a_large_offset_stay_exact() -> None:
    """Small-integer rows shifted by 2²⁰ in float32: the squared norms (2⁴⁰·d) are not exact in float32, but the
    re-centred path subtracts a data value (the lower median) and sums in float64, so every distance is exact."""
    g = torch.Generator().manual_seed(3)
    base = torch.randint(-3, 4, (9, 6), generator=g).double()
    exact = ((base[:, None, :] - base[None, :, :]) ** 2).sum(dim=2)
    dist = pairwise_sqdist((base + 2.0**20).float())
    assert torch.equal(dist.double(), exact)


@pytest.mark.parametrize("n", [5, 9])
def test_far_attackers_at_n_equal_2f_plus_1_cannot_switch_the_check_off(n: int) -> None:
    """A review of a change to the check (reading one distance past each row's median, so that f copies of an honest
    row could not force the slow path): at n = 2f + 1 that distance is one to an attacker, and f far attackers
    raised it, switched the check off, and honest distances of 0.2 came out as 128 or 0 (float32, a common offset of
    10³). The median is read again: the slow, exact path runs, and the honest distances are right. (Copies of an
    honest row can force that path: a cost, not a wrong selection.)"""
    torch.set_num_threads(1)
    f, d = (n - 1) // 2, 1000
    g = torch.Generator().manual_seed(0)
    honest = torch.full((n - f, d), 1e3) + 1e-2 * torch.randn(n - f, d, generator=g)
    far = torch.full((f, d), 1e3) + 30 * torch.randn(f, d, generator=g)
    dist = pairwise_sqdist(torch.cat([honest, far]).float())
    exact = torch.cdist(honest.double(), honest.double()).square()
    torch.testing.assert_close(dist[: n - f, : n - f].double(), exact, rtol=1e-3, atol=1e-3)
