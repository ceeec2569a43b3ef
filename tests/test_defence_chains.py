"""End-to-end chains of the pre-aggregators and the FLTrust / DnC / SignGuard rules, built with ``make``."""

from __future__ import annotations

import torch

from phalanx.aggregators import Chain, make
from phalanx.aggregators.dnc import DnC
from phalanx.aggregators.fltrust import FLTrust
from phalanx.aggregators.pre.arc import ARC
from phalanx.aggregators.pre.bucketing import Bucketing
from phalanx.aggregators.pre.clip import Clip
from phalanx.aggregators.signguard import SignGuard


def _honest(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) * 0.3 + 1.0


def test_clip_then_fltrust() -> None:
    agg = make("clip(threshold=1.0)>fltrust", f=1)
    assert isinstance(agg, Chain)
    assert isinstance(agg.pre[0], Clip) and isinstance(agg.rule, FLTrust)
    assert agg.context_keys == frozenset({"reference"})
    honest = _honest(6, 30, 0)
    ref = honest.mean(0)
    x = torch.cat([torch.full((1, 30), float("nan")), honest])
    out, contrib = agg.aggregate(x, reference=ref)
    # Clipping rescales rows, which FLTrust's normalisation undoes: same result as FLTrust alone.
    out_plain, contrib_plain = FLTrust(f=1).aggregate(x, reference=ref)
    torch.testing.assert_close(out, out_plain)
    torch.testing.assert_close(contrib, contrib_plain)
    assert torch.isfinite(out).all() and contrib[0] == 0.0


def test_arc_then_dnc() -> None:
    agg = make("arc>dnc", f=2)
    assert isinstance(agg, Chain) and isinstance(agg.pre[0], ARC) and isinstance(agg.rule, DnC)
    assert agg.min_workers() == 5
    honest = _honest(10, 200, 1)
    g = torch.Generator().manual_seed(2)
    attack = 50.0 * torch.randn(200, generator=g)
    x = torch.cat([attack.repeat(2, 1), honest])
    out, contrib = agg.aggregate(x)
    assert contrib[:2].tolist() == [0.0, 0.0]
    torch.testing.assert_close(contrib.sum(), torch.tensor(1.0, dtype=torch.float64))
    # ARC clips the k = floor(2*2*10/12) = 3 longest rows (both attackers and the longest honest row); DnC then
    # removes two rows: the attackers. The output is the mean of the (ARC-clipped) honest rows.
    clipped = ARC(f=2)(x)
    torch.testing.assert_close(out, clipped[2:].mean(0))


def test_bucketing_then_signguard() -> None:
    agg = make("bucketing(s=2)>signguard", f=1)
    assert isinstance(agg, Chain) and isinstance(agg.pre[0], Bucketing) and isinstance(agg.rule, SignGuard)
    x = _honest(10, 100, 3)
    x[7] = float("nan")
    out, contrib = agg.aggregate(x)
    assert torch.isfinite(out).all()
    assert contrib[7] == 0.0
    torch.testing.assert_close(contrib.sum(), torch.tensor(1.0, dtype=torch.float64))
    # Contributions come in pairs (the members of a kept bucket share its weight).
    assert int((contrib > 0).sum()) % 2 == 0


def test_chain_parameters_reach_their_elements() -> None:
    agg = make("bucketing(s=3, seed=4)>dnc", f=1, dnc__subsample=50, c=2.0)
    assert isinstance(agg, Chain)
    assert agg.pre[0].params() == {"f": 1, "s": 3, "seed": 4}
    assert agg.rule.params() == {"f": 1, "iterations": 1, "subsample": 50, "c": 2.0, "seed": 0}
