"""Without the C kernel, the coordinate-wise rules run on ``torch.sort`` (``coordinatewise._cw_torch``) and must
choose what the kernel chooses. MeaMed's window is the delicate part: with infinite values its costs are ±inf or
NaN (inf − inf), and a Byzantine majority — Bulyan calls MeaMed with ``trim ≥ length`` — can make every cost
non-finite. The kernel (``window_starts_`` in ``_cwkernel.c``) adds the median's halves in float64, takes
``cost = a > b ? a : b`` and replaces the best window only on a strictly smaller cost, starting from +inf; the
fallback must do the same, step for step."""

from __future__ import annotations

import pytest
import torch

from phalanx.aggregators import _sortnet, coordinatewise

NEEDS_KERNEL = pytest.mark.skipif(not coordinatewise.HAVE_KERNEL, reason="C kernel not built")
PALETTE = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1.0, -1.0, 2.5, 3e38, -3e38, 1e-45, -1e-45]


def _hostile(n: int, d: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Columns drawn from values that make MeaMed's costs infinite or NaN (±inf, NaN, ±0, the largest and the
    smallest floats), mixed with Gaussian values, a different share of each per column."""
    g = torch.Generator().manual_seed(seed)
    pal = torch.tensor(PALETTE, dtype=dtype)
    special = pal[torch.randint(len(PALETTE), (n, d), generator=g)]
    share = torch.rand(1, d, generator=g, dtype=torch.float64)
    pick = torch.rand(n, d, generator=g, dtype=torch.float64) < share
    return torch.where(pick, special, torch.randn(n, d, generator=g, dtype=dtype))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values (−0 equals +0: the sorted order of tied zeros is the network's or ``torch.sort``'s), NaN where
    NaN. Exact: the fallback adds the same float64 values in the same order as the kernel."""
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


@NEEDS_KERNEL
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 11, 17, 50])
@pytest.mark.parametrize("mode", ["trimmed", "median", "meamed"])
def test_the_fallback_gives_the_kernels_values_on_infinite_and_nan_inputs(mode: str, dtype: torch.dtype,
                                                                            n: int) -> None:
    """Every trim (MeaMed's trim ≥ length from n/2 on: Bulyan's call, no row in every window), the outputs equal
    (the window, then the same float64 additions in the same order), the contributions within float64 rounding."""
    x = _hostile(n, 700, n, dtype)
    trims = range(n) if mode == "meamed" else range((n + 1) // 2) if mode == "trimmed" else [0]
    for trim in trims:
        kernel, kc = coordinatewise.coordinate_window_mean(x, mode, trim, True)  # type: ignore[arg-type]
        fallback, fc = coordinatewise._cw_torch(x, coordinatewise._MODES[mode], trim, True)
        alone, _ = coordinatewise.coordinate_window_mean(x, mode, trim, False)  # type: ignore[arg-type]
        assert _same(kernel, fallback) and _same(alone, fallback), (n, trim)
        assert kc is not None and fc is not None and torch.allclose(kc, fc, atol=1e-12), (n, trim)


def test_the_fallback_adds_in_the_kernels_order() -> None:
    """Mutant: the former fallback's ``sum(dim=0, dtype=float64)`` (a cascade) on the window (−3e38, −1e−45, 1,
    2.5, 3e38): 3.5 / 5 = 0.7, where the kernel's sequential float64 sum loses 1 and 2.5 against −3e38 and gives 0."""
    col = torch.tensor([2.5, -3e38, float("-inf"), -1e-45, float("nan"), 3e38, 1.0, 3e38])[:, None]
    xs = torch.sort(torch.where(col.isnan(), float("inf"), col), dim=0).values
    start = coordinatewise._window_start_torch(xs, _sortnet.MODE_MEAMED, 3, 5)
    assert start.tolist() == [1]
    rows = start[None, :] + torch.arange(5)[:, None]
    assert (xs.gather(0, rows).sum(dim=0, dtype=torch.float64) / 5).item() == pytest.approx(0.7)  # the former
    assert coordinatewise._cw_torch(col, _sortnet.MODE_MEAMED, 3, False)[0].item() == 0.0
    if coordinatewise.HAVE_KERNEL:
        assert coordinatewise.coordinate_window_mean(col, "meamed", 3, False)[0].item() == 0.0


def test_the_former_fallback_took_another_window() -> None:
    """Mutant: the fallback before this test (costs through ``nan_to_num``, which also turns +inf into the largest
    float, then ``argmin``) picks a window with an infinite cost where the kernel keeps the first: n = 2, trim = 1,
    values (−inf, 2): the kernel and the fallback give −inf; the former fallback gave 2."""
    x = torch.tensor([[float("-inf")], [2.0]])
    xs = torch.sort(x, dim=0).values

    def former(xs: torch.Tensor, trim: int, length: int) -> torch.Tensor:
        n = xs.shape[0]
        med = 0.5 * xs[(n - 1) // 2] + 0.5 * xs[n // 2]
        cost = torch.maximum(med[None] - xs[: trim + 1], xs[length - 1 : length + trim] - med[None])
        return torch.nan_to_num(cost, nan=float("inf")).argmin(dim=0)

    trim, length = _sortnet.window_params(2, _sortnet.MODE_MEAMED, 1)
    assert former(xs, trim, length).tolist() == [1]
    assert coordinatewise._window_start_torch(xs, _sortnet.MODE_MEAMED, trim, length).tolist() == [0]
    assert coordinatewise._cw_torch(x, _sortnet.MODE_MEAMED, 1, False)[0].item() == float("-inf")
    if coordinatewise.HAVE_KERNEL:
        assert coordinatewise.coordinate_window_mean(x, "meamed", 1, False)[0].item() == float("-inf")


def _wide(n: int, d: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Values whose magnitudes span 2⁻⁴⁰ … 2⁴⁰ within a column: float64 sums of them depend on the order."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.pow(2.0, torch.randint(-40, 41, (n, d), generator=g).to(torch.float64))
    return (torch.randn(n, d, generator=g, dtype=torch.float64) * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["trimmed", "median", "meamed"])
def test_asking_for_contributions_changes_no_output_bit(mode: str, dtype: torch.dtype,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The training loop asks for contributions on its evaluation rounds only; the aggregate must not depend on it
    (else evaluating more often would change the run). Mutant: the trimmed mean on the pruned network again (the
    right values in its window, not in order), whose float64 sum then differs from the sorted one."""
    for n in (7, 16, 50, 130):
        x = _wide(n, 3000, n, dtype)
        for trim in sorted({0, 1, (n - 1) // 3, (n - 1) // 2}):
            asked, _ = coordinatewise.coordinate_window_mean(x, mode, trim, True)  # type: ignore[arg-type]
            plain, _ = coordinatewise.coordinate_window_mean(x, mode, trim, False)  # type: ignore[arg-type]
            assert torch.equal(asked, plain), (n, trim)
    if mode != "trimmed" or dtype != torch.float64 or not coordinatewise.HAVE_KERNEL:
        return
    monkeypatch.setattr(_sortnet, "network_window", lambda n, mode, trim, length: (trim, length))
    _sortnet.kernel_program.cache_clear()
    try:
        x = _wide(50, 3000, 50, dtype)
        asked, _ = coordinatewise.coordinate_window_mean(x, "trimmed", 10, True)
        plain, _ = coordinatewise.coordinate_window_mean(x, "trimmed", 10, False)
        assert not torch.equal(asked, plain)
    finally:
        _sortnet.kernel_program.cache_clear()
