"""docs/async.md's account of why Kardam's filter does not hold always-first sign flippers ×10
(``scripts/kardam_quantile.py``): the coefficients of rejected honest updates raise the quantile. If keeping only
accepted coefficients did not make the filter reject more flips, the account would be false and this test fails."""

from __future__ import annotations

from _scripts import load_script

kardam_quantile = load_script("scripts/kardam_quantile.py", "kardam_quantile")


def test_keeping_only_accepted_coefficients_rejects_more_flips_and_the_filter_is_restored() -> None:
    from phalanx.training.algorithms import kardam

    screen = kardam.Kardam.screen
    built = kardam_quantile.measure(0, variant=False)
    variant = kardam_quantile.measure(0, variant=True)
    assert kardam.Kardam.screen is screen  # the instrument never outlives its run
    assert built["byzantine_rejected"] < 30 < variant["byzantine_rejected"]
    assert built["accuracy"] < 20 and variant["accuracy"] < 20  # at chance either way (10 classes)
