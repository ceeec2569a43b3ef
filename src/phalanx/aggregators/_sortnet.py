"""Coordinate-wise order statistics with a branch-free sorting network, vectorised across coordinates.

Coordinate-wise rules (median, trimmed mean, MeaMed) need, for every one of the ``d`` coordinates, the ``n`` values
of that coordinate in sorted order. Sorting along dim 0 of an ``(n, d)`` tensor walks a strided axis and is far from
the memory floor (``torch.sort(x, 0)``: ~2.4 s at n=50, d=10⁶ here). Instead we apply Batcher's odd–even merge sort
network (K. E. Batcher, "Sorting networks and their applications", AFIPS 1968) — a fixed list of compare-exchange
pairs ``(a, b)`` that sorts any input — to a block of ``B`` coordinates at once: each compare-exchange is a
``min``/``max`` of two contiguous rows of the block, which the compiler vectorises (SIMD) across coordinates.
The kernel is C (``_cwkernel.c``, built at install time, optional); column ranges run in parallel threads with the
GIL released. n=50 needs 403 compare-exchanges.

After sorting, every coordinate-wise rule here is a *window mean*: the mean of sorted positions
``[start, start + length)``. Trimmed mean: ``start = t``, ``length = n − 2t``; median: the middle one (odd n) or two
(even n); MeaMed: the ``n − t`` values closest to the median, a contiguous window: of the ``t + 1`` windows of
``n − t`` consecutive sorted values, the one whose farthest value from the median is nearest (the first on ties).

The kernel runs the compare-exchanges in a cache-friendly order (:func:`cache_order`): the same comparators, each
wire's in its original order, so every wire ends with the same value bit for bit; tiles of rows that fit the L1
cache are finished before the network moves on, instead of sweeping the whole ``(n, block)`` buffer once per stage.

Before the pair loop, the kernel sorts leading groups of 128, 64, 32, 16 or 8 rows in registers as it loads them
(:func:`load_plan`, :func:`kernel_program`): Batcher's first stages stay inside such groups, and a group is only
handed over where the network's first compare-exchanges on each of its wires are exactly the group network's, so
again every wire ends with the same value bit for bit. Where n is just under a group size (7/8 of it or more), one
group padded with +∞ rows sorts all n rows.

NaN is mapped to +∞ before sorting (a NaN is the most extreme value there is), so with at most ``t`` non-finite
values per coordinate on each side the window holds only finite values.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

MODE_TRIMMED = 0
MODE_MEDIAN = 1
MODE_MEAMED = 2


@functools.lru_cache(maxsize=64)
def batcher_pairs(n: int) -> torch.Tensor:
    """Compare-exchange pairs ``(a, b)``, ``a < b``, of Batcher's odd–even merge sort for ``n`` inputs, ``(m, 2)``.

    The arbitrary-``n`` form of the network (pairs that would touch padding beyond ``n`` are dropped, which is
    valid because padding with +∞ never moves).
    """
    pairs: list[tuple[int, int]] = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2).contiguous()


@functools.lru_cache(maxsize=64)
def window_pairs(n: int, start: int, length: int) -> torch.Tensor:
    """Batcher's network pruned to what a window *sum* needs: positions ``[0, start)``, ``[start, start + length)``
    and the rest must hold the right values as sets, not in order.

    Walking the network backwards, a compare-exchange is dropped when no kept compare-exchange after it touches
    either of its two wires and both wires end in the same one of the three groups: swapping their values (or not)
    then changes no group. What remains moves every value to its group (the window's sum is exact) but leaves
    each group unsorted, so it serves the trimmed mean and the median, not rules that read sorted positions.
    Removes ~20 % of the pairs (n = 50, f = 5: 316 of 403).
    """
    def group(i: int) -> int:
        return 0 if i < start else (1 if i < start + length else 2)

    free = [True] * n
    kept: list[tuple[int, int]] = []
    for a, b in reversed(batcher_pairs(n).tolist()):
        if free[a] and free[b] and group(a) == group(b):
            continue
        kept.append((a, b))
        free[a] = free[b] = False
    kept.reverse()
    return torch.tensor(kept, dtype=torch.int64).reshape(-1, 2).contiguous()


def window_params(n: int, mode: int, trim: int) -> tuple[int, int]:
    """``(trim, length)`` of the window for a mode (median ignores ``trim``)."""
    if mode == MODE_TRIMMED:
        return trim, n - 2 * trim
    if mode == MODE_MEDIAN:
        return 0, 1 if n % 2 == 1 else 2
    return trim, n - trim


def cache_order(pairs: list[tuple[int, int]], tile: int) -> list[tuple[int, int]]:
    """The same compare-exchanges reordered so that runs of them stay inside tiles of ``tile`` consecutive wires.

    A comparator network is a sequence of compare-exchanges on wires; any reordering that keeps, for every wire,
    the order of the compare-exchanges touching it computes the same values (induction along the sequence: each
    compare-exchange sees the same two inputs, so it writes the same two outputs — a min and a max, no rounding).
    Rounds until the list is used up: (1) a *local* sweep walks the remaining compare-exchanges in order and takes
    each one whose two wires lie in the same tile (``wire // tile``) unless one of its wires is *blocked* — an
    earlier compare-exchange on it was left for later, which then blocks both of its wires; the taken ones are
    emitted tile by tile, each tile's in their original order (tiles share no wires, so their relative order is
    free); (2) a *crossing* sweep does the same for compare-exchanges whose wires lie in different tiles. Every
    round takes at least the first remaining compare-exchange, so it terminates; every taken compare-exchange
    has all its wires' earlier ones already emitted. Our construction (not from a paper), for the kernel's L1 cache:
    with ``tile`` rows of a block in L1, a tile's many stages run from L1 instead of one pass over the whole
    buffer per stage (n = 1,000: 3 rounds with ``tile`` = 256; tests/test_coordinatewise.py checks the wire order
    and the kernel's outputs, with a by-tile sort as the mutant).
    """
    if tile < 2:
        return list(pairs)
    remaining = list(range(len(pairs)))
    out: list[int] = []
    while remaining:
        blocked: set[int] = set()
        tiles: dict[int, list[int]] = {}
        deferred: list[int] = []
        for i in remaining:
            a, b = pairs[i]
            if a in blocked or b in blocked or a // tile != b // tile:
                blocked.update((a, b))
                deferred.append(i)
            else:
                tiles.setdefault(a // tile, []).append(i)
        for t in sorted(tiles):
            out.extend(tiles[t])
        blocked = set()
        remaining = []
        for i in deferred:
            a, b = pairs[i]
            if a in blocked or b in blocked or a // tile == b // tile:
                blocked.update((a, b))
                remaining.append(i)
            else:
                out.append(i)
    return [pairs[i] for i in out]


@functools.lru_cache(maxsize=64)
def kernel_network(n: int, window: tuple[int, int] | None, tile: int) -> torch.Tensor:
    """The pairs the C kernel runs, ``(m, 2)`` int64: Batcher's whole network (``window`` None) or the one pruned to
    a window sum (:func:`window_pairs`), in :func:`cache_order` for ``tile`` (``tile`` < 2: the original order)."""
    pairs = batcher_pairs(n) if window is None else window_pairs(n, *window)
    ordered = cache_order([(int(a), int(b)) for a, b in pairs.tolist()], tile)
    return torch.tensor(ordered, dtype=torch.int64).reshape(-1, 2).contiguous()


def wires_index(pairs: list[tuple[int, int]]) -> dict[int, list[int]]:
    """For each wire, the indices of ``pairs`` that touch it, in order (built once per network: O(len(pairs)))."""
    on: dict[int, list[int]] = {}
    for i, (a, b) in enumerate(pairs):
        on.setdefault(a, []).append(i)
        on.setdefault(b, []).append(i)
    return on


def group_prefix(pairs: list[tuple[int, int]], lo: int, group: list[tuple[int, int]],
                 on: dict[int, list[int]] | None = None) -> list[int] | None:
    """The indices of ``pairs`` that a group network run on wires ``[lo, lo + rows)`` as they are loaded replaces,
    or None if it may not (issue 37: the kernel sorts such groups in registers, see ``_cwkernel.load_sort_network``).

    The group qualifies when, on each of its wires, the network's first compare-exchanges are exactly ``group``'s
    (shifted by ``lo``) on that wire: the same instances in the same order. Running those first and every other
    compare-exchange after, in its order, keeps each wire's sequence of compare-exchanges — the argument of
    :func:`cache_order` — so every wire ends with the same value bit for bit. A pruned network that dropped one of
    the group's compare-exchanges does not qualify. ``on``: :func:`wires_index` of ``pairs`` (built here if not
    given); the check reads only the group's own wires' first compare-exchanges, so a plan over a network of n
    wires costs O(len(pairs)), not O(n · len(pairs)). Our construction (not from a paper).
    """
    on = wires_index(pairs) if on is None else on
    want = [(a + lo, b + lo) for a, b in group]
    found: list[int | None] = [None] * len(want)  # the index in pairs of each of the group's compare-exchanges
    position: dict[int, int] = {}
    for k, (a, b) in enumerate(want):
        for w in (a, b):
            seq = on.get(w, [])
            j = position.get(w, 0)
            if j >= len(seq) or pairs[seq[j]] != (a, b) or found[k] not in (None, seq[j]):
                return None
            found[k] = seq[j]
            position[w] = j + 1
    return sorted(i for i in found if i is not None)


def load_plan(pairs: list[tuple[int, int]], n: int, nets: tuple[tuple[int, tuple[tuple[int, int], ...]], ...],
              padded: bool = True) -> tuple[tuple[int, ...], list[int]]:
    """The kernel's load plan for a network on ``n`` wires: how many groups of each size in ``nets`` (``(rows,
    pairs)``, largest first) are sorted as they are loaded, from row 0 on in that order, and the indices of the
    compare-exchanges left to run after. From row 0, each step takes the largest group size not above the last
    one taken that :func:`group_prefix` accepts at that row (sizes are powers of two; a group starts at a multiple
    of its size); it stops where none does.

    A group may also cover all n rows alone, padded (``7/8 · rows <= n < rows``, at row 0): the kernel reads +Inf
    for the rows past n. +Inf never moves — a compare-exchange of a real wire a and a padding wire b > a leaves a's
    value and +Inf on b (``min``/``max`` as the kernel computes them) — so each real wire ends as it does under the
    group's compare-exchanges among real wires alone, and those must be the first ones of each wire, as for a whole
    group. For Batcher's network on n wires they are: it is the network on ``rows`` wires without the pairs that
    touch a wire past n (:func:`batcher_pairs`). Below 7/8 the padded group's extra rows cost more than the pair
    loop it saves (measured on a 2-core AVX2 EPYC, float32, d = 65,536, the trimmed mean and MeaMed: n = 17, 24, 33,
    50 slower padded; 14, 28, 31, 56, 63 faster). ``padded=False``: whole groups only (for an A/B of the two).
    Our construction (not from a paper)."""
    counts = [0] * len(nets)
    taken: set[int] = set()
    on = wires_index(pairs)
    for k, (rows, group) in enumerate(nets):  # the largest group that covers every row, padded
        if padded and 7 * rows <= 8 * n < 8 * rows:
            mine = group_prefix(pairs, 0, [(a, b) for a, b in group if b < n], on)
            if mine is not None and len(mine) == len(pairs):
                counts[k] = 1
                return tuple(counts), []
    row, k = 0, 0
    while k < len(nets):
        rows, group = nets[k]
        mine = group_prefix(pairs, row, list(group), on) if row % rows == 0 and row + rows <= n else None
        if mine is None:
            k += 1
            continue
        taken.update(mine)
        counts[k] += 1
        row += rows
    return tuple(counts), [i for i in range(len(pairs)) if i not in taken]


def chain_order(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The same compare-exchanges, each followed where possible by one that shares exactly one of its wires.

    The kernel runs two consecutive compare-exchanges that share one wire on three rows in registers (three row
    loads and stores instead of four). Walking the list in order, after emitting a compare-exchange this moves up
    the next pending one on either of its wires if that one is also the next pending on its other wire — nothing
    still to run touches its wires before it — so every wire keeps its sequence of compare-exchanges (the argument
    of :func:`cache_order`) and its value bit for bit. Our construction (not from a paper)."""
    on = wires_index(pairs)
    nxt = dict.fromkeys(on, 0)
    done = [False] * len(pairs)
    out: list[int] = []

    def emit(i: int) -> None:
        out.append(i)
        done[i] = True
        for w in pairs[i]:
            nxt[w] += 1

    def ready(j: int) -> bool:
        return all(nxt[w] < len(on[w]) and on[w][nxt[w]] == j for w in pairs[j])

    for i in range(len(pairs)):
        if done[i]:
            continue
        emit(i)
        for w in pairs[i]:
            j = on[w][nxt[w]] if nxt[w] < len(on[w]) else -1
            if j >= 0 and ready(j) and len(set(pairs[i]) & set(pairs[j])) == 1:
                emit(j)
                break
    return [pairs[i] for i in out]


