"""The C kernel's load-time sort (issue 37): groups of 32, 16 or 8 rows sorted in registers as they are loaded, the
rest of the network after. It must change no output bit: the split keeps every wire's sequence of compare-exchanges,
and the kernel's outputs equal those of the plain pair loop (the previous build's path) bit for bit."""

from __future__ import annotations

import pytest
import torch

from phalanx.aggregators import _sortnet, coordinatewise

NEEDS_KERNEL = pytest.mark.skipif(
    not coordinatewise.HAVE_KERNEL or not hasattr(coordinatewise._cwkernel, "load_sort_network"),
    reason="C kernel (with the load sort) not built",
)
NETS = tuple((r, tuple((a, b) for a, b in _sortnet.batcher_pairs(r).tolist())) for r in (32, 16, 8))


def _windows(n: int) -> list[tuple[int, tuple[int, int] | None]]:
    """(trim, window) for every trim of the trimmed mean, the median and the whole network (MeaMed, contributions)."""
    out: list[tuple[int, tuple[int, int] | None]] = [(t, (t, n - 2 * t)) for t in range(0, (n + 1) // 2)]
    return [*out, (0, ((n - 1) // 2, 2 - n % 2)), (0, None)]


def _base(n: int, window: tuple[int, int] | None) -> list[tuple[int, int]]:
    pairs = _sortnet.batcher_pairs(n) if window is None else _sortnet.window_pairs(n, *window)
    return [(int(a), int(b)) for a, b in pairs.tolist()]


def _sequences(pairs: list[tuple[int, int]]) -> dict[int, list[tuple[int, int]]]:
    seq: dict[int, list[tuple[int, int]]] = {}
    for a, b in pairs:
        seq.setdefault(a, []).append((a, b))
        seq.setdefault(b, []).append((a, b))
    return seq


def _as_run(pairs: list[tuple[int, int]], plan: tuple[int, ...], n: int) -> list[tuple[int, int]]:
    """What the kernel runs: the group network on each group of the plan as it is loaded, then the remaining pairs.
    A group padded past row n: its pairs among real wires (one with a padding wire leaves the real wire's value)."""
    run: list[tuple[int, int]] = []
    lo = 0
    for (rows, group), count in zip(NETS, plan):
        for _ in range(count):
            run += [(a + lo, b + lo) for a, b in group if b + lo < n]
            lo += rows
    return run + pairs


def _naive_plan(n: int, rows: int) -> tuple[int, ...]:
    """Mutant of load_plan: every whole group of ``rows``, without checking the network's compare-exchanges."""
    return tuple(n // rows if r == rows else 0 for r, _ in NETS)


def test_load_plans_of_the_benchmarked_sizes() -> None:
    """docs/benchmarks.md: n = 50's whole network runs 254 of its 403 compare-exchanges at load (rows 0-31, 32-47)
    and 132 of the other 149 in chains of two, n = 64's 382 of 543 at load (two groups of 32)."""
    for n, plan, total, rest in ((50, (1, 1, 0), 403, 149), (64, (2, 0, 0), 543, 161)):
        got_plan, pairs = _sortnet.kernel_program(n, None, 0, NETS)
        assert (got_plan, len(_base(n, None)), pairs.shape[0]) == (plan, total, rest)
    got = [tuple(p) for p in _sortnet.kernel_program(50, None, 0, NETS)[1].tolist()]
    i = chained = 0
    while i + 1 < len(got):  # the kernel's scan
        step = 2 if len(set(got[i]) & set(got[i + 1])) == 1 else 1
        chained += step == 2
        i += step
    assert 2 * chained == 132


@NEEDS_KERNEL
def test_the_kernels_group_networks_are_batchers() -> None:
    for rows in (8, 16, 32):
        want = [tuple(p) for p in _sortnet.batcher_pairs(rows).tolist()]
        assert coordinatewise._cwkernel.load_sort_network(rows) == want
    assert coordinatewise._cwkernel.load_sort_sizes() == (128, 64, 32, 16, 8)
    for rows in (64, 128):  # their schedules: tested below
        got = [tuple(p) for p in coordinatewise._cwkernel.load_sort_network(rows)]
        assert sorted(got) == sorted(tuple(p) for p in _sortnet.batcher_pairs(rows).tolist())
    with pytest.raises(ValueError):
        coordinatewise._cwkernel.load_sort_network(12)


@pytest.mark.parametrize("n", list(range(2, 71)))
def test_load_groups_keep_every_wires_sequence(n: int) -> None:
    """For every n in 2..70 and every window: group networks + the rest run every wire's compare-exchanges in the
    network's order; the unchecked mutant (every whole group) breaks that for a pruned network."""
    caught = False
    for _, window in _windows(n):
        base = _base(n, window)
        plan, rest = _sortnet.kernel_program(n, window, 0, NETS)
        run = _as_run([(int(a), int(b)) for a, b in rest.tolist()], plan, n)
        assert _sequences(run) == _sequences(base), (n, window)
        if window is None:  # the whole network: every whole group, the largest first
            padded = [rows for rows, _ in NETS if 7 * rows <= 8 * n < 8 * rows]  # one group over every row
            whole = (n // 32, n % 32 // 16, n % 16 // 8)
            assert plan == (tuple(int(r == padded[0]) for r, _ in NETS) if padded else whole), (n, plan)
        for r, group in NETS:  # the mutant: every whole group of r, those pairs dropped from the network
            k = n // r
            taken = {(a + g * r, b + g * r) for g in range(k) for a, b in group}
            mutant = _as_run([p for p in base if p not in taken], _naive_plan(n, r), n)
            caught |= _sequences(mutant) != _sequences(base)
    if n >= 8:
        assert caught, n


def _data(n: int, d: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=dtype)
    for value, p in ((0.5, 0.1), (0.0, 0.05), (-0.0, 0.05), (float("nan"), 0.02), (float("inf"), 0.02),
                     (-float("inf"), 0.02)):
        x[torch.rand(n, d, generator=gen) < p] = value
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def _kernel(x: torch.Tensor, mode: int, trim: int, length: int, pairs: torch.Tensor,
            load: tuple[int, ...]) -> torch.Tensor:
    n, d = x.shape
    out = torch.empty(d, dtype=x.dtype)
    coordinatewise._cwkernel.window_parallel(x.data_ptr(), n, d, pairs.data_ptr(), pairs.shape[0], mode, trim, length,
                                             out.data_ptr(), 0, x.dtype == torch.float64, 1, *load)
    return out


@NEEDS_KERNEL
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", list(range(2, 71)))
def test_load_sort_gives_the_pair_loops_bits(dtype: torch.dtype, n: int) -> None:
    """Every n in 2..70, every trim, the three modes: the kernel with the load sort equals, bit for bit, the kernel
    running the whole network as pairs (the previous build's path), on ties, ±0, NaN and ±inf, with a partial last
    block (d = 300). A program missing one compare-exchange (the last of the rest, or one group's) is caught."""
    d = 300
    x = _data(n, d, dtype, n)
    tile = int(coordinatewise._cwkernel.tile_rows(n, dtype == torch.float64))
    nets = coordinatewise._load_sort_nets()
    for trim, window in _windows(n):
        modes = [_sortnet.MODE_MEAMED] if window is None else (
            [_sortnet.MODE_TRIMMED] if window[0] == trim and window[1] == n - 2 * trim else [_sortnet.MODE_MEDIAN])
        for mode in modes:
            trims = range(0, n) if mode == _sortnet.MODE_MEAMED else [trim]
            for t in trims:
                tr, length = _sortnet.window_params(n, mode, t)
                if length < 1:
                    continue
                plain = _sortnet.kernel_network(n, window, tile)
                ref = _kernel(x, mode, tr, length, plain, ())
                plan, rest = _sortnet.kernel_program(n, window, tile, nets)
                got = _kernel(x, mode, tr, length, rest, plan)
                assert torch.equal(_bits(got), _bits(ref)), (n, mode, t)


@NEEDS_KERNEL
def test_a_program_missing_a_compare_exchange_is_caught() -> None:
    """The mutants of the check above, on n = 50's whole network: the last compare-exchange of the rest dropped; the
    group of 16 not load-sorted (its compare-exchanges then run nowhere); rows 0-31 as two groups of 16 (Batcher(32)'s
    last stages, which the plan replaced, never run) — each changes the output."""
    n, d = 50, 300
    x = _data(n, d, torch.float32, 7)
    tile = int(coordinatewise._cwkernel.tile_rows(n, False))
    plan, rest = _sortnet.kernel_program(n, None, tile, coordinatewise._load_sort_nets())
    assert plan == (0, 0, 1, 1, 0)  # rows 0-31 and 32-47 (no group of 128 or 64)
    trim, length = _sortnet.window_params(n, _sortnet.MODE_MEAMED, 10)
    ref = _kernel(x, _sortnet.MODE_MEAMED, trim, length, _sortnet.kernel_network(n, None, tile), ())
    assert torch.equal(_bits(_kernel(x, _sortnet.MODE_MEAMED, trim, length, rest, plan)), _bits(ref))
    for mutant, load in ((rest[:-1], plan), (rest, (0, 0, 1, 0, 0)), (rest, (0, 0, 0, 3, 0))):
        got = _kernel(x, _sortnet.MODE_MEAMED, trim, length, mutant.contiguous(), load)
        assert not torch.equal(_bits(got), _bits(ref))


@NEEDS_KERNEL
def test_bad_load_arguments_are_refused() -> None:
    x = torch.randn(20, 10)
    pairs = _sortnet.batcher_pairs(20)
    for load in ((0, 1, 0, 0, 0), (0, 0, 1, 1, 0), (0, 0, 0, 2, 0), (0, 0, 0, 0, -1), (0, 0, 0, 1, 1),
                 (0, 0, 0, 0, 3), (1, 0, 0, 0, 0)):
        with pytest.raises(ValueError):
            _kernel(x, _sortnet.MODE_MEAMED, 2, 18, pairs, load)


@NEEDS_KERNEL
def test_a_window_past_the_rows_is_refused() -> None:
    """Every window the three modes allow at n = 20 runs; one that reads past row n (trim + length > n, the median's
    length 3, a negative trim, an unknown mode) is refused before the kernel reads anything — it would have summed
    the load sort's scratch rows, or memory past the buffer (an attacker's review of the kernel's arguments)."""
    x = torch.randn(20, 10)
    pairs = _sortnet.batcher_pairs(20)
    for mode, trim, length in ((0, 0, 20), (0, 9, 2), (1, 0, 2), (2, 10, 10), (2, 0, 20), (2, 15, 5)):
        _kernel(x, mode, trim, length, pairs, ())
    for mode, trim, length in ((0, 1, 20), (0, 10, 11), (1, 0, 3), (2, 1, 20), (2, 16, 5), (0, -1, 2), (0, 2, 0),
                               (3, 0, 1), (-1, 0, 1)):
        with pytest.raises(ValueError, match="invalid arguments"):
            _kernel(x, mode, trim, length, pairs, ())
        out = torch.empty(10)  # (held: a refused call must not be what keeps a freed buffer from being written)
        with pytest.raises(ValueError, match="invalid arguments"):
            coordinatewise._cwkernel.window(x.data_ptr(), 20, 10, 0, 10, pairs.data_ptr(), pairs.shape[0], mode, trim,
                                            length, out.data_ptr(), 0, False)


def _exact_reference(x: torch.Tensor, mode: int, trim: int, shift: int = 0) -> torch.Tensor:
    """The kernel's formula on torch.sort: (T)(Σ window · (1/length)) in float64, the median (T)(½m0 + ½m1). On
    values whose sums are exact (halves, small integers, ±inf) the order of the sum cannot matter, so the kernel
    must match it bit for bit. ``shift`` > 0 is the mutant: each window starts ``shift`` rows late, one row short."""
    n = x.shape[0]
    tr, length = _sortnet.window_params(n, mode, trim)
    xt = torch.sort(torch.where(torch.isnan(x), float("inf"), x), dim=0).values
    xs = xt.double()
    if mode == _sortnet.MODE_MEDIAN:
        return (0.5 * xs[(n - 1) // 2] + 0.5 * xs[n // 2]).to(x.dtype)
    start = torch.full((x.shape[1],), tr)
    if mode == _sortnet.MODE_MEAMED:  # the kernel's rule, in its dtype: cost = a > b ? a : b, strictly better only
        med = (0.5 * xs[(n - 1) // 2] + 0.5 * xs[n // 2]).to(x.dtype)
        a, b = med[None] - xt[: tr + 1], xt[length - 1: length + tr] - med[None]
        cost = torch.where(a > b, a, b)
        start = torch.where(torch.isnan(cost), float("inf"), cost).argmin(dim=0)  # the first of the smallest
    rows = start[None, :] + torch.arange(shift, length, device=x.device)[:, None]
    return (xs.gather(0, rows).sum(dim=0) * (1.0 / length)).to(x.dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaN as NaN and -0.0 as +0.0: which wire a network leaves a -0.0 on among tied zeros is its own
    (a median of zeros may keep either sign; the window sums start from +0.0 and never give -0.0)."""
    a, b = a + 0.0, b + 0.0
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(_bits(a[~nan]), _bits(b[~nan]))


@NEEDS_KERNEL
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_mode_and_trim_matches_the_exact_reference(dtype: torch.dtype) -> None:
    """n in 2..70, trims from 0 to n - 1 (Bulyan's trim >= length among them), the three modes, on values whose
    window sums are exact: the kernel (load sort, pair loop, MeaMed's three row loops or the general one) equals the
    reference bit for bit; the mutant reference whose windows start one row late differs for every MeaMed and trimmed
    mean window of two or more rows."""
    values = torch.tensor([-4.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 3.0, float("inf"), -float("inf"),
                           float("nan")], dtype=dtype)
    for n in range(2, 71):
        gen = torch.Generator().manual_seed(1000 + n)
        x = values[torch.randint(0, 10, (n, 130), generator=gen)]
        x[torch.rand(n, 130, generator=gen) < 0.02] = values[10 + torch.randint(0, 3, (1,), generator=gen)]
        for mode in (_sortnet.MODE_TRIMMED, _sortnet.MODE_MEDIAN, _sortnet.MODE_MEAMED):
            for trim in sorted({t for t in (0, 1, n // 5, (n - 1) // 3, (n - 1) // 2, n // 2 + 1, n - 1) if t < n}):
                length = _sortnet.window_params(n, mode, trim)[1]
                if length < 1 or (mode == _sortnet.MODE_MEDIAN and trim > 0):
                    continue
                name = {0: "trimmed", 1: "median", 2: "meamed"}[mode]
                got, _ = coordinatewise.coordinate_window_mean(x, name, trim, False)  # type: ignore[arg-type]
                assert _same(got, _exact_reference(x, mode, trim)), (n, name, trim)
                if mode != _sortnet.MODE_MEDIAN and length >= 2:
                    assert not _same(got, _exact_reference(x, mode, trim, shift=1)), (n, name, trim)


def _unchecked_chain_order(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Mutant of chain_order: moves up the next compare-exchange on a wire without checking its other wire."""
    out: list[int] = []
    done = [False] * len(pairs)
    for i in range(len(pairs)):
        if done[i]:
            continue
        out.append(i)
        done[i] = True
        for j in range(i + 1, len(pairs)):
            if not done[j] and len(set(pairs[i]) & set(pairs[j])) == 1:
                out.append(j)
                done[j] = True
                break
    return [pairs[i] for i in out]


@pytest.mark.parametrize("n", [5, 16, 33, 50, 64, 100])
def test_chain_order_keeps_every_wires_sequence(n: int) -> None:
    """chain_order pairs up compare-exchanges sharing a wire (most of them: the kernel then runs each pair of them on
    three rows in registers) and keeps every wire's sequence; the mutant without the check on the other wire does
    not."""
    for window in (None, (n // 5, n - 2 * (n // 5))):
        base = _sortnet.cache_order(_base(n, window), 8)
        got = _sortnet.chain_order(base)
        assert sorted(got) == sorted(base) and _sequences(got) == _sequences(base), (n, window)
        i = chained = 0
        while i + 1 < len(got):  # the kernel's scan: two consecutive sharing exactly one wire run as one
            step = 2 if len(set(got[i]) & set(got[i + 1])) == 1 else 1
            chained += step == 2
            i += step
        if n >= 16:
            assert 2 * chained >= len(got) // 2, (n, window, chained)  # at least half of them run in chains
            assert _sequences(_unchecked_chain_order(base)) != _sequences(base), (n, window)


class _CountedPairs(list[tuple[int, int]]):
    """A list of compare-exchanges that counts how many of its items were read (by index or by iteration)."""

    reads = 0

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().__getitem__(i)

    def __iter__(self):  # type: ignore[no-untyped-def]
        for item in super().__iter__():
            self.reads += 1
            yield item


def _scanning_group_prefix(pairs: list[tuple[int, int]], lo: int, group: list[tuple[int, int]],
                           on: object = None) -> list[int] | None:
    """Mutant of group_prefix: the first version, which scanned every compare-exchange of the network per group."""
    rows = 1 + max(max(a, b) for a, b in group)
    want = [(a + lo, b + lo) for a, b in group]
    expect: dict[int, list[int]] = {w: [] for w in range(lo, lo + rows)}
    for k, (a, b) in enumerate(want):
        expect[a].append(k)
        expect[b].append(k)
    seen = dict.fromkeys(expect, 0)
    mine: list[int] = []
    for i, (a, b) in enumerate(pairs):
        pending = [w for w in (a, b) if w in expect and seen[w] < len(expect[w])]
        if not pending:
            continue
        if len(pending) < 2 or expect[a][seen[a]] != expect[b][seen[b]] or want[expect[a][seen[a]]] != (a, b):
            return None
        seen[a] += 1
        seen[b] += 1
        mine.append(i)
    return mine if all(seen[w] == len(expect[w]) for w in expect) else None


@pytest.mark.parametrize("impl", ["kept", "mutant"])
def test_a_groups_check_reads_only_its_own_wires(impl: str) -> None:
    """A load plan over n wires must cost O(the network), not O(n × the network): at n = 4,000 the first version
    took 4.6 s where the network itself takes 0.4 s, growing quadratically (minutes at n = 10⁴). Counted, not
    timed: checking one group of 32 wires reads at most its own compare-exchanges on each of its wires."""
    n = 1000
    pairs = _CountedPairs((a, b) for a, b in _sortnet.batcher_pairs(n).tolist())
    on = _sortnet.wires_index(pairs)
    group = list(NETS[0][1])
    pairs.reads = 0
    check = _sortnet.group_prefix if impl == "kept" else _scanning_group_prefix
    assert check(pairs, 64, group, on) is not None
    if impl == "kept":
        assert pairs.reads <= 2 * len(group), pairs.reads
    else:
        assert pairs.reads > 2 * len(group) and pairs.reads >= len(pairs), pairs.reads


def _sequences(pairs: list[tuple[int, int]]) -> dict[int, list[tuple[int, int]]]:
    """Each wire's compare-exchanges, in order: two orders of one network with the same sequences compute the same
    values, bit for bit (each compare-exchange's inputs are its two wires' previous outputs)."""
    seq: dict[int, list[tuple[int, int]]] = {}
    for a, b in pairs:
        seq.setdefault(a, []).append((a, b))
        seq.setdefault(b, []).append((a, b))
    return seq


@NEEDS_KERNEL
def test_the_32_row_load_sort_runs_batchers_network_in_an_order_that_keeps_every_wires_sequence() -> None:
    """The 32-row load sort runs in pieces that fit 16 vector registers (two halves of 16, four blocks of 8 rows, a
    stream of the last two stages; ``_cwkernel.c``, M32_BLOCK): the order it runs (``load_sort_schedule``, read from
    the same macros) holds Batcher's 191 compare-exchanges with every wire's sequence unchanged. Mutant: two
    compare-exchanges of one wire swapped (the first block's k = 8 and k = 4 steps on its wire 2) is caught."""
    kernel = coordinatewise._cwkernel
    batcher = [tuple(p) for p in kernel.load_sort_network(32)]
    schedule = [tuple(p) for p in kernel.load_sort_schedule()]
    assert len(schedule) == len(batcher) == 191
    assert _sequences(schedule) == _sequences(batcher)
    mutant = list(schedule)
    i, j = mutant.index((8, 16)), mutant.index((4, 8))
    mutant[i], mutant[j] = mutant[j], mutant[i]
    assert sorted(mutant) == sorted(batcher) and _sequences(mutant) != _sequences(batcher)


@NEEDS_KERNEL
@pytest.mark.parametrize("rows", [64, 128])
def test_the_64_and_128_row_load_sorts_run_batchers_network_in_an_order_that_keeps_every_wires_sequence(
        rows: int) -> None:
    """The 64-row load sort (``_cwkernel.c``, M64_STREAM): the 32-row one on each half, the p = 32 merge's stages
    k = 32, 16, 8 as eight blocks of 8 rows on a stride of 8, its stages k = 4, 2, 1 as a generated stream; the
    128-row one likewise from two of 64 (M128_STREAM). The order each runs holds Batcher's 543 (1,471)
    compare-exchanges with every wire's sequence unchanged. Mutants: two steps of one wire swapped in the 64-row
    stream (its k = 2 and k = 1 steps on wire 4) and that stream's first step moved before its blocks."""
    kernel = coordinatewise._cwkernel
    batcher = [tuple(p) for p in _sortnet.batcher_pairs(rows).tolist()]
    schedule = [tuple(p) for p in kernel.load_sort_schedule(rows)]
    assert len(schedule) == len(batcher) == {64: 543, 128: 1471}[rows]
    assert _sequences(schedule) == _sequences(batcher)
    swapped = list(schedule)
    i, j = swapped.index((2, 4)), swapped.index((3, 4))
    swapped[i], swapped[j] = swapped[j], swapped[i]
    early = list(schedule)
    first = early.index((4, 8))
    early.insert(early.index((0, 32)), early.pop(first))
    for mutant in (swapped, early):
        assert sorted(mutant) == sorted(batcher) and _sequences(mutant) != _sequences(batcher)


@NEEDS_KERNEL
def test_the_64_and_128_row_groups_change_no_bit_and_their_mutants_are_caught() -> None:
    """n = 64, 100, 128, 200, 300 (groups of 128 and 64 at load, a padded 128 at n = 120): the kernel's output equals
    the whole network run as pairs, bit for bit, in the three modes; with the largest group run as two halves
    instead (its last merge, which the plan replaced, never runs), the output changes."""
    nets = coordinatewise._load_sort_nets()
    sizes = [rows for rows, _ in nets]
    for n in (64, 100, 120, 128, 200, 300):
        x = _data(n, 300, torch.float32, n)
        tile = int(coordinatewise._cwkernel.tile_rows(n, False))
        plan, rest = _sortnet.kernel_program(n, None, tile, nets)
        k = next(i for i, count in enumerate(plan) if count)
        assert sizes[k] >= 64, (n, plan)
        halves = list(plan)
        halves[k] -= 1
        halves[k + 1] += 2
        for mode, t in ((_sortnet.MODE_TRIMMED, n // 5), (_sortnet.MODE_MEDIAN, 0), (_sortnet.MODE_MEAMED, n // 5)):
            tr, length = _sortnet.window_params(n, mode, t)
            ref = _kernel(x, mode, tr, length, _sortnet.kernel_network(n, None, tile), ())
            assert torch.equal(_bits(_kernel(x, mode, tr, length, rest, plan)), _bits(ref)), (n, mode)
            if mode == _sortnet.MODE_TRIMMED and sizes[k] <= n:
                assert not torch.equal(_bits(_kernel(x, mode, tr, length, rest, tuple(halves))), _bits(ref)), n


def test_the_stream_header_is_what_its_generator_writes() -> None:
    """``_cwkernel_streams.h`` is generated (``scripts/gen_cw_streams.py``): an edit by hand, or a generator changed
    without regenerating, fails here (the schedule tests above then check what the header holds)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "scripts" / "gen_cw_streams.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    header = root / "src" / "phalanx" / "aggregators" / "_cwkernel_streams.h"
    text = header.read_text()
    assert "at most 5 rows live" in text and "at most 9 rows live" in text


@NEEDS_KERNEL
def test_the_kernels_program_is_cached_on_small_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule's call finds its (plan, pairs) in a cache keyed by (n, window, tile): ``_sortnet.kernel_program``'s
    own key holds the load sorts' pairs, which a tuple hashes anew on every call (about 40-70 µs; a review found it
    once the groups of 64 and 128 rows made that tuple 2,287 pairs long). Mutant: calling kernel_program directly."""
    x = torch.randn(16, 300, generator=torch.Generator().manual_seed(3))
    first, _ = coordinatewise._cw_kernel(x, _sortnet.MODE_TRIMMED, 3, False)

    def rebuilt(*args: object, **kwargs: object) -> None:
        raise AssertionError("kernel_program was called again for the same (n, window, tile)")

    monkeypatch.setattr(_sortnet, "kernel_program", rebuilt)
    again, _ = coordinatewise._cw_kernel(x, _sortnet.MODE_TRIMMED, 3, False)
    assert torch.equal(first, again)
