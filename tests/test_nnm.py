"""Tests of nearest-neighbour mixing (Allouah et al., AISTATS 2023) and of chains ending in Krum / Multi-Krum."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.aggregators import make
from phalanx.aggregators.chain import Chain
from phalanx.aggregators.krum import Krum, MultiKrum
from phalanx.aggregators.pre.nnm import NNM
from phalanx.errors import ConfigError


def _data(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)


def nnm_reference(x: torch.Tensor, f: int) -> torch.Tensor:
    """Row by row, straight from Algorithm 1: the mean of the n − f nearest rows, itself included."""
    n = x.shape[0]
    out = []
    for i in range(n):
        d = [(0.0 if j == i else float(((x[i] - x[j]) ** 2).sum()), 0 if j == i else 1, j) for j in range(n)]
        nearest = [j for _, _, j in sorted(d)[: n - f]]
        out.append(x[nearest].mean(dim=0))
    return torch.stack(out)


def test_hand_example() -> None:
    # n = 5, f = 1: each row averages its 4 nearest rows (itself included).
    # 0, 1, 2 all take {0, 1, 2, 10} -> 13/4; 10 and 11 take {10, 11, 2, 1} -> 6.
    x = torch.tensor([[0.0], [1.0], [2.0], [10.0], [11.0]], dtype=torch.float64)
    y, m = NNM(f=1).mix(x)
    torch.testing.assert_close(y, torch.tensor([[3.25], [3.25], [3.25], [6.0], [6.0]], dtype=torch.float64))
    q = 0.25
    want = torch.tensor([
        [q, q, q, q, 0], [q, q, q, q, 0], [q, q, q, q, 0], [0, q, q, q, q], [0, q, q, q, q],
    ], dtype=torch.float64)
    torch.testing.assert_close(m, want)


def test_ties_go_to_the_smaller_index() -> None:
    # Row 0 = 0 is at distance 1 from both 1 (row 1) and -1 (row 2): row 1 wins.
    x = torch.tensor([[0.0], [1.0], [-1.0]], dtype=torch.float64)
    y, m = NNM(f=1).mix(x)
    torch.testing.assert_close(y, torch.tensor([[0.5], [0.5], [-0.5]], dtype=torch.float64))
    torch.testing.assert_close(
        m, torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5]], dtype=torch.float64),
    )


def test_itself_always_included_even_among_duplicates() -> None:
    x = torch.tensor([[1.0], [1.0], [1.0], [5.0], [6.0]], dtype=torch.float64)
    _, m = NNM(f=2).mix(x)  # 3 neighbours; rows 0-2 are all at distance 0 from each other
    assert (torch.diagonal(m) > 0).all()


@given(st.integers(0, 4), st.integers(0, 3), st.integers(0, 10_000))
def test_matches_row_by_row_reference(f: int, extra: int, seed: int) -> None:
    n = 2 * f + 1 + extra
    x = _data(n, 4, seed)
    y, m = NNM(f=f).mix(x)
    torch.testing.assert_close(y, nnm_reference(x, f))
    torch.testing.assert_close(m.sum(dim=1), torch.ones(n, dtype=torch.float64))
    assert ((m == 0) | (m == 1.0 / (n - f))).all()
    torch.testing.assert_close(m @ x, y)


def test_permutation_equivariance() -> None:
    x = _data(9, 5, 1)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    y, m = NNM(f=3).mix(x)
    y_p, m_p = NNM(f=3).mix(x[perm])
    torch.testing.assert_close(y_p, y[perm])
    torch.testing.assert_close(m_p, m[perm][:, perm])


def test_identical_rows_unchanged() -> None:
    x = torch.tensor([2.0, -1.0], dtype=torch.float64).repeat(5, 1)
    torch.testing.assert_close(NNM(f=2)(x), x)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_bad_rows_never_reach_honest_outputs(garbage: float) -> None:
    honest = _data(9, 6, 2, torch.float32)
    x = torch.cat([honest[:3], torch.full((2, 6), garbage), honest[3:]])  # rows 3 and 4 are bad
    y, m = NNM(f=2).mix(x)
    good = [0, 1, 2, 5, 6, 7, 8, 9, 10]
    assert torch.isfinite(y[good]).all()
    assert (m[good][:, [3, 4]] == 0).all()
    # Each honest row's 9 neighbours are exactly the 9 honest rows: every honest output is the honest mean.
    torch.testing.assert_close(y[good], honest.mean(dim=0).expand(9, 6))
    assert not torch.isfinite(y[[3, 4]]).all(dim=1).any()  # bad rows stay bad


def test_input_unchanged() -> None:
    x = _data(7, 5, 3)
    before = x.clone()
    y = NNM(f=2)(x)
    y += 1.0
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_kept(dtype: torch.dtype) -> None:
    x = _data(7, 4, 4, dtype)
    y, m = NNM(f=2).mix(x)
    assert y.dtype == dtype and y.shape == (7, 4) and m.dtype == torch.float64
    torch.testing.assert_close(y.double(), nnm_reference(x.double(), 2), atol=2e-2, rtol=2e-2)


def test_invalid_configuration() -> None:
    for bad in (-1, 1.0, "3", True):
        with pytest.raises(ConfigError) as info:
            NNM(f=bad)  # type: ignore[arg-type]
        assert info.value.parameter == "f"
    assert NNM(f=3).min_workers() == 7 and NNM(f=3).output_rows(9) == 9
    with pytest.raises(ConfigError) as info2:
        NNM(f=3)(_data(6, 2, 0))
    assert info2.value.parameter == "n"


def test_chain_nnm_krum() -> None:
    x = _data(9, 6, 5)
    x[7] += 10.0
    agg = make("nnm>krum", f=2)
    assert isinstance(agg, Chain) and agg.min_workers() == 7
    out, contrib = agg.aggregate(x)
    y, m = NNM(f=2).mix(x)
    out_rule, c_rule = Krum(f=2).aggregate(y)
    torch.testing.assert_close(out, out_rule)
    torch.testing.assert_close(contrib, c_rule @ m)
    torch.testing.assert_close(contrib.sum(), torch.tensor(1.0, dtype=torch.float64))
    # Krum's output is one mixed row, i.e. the mean of n - f = 7 inputs: 7 contributions of 1/7.
    assert int((contrib > 0).sum()) == 7
    torch.testing.assert_close(out, (contrib.to(x.dtype) @ x))


def test_chain_nnm_multikrum() -> None:
    x = _data(5, 4, 6)
    agg = make("nnm>multikrum(m=3)", f=1)
    out, contrib = agg.aggregate(x)
    y, m = NNM(f=1).mix(x)
    out_rule, c_rule = MultiKrum(f=1, m=3).aggregate(y)
    torch.testing.assert_close(out, out_rule)
    torch.testing.assert_close(contrib, c_rule @ m)
    torch.testing.assert_close(contrib.sum(), torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(out, contrib.to(x.dtype) @ x)


def test_chain_with_bad_rows_is_finite() -> None:
    x = _data(9, 6, 7, torch.float32)
    x[[2, 6]] = float("nan")
    out, contrib = make("nnm>krum", f=2).aggregate(x)
    assert torch.isfinite(out).all() and contrib[[2, 6]].sum() == 0


def test_registry_and_metadata() -> None:
    pre = make("nnm>multikrum", f=1).pre[0]  # type: ignore[attr-defined]
    assert isinstance(pre, NNM)
    info = pre.describe()
    assert info["kind"] == "pre" and info["requirement"] == "n > 2f" and "Allouah" in info["reference"]
