"""FoolsGold's tie rule (issue 38): identical or exactly parallel histories have similarity exactly 1, whatever the
order of the rows or of the sums (phalanx.aggregators.foolsgold.similarities)."""

from __future__ import annotations

import pytest
import torch

from phalanx.aggregators import foolsgold as fg
from phalanx.aggregators._rowops import cosine_matrix, float64_gram
from phalanx.aggregators.foolsgold import FoolsGold, foolsgold_weights, similarities, tie_band

D = 2000


def sybils_and_honest(seed: int, sybils: int = 3, honest: int = 5) -> torch.Tensor:
    """``sybils`` identical float32 histories (ALIE's clients send one row) then ``honest`` random ones."""
    g = torch.Generator().manual_seed(seed)
    twin = torch.randn(1, D, generator=g).expand(sybils, -1)
    return torch.cat([twin, torch.randn(honest, D, generator=g)]).contiguous()


def presentations(h: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same histories presented differently: (rows, which original row each is). Row permutations, the columns
    reversed or shuffled (the same cosines, every Gram entry summed in another order), and a float64 copy (the
    history FoolsGold keeps for float64 inputs)."""
    n = h.shape[0]
    g = torch.Generator().manual_seed(99)
    out = [(h, torch.arange(n)), (h.flip(1).contiguous(), torch.arange(n)), (h.double(), torch.arange(n)),
           (h[:, torch.randperm(h.shape[1], generator=g)].contiguous(), torch.arange(n))]
    for _ in range(4):
        p = torch.randperm(n, generator=g)
        out.append((h[p].contiguous(), p))
        out.append((h[p].flip(1).contiguous(), p))
    return out


def weights_in_original_order(h: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    w = foolsgold_weights(h, torch.ones(h.shape[0], dtype=torch.bool))
    return torch.empty_like(w).index_copy_(0, where, w)


@pytest.mark.parametrize("seed", range(3))
def test_identical_histories_get_the_same_weights_in_every_order_bit_for_bit(seed: int) -> None:
    h = sybils_and_honest(seed)
    ref = weights_in_original_order(h, torch.arange(h.shape[0]))
    assert (ref[:3] == 0).all() and (ref[3:] > 0).all()
    for rows, where in presentations(h):
        assert torch.equal(weights_in_original_order(rows, where), ref)
    alone = h[:3]  # a round whose participants are all twins: every weight 0, in every order
    for rows, where in presentations(alone):
        assert torch.equal(weights_in_original_order(rows, where), torch.zeros(3, dtype=torch.float64))


def summed(rounds: torch.Tensor, order: str) -> torch.Tensor:
    """One client's float32 history, the sum of its rounds ``(T, d)`` accumulated in a given order."""
    if order == "reversed":
        rounds = rounds.flip(0)
    if order == "pairwise":
        while rounds.shape[0] > 1:
            odd = rounds[-1:] if rounds.shape[0] % 2 else rounds[:0]
            rounds = torch.cat([rounds[0 : rounds.shape[0] // 2 * 2 : 2] + rounds[1 : rounds.shape[0] // 2 * 2 : 2],
                                odd])
        return rounds[0]
    total = torch.zeros(rounds.shape[1])
    for r in rounds:
        total = total + r
    return total


def test_twins_whose_histories_were_summed_in_different_orders_are_still_twins() -> None:
    """The sybils' rounds are the same, but each history was accumulated in another order (float32): the rows differ in
    their last bits, their cosine is within the tie band, and the weights are those of exactly identical rows."""
    g = torch.Generator().manual_seed(4)
    rounds = torch.randn(12, D, generator=g)
    honest = torch.randn(5, D, generator=g)
    twins = torch.stack([summed(rounds, o) for o in ("forward", "reversed", "pairwise")])
    assert not torch.equal(twins[0], twins[1]) and not torch.equal(twins[0], twins[2])
    same = twins[0].expand(3, -1)
    ones = torch.ones(8, dtype=torch.bool)
    assert torch.equal(foolsgold_weights(torch.cat([twins, honest]), ones),
                       foolsgold_weights(torch.cat([same, honest]), ones))
    assert torch.equal(foolsgold_weights(twins, ones[:3]), torch.zeros(3, dtype=torch.float64))
    cs, _ = similarities(twins, ones[:3])
    assert torch.equal(cs, 1.0 - torch.eye(3, dtype=torch.float64))


def test_exactly_parallel_histories_are_computed_within_half_the_band_in_any_order() -> None:
    """tie_band's bound: a pair whose exact cosine is 1 (a row and its copy scaled by a power of two, exact in
    floating point) is computed at least 1 − τ/2, columns in their order or reversed, float32 or float64."""
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        r = torch.randn(1, 777, generator=g) * torch.rand(1, 777, generator=g).pow(8) * 1e3
        h = torch.cat([r, r * 2.0 ** (seed - 10)])
        keep = torch.ones(2, dtype=torch.bool)
        for rows in (h, h.flip(1), h.double(), h.double().flip(1)):
            cos, _ = cosine_matrix(float64_gram(rows.contiguous(), keep), keep)
            assert float(cos[0, 1]) >= 1.0 - tie_band(777) / 2
            assert float(cos[1, 0]) >= 1.0 - tie_band(777) / 2
    assert tie_band(79_510) == 4 * 79_514 * 2.0 ** -53


@pytest.fixture
def without_the_tie_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: no band (a cosine is 1 only if it is computed as 1 — the code before the rule)."""
    monkeypatch.setattr(fg, "tie_band", lambda d: 0.0)


@pytest.mark.usefixtures("without_the_tie_rule")
def test_the_mutant_without_the_tie_rule_decides_by_the_last_bit() -> None:
    """Three identical rows [1, 1]: their Gram entries are exactly 2, and 2 / (√2·√2) is 1 − 2⁻⁵² in IEEE
    arithmetic op by op — every weight 1 — but exactly 1 where torch's vector kernels round otherwise (seen on an
    AVX-512 machine) — every weight 0: the mutant's answer follows the machine's last bit, whichever it is. Three
    rows [1, 0] (Gram 1, cosine exactly 1 everywhere) — every weight 0. And the same three identical random rows give
    every weight 1 or every weight 0 depending on the order the Gram matrix summed their columns in (found among 200
    seeds, on both kinds of machine)."""
    ones = torch.ones(3, dtype=torch.bool)
    twins = torch.tensor([[1.0, 1.0]] * 3)
    cos = float(cosine_matrix(float64_gram(twins, ones), ones)[0][0, 1])
    assert cos in (1.0, 1.0 - 2.0**-52)
    expected = torch.zeros(3, dtype=torch.float64) if cos == 1.0 else torch.ones(3, dtype=torch.float64)
    assert torch.equal(foolsgold_weights(twins, ones), expected)
    assert torch.equal(foolsgold_weights(torch.tensor([[1.0, 0.0]] * 3), ones), torch.zeros(3, dtype=torch.float64))
    for seed in range(200):
        row = torch.randn(1, 1000, generator=torch.Generator().manual_seed(seed)).expand(3, -1)
        one, other = foolsgold_weights(row.contiguous(), ones), foolsgold_weights(row.flip(1).contiguous(), ones)
        if not torch.equal(one, other):
            break
    else:
        pytest.fail("no seed among 200 whose two summation orders differ without the tie rule")


def test_the_rule_gives_the_constructed_cases_their_exact_similarity() -> None:
    """The mutant's cases with the rule: [1, 1] and [1, 0] twins alike (every weight 0, similarity exactly 1), and
    the seeds whose orders differed without it give weight 0 in both orders."""
    ones = torch.ones(3, dtype=torch.bool)
    for row in ([1.0, 1.0], [1.0, 0.0]):
        h = torch.tensor([row] * 3)
        assert torch.equal(foolsgold_weights(h, ones), torch.zeros(3, dtype=torch.float64))
        assert torch.equal(similarities(h, ones)[0], 1.0 - torch.eye(3, dtype=torch.float64))
    for seed in range(200):
        row = torch.randn(1, 1000, generator=torch.Generator().manual_seed(seed)).expand(3, -1)
        for h in (row.contiguous(), row.flip(1).contiguous()):
            assert torch.equal(foolsgold_weights(h, ones), torch.zeros(3, dtype=torch.float64))


def test_the_rule_keeps_its_history_and_shares_whatever_order_the_clients_come_in() -> None:
    """Over rounds, as a server runs it: three ALIE-like clients send one row, five honest clients their own; two
    servers see the clients in different orders each round (ids follow the rows) and their shares and histories
    agree bit for bit."""
    g = torch.Generator().manual_seed(7)
    a, b = FoolsGold(), FoolsGold()
    for t in range(5):
        rows = sybils_and_honest(100 + t)
        p = torch.randperm(8, generator=g)
        _, sa = a.aggregate(rows, ids=torch.arange(8))
        _, sb = b.aggregate(rows[p].contiguous(), ids=p)
        assert torch.equal(torch.empty_like(sb).index_copy_(0, p, sb), sa)
        assert (sa[:3] == 0).all()
    assert torch.equal(a.state_dict()["history"], b.state_dict()["history"])
