"""Selection for the float32 median, trimmed mean and MeaMed (``_cwselect.c``, ``_cwselect_meamed.h``): the same bits
as the sorting network, or a flag that hands the column to it.

Each case compares the rule's output with selection against the network (``select=False``) bit for bit (the int32
patterns, so ``-0.0`` and ``+0.0`` differ; NaN outputs compared as NaN). The mutant: the exactness condition switched
off (``check_exact=0``) must give a different sum on a column built to make the order of additions matter, which the
real call flags instead (one column for the trimmed mean, one for MeaMed).
"""

from __future__ import annotations

import pytest
import torch

from phalanx.aggregators import _sortnet, coordinatewise

pytestmark = pytest.mark.skipif(not coordinatewise.HAVE_SELECT, reason="selection needs x86-64 with AVX2")


def _select(
    x: torch.Tensor, mode: int, trim: int, check_exact: int = 1, seed: int = 12345
) -> tuple[torch.Tensor, torch.Tensor]:
    n, d = x.shape
    trim_, length = _sortnet.window_params(n, mode, trim)
    out = torch.full((d,), float("nan"))
    flags = torch.zeros(d, dtype=torch.uint8)
    coordinatewise._cwselect.select(
        x.data_ptr(), n, d, 0, d, mode, trim_, length, out.data_ptr(), flags.data_ptr(), seed, check_exact
    )
    return out, flags


