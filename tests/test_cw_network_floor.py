"""The coordinate-wise rules' second floor (``benchmarks/cw_floor.py``): compare-exchanges in registers, and the
size of the network each rule runs."""

from __future__ import annotations

import pytest

from _scripts import load_script
from phalanx.aggregators import coordinatewise

cw_floor = load_script("benchmarks/cw_floor.py", "phalanx_bench_cw_floor")
kernel = coordinatewise._cwkernel
needs_kernel = pytest.mark.skipif(not coordinatewise.HAVE_KERNEL, reason="the C kernel is not built")


@needs_kernel
@pytest.mark.parametrize("is_double", [False, True])
def test_the_spin_counts_what_it_ran_and_rejects_no_work(is_double: bool) -> None:
    assert kernel.compare_exchange_spin(3, is_double) == 3 * 8 * 19 * 128  # passes × Batcher(8) × a block's columns
    with pytest.raises(ValueError, match="reps"):
        kernel.compare_exchange_spin(0, is_double)


@needs_kernel
def test_a_rate_is_measured_and_an_older_build_has_none() -> None:
    rate = cw_floor.compare_exchange_seconds(kernel, 1)
    assert rate is not None and rate > 0
    assert cw_floor.compare_exchange_seconds(object(), 1) is None


def test_each_rule_is_held_to_the_network_it_runs() -> None:
    """Batcher's whole network (543 compare-exchanges at n = 64) for the trimmed mean and MeaMed, which add or read
    sorted positions; the median's is pruned to its two middle wires."""
    assert cw_floor.network_size(64, "trimmed", 12) == cw_floor.network_size(64, "meamed", 12) == 543
    assert cw_floor.network_size(64, "median", 12) == 444
    assert cw_floor.network_size(63, "median", 12) < cw_floor.network_size(63, "trimmed", 12)