def network_window(n: int, mode: int, trim: int, length: int) -> tuple[int, int] | None:
    """The window of sorted positions a mode's pruned network must produce (``(start, length)``), or None where the
    whole network runs: MeaMed reads every sorted position (so do contributions, which the caller decides), and so
    does the trimmed mean, whose window is *added* in sorted order: a pruned network leaves the right values in the
    window but not in order, and float64 additions in another order give other last bits — so the trimmed mean of
    a round that records contributions (every evaluation round) differed from one that does not, and from the
    ``torch.sort`` fallback (float64 inputs often, float32 ones whose values span more than ~2²⁹; what the whole
    network costs: docs/benchmarks.md, ``benchmarks/cw_floor.py``). The median keeps its pruned network: it reads
    the one or two middle positions, whose halves it adds in either order alike."""
    if mode in (MODE_MEAMED, MODE_TRIMMED):
        return None
    return ((n - 1) // 2, length)


def load_sort_nets(kernel: Any) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """The networks a kernel build runs on groups of rows as it loads them, ``(rows, pairs)`` in its plan arguments'
    order: 128, 64, 32, 16 and 8 rows (``load_sort_sizes``), or 32, 16 and 8 for a build before those groups; none
    for an older build without ``load_sort_network``."""
    if not hasattr(kernel, "load_sort_network"):
        return ()
    sizes = tuple(kernel.load_sort_sizes()) if hasattr(kernel, "load_sort_sizes") else (32, 16, 8)
    return tuple((rows, tuple(tuple(p) for p in kernel.load_sort_network(rows))) for rows in sizes)


@functools.lru_cache(maxsize=64)
def kernel_program(n: int, window: tuple[int, int] | None, tile: int,
                   nets: tuple[tuple[int, tuple[tuple[int, int], ...]], ...],
                   padded: bool = True) -> tuple[tuple[int, ...], torch.Tensor]:
    """``(plan, pairs)`` for the C kernel: ``plan`` (:func:`load_plan`) counts the groups of each size in ``nets``
    sorted as they are loaded, then ``pairs`` — what remains of :func:`kernel_network`'s compare-exchanges — run
    in :func:`cache_order`, then :func:`chain_order`. With no ``nets`` (an older build) it is
    :func:`kernel_network`'s, with an empty plan."""
    base = [(int(a), int(b)) for a, b in (batcher_pairs(n) if window is None else window_pairs(n, *window)).tolist()]
    plan, rest = load_plan(base, n, nets, padded)
    ordered = cache_order([base[i] for i in rest], tile)
    if nets:  # a build with the load sort also runs two compare-exchanges sharing a wire as one (chain_order)
        ordered = chain_order(ordered)
    return plan, torch.tensor(ordered, dtype=torch.int64).reshape(-1, 2).contiguous()
