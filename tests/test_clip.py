"""Tests of static norm clipping (``clip``)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from phalanx.aggregators import make
from phalanx.aggregators.pre.clip import Clip
from phalanx.errors import ConfigError


def test_hand_example() -> None:
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
    y, m = Clip(threshold=1.0).mix(x)
    expected = torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
    torch.testing.assert_close(y, expected)
    assert torch.equal(m, torch.eye(4, dtype=torch.float64))


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_bad_rows_stay_bad(garbage: float) -> None:
    x = torch.tensor([[garbage, 1.0], [3.0, 4.0]])
    y = Clip(threshold=2.0)(x)
    assert torch.equal(torch.isnan(y[0]), torch.isnan(x[0]))
    assert torch.equal(torch.nan_to_num(y[0]), torch.nan_to_num(x[0]))
    torch.testing.assert_close(y[1], torch.tensor([1.2, 1.6]))


def test_default_threshold_and_metadata() -> None:
    clip = Clip()
    assert clip.threshold == 1.0
    assert clip.params() == {"f": 0, "threshold": 1.0}
    assert clip.output_rows(7) == 7 and clip.min_workers() == 1
    assert isinstance(make("clip(threshold=2.5)>mean", f=0).pre[0], Clip)  # type: ignore[attr-defined]


@pytest.mark.parametrize("threshold", [0.0, -1.0, math.nan, math.inf, "1", True, None])
def test_invalid_threshold(threshold: object) -> None:
    with pytest.raises(ConfigError) as info:
        Clip(threshold=threshold)  # type: ignore[arg-type]
    assert info.value.parameter == "threshold"


def test_invalid_f() -> None:
    with pytest.raises(ConfigError) as info:
        Clip(f=-1)
    assert info.value.parameter == "f"


def test_input_not_modified() -> None:
    x = torch.tensor([[30.0, 40.0], [float("nan"), 1.0]])
    x0 = x.clone()
    Clip(threshold=1.0)(x)
    assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(x0)) and torch.equal(x.isnan(), x0.isnan())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_dtype_is_kept(dtype: torch.dtype) -> None:
    y = Clip(threshold=1.0)(torch.tensor([[3.0, 4.0]], dtype=dtype))
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), torch.tensor([[0.6, 0.8]], dtype=torch.float64), atol=1e-2, rtol=1e-2)


@given(
    st.lists(st.lists(st.floats(-1e6, 1e6), min_size=4, max_size=4), min_size=1, max_size=6),
    st.floats(1e-3, 1e3),
)
def test_norms_never_exceed_threshold_and_directions_are_kept(rows: list[list[float]], tau: float) -> None:
    x = torch.tensor(rows, dtype=torch.float64)
    y = Clip(threshold=tau)(x)
    norms = x.norm(dim=1)
    assert bool((y.norm(dim=1) <= tau * (1 + 1e-12)).all())
    short = norms <= tau
    torch.testing.assert_close(y[short], x[short])
    long = ~short
    torch.testing.assert_close(y[long], x[long] * (tau / norms[long])[:, None])


@pytest.mark.parametrize("rule", ["clip", "arc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_large_outputs_are_the_same_values_in_their_own_memory(rule: str, dtype: torch.dtype) -> None:
    # Outputs of ≥ 2 MiB are written into a huge-page-advised buffer (phalanx.aggregators._rowops.new_rows): the
    # values are exactly x · min(1, τ/‖x‖), the memory is not the input's, and writing into it leaves x alone.
    from phalanx.aggregators import _rowops, registry

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(8, 70_000, generator=g) * torch.linspace(0.5, 2, 8)[:, None]).to(dtype)
    assert x.numel() * x.element_size() >= _rowops.HUGE_OUTPUT_BYTES or dtype == torch.float16
    kept = x.clone()
    pre = registry.get_class(rule)(f=2, **({"threshold": 250.0} if rule == "clip" else {}))
    y = pre(x)
    xc = x.float() if dtype == torch.float16 else x
    norms, bad = _rowops.row_norms(xc)
    if rule == "clip":
        tau: torch.Tensor | float = 250.0
    else:
        tau = torch.sort(norms, descending=True).values[2 * 2 * 6 // 8]
    expected = (xc * _rowops.clip_scales(norms, bad, tau).to(xc.dtype)[:, None]).to(dtype)
    assert y.dtype == dtype and torch.equal(y, expected)
    assert y.data_ptr() != x.data_ptr()
    y.fill_(0)
    assert torch.equal(x, kept)