def _network(x: torch.Tensor, mode: int, trim: int) -> torch.Tensor:
    return coordinatewise._cw_kernel(x.contiguous(), mode, trim, False, select=False)[0]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (signed zeros apart), every NaN alike."""
    nan = torch.full_like(a, float("nan"))
    a, b = torch.where(a.isnan(), nan, a), torch.where(b.isnan(), nan, b)
    return bool(torch.equal(a.view(torch.int32), b.view(torch.int32)))


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    n, d = 1000, 203  # d not a multiple of 8: the transpose's and the samples' scalar edges
    cases = {
        "gaussian": torch.randn(n, d, generator=g),
        "ties": torch.randint(-3, 4, (n, d), generator=g).float(),
        "zeros": torch.where(torch.rand(n, d, generator=g) < 0.5, 0.0, -0.0),
        "negative zeros": torch.full((n, d), -0.0),
        "zeros and values": torch.where(torch.rand(n, d, generator=g) < 0.6, 0.0, torch.randn(n, d, generator=g)),
        "sorted": torch.randn(n, d, generator=g).sort(dim=0).values,
        "reversed": torch.randn(n, d, generator=g).sort(dim=0, descending=True).values,
        "one value": torch.full((n, d), 2.5),
        "wide exponents": torch.randn(n, d, generator=g) * torch.exp2(torch.randint(-60, 60, (n, d), generator=g)),
        "subnormals": torch.randn(n, d, generator=g) * 1e-40,
    }
    special = torch.randn(n, d, generator=g)
    pick = torch.rand(n, d, generator=g)
    special[pick < 0.15] = float("nan")
    special[(pick >= 0.15) & (pick < 0.25)] = float("inf")
    special[(pick >= 0.25) & (pick < 0.35)] = float("-inf")
    cases["nan and infinities"] = special
    tiny = torch.randn(n, d, generator=g)
    tiny[n // 2] = 1e-45  # one Byzantine row defeats the exactness condition in every column
    cases["one tiny row"] = tiny
    # rows i n / 64 (a fixed sample would take them) hold the column's extremes
    cases["crafted rows"] = _crafted(n, d, g)
    return cases


def _crafted(n: int, d: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(n, d, generator=g)
    rows = [i * n // 64 for i in range(64)]
    sign = torch.tensor([1e6 if k % 2 == 0 else -1e6 for k in range(len(rows))])
    x[torch.tensor(rows)] = sign[:, None].expand(len(rows), d)
    return x


_NAMES: dict[int, coordinatewise.Mode] = {
    _sortnet.MODE_MEDIAN: "median", _sortnet.MODE_TRIMMED: "trimmed", _sortnet.MODE_MEAMED: "meamed"
}


@pytest.mark.parametrize("case", list(_inputs()))
@pytest.mark.parametrize("mode", list(_NAMES))
def test_selection_matches_the_network_or_flags_the_column(case: str, mode: int) -> None:
    x = _inputs()[case]
    out, flags = _select(x, mode, 200)
    kept = flags == 0
    assert _same(out[kept], _network(x, mode, 200)[kept]), case
    # the rule with selection (flagged columns through the network) against the network and torch's reference
    coordinatewise.SELECT_MIN_ROWS, saved = 0, coordinatewise.SELECT_MIN_ROWS
    try:
        got = coordinatewise.coordinate_window_mean(x, _NAMES[mode], 200, False)[0]
    finally:
        coordinatewise.SELECT_MIN_ROWS = saved
    assert _same(got, _network(x, mode, 200))
    # torch's stable sort places signed zeros in row order, the network by its compare-exchanges: values alike
    reference = coordinatewise._cw_torch(x, mode, 200, False)[0]
    assert torch.equal(got.nan_to_num(nan=1.5e38), reference.nan_to_num(nan=1.5e38))


@pytest.mark.parametrize("n", [64, 65, 127, 700, 1001])
def test_row_counts_odd_and_even(n: int) -> None:
    x = torch.randn(n, 77, generator=torch.Generator().manual_seed(n))
    for mode in (_sortnet.MODE_MEDIAN, _sortnet.MODE_TRIMMED):
        out, flags = _select(x, mode, n // 5)
        kept = flags == 0
        assert kept.float().mean() > 0.5  # Gaussian columns are selection's case, not the fallback's
        assert _same(out[kept], _network(x, mode, n // 5)[kept])


def test_brackets_that_meet_are_left_for_quickselect_on_the_whole_column_not_flagged() -> None:
    # trim 400 of 1,000: the brackets around ranks 400 and 599 overlap, so every column takes the whole-column path
    x = torch.randn(1000, 203, generator=torch.Generator().manual_seed(5))
    out, flags = _select(x, _sortnet.MODE_TRIMMED, 400)
    assert float(flags.float().mean()) < 0.05  # only sums not proven exact
    kept = flags == 0
    assert _same(out[kept], _network(x, _sortnet.MODE_TRIMMED, 400)[kept])


def test_blocks_after_a_flagged_block_are_flagged_untried_until_a_good_block() -> None:
    x = torch.randn(1000, 128 * 6, generator=torch.Generator().manual_seed(9))
    x[500, :128] = 1e-45  # the first block of 128 columns fails the exactness condition everywhere
    x[500, 300] = 1e-45  # one column of the third block: under a quarter, no back-off
    out, flags = _select(x, _sortnet.MODE_TRIMMED, 200)
    assert bool(flags[:256].all())  # the bad block, then one block flagged without being tried
    assert float(flags[256:].float().mean()) < 0.05  # the third block is tried, is good, and ends the back-off
    kept = flags == 0
    assert _same(out[kept], _network(x, _sortnet.MODE_TRIMMED, 200)[kept])
    got = coordinatewise._cw_select(x, _sortnet.MODE_TRIMMED, 200, 600)  # flagged columns: the network, in place
    assert _same(got, _network(x, _sortnet.MODE_TRIMMED, 200))


def test_flagged_columns_split_into_long_runs_in_place_and_the_rest_gathered() -> None:
    flags = torch.zeros(1000, dtype=torch.uint8)
    flags[[3, 40, 41, 999]] = 1
    flags[100:300] = 1  # a run of 200 >= 128 columns
    runs, scattered = coordinatewise._flagged_runs(flags)
    assert runs == [(100, 300)]
    assert scattered.tolist() == [3, 40, 41, 999]
    assert coordinatewise._flagged_runs(torch.zeros(5, dtype=torch.uint8))[0] == []


def test_spaced_flags_cost_the_network_only_their_columns() -> None:
    # one flagged column every 32 (an attacker's tiny value there): gathered, not recomputed by whole blocks in place
    x = torch.randn(640, 4096, generator=torch.Generator().manual_seed(4))
    x[5, ::32] = 1e-45
    flags = torch.zeros(4096, dtype=torch.uint8)
    flags[::32] = 1
    runs, scattered = coordinatewise._flagged_runs(flags)
    assert runs == [] and scattered.numel() == 128
    coordinatewise.SELECT_MIN_ROWS, saved = 0, coordinatewise.SELECT_MIN_ROWS
    try:
        got = coordinatewise.coordinate_window_mean(x, "trimmed", 128, False)[0]
    finally:
        coordinatewise.SELECT_MIN_ROWS = saved
    assert _same(got, _network(x, _sortnet.MODE_TRIMMED, 128))


def test_scattered_flags_are_gathered_a_bounded_number_of_values_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 640
    x = torch.randn(n, 4096, generator=torch.Generator().manual_seed(6))
    x[5, ::5] = 1e-45  # a fifth of the columns flagged (under the back-off's quarter), none in a run of 128
    monkeypatch.setattr(coordinatewise, "_GATHER_FLOATS", n * 128)
    monkeypatch.setattr(coordinatewise, "SELECT_MIN_ROWS", 0)
    real, widths = coordinatewise._cw_kernel, []

    def spy(y: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor | None]:
        if kwargs.get("select") is False:
            widths.append(y.shape[1])
        return real(y, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(coordinatewise, "_cw_kernel", spy)
    got = coordinatewise._cw_select(x, _sortnet.MODE_TRIMMED, 128, n - 256)
    assert widths and max(widths) <= 128 and sum(widths) >= 4096 // 5
    assert _same(got, real(x, _sortnet.MODE_TRIMMED, 128, False, select=False)[0])


def test_no_columns() -> None:
    x = torch.randn(700, 0)
    for mode, name in _NAMES.items():
        assert coordinatewise.coordinate_window_mean(x, name, 100, False)[0].shape == (0,)
        # contributions of no coordinates: zeros on the kernel's path and torch's (which divided 0 by 0 before)
        for out, contrib in (
            coordinatewise.coordinate_window_mean(x, name, 100, True), coordinatewise._cw_torch(x, mode, 100, True)
        ):
            assert out.shape == (0,)
            assert contrib is not None and torch.equal(contrib, torch.zeros(700, dtype=torch.float64))


def test_the_seed_changes_no_value() -> None:
    x = _inputs()["gaussian"]
    for mode in _NAMES:
        network = _network(x, mode, 200)
        for seed in (0, 1, 2**64 - 1, 987654321):
            out, flags = _select(x, mode, 200, seed=seed)
            kept = flags == 0
            assert _same(out[kept], network[kept])


def test_a_zero_median_among_zeros_of_both_signs_is_the_networks() -> None:
    # which zero sits at the median rank is the network's order, not a value: selection flags such columns
    x = torch.where(torch.rand(801, 40, generator=torch.Generator().manual_seed(2)) < 0.5, 0.0, -0.0)
    out, flags = _select(x, _sortnet.MODE_MEDIAN, 0)
    assert bool(flags.all())
    same_sign = torch.full((801, 40), -0.0)
    out, flags = _select(same_sign, _sortnet.MODE_MEDIAN, 0)
    assert not bool(flags.any())
    assert _same(out, _network(same_sign, _sortnet.MODE_MEDIAN, 0))


def test_a_trimmed_mean_of_negative_zeros_is_positive_zero_as_the_networks() -> None:
    x = torch.full((600, 3), -0.0)
    out, flags = _select(x, _sortnet.MODE_TRIMMED, 120)
    assert not bool(flags.any())
    assert out.view(torch.int32).tolist() == [0, 0, 0]  # +0.0: the network adds from +0.0
    assert _same(out, _network(x, _sortnet.MODE_TRIMMED, 120))


def test_threads_split_the_columns_and_change_no_value() -> None:
    x = torch.randn(coordinatewise.SELECT_MIN_ROWS, 3000, generator=torch.Generator().manual_seed(11))
    saved = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(coordinatewise.coordinate_window_mean(x, "trimmed", x.shape[0] // 5, False)[0])
    finally:
        torch.set_num_threads(saved)
    assert all(torch.equal(r, results[0]) for r in results)
    assert _same(results[0], _network(x, _sortnet.MODE_TRIMMED, x.shape[0] // 5))


def _order_sensitive_column(n: int = 1000) -> torch.Tensor:
    """A column whose window sum depends on the order of the additions in double: ±2^40 cancel, and 100 values of
    2^-20 are lost when added to 2^40 first (the sorted order adds -2^40 first), not when added to each other."""
    col = torch.zeros(n)
    col[:200] = -1e30  # trimmed
    col[800:] = 1e30  # trimmed
    col[200] = -(2.0**40)
    col[799] = 2.0**40
    col[300:400] = 2.0**-20
    col[400:799] = 1.0
    return col[torch.randperm(n, generator=torch.Generator().manual_seed(3))][:, None].contiguous()


def test_the_exactness_condition_flags_an_order_sensitive_sum_and_its_mutant_does_not() -> None:
    x = _order_sensitive_column()
    network = _network(x, _sortnet.MODE_TRIMMED, 200)
    _, flags = _select(x, _sortnet.MODE_TRIMMED, 200)
    assert flags.tolist() == [1]  # the real call hands it to the network
    mutant, mutant_flags = _select(x, _sortnet.MODE_TRIMMED, 200, check_exact=0)
    assert mutant_flags.tolist() == [0]
    assert not _same(mutant, network), "the order of additions must matter on this column, or the test proves nothing"


def test_bad_arguments_are_refused_before_any_work() -> None:
    x = torch.randn(100, 8)
    out = torch.empty(8)
    flags = torch.zeros(8, dtype=torch.uint8)
    sel = coordinatewise._cwselect.select
    with pytest.raises(ValueError, match="64 <= n"):
        sel(x.data_ptr(), 63, 8, 0, 8, 1, 0, 1, out.data_ptr(), flags.data_ptr(), 1)
    with pytest.raises(ValueError, match="j0 <= j1 <= d"):
        sel(x.data_ptr(), 100, 8, 0, 9, 1, 0, 1, out.data_ptr(), flags.data_ptr(), 1)
    with pytest.raises(ValueError, match="mode 0, 1 or 2"):
        sel(x.data_ptr(), 100, 8, 0, 8, 3, 0, 1, out.data_ptr(), flags.data_ptr(), 1)
    with pytest.raises(ValueError, match="MeaMed needs"):  # trim past (n - 1) / 2: windows without the median
        sel(x.data_ptr(), 100, 8, 0, 8, 2, 50, 50, out.data_ptr(), flags.data_ptr(), 1)
    with pytest.raises(ValueError, match="MeaMed needs"):
        sel(x.data_ptr(), 100, 8, 0, 8, 2, 10, 80, out.data_ptr(), flags.data_ptr(), 1)
    with pytest.raises(ValueError, match="window"):
        sel(x.data_ptr(), 100, 8, 0, 8, 0, 60, 50, out.data_ptr(), flags.data_ptr(), 1)


def test_the_rule_uses_selection_only_where_it_is_the_same_computation() -> None:
    x = torch.randn(coordinatewise.SELECT_MIN_ROWS, 4)
    assert coordinatewise._use_select(x, _sortnet.MODE_MEDIAN, 2, False)
    assert not coordinatewise._use_select(x, _sortnet.MODE_MEDIAN, 2, True)  # contributions: the sorted order
    assert not coordinatewise._use_select(x.double(), _sortnet.MODE_MEDIAN, 2, False)  # float64: not exact sums
    n = x.shape[0]
    assert coordinatewise._use_select(x, _sortnet.MODE_MEAMED, n - (n - 1) // 2, False)
    assert not coordinatewise._use_select(x, _sortnet.MODE_MEAMED, n - (n - 1) // 2 - 1, False)  # n > 2 trim
    assert not coordinatewise._use_select(x[:-1], _sortnet.MODE_MEDIAN, 2, False)
    coordinatewise.SELECT_MIN_ROWS, saved = 0, coordinatewise.SELECT_MIN_ROWS
    try:  # below the kernel's 64-row sample: the network, whatever the switch says
        assert not coordinatewise._use_select(x[:63], _sortnet.MODE_MEDIAN, 2, False)
    finally:
        coordinatewise.SELECT_MIN_ROWS = saved
    assert not coordinatewise._use_select(x, _sortnet.MODE_TRIMMED, n // 4 - 1, False)  # brackets would meet


def _meamed_order_sensitive_column(n: int = 1000) -> torch.Tensor:
    """MeaMed's window (trim 200: the 1e30s left out) holds -2^40 and 2^40, which cancel, and 100 values of 2^-14,
    each lost when added to -2^40 (half an ulp, rounded to even) -- as the sorted order adds them -- but kept when
    added to each other first."""
    col = torch.ones(n)
    col[:200] = 1e30
    col[200], col[201] = -(2.0**40), 2.0**40
    col[202:302] = 2.0**-14
    return col[torch.randperm(n, generator=torch.Generator().manual_seed(0))][:, None].contiguous()


def test_the_exactness_condition_flags_meameds_order_sensitive_sum_and_its_mutant_does_not() -> None:
    x = _meamed_order_sensitive_column()
    network = _network(x, _sortnet.MODE_MEAMED, 200)
    for seed in (1, 2, 3):
        _, flags = _select(x, _sortnet.MODE_MEAMED, 200, seed=seed)
        assert flags.tolist() == [1]
        mutant, mutant_flags = _select(x, _sortnet.MODE_MEAMED, 200, check_exact=0, seed=seed)
        assert mutant_flags.tolist() == [0]
        assert not _same(mutant, network), "the order of additions must matter on this column"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # 300 x -2, 100 x 0, 200 x 1, 100 x 9 (n = 700, trim = 300, L = 400): the median is 0, the 400th distance
        # r* = 2, and every window from start 0 to 200 costs 2 -- the network keeps the first: 300 x -2 and 100 x 0
        # (the window ends in copies of the median), leaving out the 1s although they are nearer than -2
        ([(-2.0, 300), (0.0, 100), (1.0, 200), (9.0, 100)], -600 / 400),
        # the same with 60 zeros, then 20 x 0.25 and 40 x 0.5: the window takes the 60 zeros and the 40 smallest
        # values above the median, 20 x 0.25 and 20 x 0.5 (selected among the values above it)
        ([(-2.0, 300), (0.0, 60), (0.25, 20), (0.5, 40), (1.0, 180), (9.0, 100)], (-600 + 5 + 10) / 400),
    ],
)
def test_a_meamed_window_that_cuts_the_values_nearer_than_its_end_is_the_networks(
    values: list[tuple[float, int]], expected: float
) -> None:
    col = torch.tensor([v for v, count in values for _ in range(count)])
    g = torch.Generator().manual_seed(4)
    x = torch.stack([col[torch.randperm(700, generator=g)] for _ in range(24)], dim=1).contiguous()
    out, flags = _select(x, _sortnet.MODE_MEAMED, 300)
    assert not bool(flags.any())
    assert out.tolist() == [torch.tensor(expected, dtype=torch.float32).item()] * 24
    assert _same(out, _network(x, _sortnet.MODE_MEAMED, 300))


def test_a_meamed_window_of_copies_of_the_median_is_its_product_not_a_flag() -> None:
    # 90 % zeros of both signs: r* = 0 and more than L values equal the median; the network's sum from +0.0 is +0.0
    g = torch.Generator().manual_seed(5)
    x = torch.where(torch.rand(800, 64, generator=g) < 0.9, 0.0, torch.randn(800, 64, generator=g))
    x = torch.where(torch.rand(800, 64, generator=g) < 0.5, x, -x)
    out, flags = _select(x, _sortnet.MODE_MEAMED, 160)
    assert not bool(flags.any())
    assert out.view(torch.int32).tolist() == [0] * 64
    assert _same(out, _network(x, _sortnet.MODE_MEAMED, 160))


@pytest.mark.parametrize("trim", [0, 1, 31, 499])
def test_meamed_at_every_trim_from_none_to_half(trim: int) -> None:
    # trim 0: the window is every value; 499 = (n - 1) // 2: the narrowest window that still holds the median
    g = torch.Generator().manual_seed(trim)
    x = torch.randn(1000, 67, generator=g) + torch.where(torch.rand(1000, 1, generator=g) < 0.2, 5.0, 0.0)
    out, flags = _select(x, _sortnet.MODE_MEAMED, trim)
    kept = flags == 0
    assert int(kept.sum()) >= 60
    assert _same(out[kept], _network(x, _sortnet.MODE_MEAMED, trim)[kept])


def test_meamed_on_rounded_updates_at_the_largest_trim_cuts_its_window_without_flags() -> None:
    # few distinct values and trim (n - 1) // 2: A + B > L with r* = 1 in every column (the attacker review's slow
    # case before the cut was vectorised); n = 1001 leaves a scalar tail after the 8-lane loop
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1001, 40, generator=g).round()
    out, flags = _select(x, _sortnet.MODE_MEAMED, 500)
    assert not bool(flags.any())
    assert _same(out, _network(x, _sortnet.MODE_MEAMED, 500))
